"""The Winograd transforms (cinn.ops.winograd) on CPU: tile positions unrolled, so that every transform coefficient is
a constant and the zero ones vanish, and tiles vectorized (the input's over consecutive tiles of an image, the
output's over tile columns)."""
from __future__ import annotations

from tvm.s_tir import Schedule

from cinn.ops.winograd import tile_size
from cinn.schedules.analysis import blocks, reverse_inline_all
from cinn.schedules.cpu_common import lanes
from cinn.schedules.cpu_matmul import vectorize_innermost
from cinn.target import Target

INPUT, OUTPUT, PAD = "winograd_input", "winograd_output", "winograd_pad"


def applicable(sch: Schedule) -> bool:
    """A winograd_input or winograd_output kernel."""
    return any(sch.get(b).name_hint in (INPUT, OUTPUT) for b in blocks(sch))


def schedule(sch: Schedule, target: Target) -> None:
    """Schedule whichever transform the kernel holds."""
    names = {sch.get(b).name_hint for b in blocks(sch)}
    if INPUT in names:
        _input(sch, lanes(sch.get(sch.get_sblock(INPUT)).writes[0].source.dtype, target))
    else:
        _output(sch)


def _input(sch: Schedule, width: int) -> None:
    """Per (channel, image) in parallel: its padded copy, then vectors of `width` consecutive tiles x the unrolled
    (alpha^2) tile positions; the last vector takes the tiles left (its own loop, without a bounds test)."""
    main, pad = sch.get_sblock(INPUT), sch.get_sblock(PAD)
    t, c, p = sch.get_loops(main)
    n, _, _, _, span = (int(d) for d in sch.get(pad).writes[0].source.shape)
    tiles = int(sch.get(p).extent) // n  # per image; the copy spans a tile row more
    b, p = sch.split(p, [n, tiles])
    outer, inner = sch.split(p, [None, width])
    sch.reorder(c, b, outer, t, inner)
    par = sch.fuse(c, b)
    sch.parallel(par)
    sch.unroll(t)
    sch.compute_at(pad, par)
    # the padded copy by rows of tiles, each one vector of tile columns
    sch.split(sch.get_loops(pad)[-1], [None, span - tiles])
    vectorize_innermost(sch, pad)
    if tiles % width == 0:
        sch.vectorize(inner)
        return
    if tiles > width:  # whole vectors, then the rest
        main_part, outer = sch.loop_partition(outer, [tiles // width, None])
        sch.vectorize(_innermost(sch, main_part))
    sch.vectorize(sch.loop_partition(_innermost(sch, outer), [tiles % width, None])[0])


def _innermost(sch: Schedule, loop):
    """The innermost loop of the (one) block under `loop`."""
    (block,) = sch.get_child_blocks(loop)
    return sch.get_loops(block)[-1]


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

