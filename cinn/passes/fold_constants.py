"""Constant folding: nodes whose inputs are all constants are evaluated at compile time."""
from __future__ import annotations

import numpy as np

from cinn.ir import Node, Program
from cinn.ops import get_op
from cinn.passes.rewrite import Rewriter, rewrite

# Folded results are stored in the program and copied into the executable's buffers: above this
# size (e.g. a broadcast of a small constant to a huge shape) computing at run time is cheaper
# than keeping the data, so such nodes are left in the graph.
MAX_FOLDED_BYTES = 64 * 1024 * 1024


def fold_constants(program: Program) -> Program:
    """Replace every node with only constant inputs by constants holding its numpy reference result."""
    return rewrite(program, _fold)


def _fold(rw: Rewriter, node: Node) -> bool:
    arrays = [rw.constant(v) for v in rw.inputs(node)]
    if any(a is None for a in arrays) or sum(v.type.nbytes for v in node.outputs) > MAX_FOLDED_BYTES:
        return False
    results = get_op(node.op, node.name).reference(arrays, node.attrs)
    for v, data in zip(node.outputs, results, strict=True):
        rw.make_constant(v, np.asarray(data))
    return True
