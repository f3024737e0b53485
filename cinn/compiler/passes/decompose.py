"""Expand composite ops (softmax, layer_norm, batch_norm...) into primitive ops, as CINN's decomposer."""
from __future__ import annotations

from cinn.core.builder import NetBuilder
from cinn.core.ir import Node, Program, Value
from cinn.core.ops import get_op


def decompose(program: Program) -> Program:
    """Replace every composite node by the primitive nodes its op table entry emits."""
    if not any(get_op(n.op).is_composite for n in program.nodes):
        return program
    emitter = NetBuilder.continuing(program)
    rename: dict[str, Value] = {}
    for node in program.nodes:
        inputs = [rename.get(v.name, v) for v in node.inputs]
        expand = get_op(node.op, node.name).decompose
        if expand is None:
            emitter.append(Node(node.op, tuple(inputs), node.outputs, node.attrs, node.name))
            continue
        outs = expand(emitter, inputs, node.attrs)
        outs = (outs,) if isinstance(outs, Value) else tuple(outs)
        for old, new in zip(node.outputs, outs, strict=True):
            rename[old.name] = new
    result = emitter.build([rename.get(v.name, v) for v in program.outputs])
    return decompose(result)  # a decomposition may emit other composite ops
