"""Algebraic simplification: drop no-op ops, fold batch norm into weights, merge layout ops."""
from __future__ import annotations

import dataclasses
from math import prod
from typing import cast

import numpy as np

from cinn.compiler.passes.dce import dce
from cinn.compiler.passes.rewrite import Rewriter, Rule, rewrite, same_graph
from cinn.core.ir import Node, Program, Value
from cinn.core.ops import PatternKind, get_op
from cinn.core.ops.elementwise import ScaleAttrs
from cinn.core.ops.nn import DataFormat, MatmulAttrs
from cinn.core.ops.shape import ReshapeAttrs, TransposeAttrs

# Ops that only change the shape, not the row-major order of the elements.
RESHAPE_LIKE = ("reshape", "flatten", "squeeze", "expand_dims")
# Each rule can enable another (a removed identity exposes a transpose pair...): sweep to a fixed point.
MAX_ROUNDS = 8


def simplify(program: Program) -> Program:
    """Apply every simplification rule until the graph stops changing (dead nodes removed each sweep)."""
    for _ in range(MAX_ROUNDS):
        before = program
        for rule in RULES:
            program = dce(rewrite(program, rule))
        if same_graph(before, program):
            break
    return program


# -- no-op ops ----------------------------------------------------------------------------------
def remove_noops(rw: Rewriter, node: Node) -> bool:
    """identity and a cast to the dtype it has disappear; so does inference dropout, or it becomes a scale when it
    multiplies (downgrade_in_infer)."""
    if node.op == "dropout" and node.attrs.keep_scale != 1.0:
        rw.keep(node, op="scale", attrs=ScaleAttrs(scale=node.attrs.keep_scale))
        return True
    if node.op in ("identity", "dropout") or (node.op == "cast" and node.inputs[0].dtype == node.outputs[0].dtype):
        rw.substitute(node.outputs[0], rw.inputs(node)[0])
        return True
    return False


# -- batch norm folding -------------------------------------------------------------------------
def fold_batchnorm(rw: Rewriter, node: Node) -> bool:
    """batchnorm after a conv2d/matmul with constant weights -> scaled weights + bias add.

    bn(conv(x, w)) = conv(x, w * s) + (bias - mean * s) with s = scale / sqrt(variance + epsilon),
    valid only when the conv output feeds nothing else.
    """
    if node.op != "batchnorm":
        return False
    x, *stats = rw.inputs(node)
    producer = rw.producer(x)
    params = [p for p in (rw.constant(v) for v in stats) if p is not None]
    if producer is None or not rw.has_single_use(x) or len(params) != len(stats):
        return False
    scale, bias, mean, variance = (p.astype(np.float64) for p in params)
    s = scale / np.sqrt(variance + node.attrs.epsilon)
    channel_axis = 1 if node.attrs.data_layout is DataFormat.NCHW else len(x.shape) - 1
    folded = _scaled_weight(rw, producer, channel_axis, s)
    if folded is None:
        return False
    data, bias_shape = folded
    out = node.outputs[0]
    weight = rw.new_constant(data, "bn_folded_weight")
    (y,) = rw.emit(producer.op, [producer.inputs[0], weight], producer.attrs)
    b = rw.new_constant((bias - mean * s).reshape(bias_shape).astype(out.dtype), "bn_folded_bias")
    (z,) = rw.emit("add", [y, b])
    rw.substitute(out, z)
    return True


def _scaled_weight(rw: Rewriter, producer: Node, channel_axis: int, s: np.ndarray) -> tuple[np.ndarray, tuple[int, ...]] | None:
    """The producer's constant weight scaled per output channel and the bias shape; None if not foldable (any other
    producer, a weight computed at run time, or a channel axis that is not the producer's output channel axis)."""
    if producer.op not in ("conv2d", "matmul"):
        return None
    w = rw.constant(producer.inputs[1])
    if w is None:
        return None
    a = producer.attrs
    if producer.op == "conv2d":
        if channel_axis != 1 or a.data_format is not DataFormat.NCHW:
            return None
        return (w * s.reshape(-1, 1, 1, 1)).astype(w.dtype), (-1, 1, 1)
    if w.ndim < 2 or channel_axis != len(producer.outputs[0].shape) - 1:
        return None
    # the channel is the matmul's N axis: the last axis of y, or the one before when trans_y
    per_channel = s.reshape(-1, 1) if a.trans_y else s
    return (w * per_channel).astype(w.dtype), (-1,)


# -- layout ops ---------------------------------------------------------------------------------
def merge_reshapes(rw: Rewriter, node: Node) -> bool:
    """A chain of reshape-like ops becomes one reshape; a reshape to the input's own shape disappears."""
    if node.op not in RESHAPE_LIKE:
        return False
    (x,) = rw.inputs(node)
    out = node.outputs[0]
    source = _through(rw, x, RESHAPE_LIKE)
    if source.shape == out.shape:
        rw.substitute(out, source)
        return True
    if source == x:
        return False
    rw.keep(node, op="reshape", inputs=(source,), attrs=ReshapeAttrs(out.shape))
    return True


def merge_transposes(rw: Rewriter, node: Node) -> bool:
    """transpose(transpose(x, p), q) -> transpose(x, p[q]); an identity permutation disappears."""
    if node.op != "transpose":
        return False
    (x,) = rw.inputs(node)
    perm = transpose_perm(node)
    source = _through(rw, x, ("transpose",))
    inner_node = rw.producer(x)
    if source != x and inner_node is not None:
        inner = transpose_perm(inner_node)
        perm = tuple(inner[i] for i in perm)
    if perm == tuple(range(len(perm))):
        rw.substitute(node.outputs[0], source)
        return True
    if source == x:
        return False
    rw.keep(node, inputs=(source,), attrs=dataclasses.replace(cast(TransposeAttrs, node.attrs), axis=perm))
    return True


def unit_transpose_to_reshape(rw: Rewriter, node: Node) -> bool:
    """A transpose that moves only unit axes ([1, seq, dim] -> [seq, 1, dim], torch's batch-first to sequence-first at
    batch 1) keeps the elements' order: a reshape, which merges with its neighbours."""
    if node.op != "transpose":
        return False
    shape = node.inputs[0].shape
    moved = [a for a in transpose_perm(node) if shape[a] != 1]
    if moved != sorted(moved):
        return False
    rw.keep(node, op="reshape", attrs=ReshapeAttrs(node.outputs[0].shape))
    return True


def matmul_of_rows(rw: Rewriter, node: Node) -> bool:
    """matmul(reshape(x), y [K, N]) -> reshape(matmul(x, y)) where x [1.., M, K] holds all its rows in one axis and
    the reshape keeps K (torch's sequence-first [seq, 1, dim] at batch 1, an exporter's [seq, dim] before a Gemm): the
    kernel then tiles x's M rows as they are, and the reshape moves on to meet its opposite."""
    if node.op != "matmul":
        return False
    viewed, y = rw.inputs(node)
    reshape = rw.producer(viewed)
    if reshape is None or reshape.op not in RESHAPE_LIKE or len(y.shape) != 2 or node.attrs.trans_x:
        return False
    x = rw.inputs(reshape)[0]
    if len(x.shape) < 2 or prod(x.shape[:-2]) != 1 or x.shape[-1] != viewed.shape[-1] or len(viewed.shape) < 2:
        return False
    (out,) = rw.emit("matmul", [x, y], node.attrs)
    (back,) = rw.emit("reshape", [out], ReshapeAttrs(node.outputs[0].shape))
    rw.substitute(node.outputs[0], back)
    return True


def sink_reshape(rw: Rewriter, node: Node) -> bool:
    """op(reshape(x), b) -> reshape(op(x, b)) for an elementwise op whose other operands vary along the last axis
    alone (a bias), which the reshape keeps: the op then joins x's producer (a matmul's epilogue), and the reshape
    moves on to meet its opposite."""
    inputs = rw.inputs(node)
    if get_op(node.op).kind not in (PatternKind.ELEMENTWISE, PatternKind.BROADCAST) or len(node.outputs) != 1 \
            or len(inputs) < 2:
        return False
    viewed = [i for i, v in enumerate(inputs) if (p := rw.producer(v)) is not None and p.op in RESHAPE_LIKE
              and rw.has_single_use(v)]
    if len(viewed) != 1:
        return False
    (i,) = viewed
    x = rw.inputs(cast(Node, rw.producer(inputs[i])))[0]
    out = node.outputs[0]
    if not (x.shape and out.shape) or x.shape[-1] != out.shape[-1] or inputs[i].shape != out.shape or any(
            prod(v.shape[:-1]) != 1 for k, v in enumerate(inputs) if k != i):
        return False
    (y,) = rw.emit(node.op, [x if k == i else v for k, v in enumerate(inputs)], node.attrs)
    (back,) = rw.emit("reshape", [y], ReshapeAttrs(out.shape))
    rw.substitute(out, back)
    return True


def fold_transpose_into_matmul(rw: Rewriter, node: Node) -> bool:
    """matmul(transpose(a) swapping the last two dims, b) -> matmul(a, b, trans_x=not trans_x) (same for b)."""
    if node.op != "matmul":
        return False
    inputs = list(rw.inputs(node))
    flags = [node.attrs.trans_x, node.attrs.trans_y]
    for i, v in enumerate(inputs):
        producer = rw.producer(v)
        if producer is not None and producer.op == "transpose" and _swaps_last_two(transpose_perm(producer)):
            inputs[i], flags[i] = producer.inputs[0], not flags[i]
    if inputs == list(rw.inputs(node)):
        return False
    rw.keep(node, inputs=tuple(inputs), attrs=dataclasses.replace(cast(MatmulAttrs, node.attrs), trans_x=flags[0], trans_y=flags[1]))
    return True


def _through(rw: Rewriter, v: Value, ops: tuple[str, ...]) -> Value:
    """The input of v's producer when that is one of `ops` (already merged with its own producers), else v."""
    producer = rw.producer(v)
    return producer.inputs[0] if producer is not None and producer.op in ops else v


def transpose_perm(node: Node) -> tuple[int, ...]:
    """A transpose node's permutation with non-negative axes."""
    ndim = len(node.inputs[0].shape)
    return tuple(a % ndim for a in node.attrs.axis) if ndim else ()


def _swaps_last_two(perm: tuple[int, ...]) -> bool:
    n = len(perm)
    return n >= 2 and perm == tuple(range(n - 2)) + (n - 1, n - 2)


# -- powers ---------------------------------------------------------------------------------------
def pow_to_roots(rw: Rewriter, node: Node) -> bool:
    """x ** c for c in {0.5, 0.75, 1, 2} -> square roots and products: vector instructions instead of a scalar libm
    pow per element (LRN's x ** 0.75; see docs/notes/graph-rewrites.md). Only -inf ** 0.5 differs (NaN, not inf)."""
    if node.op != "pow":
        return False
    x, e = rw.inputs(node)
    c = rw.constant(e)
    if c is None or c.size != 1 or x.shape != node.outputs[0].shape:
        return False
    exponent = float(c.reshape(()))
    if exponent not in (0.5, 0.75, 1, 2):
        return False
    if exponent == 1:
        rw.substitute(node.outputs[0], x)
        return True
    if exponent == 2:
        (y,) = rw.emit("multiply", [x, x])
    else:
        (y,) = rw.emit("sqrt", [x])
        if exponent == 0.75:
            (y,) = rw.emit("multiply", [y, *rw.emit("sqrt", [y])])
    rw.substitute(node.outputs[0], y)
    return True


# -- integer round trips --------------------------------------------------------------------------
def drop_integer_round_trip(rw: Rewriter, node: Node) -> bool:
    """cast(cast(y, int type), y's float type) -> y when y is integral and clipped into the int type's range: a
    quantize-dequantize pair's epilogue stays in float vectors (see docs/notes/vnni-kernels.md). Only a NaN y
    differs: it stays NaN instead of becoming an arbitrary integer."""
    if node.op != "cast":
        return False
    (mid,) = rw.inputs(node)
    inner = rw.producer(mid)
    if inner is None or inner.op != "cast" or np.dtype(mid.dtype).kind not in "iu":
        return False
    (y,) = rw.inputs(inner)
    if y.dtype != node.outputs[0].dtype or np.dtype(y.dtype).kind != "f" or not _clipped_integral(rw, y, mid.dtype):
        return False
    rw.substitute(node.outputs[0], y)
    return True


def _clipped_integral(rw: Rewriter, y: Value, dtype: str) -> bool:
    """Whether y = clip(z, lo, hi) with integral z and [lo, hi] within `dtype`'s range."""
    clip = rw.producer(y)
    if clip is None or clip.op != "clip":
        return False
    info = np.iinfo(dtype)
    in_range = info.min <= clip.attrs.min and clip.attrs.max <= info.max
    whole = float(clip.attrs.min).is_integer() and float(clip.attrs.max).is_integer()
    return in_range and whole and _integral(rw, rw.inputs(clip)[0], depth=4)


def _integral(rw: Rewriter, v: Value, depth: int) -> bool:
    """Whether v holds whole numbers: rounded, an integer cast to float, an integral constant, or sums of those."""
    data = rw.constant(v)
    if data is not None:
        return bool(np.all(np.mod(data, 1) == 0))
    producer = rw.producer(v)
    if producer is None or depth == 0:
        return False
    if producer.op in ("round", "floor", "ceil"):
        return True
    if producer.op == "cast":
        return np.dtype(producer.inputs[0].dtype).kind in "iub"
    if producer.op in ("add", "subtract"):
        return all(_integral(rw, x, depth - 1) for x in rw.inputs(producer))
    return False


RULES: tuple[Rule, ...] = (remove_noops, fold_batchnorm, merge_reshapes, merge_transposes, unit_transpose_to_reshape,
                           matmul_of_rows, sink_reshape, fold_transpose_into_matmul, pow_to_roots, drop_integer_round_trip)
