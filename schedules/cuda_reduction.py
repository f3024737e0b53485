"""Row schedule for REDUCTION groups on CUDA (softmax, layer_norm): one thread block per row.

The rows are those of analysis.row_depth (the anchor's leading loops, kept by every reduction). Each row is a
thread block: every reduction of the row is a cross-thread reduction over the block's threads (TVM lowers it to
warp shuffles), the intermediates shared by several consumers live in shared memory, and the elementwise tail
writes the row, all in one kernel that reads the row once.
"""
from __future__ import annotations

from math import prod

from tvm.s_tir import Schedule

from cinn.core.ops import PatternKind, TargetKind
from cinn.core.target import Target
from schedules.analysis import (
    blocks,
    compute_at_row,
    extents,
    inline_all,
    is_output,
    is_reduction,
    is_row_reduction,
    output_anchor,
    row_depth,
    row_stage,
    write_dtype,
)
from schedules.cuda_common import FEW_OUTPUTS, STAGE_BLOCKS, TWO_STAGE_MIN, cross_thread_ok, thread_inner, tuned_threads
from schedules.knobs import DEFAULT, Knobs
from schedules.registry import schedule_rule

SHARED_BYTES = 48 * 1024  # static shared memory a block may use without opting in


def _row_elems(sch: Schedule, anchor) -> int:
    """Elements of one row: the anchor's extent below its row loops (its reduce extent when it reduces)."""
    loops = sch.get_loops(anchor)
    return prod(extents(sch, loops[row_depth(sch, anchor) :]))


def fits(sch: Schedule) -> bool:
    """Whether every reduction can go across threads, there are enough rows to fill the GPU (else the generic
    schedule's two-stage reductions), and a row's intermediates fit in shared memory (assuming every block keeps a
    row-sized buffer)."""
    if not all(cross_thread_ok(sch, b) for b in blocks(sch) if is_reduction(sch, b)):
        return False
    anchor = output_anchor(sch)
    row = _row_elems(sch, anchor)
    rows = prod(extents(sch, sch.get_loops(anchor)[: row_depth(sch, anchor)]))
    if row >= TWO_STAGE_MIN and rows * STAGE_BLOCKS <= FEW_OUTPUTS:  # few long rows: two-stage reductions instead
        return False
    per_row = sum(row * _bytes(write_dtype(sch, b)) for b in blocks(sch) if not is_output(sch, b))
    return per_row <= SHARED_BYTES


def _bytes(dtype: str) -> int:
    """Bytes per element of a dtype (bool counts as one)."""
    return max(1, int("".join(ch for ch in dtype if ch.isdigit()) or 8) // 8)


def schedule(sch: Schedule, target: Target, knobs: Knobs = DEFAULT) -> None:
    """Bind the anchor's rows to blocks and compute every other block inside its row over the same threads."""
    anchor = output_anchor(sch)
    inline_all(sch, keep=lambda b: row_stage(sch, b))  # a kept stage lives in shared memory
    depth = row_depth(sch, anchor)
    threads = tuned_threads(sch, knobs, _row_elems(sch, anchor))
    assert depth is not None, "the rule applies to row reductions only"
    row, others = compute_at_row(sch, anchor, depth)
    sch.bind(row, "blockIdx.x")
    for block in [*others, anchor]:
        thread_inner(sch, block, sch.get_loops(block)[1:], threads)
    for block in others:
        sch.set_scope(block, 0, "shared")


@schedule_rule(TargetKind.CUDA, 20)
class CudaRowReduction:
    """Reductions over rows whose intermediates fit in shared memory."""

    def applicable(self, sch: Schedule, kind: PatternKind, target: Target, knobs: Knobs) -> bool:
        return kind == PatternKind.REDUCTION and is_row_reduction(sch) and fits(sch)

    def apply(self, sch: Schedule, target: Target, knobs: Knobs) -> None:
        schedule(sch, target, knobs)
