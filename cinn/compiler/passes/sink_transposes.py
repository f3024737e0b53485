"""Move transposes below elementwise ops, toward their consumers, where opposite transposes meet and cancel.

The integer convolutions compute channels last and hand their result back to the NCHW graph through a transpose;
the next integer convolution transposes its quantized input channels last again. Sunk through the epilogue between
them (dequantize, bias, relu, residual add, quantize), the two meet and cancel: the quantized tensors then stay
channels last from one convolution to the next, with no copy kernel and no gathering write-back.
"""
from __future__ import annotations

import numpy as np

from cinn.compiler.passes.dce import dce
from cinn.compiler.passes.rewrite import Rewriter, rewrite, same_graph
from cinn.compiler.passes.simplify import merge_transposes
from cinn.core.ir import Node, Program
from cinn.core.ops import PatternKind, get_op
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
