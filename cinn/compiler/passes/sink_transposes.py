"""Move transposes below elementwise ops and reductions, toward their consumers, where opposite transposes meet and
cancel.

The integer convolutions compute channels last and hand their result back to the NCHW graph through a transpose;
the next integer convolution transposes its quantized input channels last again. Sunk through the epilogue between
them (dequantize, bias, relu, residual add, quantize), the two meet and cancel: the quantized tensors then stay
channels last from one convolution to the next, with no copy kernel and no gathering write-back.

A reduction of a transposed tensor reduces the tensor itself over the axes the permutation maps its own to: a
squeeze-excite block's global average pool over a channels-last depthwise conv's output then reads it in place, and
only its small result is transposed (channels_last).
"""
from __future__ import annotations

import numpy as np

from cinn.compiler.passes.dce import dce
from cinn.compiler.passes.rewrite import Rewriter, rewrite, same_graph
from cinn.compiler.passes.simplify import merge_transposes
from cinn.core.ir import Node, Program
from cinn.core.ops import PatternKind, get_op
from cinn.core.ops.reduction import ReduceAttrs, reduced_axes
from cinn.core.ops.shape import AxisAttrs, TransposeAttrs

AXIS_BOUND = frozenset({"batchnorm"})  # elementwise, but its per-channel operands follow an axis attribute
MAX_ROUNDS = 16  # a sweep sinks a transpose through a whole chain: more rounds only for chains that meet late


def sink_transposes(program: Program) -> Program:
    """Sink transposes through elementwise ops and merge the ones that meet, to a fixed point."""
    for _ in range(MAX_ROUNDS):
        before = program
        program = dce(rewrite(dce(rewrite(program, _sink)), merge_transposes))
        if same_graph(before, program):
            break
    return program


def _sink(rw: Rewriter, node: Node) -> bool:
    """op(transpose(a, p), transpose(b, p), constants) -> transpose(op(a, b, constants permuted back), p); a concat
    of transposes likewise, along the axis the permutation maps its own to."""
    if node.op == "concat":
        return _sink_concat(rw, node)
    if isinstance(node.attrs, ReduceAttrs):
        return _sink_reduce(rw, node)
    if get_op(node.op).kind is not PatternKind.ELEMENTWISE or node.op in AXIS_BOUND or len(node.outputs) != 1:
        return False
    inputs = rw.inputs(node)
    perm = _one_permutation(rw, inputs)
    rank = len(node.outputs[0].shape)
    if perm is None or len(perm) != rank:
        return False
    back = tuple(int(i) for i in np.argsort(perm))
    sources = []
    for v in inputs:
        if _transposed(rw, v):
            sources.append(rw.inputs(rw.producer(v))[0])  # type: ignore[arg-type]
            continue
        data = rw.constant(v)
        if data is None:
            return False  # an operand that is neither transposed nor a constant
        if data.ndim == 0:
            sources.append(v)
            continue
        full = data.reshape((1,) * (rank - data.ndim) + data.shape)
        sources.append(rw.new_constant(np.ascontiguousarray(np.transpose(full, back)), v.name))
    _transposed_result(rw, node, sources, node.attrs, perm)
    return True


def _sink_concat(rw: Rewriter, node: Node) -> bool:
    inputs = rw.inputs(node)
    perm = _one_permutation(rw, inputs)
    if perm is None or not all(_transposed(rw, v) for v in inputs):
        return False
    sources = [rw.inputs(rw.producer(v))[0] for v in inputs]  # type: ignore[arg-type]
    _transposed_result(rw, node, sources, AxisAttrs(perm[node.attrs.axis % len(perm)]), perm)
    return True


def _sink_reduce(rw: Rewriter, node: Node) -> bool:
    """reduce(transpose(x, p), dims) -> transpose(reduce(x, p[dims]), q), q the permutation of the axes kept (none
    where it is the identity)."""
    (y,) = rw.inputs(node)
    if not _transposed(rw, y):
        return False
    (x,) = rw.inputs(rw.producer(y))  # type: ignore[arg-type]
    perm = rw.producer(y).attrs.axis  # type: ignore[union-attr]
    dims = reduced_axes(node.op, node.attrs.dim, y.shape)
    keep = node.attrs.keep_dim
    (r,) = rw.emit(node.op, [x], ReduceAttrs(tuple(sorted(perm[d] for d in dims)), keep))
    kept = [perm[i] for i in range(len(perm)) if keep or i not in dims]  # x's axes, in the order of the result's
    order = tuple(sorted(kept).index(a) for a in kept)
    if order != tuple(range(len(order))):
        (r,) = rw.emit("transpose", [r], TransposeAttrs(order))
    rw.substitute(node.outputs[0], r)
    return True


def _one_permutation(rw: Rewriter, inputs) -> tuple[int, ...] | None:
    """The permutation the transposed inputs share, or None when there are none or they differ."""
    perms = {rw.producer(v).attrs.axis for v in inputs if _transposed(rw, v)}  # type: ignore[union-attr]
    return next(iter(perms)) if len(perms) == 1 else None


def _transposed_result(rw: Rewriter, node: Node, sources: list, attrs, perm: tuple[int, ...]) -> None:
    """Replace node's output by transpose(node's op on `sources`, perm)."""
    (y,) = rw.emit(node.op, sources, attrs)
    (t,) = rw.emit("transpose", [y], TransposeAttrs(perm))
    rw.substitute(node.outputs[0], t)


def _transposed(rw: Rewriter, v) -> bool:
    producer = rw.producer(v)
    return producer is not None and producer.op == "transpose"
