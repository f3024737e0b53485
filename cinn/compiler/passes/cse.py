"""Common subexpression elimination: merge identical constants and identical op applications."""
from __future__ import annotations

import hashlib

from cinn.compiler.passes.rewrite import Rewriter, rewrite
from cinn.core.ir import Node, Program, Value


def cse(program: Program) -> Program:
    """Constants with equal dtype, shape and bytes become one; so do nodes with equal op, inputs and attrs."""
    seen: dict[tuple, tuple[Value, ...]] = {}

    def rule(rw: Rewriter, node: Node) -> bool:
        key = (node.op, tuple(v.name for v in rw.inputs(node)), node.attrs)
        first = seen.get(key)
        if first is None:
            seen[key] = node.outputs
            return False
        for old, new in zip(node.outputs, first, strict=True):
            rw.substitute(old, new)
        return True

    return rewrite(_merge_constants(program), rule)


def _merge_constants(program: Program) -> Program:
    """Redirect every duplicate constant to the first one with the same content."""
    rw = Rewriter(program)
    first: dict[tuple, Value] = {}
    for v in program.const_values:
        data = program.constants[v.name]
        # a digest keeps the table small for large weights; sha256 collisions are not a practical concern
        key = (v.type, hashlib.sha256(data.tobytes()).digest())
        if key in first:
            rw.substitute(v, first[key])
        else:
            first[key] = v
    for node in program.nodes:
        rw.keep(node)
    return rw.finish()
