"""Zero-size tensors: a value with a zero dim holds no data, so no kernel computes it or reads it.

Every node whose outputs are all empty becomes empty constants (a slice past the end, a Shape sliced to nothing); a
node whose output is not empty though it reads an empty value is folded, all its inputs being known (a reduction over
an empty axis gives the reduction's identity, a matmul over an empty inner axis zeros), except that concat drops its
empty parts and split its empty sections. The pass runs before any other, so the rewrites, fusion and the schedules
never see a zero-size value (a loop of extent 0 breaks the schedules' splits and fusions).
"""
from __future__ import annotations

import numpy as np

from cinn.compiler.passes.dce import dce
from cinn.compiler.passes.fold_constants import MAX_FOLDED_BYTES, fold
from cinn.compiler.passes.rewrite import Rewriter, rewrite
from cinn.core.ir import Node, Program, Value
from cinn.core.ops import get_op
from cinn.core.ops.common import normalize_axis
from cinn.core.ops.shape import SplitAttrs


def zero_size(program: Program) -> Program:
    """The program without zero-size values computed at run time (program inputs stay: they are its interface)."""
    if not any(_empty(v) for n in program.nodes for v in (*n.inputs, *n.outputs)):
        return program
    return dce(rewrite(program, _rule))


def _empty(v: Value) -> bool:
    return v.type.size == 0


def _rule(rw: Rewriter, node: Node) -> bool:
    inputs = rw.inputs(node)
    if not any(map(_empty, (*inputs, *node.outputs))):
        return False
    if all(map(_empty, node.outputs)):
        for v in node.outputs:
            rw.make_constant(v, np.zeros(v.shape, v.dtype))
        return True
    if node.op == "concat":
        _drop_empty_parts(rw, node, inputs)
    elif node.op == "split":
        _drop_empty_sections(rw, node, inputs[0])
    else:
        _fold(rw, node, inputs)
    return True


def _drop_empty_parts(rw: Rewriter, node: Node, inputs: tuple[Value, ...]) -> None:
    """A concat of its non-empty parts (the one part itself where only one is left)."""
    parts = tuple(v for v in inputs if not _empty(v))
    if len(parts) == 1:
        rw.substitute(node.outputs[0], parts[0])
    else:
        rw.keep(node, inputs=parts)


def _drop_empty_sections(rw: Rewriter, node: Node, x: Value) -> None:
    """A split into its non-empty sections (x itself where one section takes all of it); the empty ones are
    constants."""
    axis = normalize_axis("split", node.attrs.axis, len(x.shape))
    kept = tuple(v for v in node.outputs if not _empty(v))
    for v in node.outputs:
        if _empty(v):
            rw.make_constant(v, np.zeros(v.shape, v.dtype))
    if len(kept) == 1:
        rw.substitute(kept[0], x)
    else:
        rw.keep(node, outputs=kept, attrs=SplitAttrs(tuple(v.shape[axis] for v in kept), node.attrs.axis))


def _fold(rw: Rewriter, node: Node, inputs: tuple[Value, ...]) -> None:
    """The node's results as constants: every input must be known (a constant, or empty)."""
    where = f"{rw.program.name}: node {node.name!r} ({node.op})"
    arrays = [np.zeros(v.shape, v.dtype) if _empty(v) else rw.constant(v) for v in inputs]
    unknown = [v.name for v, a in zip(inputs, arrays, strict=True) if a is None]
    if unknown:
        raise NotImplementedError(f"{where} reads zero-size values and values computed at run time ({unknown}), "
                                  f"but its outputs {[v.shape for v in node.outputs]} are not empty: not supported")
    try:
        results = fold(get_op(node.op, node.name), arrays, node.attrs, [v.type for v in node.outputs], grow=True)
    except ValueError as e:  # numpy's argmax of an empty axis
        raise ValueError(f"{where} of zero-size inputs: {e}") from None
    if results is None:
        raise NotImplementedError(f"{where} of zero-size inputs gives outputs {[v.shape for v in node.outputs]}, "
                                  f"more than the {MAX_FOLDED_BYTES} bytes a folded constant may hold")
    for v, data in zip(node.outputs, results, strict=True):
        rw.make_constant(v, data)
