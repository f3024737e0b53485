"""Pick the schedule for a group by target and pattern kind."""
from __future__ import annotations

from tvm.s_tir import Schedule

from cinn.ops import PatternKind
from cinn.schedules import cpu, cuda
from cinn.schedules.knobs import DEFAULT, Knobs
from cinn.target import Target


def apply_default(sch: Schedule, kind: PatternKind, target: Target, knobs: Knobs = DEFAULT) -> None:
    """Apply the schedule for a group of this kind; the knobs decide its tunable choices (default: hand-written)."""
    (cuda if target.is_cuda else cpu).schedule(sch, kind, target, knobs)
