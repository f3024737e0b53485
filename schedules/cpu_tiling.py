"""Generic multi-level tiling for OUT_FUSIBLE groups, the tuner's second sketch beside cpu_matmul (CPU, SSRSRS).

Every spatial axis is split in four levels and every reduce axis in two, ordered S0 S1 R0 S2 R1 S3 as Ansor and
MetaSchedule do on CPUs: S0 is parallel, the accumulator tile (cache_write) is written back with the epilogue at S1,
S3's last loop is vectorized. Producers (padding) are inlined. Unlike cpu_matmul it assumes nothing about which
operand to pack or which axis holds the register rows, so it reaches tilings cpu_matmul's structure cannot (conv tiles
over output rows and channels at once); its decisions are all the tuner's.
"""
from __future__ import annotations

from tvm.s_tir import Schedule

from cinn.core.target import Target
from schedules.analysis import (
    blocks,
    inline_all,
    is_reduction,
    reverse_inline_all,
    size,
    spatial_count,
    split,
    write_dtype,
)
from schedules.cpu_common import injective, lanes, vectorize_innermost
from schedules.knobs import Knob, Knobs, unroll

INNER_SPATIAL = 16  # largest innermost tile of a non-vector spatial axis (register rows)


def schedule(sch: Schedule, target: Target, knobs: Knobs) -> None:
    """Tile SSRSRS with sampled factors, accumulate in a cache_write tile, fuse the epilogue into its write-back."""
    main = next(b for b in blocks(sch) if is_reduction(sch, b))
    inline_all(sch)
    write_back = sch.cache_write(main, 0, "global")
    reverse_inline_all(sch, write_back)
    wb_name = sch.get(write_back).name_hint
    stages = [b for b in blocks(sch) if not is_reduction(sch, b) and sch.get(b).name_hint != wb_name]
    width = lanes(write_dtype(sch, main), target)
    loops = sch.get_loops(main)
    n = spatial_count(sch, main)
    spatial = [_split(sch, knobs, Knob.SPATIAL_TILE, lp, 4, 4 * width if i == n - 1 else INNER_SPATIAL)
               for i, lp in enumerate(loops[:n])]
    reduce = [_split(sch, knobs, Knob.REDUCE_TILE, lp, 2, size(sch, sch.get(lp).extent)) for i, lp in enumerate(loops[n:])]
    level = [[parts[k] for parts in spatial] for k in range(4)]
    sch.reorder(*level[0], *level[1], *[p[0] for p in reduce], *level[2], *[p[1] for p in reduce], *level[3])
    par = sch.fuse(*level[0]) if len(level[0]) > 1 else level[0][0]
    sch.reverse_compute_at(write_back, level[1][-1] if knobs.choose(sch, Knob.WRITE_BACK_AT, [0, 1], 1) else par)
    sch.parallel(par)
    unroll(sch, knobs, par)
    sch.vectorize(level[3][-1])
    init = sch.decompose_reduction(main, reduce[0][0])
    for block in (init, write_back):
        vectorize_innermost(sch, block, width)
    for stage in stages:  # epilogues TVM would not inline into the write-back
        injective(sch, stage, target)


def _split(sch: Schedule, knobs: Knobs, knob: Knob, loop, n: int, max_innermost: int) -> list:
    """Split a loop into n sampled perfect levels (the default keeps it whole in the outermost)."""
    extent = size(sch, sch.get(loop).extent)
    return split(sch, loop, knobs.tile(sch, knob, loop, n, [extent] + [1] * (n - 1), max_innermost))
