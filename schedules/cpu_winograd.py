"""The Winograd transforms (cinn.ops.winograd) on CPU: tile positions unrolled, so that every transform coefficient is
a constant and the zero ones vanish, and tile columns vectorized."""
from __future__ import annotations

from tvm.s_tir import Schedule

from cinn.ops.winograd import tile_size
from cinn.schedules.analysis import blocks, reverse_inline_all
from cinn.schedules.cpu_matmul import vectorize_innermost

INPUT, OUTPUT, PAD = "winograd_input", "winograd_output", "winograd_pad"


def applicable(sch: Schedule) -> bool:
    """A winograd_input or winograd_output kernel."""
    return any(sch.get(b).name_hint in (INPUT, OUTPUT) for b in blocks(sch))


def schedule(sch: Schedule) -> None:
    """Schedule whichever transform the kernel holds."""
    names = {sch.get(b).name_hint for b in blocks(sch)}
    (_input if INPUT in names else _output)(sch)


def _input(sch: Schedule) -> None:
    """Per (channel, image) in parallel: its padded plane, then tile rows x the unrolled (alpha^2) tile positions x
    the tile columns as one vector."""
    main, pad = sch.get_sblock(INPUT), sch.get_sblock(PAD)
    t, c, p = sch.get_loops(main)
    tile = tile_size(int(sch.get(t).extent))
    n, _, rows, _, cols = (int(d) for d in sch.get(pad).writes[0].source.shape)
    b, row, col = sch.split(p, [n, (rows - 2) // tile, cols - 1])
    sch.reorder(c, b, row, t, col)
    par = sch.fuse(c, b)
    sch.parallel(par)
    sch.unroll(t)
    sch.vectorize(col)
    sch.compute_at(pad, par)
    vectorize_innermost(sch, pad)


def _output(sch: Schedule) -> None:
    """The epilogue inlined; per (image, channel) in parallel: tile rows x the unrolled m x m positions in a tile x
    the tile columns as one vector."""
    main = sch.get_sblock(OUTPUT)
    tile = tile_size(int(sch.get(main).reads[0].source.shape[0]))
    reverse_inline_all(sch, main)  # the producer block keeps its name, now writing the epilogue's output
    stages = [sch.get(b).name_hint for b in blocks(sch) if sch.get(b).name_hint != OUTPUT]
    n, k, h, w = sch.get_loops(main)
    overhangs = int(sch.get(w).extent) % tile != 0  # the last tile column is partly outside the output
    th, a = sch.split(h, [None, tile])
    tw, col = sch.split(w, [None, tile])
    sch.reorder(th, a, col, tw)
    par = sch.fuse(n, k)
    sch.parallel(par)
    sch.unroll(a)
    sch.unroll(col)
    for name in stages:  # epilogue stages TVM would not inline run per tile row
        block = sch.get_sblock(name)
        sch.reverse_compute_at(block, th)
        vectorize_innermost(sch, block)
    tiles = int(sch.get(tw).extent)
    if tiles > 1 and overhangs:
        # the last tile column overhangs the output: its own loop keeps the bounds test, the others are one vector
        tw = sch.loop_partition(tw, [tiles - 1, None])[0]
    sch.vectorize(tw)

