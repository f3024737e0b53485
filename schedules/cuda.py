"""Default CUDA schedules: a specialised schedule per group kind where the func fits it, else the generic one."""
from __future__ import annotations

from tvm.s_tir import Schedule

from cinn.core.ops import PatternKind
from cinn.core.target import Target
from schedules import cpu_matmul, cpu_reduction, cuda_matmul, cuda_reduction
from schedules.cuda_common import generic
from schedules.knobs import DEFAULT, Knobs


def schedule(sch: Schedule, kind: PatternKind, target: Target, knobs: Knobs = DEFAULT) -> None:
    """Apply the specialised schedule of the group's kind when it matches, else the generic one."""
    if kind == PatternKind.OUT_FUSIBLE and cpu_matmul.applicable(sch):
        cuda_matmul.schedule(sch, target, knobs)
    elif kind == PatternKind.REDUCTION and cpu_reduction.applicable(sch) and cuda_reduction.fits(sch):
        cuda_reduction.schedule(sch, target, knobs)
    else:
        generic(sch, target, knobs)
