"""The default pass pipeline run by cinn.compile before fusion."""
from __future__ import annotations

from cinn.ir import Program
from cinn.passes.decompose import decompose


def optimize(program: Program) -> Program:
    """Decompose composite ops, then simplify and clean the graph."""
    return decompose(program)
