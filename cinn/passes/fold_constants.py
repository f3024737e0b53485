"""Constant folding: nodes whose inputs are all constants are evaluated at compile time."""
from __future__ import annotations

import numpy as np

from cinn.ir import Node, Program
from cinn.ops import get_op
from cinn.passes.rewrite import Rewriter, rewrite

# Folded results are stored in the program and copied into the executable's buffers, so a huge
# one costs memory and load time for little gain: nodes producing more than this stay in the graph.
MAX_FOLDED_BYTES = 64 * 1024 * 1024


def fold_constants(program: Program) -> Program:
    """Replace every node with only constant inputs by constants holding its numpy reference result.

    Skipped: results over MAX_FOLDED_BYTES, and results with more elements than their inputs together
    (a broadcast, an arange): the kernel consuming them recomputes those for free, whereas a folded
    constant costs memory and bandwidth (XLA's constant folding makes the same choice).
    """
    return rewrite(program, _fold)


def _fold(rw: Rewriter, node: Node) -> bool:
    inputs = rw.inputs(node)
    arrays = [rw.constant(v) for v in inputs]
    if any(a is None for a in arrays) or sum(v.type.nbytes for v in node.outputs) > MAX_FOLDED_BYTES:
        return False
    if sum(v.type.size for v in node.outputs) > sum(v.type.size for v in inputs):
        return False
    results = get_op(node.op, node.name).reference(arrays, node.attrs)
    for v, data in zip(node.outputs, results, strict=True):
        rw.make_constant(v, np.asarray(data))
    return True
