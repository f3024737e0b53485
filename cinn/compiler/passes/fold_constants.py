"""Constant folding: nodes whose inputs are all constants are evaluated at compile time."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cinn.compiler.passes.rewrite import Rewriter, rewrite
from cinn.core.ir import Attrs, Node, Program, TensorType
from cinn.core.ops import OpDef, get_op

# Folded results are stored in the program and copied into the executable's buffers, so a huge
# one costs memory and load time for little gain: nodes producing more than this stay in the graph.
MAX_FOLDED_BYTES = 64 * 1024 * 1024


def fold(op: OpDef, arrays: Sequence[np.ndarray | None], attrs: Attrs, out_types: Sequence[TensorType], *,
         grow: bool) -> list[np.ndarray] | None:
    """The op's results on constant inputs (with its numpy reference), or None where it stays in the graph.

    It stays when an input is not constant (None), when its results exceed MAX_FOLDED_BYTES, or, unless `grow`,
    when they have more elements than its inputs together (a broadcast, an arange): the kernel consuming them
    recomputes those for free, whereas a folded constant costs memory and bandwidth (XLA makes the same choice).
    Importers pass grow=True: their converters need the values of shape subgraphs to choose attributes.
    """
    if any(a is None for a in arrays) or sum(t.nbytes for t in out_types) > MAX_FOLDED_BYTES:
        return None
    if not grow and sum(t.size for t in out_types) > sum(a.size for a in arrays if a is not None):
        return None
    results = op.reference([a for a in arrays if a is not None], attrs)
    return [np.asarray(r).astype(t.dtype).reshape(t.shape) for r, t in zip(results, out_types, strict=True)]


def fold_constants(program: Program) -> Program:
    """Replace every node with only constant inputs by constants holding its numpy reference result."""
    return rewrite(program, _fold)


def _fold(rw: Rewriter, node: Node) -> bool:
    arrays = [rw.constant(v) for v in rw.inputs(node)]
    results = fold(get_op(node.op, node.name), arrays, node.attrs, [v.type for v in node.outputs], grow=False)
    if results is None:
        return False
    for v, data in zip(node.outputs, results, strict=True):
        rw.make_constant(v, data)
    return True
