"""Pick the schedule for a group by target and pattern kind."""
from __future__ import annotations

from tvm.s_tir import Schedule

from cinn.core.ops import PatternKind
from cinn.core.target import Target
from schedules import cpu, cuda
from schedules.knobs import DEFAULT, Knobs


def apply_default(sch: Schedule, kind: PatternKind, target: Target, knobs: Knobs = DEFAULT) -> None:
    """Apply the schedule for a group of this kind; the knobs decide its tunable choices (default: hand-written)."""
    (cuda if target.is_cuda else cpu).schedule(sch, kind, target, knobs)
