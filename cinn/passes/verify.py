"""Program verification before compiling: known ops, defined inputs, consistent types."""
from __future__ import annotations

from cinn.ir import Program
from cinn.ops import OPS, infer


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
        defined.update(v.name for v in n.outputs)
    undefined = [v.name for v in program.outputs if v.name not in defined]
    if undefined:
        raise ValueError(f"{program.name}: outputs {undefined} are not produced by the program")
