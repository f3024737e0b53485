"""Pick the default schedule for a group by target and pattern kind."""
from __future__ import annotations

from tvm.s_tir import Schedule

from cinn.ops import PatternKind
from cinn.target import Target
from schedules import cpu, cuda


def apply_default(sch: Schedule, kind: PatternKind, target: Target) -> None:
    """Apply the hand-written default schedule for a group of this kind."""
    (cuda if target.is_cuda else cpu).schedule(sch, kind, target)
