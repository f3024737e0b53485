"""Schedule knobs: the decisions a schedule makes, taken from the hand-written defaults or sampled by the auto-tuner.

Each default schedule asks its Knobs for every tunable decision, so the tuner's search space is the default
schedule with its decisions opened up (the default is one point of the space), and a sampled decision becomes a
TVM sampling instruction in the schedule's trace.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from tvm.s_tir import Schedule

UNROLL_STEPS = (0, 16, 64, 512)  # candidate pragma_auto_unroll_max_step values, as MetaSchedule's CPU rule
# over an explicitly unrolled register tile, a larger budget unrolls the reduction and the per-tile copies around it:
# on a 64->64 3x3 conv, 512 steps outlasted the 30 s build timeout and 64 took 6-20 s to build, for at most 2%
TILED_UNROLL_STEPS = (0, 16)


class Knobs(Protocol):
    """Where a schedule gets its decisions."""

    def choose(self, sch: Schedule, name: str, candidates: Sequence[int], default: int) -> int:
        """One of `candidates` (ints, `default` among them)."""

    def tile(self, sch: Schedule, name: str, loop, n: int, default: Sequence[int], max_innermost: int) -> list:
        """Split factors (ints or sampled ExprRVs) of `loop` into `n` perfect levels; `default` multiplies to its
        extent and its innermost factor is at most `max_innermost`."""


class DefaultKnobs:
    """The hand-written defaults: no sampling instructions."""

    def choose(self, sch: Schedule, name: str, candidates: Sequence[int], default: int) -> int:
        return default

    def tile(self, sch: Schedule, name: str, loop, n: int, default: Sequence[int], max_innermost: int) -> list:
        return list(default)


DEFAULT = DefaultKnobs()


def divisors(n: int, limit: int | None = None) -> list[int]:
    """Divisors of n (up to `limit`), ascending."""
    top = n if limit is None else min(n, limit)
    return [d for d in range(1, top + 1) if n % d == 0]


def unroll(sch: Schedule, knobs: Knobs, loop, steps: Sequence[int] = UNROLL_STEPS) -> None:
    """Let LLVM's pre-unroll of small loops be tuned: an auto-unroll budget on the outermost loop."""
    step = knobs.choose(sch, "unroll", steps, 0)
    if step:
        sch.annotate(loop, "pragma_auto_unroll_max_step", step)
        sch.annotate(loop, "pragma_unroll_explicit", 1)
