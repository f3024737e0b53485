"""Schedule knobs: the decisions a schedule makes, taken from the hand-written defaults or sampled by the auto-tuner.

Each default schedule asks its Knobs for every tunable decision, so the tuner's search space is the default
schedule with its decisions opened up (the default is one point of the space), and a sampled decision becomes a
TVM sampling instruction in the schedule's trace.
"""
from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Protocol

from tvm.s_tir import Schedule

AUTO_UNROLL, EXPLICIT_UNROLL = "pragma_auto_unroll_max_step", "pragma_unroll_explicit"  # TVM's unroll annotations
UNROLL_STEPS = (0, 16, 64, 512)  # candidate AUTO_UNROLL values, as MetaSchedule's CPU rule
# over an explicitly unrolled register tile, a larger budget unrolls the reduction and the per-tile copies around it,
# which costs far more build time than it gains (see docs/notes/build-time-limits.md)
TILED_UNROLL_STEPS = (0, 16)
MAX_UNROLLED = 64  # the longest loop cinn unrolls: a register tile's (schedules.replay refuses a trace's longer ones)


class Knob(enum.StrEnum):
    """The tunable decisions of cinn's schedules; the tuner keys a candidate's decisions by knob and occurrence."""

    SKETCH = "sketch"  # CPU matmul/conv: cinn's register-tiled schedule or generic SSRSRS tiling
    UNROLL = "unroll"  # auto-unroll budget of the outermost loop
    PARALLEL = "parallel"  # parallelize the outer loop
    VECTOR = "vector"  # vector lanes of the innermost loop
    COLS = "cols"  # register tile: column vectors
    ROWS = "rows"  # register tile: rows
    ROWS2 = "rows2"  # register tile: a second row axis (a conv's output rows)
    PACK = "pack"  # pack the column operand's panel
    VECTOR_AXIS = "vector_axis"  # which axis a conv vectorizes: output columns or channels
    PRODUCER_AT_TILE = "producer_at_tile"  # compute a lone producer (padding) per parallel tile
    PARALLEL_ROWS = "parallel_rows"  # let row tiles join the parallel loop
    ROW_BLOCK = "row_block"  # parallel row tiles per block that the vector tiles run inside
    COL_SPLIT = "col_split"  # outer/middle split of the column tiles
    ROW_SPLIT = "row_split"  # outer/middle split of the row tiles
    REDUCE_SPLIT = "reduce_split"  # outer/inner split of the reduction
    OUTSIDE_TILES = "outside_tiles"  # run a matmul's batches and reduction chunks serially outside its parallel tiles
    SPATIAL_TILE = "spatial_tile"  # SSRSRS: the four levels of a spatial loop (one per loop, in order)
    REDUCE_TILE = "reduce_tile"  # SSRSRS: the two levels of a reduction loop (one per loop, in order)
    WRITE_BACK_AT = "write_back_at"  # SSRSRS: where the write-back block goes
    THREADS = "threads"  # CUDA: threads per block
    ROW_REGS = "row_regs"  # CUDA matmul: registers along the rows
    ROW_THREADS = "row_threads"  # CUDA matmul: threads along the rows
    COL_REGS = "col_regs"  # CUDA matmul: registers along the columns
    COL_THREADS = "col_threads"  # CUDA matmul: threads along the columns
    K_STEP = "k_step"  # CUDA matmul: reduction step staged in shared memory


class Knobs(Protocol):
    """Where a schedule gets its decisions."""

    def choose(self, sch: Schedule, knob: Knob, candidates: Sequence[int], default: int) -> int:
        """One of `candidates` (ints, `default` among them)."""

    def tile(self, sch: Schedule, knob: Knob, loop, n: int, default: Sequence[int], max_innermost: int) -> list:
        """Split factors (ints or sampled ExprRVs) of `loop` into `n` perfect levels; `default` multiplies to its
        extent and its innermost factor is at most `max_innermost`."""


class DefaultKnobs:
    """The hand-written defaults: no sampling instructions."""

    def choose(self, sch: Schedule, knob: Knob, candidates: Sequence[int], default: int) -> int:
        return default

    def tile(self, sch: Schedule, knob: Knob, loop, n: int, default: Sequence[int], max_innermost: int) -> list:
        return list(default)


DEFAULT = DefaultKnobs()


def divisors(n: int, limit: int | None = None) -> list[int]:
    """Divisors of n (up to `limit`), ascending."""
    top = n if limit is None else min(n, limit)
    return [d for d in range(1, top + 1) if n % d == 0]


def unroll(sch: Schedule, knobs: Knobs, loop, steps: Sequence[int] = UNROLL_STEPS) -> None:
    """Let LLVM's pre-unroll of small loops be tuned: an auto-unroll budget on the outermost loop."""
    step = knobs.choose(sch, Knob.UNROLL, steps, 0)
    if step:
        sch.annotate(loop, AUTO_UNROLL, step)
        sch.annotate(loop, EXPLICIT_UNROLL, 1)
