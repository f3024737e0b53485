"""Row schedule for REDUCTION groups (softmax, layer_norm): one parallel loop over rows, everything per row inside.

The group's single output block is the anchor; its leading loops are the rows that every reduction keeps. Each
reduction and each shared intermediate is computed at the row loop, so a row is read from memory once and the
intermediates live in per-row buffers; reductions are vectorized by rfactor over vector lanes.
"""
from __future__ import annotations

from math import prod

from tvm.s_tir import Schedule, ScheduleError

from cinn.core.ops import PatternKind, TargetKind
from cinn.core.target import Target
from schedules.analysis import (
    blocks,
    compute_at_row,
    extents,
    inline_all,
    is_gemv,
    is_reduction,
    is_row_reduction,
    output_anchor,
    row_depth,
    row_stage,
    size,
    spatial_count,
    write_dtype,
)
from schedules.cpu_common import PARALLEL_MIN, column_reduction, columns, lanes, vector_width
from schedules.knobs import DEFAULT, Knob, Knobs, unroll
from schedules.registry import schedule_rule


def schedule(sch: Schedule, target: Target, knobs: Knobs = DEFAULT) -> None:
    """Parallelize the rows of the anchor and compute every other block (vectorized) inside a row."""
    anchor = output_anchor(sch)
    inline_all(sch, keep=lambda b: row_stage(sch, b))
    if _columns(sch, target):
        return
    depth = row_depth(sch, anchor)
    # the work of a row: a GEMV's 1000 outputs are one element each but reduce 2048 products
    work = max(prod(extents(sch, sch.get_loops(b))) for b in blocks(sch))
    partials = [p for b in blocks(sch) if is_reduction(sch, b) for p in _lane_partial(sch, b, target, knobs)]
    assert depth is not None, "the rule applies to row reductions only"
    row, others = compute_at_row(sch, anchor, depth)
    for block in [*others, anchor]:
        if not any(sch.get(block).name_hint == sch.get(p).name_hint for p in partials):
            _vectorize_spatial(sch, block, target, knobs)
    rows = size(sch, sch.get(row).extent)
    big = rows > 1 and work >= PARALLEL_MIN
    if rows > 1 and knobs.choose(sch, Knob.PARALLEL, [0, 1], int(big)):
        sch.parallel(row)  # before decompose_reduction, which leaves blocks parallel() refuses
    unroll(sch, knobs, row)
    for partial in partials:
        _vectorize_partial(sch, partial)


def _columns(sch: Schedule, target: Target) -> bool:
    """Schedule a reduction over outer axes with vector lanes over its rows where the group allows it (see
    column_reduction); False where the group is left to the row schedule."""
    column = column_reduction(sch, target)
    if column is None:
        return False
    columns(sch, column[0], column[1], target)
    return True


def _vectorize_spatial(sch: Schedule, block, target: Target, knobs: Knobs) -> None:
    """Vectorize the loops of a spatial block inside the row (reduction blocks keep their scalar loops)."""
    inner = sch.get_loops(block)[1:]
    if not inner or is_reduction(sch, block):
        return
    fused = sch.fuse(*inner) if len(inner) > 1 else inner[0]
    width = vector_width(sch, knobs, lanes(write_dtype(sch, block), target), size(sch, sch.get(fused).extent))
    if width:
        _, vec = sch.split(fused, [None, width])
        sch.vectorize(vec)


def _lane_partial(sch: Schedule, block, target: Target, knobs: Knobs) -> list:
    """Split a fresh reduction's (fused) reduce loop into vector lanes and rfactor them: lane-wise partial results,
    then a short reduction over the lanes. Returns the partial block ([] when the reduction stays scalar)."""
    reduce_loops = sch.get_loops(block)[spatial_count(sch, block) :]
    width = vector_width(sch, knobs, lanes(write_dtype(sch, block), target), prod(extents(sch, reduce_loops)), 2)
    if not width:
        return []
    fused = sch.fuse(*reduce_loops) if len(reduce_loops) > 1 else reduce_loops[0]
    _, lane = sch.split(fused, [None, width])
    try:
        return [sch.rfactor(lane, factor_axis=0)]
    except ScheduleError:  # a reducer TVM cannot factor (e.g. a non-commutative combiner) stays scalar
        return []


def _vectorize_partial(sch: Schedule, partial) -> None:
    """Put the lane loop of a partial (rfactor) block innermost, hoist its init and vectorize both."""
    loops = sch.get_loops(partial)
    lane, reduce_loop = loops[1], loops[-1]  # iterators: lane first, reduced chunk last
    sch.reorder(reduce_loop, lane)
    sch.vectorize(lane)  # before decompose_reduction: the update block alone is no longer a reduction
    init = sch.decompose_reduction(partial, reduce_loop)
    sch.vectorize(sch.get_loops(init)[-1])


@schedule_rule(TargetKind.CPU, 40)
class Gemv:
    """A matrix-vector product: one dot product per output column, over contiguous operands."""

    def applicable(self, sch: Schedule, kind: PatternKind, target: Target, knobs: Knobs) -> bool:
        return kind == PatternKind.OUT_FUSIBLE and is_gemv(sch) and is_row_reduction(sch, per_row_work=False)

    def apply(self, sch: Schedule, target: Target, knobs: Knobs) -> None:
        schedule(sch, target, knobs)


@schedule_rule(TargetKind.CPU, 20)
class RowReduction:
    """Reductions over rows (softmax, layer_norm)."""

    def applicable(self, sch: Schedule, kind: PatternKind, target: Target, knobs: Knobs) -> bool:
        return kind == PatternKind.REDUCTION and is_row_reduction(sch)

    def apply(self, sch: Schedule, target: Target, knobs: Knobs) -> None:
        schedule(sch, target, knobs)
