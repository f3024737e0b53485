"""Program verification before compiling: known ops, defined inputs, consistent types."""
from __future__ import annotations

from cinn.core.ir import Node, Program
from cinn.core.ops import OPS, infer
from cinn.core.ops.common import normalize_axis


def verify(program: Program) -> None:
    """Raise a clear error for unknown ops (all of them at once), undefined values or wrong types."""
    unknown = [f"{n.op!r} (node {n.name!r})" for n in program.nodes if n.op not in OPS]
    if unknown:
        raise NotImplementedError(f"{program.name}: unknown op{'s' if len(unknown) > 1 else ''} " + ", ".join(unknown))
    defined = {v.name for v in program.inputs} | set(program.constants)
    for n in program.nodes:
        missing = [v.name for v in n.inputs if v.name not in defined]
        if missing:
            raise ValueError(f"{program.name}: node {n.name!r} ({n.op}) reads undefined values {missing}")
        types = infer(OPS[n.op], [v.type for v in n.inputs], n.attrs)
        if list(types) != [v.type for v in n.outputs]:
            declared = [v.type for v in n.outputs]
            raise ValueError(f"{program.name}: node {n.name!r} ({n.op}) declares outputs {declared}, inferred {list(types)}")
        _check_constant_indices(program, n)
        defined.update(v.name for v in n.outputs)
    undefined = [v.name for v in program.outputs if v.name not in defined]
    if undefined:
        raise ValueError(f"{program.name}: outputs {undefined} are not produced by the program")


def _check_constant_indices(program: Program, n: Node) -> None:
    """A constant index outside its axis is a bug in the model: refused here, where the node can be named (at run
    time the kernel can only clamp it)."""
    k = OPS[n.op].index_input
    if k is None:
        return
    data = program.constants.get(n.inputs[k].name)
    if data is None or not data.size:
        return
    x = n.inputs[0]
    ax = normalize_axis(n.op, n.attrs.axis, len(x.shape))
    bad = data[(data >= x.shape[ax]) | (data < -x.shape[ax])]
    if bad.size:
        raise ValueError(f"{program.name}: node {n.name!r} ({n.op}) index {int(bad.flat[0])} is out of range for axis "
                         f"{ax} of size {x.shape[ax]} (shapes {x.shape} and {n.inputs[k].shape})")
