"""The Winograd transforms (cinn.core.ops.winograd) on CPU: tile positions unrolled, so that every transform coefficient is
a constant and the zero ones vanish, over vectors of consecutive tiles of an image."""
from __future__ import annotations

from tvm.s_tir import Schedule

from cinn.core.ops import PatternKind, RuleName, TargetKind
from cinn.core.ops.winograd import ROW_ANNOTATION, tile_size
from cinn.core.target import Target
from schedules.analysis import blocks, reverse_inline_all, size, split
from schedules.cpu_common import lanes, vectorize_innermost
from schedules.knobs import Knobs
from schedules.registry import schedule_rule

INPUT, OUTPUT, PAD, TILES = "winograd_input", "winograd_output", "winograd_pad", "winograd_tiles"


def applicable(sch: Schedule) -> bool:
    """A winograd_input or winograd_output kernel."""
    return any(sch.get(b).name_hint in (INPUT, OUTPUT) for b in blocks(sch))


def schedule(sch: Schedule, target: Target) -> None:
    """Schedule whichever transform the kernel holds."""
    is_input = INPUT in {sch.get(b).name_hint for b in blocks(sch)}
    main = sch.get_sblock(INPUT if is_input else OUTPUT)
    (_input if is_input else _output)(sch, main, lanes(sch.get(main).writes[0].source.dtype, target))


def _input(sch: Schedule, main, width: int) -> None:
    """Per (channel, image) in parallel: its padded copy, then the transform over vectors of consecutive tiles."""
    pad = sch.get_sblock(PAD)
    t, c, p = sch.get_loops(main)
    n = size(sch, sch.get(pad).writes[0].source.shape[0])
    tiles = size(sch, sch.get(p).extent) // n  # per image
    b, p = split(sch, p, [n, tiles])
    sch.reorder(c, b, t, p)
    par = sch.fuse(c, b)
    sch.parallel(par)
    sch.compute_at(pad, par)
    # the padded copy by rows of tiles, each one vector of tile columns
    sch.split(sch.get_loops(pad)[-1], [None, int(sch.get(pad).annotations[ROW_ANNOTATION])])
    vectorize_innermost(sch, pad, width)
    _vectorize_tiles(sch, t, p, width)


def _output(sch: Schedule, main, width: int) -> None:
    """The epilogue inlined; per (image, channel) in parallel: the outputs of its tiles over vectors of consecutive
    tiles, then the output rows, each one vector, or wider ones as m vectors of every m-th column (stored at a
    stride of m; see docs/notes/winograd-kernels.md)."""
    products = sch.get_sblock(TILES)
    m = tile_size(size(sch, sch.get(products).reads[0].source.shape[0]))
    reverse_inline_all(sch, main)  # the producer block keeps its name, now writing the epilogue's output
    stages = [sch.get(b).name_hint for b in blocks(sch) if sch.get(b).name_hint not in (OUTPUT, TILES)]
    n, k, h, w = sch.get_loops(main)
    par = sch.fuse(n, k)
    sch.parallel(par)
    columns = size(sch, sch.get(w).extent)
    if columns > width and columns % m == 0:
        w, phase = sch.split(w, [None, m])
        sch.reorder(phase, w)
        sch.unroll(phase)
    sch.vectorize(w)
    for name in stages:  # epilogue stages TVM would not inline run per output row
        block = sch.get_sblock(name)
        sch.reverse_compute_at(block, h)
        vectorize_innermost(sch, block, width)
    sch.compute_at(products, par)
    _, t, *_, p = sch.get_loops(products)  # under the parallel loop
    _vectorize_tiles(sch, t, p, width)


def _vectorize_tiles(sch: Schedule, t, p, width: int) -> None:
    """The (unrolled) tile positions `t` over vectors of `width` consecutive tiles `p`; the last vector, shorter,
    its own loop without a bounds test."""
    tiles = size(sch, sch.get(p).extent)
    outer, inner = sch.split(p, [None, width])
    sch.reorder(outer, t, inner)
    sch.unroll(t)
    if tiles % width == 0:
        sch.vectorize(inner)
        return
    if tiles > width:  # whole vectors, then the rest
        whole, outer = sch.loop_partition(outer, [tiles // width, None])
        sch.vectorize(_innermost(sch, whole))
    sch.vectorize(sch.loop_partition(_innermost(sch, outer), [tiles % width, None])[0])


def _innermost(sch: Schedule, loop):
    """The innermost loop of the (one) block under `loop`."""
    (block,) = sch.get_child_blocks(loop)
    return sch.get_loops(block)[-1]


@schedule_rule(TargetKind.CPU, 70, serves=RuleName.CPU_WINOGRAD)
class Winograd:
    """A Winograd transform, whatever else its group holds."""

    def applicable(self, sch: Schedule, kind: PatternKind, target: Target, knobs: Knobs) -> bool:
        return kind in (PatternKind.NON_FUSIBLE, PatternKind.OUT_FUSIBLE) and applicable(sch)

    def apply(self, sch: Schedule, target: Target, knobs: Knobs) -> None:
        schedule(sch, target)
