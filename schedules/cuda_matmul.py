"""Tiled CUDA schedule for OUT_FUSIBLE groups (matmul, conv): one reduction block plus elementwise epilogues.

The output's last axis (columns) and a second spatial axis that the column operand does not index (matmul rows,
conv output channels) are tiled three ways: thread blocks, threads, and a register tile per thread. Each step of the
outer reduce loop stages the operands' tiles in shared memory, fetched cooperatively by all threads of the block;
each thread accumulates its register tile (cache_write 'local', unrolled) and writes it back once, with the epilogue
(bias, activation) inlined into the write-back.
"""
from __future__ import annotations

from dataclasses import dataclass

from tvm.s_tir import Schedule, ScheduleError

from cinn.core.ops import PatternKind, TargetKind
from cinn.core.target import Target
from schedules.analysis import (
    blocks,
    inline_all,
    is_matmul,
    is_reduction,
    reverse_inline_all,
    single_reduction,
    spatial_count,
    vars_in,
)
from schedules.cuda_common import injective, is_bound, thread_inner
from schedules.knobs import DEFAULT, Knob, Knobs, unroll
from schedules.registry import schedule_rule

COL_THREADS, ROW_THREADS = 16, 16  # a 16x16 thread block
REGS = 4  # register tile per thread along each tiled axis: 4x4 accumulators
K_STEP = 8  # reduce elements staged per shared-memory step
# what the tuner may pick instead: threads and registers per axis, reduce elements per shared-memory step
TUNE_THREADS, TUNE_REGS, TUNE_K_STEPS = (4, 8, 16, 32), (1, 2, 4, 8), (4, 8, 16, 32)


@dataclass(frozen=True)
class Tiling:
    """Iterator indices of the column and row axes (row None when there is none) and their split factors."""

    col: int
    col_split: tuple[int, int]  # (threads, registers)
    row: int | None
    row_split: tuple[int, int]


def _largest_divisor(extent: int, cap: int) -> int:
    """The largest divisor of extent not above cap (tiles that divide the axis need no predicates)."""
    return max(d for d in range(1, min(extent, cap) + 1) if extent % d == 0)


def _split(sch: Schedule, knobs: Knobs, knob: tuple[Knob, Knob], extent: int, threads: int) -> tuple[int, int]:
    """(threads, registers) along an axis: a register tile of up to REGS, then up to `threads` threads."""
    default = _largest_divisor(extent, REGS) if extent >= REGS * threads else 1
    regs = knobs.choose(sch, knob[0], _fitting(extent, TUNE_REGS, default), default)
    default = _largest_divisor(extent // regs, threads)
    return knobs.choose(sch, knob[1], _fitting(extent // regs, TUNE_THREADS, default), default), regs


def _fitting(extent: int, options: tuple[int, ...], default: int) -> list[int]:
    """The options that divide the extent, and the default."""
    return sorted({o for o in options if extent % o == 0} | {default})


def plan(sch: Schedule, main, knobs: Knobs = DEFAULT) -> Tiling:
    """Columns: the last spatial axis; rows: the last other non-unit spatial axis the column operand does not read
    (so a thread's column loads serve all its rows)."""
    block = sch.get(main)
    n = spatial_count(sch, main)
    ext = [int(iv.dom.extent) for iv in block.iter_vars]
    col = n - 1
    col_var = block.iter_vars[col].var
    col_reads = [r for r in block.reads if any(col_var in vars_in(rg.min) for rg in r.region)]
    used = set().union(*(vars_in(rg.min) for r in col_reads for rg in r.region))
    free = [i for i in range(col) if block.iter_vars[i].var not in used and ext[i] > 1]
    row = free[-1] if free else None
    row_split = _split(sch, knobs, (Knob.ROW_REGS, Knob.ROW_THREADS), ext[row], ROW_THREADS) if row is not None else (1, 1)
    return Tiling(col, _split(sch, knobs, (Knob.COL_REGS, Knob.COL_THREADS), ext[col], COL_THREADS), row, row_split)


def schedule(sch: Schedule, target: Target, knobs: Knobs = DEFAULT) -> None:
    """Tile over blocks, threads and registers; stage operands in shared memory; fuse the epilogue."""
    main = single_reduction(sch)
    producers = [sch.get(b).name_hint for b in sch.get_producers(main)]
    # the reduction's producers (padding) are inlined into the shared-memory fetch instead, below
    inline_all(sch, keep=lambda b: sch.get(b).name_hint in producers)
    tiling = plan(sch, main, knobs)
    write_back = sch.cache_write(main, 0, "local")
    reverse_inline_all(sch, write_back)
    thread_loop, k_outer, regs = _tile(sch, main, tiling, knobs)
    sch.reverse_compute_at(write_back, thread_loop)
    threads = tiling.col_split[0] * tiling.row_split[0]
    _stage_shared(sch, main, k_outer, threads)
    for name in producers:
        _inline_or_bind(sch, sch.get_sblock(name))
    for loop in regs:
        sch.unroll(loop)
    unroll(sch, knobs, thread_loop)
    sch.decompose_reduction(main, k_outer)
    _unroll_inner(sch, write_back)
    wb = sch.get(write_back).name_hint
    for block in blocks(sch):  # epilogues TVM would not inline into the write-back: their own kernels
        if not is_reduction(sch, block) and sch.get(block).name_hint != wb and not is_bound(sch, block):
            injective(sch, block)


def _tile(sch: Schedule, main, t: Tiling, knobs: Knobs):
    """Split and order the loops: [other spatial, row/col block tiles] -> blockIdx.x, [row, col threads] ->
    threadIdx.x, outer reduce, inner reduce, row and column registers."""
    loops = sch.get_loops(main)
    n = spatial_count(sch, main)
    c_block, c_thread, c_reg = sch.split(loops[t.col], [None, *t.col_split])
    outer, thread, regs = [c_block], [c_thread], [c_reg]
    if t.row is not None:
        r_block, r_thread, r_reg = sch.split(loops[t.row], [None, *t.row_split])
        outer, thread, regs = [r_block, c_block], [r_thread, c_thread], [r_reg, c_reg]
    others = [loops[i] for i in range(n) if i not in (t.col, t.row)]
    reduce_loops = loops[n:]
    k_extent = int(sch.get(reduce_loops[0]).extent)
    default = _largest_divisor(k_extent, K_STEP)
    k_step = knobs.choose(sch, Knob.K_STEP, _fitting(k_extent, TUNE_K_STEPS, default), default)
    k_outer, k_inner = sch.split(reduce_loops[0], [None, k_step])
    sch.reorder(*others, *outer, *thread, k_outer, k_inner, *reduce_loops[1:], *regs)
    block_loop = sch.fuse(*others, *outer)
    thread_loop = sch.fuse(*thread) if len(thread) > 1 else thread[0]
    sch.bind(block_loop, "blockIdx.x")
    sch.bind(thread_loop, "threadIdx.x")
    return thread_loop, k_outer, regs


def _stage_shared(sch: Schedule, main, k_outer, threads: int) -> None:
    """Copy each operand's tile for one outer reduce step into shared memory, all threads of the block fetching."""
    written = sch.get(main).writes[0].source
    n_reads = len(sch.get(main).reads)
    for index in range(n_reads):
        if sch.get(main).reads[index].source.same_as(written):
            continue
        stage = sch.cache_read(main, index, "shared")
        sch.compute_at(stage, k_outer)
        # below [block, thread, k_outer]: the tile copy, whose region TVM relaxes over the block's threads
        thread_inner(sch, stage, sch.get_loops(stage)[3:], threads)


def _inline_or_bind(sch: Schedule, block) -> None:
    """Inline a producer (padding) into its shared-memory fetch, or give it its own kernel."""
    try:
        sch.compute_inline(block)
    except ScheduleError:  # a producer TVM cannot substitute into the fetch stays a stage
        injective(sch, block)


def _unroll_inner(sch: Schedule, write_back) -> None:
    """Unroll the write-back's register-tile loops (below the thread loop) so accumulators stay in registers."""
    for loop in sch.get_loops(write_back)[2:]:
        sch.unroll(loop)


@schedule_rule(TargetKind.CUDA, 30)
class CudaMatmul:
    """A matmul or conv with its epilogue."""

    def applicable(self, sch: Schedule, kind: PatternKind, target: Target, knobs: Knobs) -> bool:
        return kind == PatternKind.OUT_FUSIBLE and is_matmul(sch)

    def apply(self, sch: Schedule, target: Target, knobs: Knobs) -> None:
        schedule(sch, target, knobs)
