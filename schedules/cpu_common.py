"""Generic CPU scheduling steps shared by the specialised schedules."""
from __future__ import annotations

from math import prod

from tvm import tirx
from tvm.s_tir import Schedule
from tvm.s_tir.schedule import SBlockRV
from tvm.sym.pattern import detect_linear_equation
from tvm.tirx import IndexMap

from cinn.core.cpu_model import MIN_LANES
from cinn.core.ops import PatternKind, TargetKind
from cinn.core.target import Target
from schedules.analysis import (
    blocks,
    extents,
    inline_all,
    is_fresh,
    is_reduction,
    is_static,
    operand_reads,
    size,
    spatial_count,
    split,
    vars_in,
    write_dtype,
)
from schedules.knobs import DEFAULT, Knob, Knobs, divisors, unroll
from schedules.registry import FALLBACK, schedule_rule

PARALLEL_MIN = 4096  # elements below which a thread fork costs more than it saves
PARALLEL_TASKS = 64  # parallel iterations that balance the cores whatever each one costs


def parallel_outer(sch: Schedule) -> None:
    """Run each block's outermost loop in parallel where it is a spatial one (the plain schedule of a symbolic
    kernel whose default schedule does not apply)."""
    for block in blocks(sch):
        loops = sch.get_loops(block)
        if loops and spatial_count(sch, block) > 0:
            sch.parallel(loops[0])


def lanes(dtype: str, target: Target) -> int:
    """Vector lanes of one of the target's widest registers for a dtype (bool counts as 8 bits)."""
    bits = int("".join(ch for ch in dtype if ch.isdigit()) or 8)
    return max(1, target.vector_bits // bits)


WINDOW_MAX = 64  # reduced elements per output up to which a reduction is a window (pooling), vectorized over outputs
MAX_VECTORIZED = 4  # registers one vectorized loop spans at most (as the widest vector_width lets the tuner try)


def register_lanes(cols: int, width: int) -> int:
    """Lanes of the registers a vector tile of `cols` is computed in: the widest power of two up to the target's
    width that divides it (a 28-column tile: 7 registers of 4 lanes)."""
    return min(width, cols & -cols)


def generic(sch: Schedule, target: Target, knobs: Knobs = DEFAULT) -> None:
    """Inline producers, then parallelize every remaining block and vectorize the injective ones and the windows."""
    inline_all(sch, keep=lambda b: _pads_a_window(sch, b))
    # the blocks before a column reduction's decomposition adds its init, by name too: a stage computed inside a
    # window's loops may be partitioned into others (vectorize_bounded)
    todo = [(b, sch.get(b).name_hint) for b in blocks(sch)]
    column = column_reduction(sch, target)
    done: set[str] = set()  # blocks scheduled, and stages computed inside a window's or a column reduction's loops
    if column is not None:
        done = {sch.get(column[0]).name_hint}  # its name in `todo`: the decomposition names it anew
        done |= columns(sch, column[0], column[1], target)
    for block, name in todo:
        if name in done or _pads_a_window(sch, block):
            continue
        if is_reduction(sch, block) and any(_pads_a_window(sch, p) for p in sch.get_producers(block)):
            done |= padded_window(sch, block, target)
        elif is_reduction(sch, block) and _is_window(sch, block, target):
            window(sch, block, target)
        elif is_reduction(sch, block):
            parallel_spatial(sch, block)
        else:
            injective(sch, block, target, knobs)


def _pads_a_window(sch: Schedule, block) -> bool:
    """Whether a block is a padding stage read by a window reduction over the last two axes (a padded pool)."""
    if sch.get(block).name_hint != "pad" or is_reduction(sch, block):
        return False
    readers = sch.get_consumers(block)
    if len(readers) != 1 or not is_reduction(sch, readers[0]) or not is_fresh(sch, readers[0]):
        return False
    reader = sch.get(readers[0])
    n = spatial_count(sch, readers[0])
    (read,) = [r for r in reader.reads if r.source.same_as(sch.get(block).writes[0].source)] or [None]
    loops = extents(sch, sch.get_loops(readers[0]))
    return (read is not None and n >= 2 and prod(loops[n:]) <= WINDOW_MAX and loops[n - 1] >= MIN_LANES
            and all((index_step(read.region[d - 2].min, reader.iter_vars[n + d - 2].var) or 0) >= 1 for d in range(2)))


def padded_window(sch: Schedule, block, target: Target) -> set[str]:
    """A window over its padded input: parallel over channels, the input padded per channel (small, hot), each
    output row one vector (any width up to MAX_VECTORIZED registers: LLVM splits it; a longer row in vectors
    of bounded_lanes) with no bounds test (see docs/notes/pooling-and-reductions.md)."""
    loops = sch.get_loops(block)
    n = spatial_count(sch, block)
    pad = next(b for b in sch.get_producers(block) if _pads_a_window(sch, b))
    par = sch.fuse(*loops[: n - 2]) if n > 2 else loops[0]
    width = lanes(write_dtype(sch, block), target)
    row = extents(sch, loops[n - 1 : n])[0]
    pieces = [loops[n - 1]]
    if row > MAX_VECTORIZED * width:
        pieces = split(sch, loops[n - 1], [None, bounded_lanes(row, width)])
    sch.reorder(par, loops[n - 2], *pieces[:-1], *loops[n:], pieces[-1])
    sch.parallel(par)
    phased = deinterleave(sch, block, pad)
    sch.compute_at(pad, par)
    if phased:
        copy_in_read_order(sch, pad)
    else:
        vectorize_bounded(sch, sch.get_loops(pad)[-1], width)
    _vector_reduce(sch, block, pieces[-1], loops[n])
    return _consumers_at(sch, block, par, width)


def vectorize_bounded(sch: Schedule, loop, width: int) -> None:
    """Vectorize a loop of up to MAX_VECTORIZED registers of `width` lanes; a longer one as a loop over
    one-register vectors, the lanes short of a whole register a vector loop of their own. TVM makes a vectorized loop
    one vector of all its lanes, which LLVM compiles as straight-line code in a time that grows steeply with the lanes
    where they gather: a conv1d's write-back over its 1500 positions did not finish building (see
    docs/notes/build-time-limits.md). A symbolic loop is vectorized as it is."""
    extent = sch.get(loop).extent
    if not isinstance(extent, tirx.IntImm) or int(extent) <= MAX_VECTORIZED * width:
        sch.vectorize(loop)
        return
    whole = int(extent) - int(extent) % width
    if whole < int(extent):
        loop, rest = sch.loop_partition(loop, [whole, None])
        sch.vectorize(rest)
    sch.vectorize(sch.split(loop, [None, width])[1])


def bounded_lanes(extent: int, width: int) -> int:
    """The lanes of a vector loop over a longer loop whose blocks cannot be partitioned (a reduction): the widest
    divisor of the extent of MIN_LANES to MAX_VECTORIZED registers, else one register (its last vector
    guarded, and so scalar)."""
    fits = [d for d in divisors(extent, MAX_VECTORIZED * width) if d >= MIN_LANES]
    return fits[-1] if fits else width


def vectorize_innermost(sch: Schedule, block, width: int) -> None:
    """Vectorize a block's innermost loop (vectorize_bounded, `width` lanes a register) when it is wider than one
    element."""
    loops = sch.get_loops(block)
    if loops and extents(sch, loops[-1:])[0] > 1:
        vectorize_bounded(sch, loops[-1], width)


def _vector_reduce(sch: Schedule, block, lane, first_reduce) -> None:
    """Vectorize a reduction's lane loop (inside its reduce loops) and the init that decompose_reduction hoists."""
    sch.vectorize(lane)  # before decompose_reduction, after which the update block alone is not a reduction
    init = sch.decompose_reduction(block, first_reduce)
    sch.vectorize(sch.get_loops(init)[-1])


def _consumers_at(sch: Schedule, block, loop, width: int) -> set[str]:
    """Compute a reduction's consumers (an average's division) at its parallel loop, vectorized, while its results
    are hot; returns their names."""
    consumers = sch.get_consumers(block)
    names = {sch.get(c).name_hint for c in consumers}  # before vectorize_bounded may partition them
    for consumer in consumers:
        compute_at_vectorized(sch, consumer, loop, width)
    return names


def compute_at_vectorized(sch: Schedule, consumer, loop, width: int) -> None:
    """Compute a consumer inside `loop` (reverse_compute_at), its innermost loop of its own vectorized
    (vectorize_bounded) where it has one wider than an element (`loop` itself may be parallel)."""
    sch.reverse_compute_at(consumer, loop)
    *_, inner = sch.get_loops(consumer)
    if not sch.get(inner).same_as(sch.get(loop)) and extents(sch, [inner])[0] > 1:
        vectorize_bounded(sch, inner, width)


def _is_window(sch: Schedule, block, target: Target) -> bool:
    """A fresh reduction over a few elements per output (a pooling window) whose innermost output axis steps the
    innermost axis of what it reads by a stride, in a whole number of 4-lane or wider registers. Strided windows were
    scalar loads either way, so vector max/add win; stride-1 windows with padding on both sides lost to the per-lane
    bounds checks (see docs/notes/pooling-and-reductions.md)."""
    if not is_fresh(sch, block):
        return False
    ext = extents(sch, sch.get_loops(block))
    n = spatial_count(sch, block)
    if n == 0 or prod(ext[n:]) > WINDOW_MAX or register_lanes(ext[n - 1], lanes(write_dtype(sch, block), target)) < MIN_LANES:
        return False
    var = sch.get(block).iter_vars[n - 1].var
    reads = operand_reads(sch.get(block))
    return bool(reads) and all((index_step(r.region[-1].min, var) or 0) > 1 for r in reads)


def index_step(index, var) -> int | None:
    """The constant step of an index per step of var (0 when it does not use var; None when the step is not a
    constant)."""
    linear = detect_linear_equation(index, [var])
    return int(linear[0]) if linear and isinstance(linear[0], tirx.IntImm) else None


def window(sch: Schedule, block, target: Target) -> None:
    """A window reduction vectorized over its innermost outputs: the window loops run outside the lanes, each step a
    vector max/add (maxpool 3x3 stride 2 of 64x112x112 was one scalar output at a time)."""
    loops = sch.get_loops(block)
    n = spatial_count(sch, block)
    reg = register_lanes(extents(sch, loops[n - 1 : n])[0], lanes(write_dtype(sch, block), target))
    outer, lane = sch.split(loops[n - 1], [None, reg])
    sch.reorder(*loops[: n - 1], outer, *loops[n:], lane)
    par = sch.fuse(*loops[: n - 1]) if n > 1 else outer
    sch.parallel(par)
    _vector_reduce(sch, block, lane, loops[n])


def column_reduction(sch: Schedule, target: Target) -> tuple[SBlockRV, int] | None:
    """The group's only reduction and its column axis (see column_axis) where every other block reads it directly
    (a mean's division); None otherwise (a softmax over an outer axis: its exponentials feed a second reduction)."""
    reductions = [b for b in blocks(sch) if is_reduction(sch, b)]
    if len(reductions) != 1:
        return None
    (block,) = reductions
    axis = column_axis(sch, block, target)
    others = {sch.get(b).name_hint for b in blocks(sch)} - {sch.get(c).name_hint for c in sch.get_consumers(block)}
    return (block, axis) if axis is not None and others == {sch.get(block).name_hint} else None


def column_axis(sch: Schedule, block, target: Target) -> int | None:
    """The innermost non-unit spatial axis of a fresh reduction when everything it reads is contiguous along that axis
    and not along a reduced one (a mean over the pixels of channels-last channels), in whole 4-lane or wider
    registers; None otherwise (also for an argmax's pair of values and indices)."""
    if not is_fresh(sch, block) or len(sch.get(block).writes) != 1:
        return None
    ext = extents(sch, sch.get_loops(block))
    n = spatial_count(sch, block)
    axes = [d for d in range(n) if ext[d] > 1]
    if not axes or register_lanes(ext[axes[-1]], lanes(write_dtype(sch, block), target)) < MIN_LANES:
        return None
    iters = sch.get(block).iter_vars
    reads = [r.region[-1].min for r in operand_reads(sch.get(block))]
    contiguous = all(index_step(i, iters[axes[-1]].var) == 1 and all(index_step(i, iv.var) == 0 for iv in iters[n:])
                     for i in reads)
    return axes[-1] if reads and contiguous else None


def columns(sch: Schedule, block, axis: int, target: Target) -> set[str]:
    """A reduction over outer axes vectorized over its contiguous outputs: parallel over vectors of them, each
    reduce step a vector add, not one strided element per channel (see docs/notes/pooling-and-reductions.md).
    Returns the consumers computed inside (see _consumers_at)."""
    loops = sch.get_loops(block)
    n = spatial_count(sch, block)
    width = lanes(write_dtype(sch, block), target)
    reg = register_lanes(extents(sch, loops[axis : axis + 1])[0], width)
    outer, lane = sch.split(loops[axis], [None, reg])
    sch.reorder(outer, *loops[axis + 1 : n], *loops[n:], lane)
    par = sch.fuse(*loops[:axis], outer) if axis else outer
    sch.parallel(par)
    _vector_reduce(sch, block, lane, loops[n])
    return _consumers_at(sch, block, par, width)


def injective(sch: Schedule, block, target: Target, knobs: Knobs = DEFAULT) -> None:
    """Vectorize a spatial block's inner lanes and parallelize the rest (fused) when large."""
    loops = sch.get_loops(block)
    if not loops or _transpose_in_tiles(sch, block, target):
        return
    extent = prod(extents(sch, loops))
    cut, width = _vector_suffix(sch, block, lanes(write_dtype(sch, block), target))
    outer, inner = loops[:cut], loops[cut:]
    inner_loop = sch.fuse(*inner) if len(inner) > 1 else inner[0]
    width = vector_width(sch, knobs, width, size(sch, sch.get(inner_loop).extent), 4 if not outer else 1)
    # the axes outside the vector suffix (a concat's channels) stay the parallel loop, the suffix's vectors a serial
    # loop inside it, when they make enough tasks: its selects and index arithmetic are then loop-invariant
    # (a symbolic kernel's outer axes may be 1 at run time: a batch)
    serial = bool(outer) and prod(extents(sch, outer)) >= PARALLEL_TASKS and is_static(sch, outer)
    if width:
        rest, lane = sch.split(inner_loop, [None, width])
        sch.vectorize(lane)
        outer = outer if serial else [*outer, rest]
    elif inner and not serial:
        outer = [*outer, inner_loop]
    fused = sch.fuse(*outer) if len(outer) > 1 else outer[0]
    if extent > 1 and knobs.choose(sch, Knob.PARALLEL, [0, 1], int(extent >= PARALLEL_MIN)):
        sch.parallel(fused)
    unroll(sch, knobs, fused)


def _transpose_in_tiles(sch: Schedule, block, target: Target) -> bool:
    """A copy that moves the input's innermost axis (a transpose): tiles of CpuModel.transpose_rows input rows x one
    vector of output columns, the tile in L1, each output row written as a vector, not whole output rows that read
    every input row once per column (see docs/notes/injective-vectorization.md). Returns whether it applied."""
    loops = sch.get_loops(block)
    b = sch.get(block)
    if not is_fresh(sch, block) or len(b.reads) != 1 or len(loops) < 2:
        return False
    iters = [iv.var for iv in b.iter_vars]
    index = [rg.min for rg in b.reads[0].region]
    read_vars = [e for e in index if isinstance(e, tirx.Var)]  # the others: constant indices of unit dims
    if len(read_vars) + sum(isinstance(e, tirx.IntImm) for e in index) != len(index) or not read_vars \
            or not isinstance(index[-1], tirx.Var) or index[-1].same_as(iters[-1]) \
            or not all(any(v.same_as(i) for i in iters) for v in read_vars):
        return False
    ext = extents(sch, loops)
    row = next(k for k, v in enumerate(iters) if v.same_as(index[-1]))  # the output axis the input runs along
    if ext[-1] < MIN_LANES or ext[row] < MIN_LANES:
        return False
    width = lanes(write_dtype(sch, block), target)
    cols = _tile_side(ext[-1], (width, width // 2, width // 4), 4 * width)
    tile = target.model.transpose_rows
    rows = _tile_side(ext[row], (tile, tile // 2, tile // 4), tile)
    row_out, row_in = sch.split(loops[row], [None, rows])
    col_out, col_in = sch.split(loops[-1], [None, cols])
    others = [lp for k, lp in enumerate(loops[:-1]) if k != row]
    sch.reorder(*others, row_out, col_out, row_in, col_in)
    fused = sch.fuse(*others, row_out, col_out)
    if prod(ext) >= PARALLEL_MIN:
        sch.parallel(fused)
    sch.vectorize(col_in)
    return True


def _tile_side(extent: int, preferred: tuple[int, ...], limit: int) -> int:
    """A transpose tile's side: the first preferred size that divides the extent, else its largest divisor from
    MIN_LANES to `limit` (111 columns: 37), else the first preferred size with a partial last tile."""
    fits = [d for d in preferred if d >= MIN_LANES and extent % d == 0]
    if fits:
        return fits[0]
    wide = [d for d in divisors(extent, limit) if d >= MIN_LANES]
    return wide[-1] if wide else preferred[0]


def _vector_suffix(sch: Schedule, block, width: int) -> tuple[int, int]:
    """Where the vectorized (fused) inner loops start, and their lanes: the longest suffix of axes that every read
    indexes by the bare iterator (or not at all), so lanes never straddle an axis with a select or index arithmetic
    that would make every load a gather (a concat's or a channel shuffle's channel; see
    docs/notes/injective-vectorization.md); all loops when that suffix is empty or under 4 lanes."""
    loops = sch.get_loops(block)
    if not is_fresh(sch, block):
        return 0, width
    iters = [iv.var for iv in sch.get(block).iter_vars]
    reads = [[rg.min for rg in r.region] for r in sch.get(block).reads]
    cut = len(iters)
    while cut > 0 and all(_bare_lanes(index, iters[cut - 1], iters[cut:]) for index in reads):
        cut -= 1
    # lanes over three or more fused axes index them by nested divisions that TVM's vectorizer may turn into a
    # gather per lane (see docs/notes/injective-vectorization.md); two axes that make whole vectors suffice
    if len(iters) - cut > 2 and prod(extents(sch, loops[-2:])) % width == 0:
        cut = len(iters) - 2
    reg = register_lanes(prod(extents(sch, loops[cut:])), width)
    return (cut, reg) if 0 < cut < len(iters) and reg >= MIN_LANES else (0, width)


def _bare_lanes(index: list, var, suffix: list) -> bool:
    """Whether a read's index lets the vector lanes extend over `var`: it uses var as a bare iterator or not at all,
    and a read of var that uses no axis of the suffix is not one constant broadcast over the suffix (a batch norm's
    per-channel scale: lanes across channels would gather it; see docs/notes/injective-vectorization.md)."""
    if not any(var in vars_in(e) for e in index):
        return True
    used = set().union(*(vars_in(e) for e in index))
    return all(e.same_as(var) or var not in vars_in(e) for e in index) and (not suffix or bool(used & set(suffix)))


def deinterleave(sch: Schedule, main, stage) -> bool:
    """Store a producer that the vector loop reads at a stride s (a strided depthwise conv's padded input, vectorized
    over output columns) phase by phase, [..., w % s, w // s], so that its vector loads are contiguous rather than
    one scalar insert per lane (see docs/notes/depthwise-conv.md); returns whether it did."""
    block = sch.get(main)
    var = block.iter_vars[spatial_count(sch, main) - 1].var
    buffer = sch.get(stage).writes[0].source
    reads = [r for r in block.reads if r.source.same_as(buffer)]
    step = index_step(reads[0].region[-1].min, var) if len(reads) == 1 else None
    if step is None or step < 2 or size(sch, buffer.shape[-1]) % step:
        return False
    phases = IndexMap.from_func(lambda *ix: [*ix[:-1], ix[-1] % step, ix[-1] // step], ndim=len(buffer.shape),
                                index_dtype=str(buffer.shape[-1].ty))
    sch.transform_layout(stage, ("write", 0), phases)
    sch.transform_block_layout(stage, phases)  # the copy loops over what it writes, in order
    return True


def copy_in_read_order(sch: Schedule, stage) -> None:
    """Order a deinterleaved copy (computed at its tile) as it reads, phases innermost: LLVM vectorizes that with
    permutes, where TVM would gather lane by lane; the columns between the first and the last (which hold the
    padding where it is narrower than the stride) are a loop of their own, so the lowering drops its bounds test."""
    *_, phase, column = sch.get_loops(stage)
    sch.reorder(column, phase)
    extent = size(sch, sch.get(column).extent)
    if extent > 2:
        sch.loop_partition(column, [1, extent - 2, None])


def vector_width(sch: Schedule, knobs: Knobs, width: int, extent: int, min_vectors: int = 1) -> int:
    """The vector width of a loop: one register by default, up to four for the tuner; 0 when the loop is too short
    (under `min_vectors` registers) or not a multiple of the lanes."""
    fits = [w for w in (width, 2 * width, 4 * width) if extent >= min_vectors * w and extent % w == 0]
    return knobs.choose(sch, Knob.VECTOR, [0, *fits], fits[0]) if fits else 0


def parallel_spatial(sch: Schedule, block) -> None:
    """Parallelize the leading spatial loops of a fresh reduction block (loops map 1:1 to iterators). The innermost
    stays a serial loop when the others make enough tasks, so its outputs' indices are increments, not divisions per
    output (a pooling window on odd columns; see docs/notes/pooling-and-reductions.md)."""
    loops = sch.get_loops(block)
    n = spatial_count(sch, block)
    lead = n - 1 if n > 1 and prod(extents(sch, loops[: n - 1])) >= PARALLEL_TASKS else n
    if lead:
        sch.parallel(sch.fuse(*loops[:lead]) if lead > 1 else loops[0])


@schedule_rule(TargetKind.CPU, FALLBACK)
class Generic:
    """Every kernel (the fallback): producers inlined, the other blocks parallel and vectorized."""

    def applicable(self, sch: Schedule, kind: PatternKind, target: Target, knobs: Knobs) -> bool:
        return True

    def apply(self, sch: Schedule, target: Target, knobs: Knobs) -> None:
        generic(sch, target, knobs)
