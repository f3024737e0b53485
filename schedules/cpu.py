"""Default CPU schedules: a specialised schedule per group kind where the func fits it, else the generic one."""
from __future__ import annotations

from tvm.s_tir import Schedule

from cinn.core.ops import PatternKind
from cinn.core.target import Target
from schedules import cpu_attention, cpu_int8, cpu_matmul, cpu_reduction, cpu_tiling, cpu_winograd
from schedules.cpu_common import generic
from schedules.knobs import DEFAULT, Knob, Knobs


def schedule(sch: Schedule, kind: PatternKind, target: Target, knobs: Knobs = DEFAULT) -> None:
    """Apply the specialised schedule of the group's kind when it matches, else the generic one."""
    if kind in (PatternKind.NON_FUSIBLE, PatternKind.OUT_FUSIBLE) and cpu_winograd.applicable(sch):
        cpu_winograd.schedule(sch, target)
    elif kind == PatternKind.NON_FUSIBLE and cpu_attention.applicable(sch):
        cpu_attention.schedule(sch, target, knobs)
    elif kind == PatternKind.OUT_FUSIBLE and cpu_int8.applicable(sch, target):
        cpu_int8.schedule(sch, target, knobs)
    elif kind == PatternKind.OUT_FUSIBLE and cpu_matmul.is_gemv(sch) and cpu_reduction.applicable(sch, False):
        cpu_reduction.schedule(sch, target, knobs)  # one dot product per output column, over contiguous operands
    elif kind == PatternKind.OUT_FUSIBLE and cpu_matmul.applicable(sch):
        # the tuner may also try generic multi-level tiling; the default is cinn's register-tiled schedule. Not over
        # a padded view: its cache_write write-back would store the rows past the view's end (heap corruption)
        tiled = not cpu_matmul.writes_past_its_view(sch) and knobs.choose(sch, Knob.SKETCH, [0, 1], 0)
        (cpu_tiling if tiled else cpu_matmul).schedule(sch, target, knobs)
    elif kind == PatternKind.REDUCTION and cpu_reduction.applicable(sch):
        cpu_reduction.schedule(sch, target, knobs)
    else:
        generic(sch, target, knobs)
