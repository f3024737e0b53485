"""Register-tiled schedule for OUT_FUSIBLE groups: one matmul/conv reduction block plus elementwise epilogues.

The reduction's innermost spatial axis (the output's contiguous one) is the vector axis; a second spatial axis that
the vector-axis operand does not depend on (matmul rows, conv output channels) forms the register-tile rows, so
each vector load of that operand feeds `rows` FMAs. Convolutions whose output rows are not a whole number of vectors
(or whose input is read at strided offsets) turn this around, as direct convolutions do: the vector axis is the output
channels over a packed weight panel, and the register rows are output columns, each a broadcast input value. A second
register-row axis that only one operand depends on (a conv's output rows) multiplies the tile again. The accumulator
tile lives in a cache_write buffer whose write-back block absorbs the epilogue, so the output is written once, after
bias/activation.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from math import gcd, prod

import tvm
from tvm import DataType, tirx
from tvm.s_tir import Schedule, ScheduleError

from cinn.core.ops import PatternKind, TargetKind
from cinn.core.target import NO_PARTIAL_UNROLL, Target
from schedules import cpu_tiling
from schedules.analysis import (
    NOMINAL_SIZES,
    blocks,
    extents,
    inline_all,
    is_matmul,
    is_output,
    is_reduction,
    is_static,
    operand_reads,
    reverse_inline_all,
    single_reduction,
    size,
    spatial_count,
    split,
    vars_in,
    write_dtype,
)
from schedules.cpu_common import (
    MIN_LANES,
    compute_at_vectorized,
    copy_in_read_order,
    deinterleave,
    index_step,
    injective,
    lanes,
    register_lanes,
    vectorize_innermost,
)
from schedules.knobs import DEFAULT, MAX_UNROLLED, TILED_UNROLL_STEPS, Knob, Knobs, divisors, unroll
from schedules.registry import schedule_rule

MAX_COLS = 32
MAX_ROWS = 16  # register-tile rows the tuner may try
IMBALANCE = 1.1  # work of the busiest core over the average above which row tiles run in parallel too
ROW_BLOCK_SHARE = 0.25  # the share of L2 a block of parallel row tiles' row operand takes (the panels need the rest)
TRANSPOSED_SHARE = 0.25  # a channel-vectorized 1x1 conv's output per tile, of L2, beyond which rows run in parallel
MIN_CHUNK = 256  # reduction steps per chunk run outside the tiles: shorter ones spend more on the accumulators' trips


@dataclass(frozen=True)
class Tiling:
    """The tiling decisions: iterator indices of the vector and row axes, their tile sizes, and the operand to pack.

    `row2` is a second register-row axis (a conv's output rows): one operand's loads do not depend on it, so the
    tile reuses them `rows2` times. `pack` is the index (in the block's reads) of the vector-axis operand to copy
    into a contiguous panel per parallel tile, and `pack_perm` the permutation of its dimensions that puts the vector
    axis last."""

    col: int
    cols: int
    row: int | None
    rows: int
    row2: int | None
    rows2: int
    pack: int | None
    pack_perm: tuple[int, ...]
    per_tile: bool = False  # the packed operand is read per tile (a depthwise conv's input), not shared by row tiles

    @property
    def pack_transposes(self) -> bool:
        """Whether the packed panel's layout differs from the operand's (not a plain copy)."""
        return self.pack_perm != tuple(range(len(self.pack_perm)))


@dataclass(frozen=True)
class Outside:
    """What of a matmul whose rows outgrow L2 runs serially outside its parallel tiles (see _outside): its batches,
    one batch's rows at a time, and chunks of its reduction (`chunk` steps each, 0 for none)."""

    batches: tuple[int, ...] = ()
    chunk: int = 0


INSIDE = Outside()


def _tile_cols(extent: int, width: int) -> int:
    """The vector tile: the widest multiple of the lane count that divides the axis, else a divisor up to MAX_COLS."""
    for cols in (MAX_COLS, 2 * width, width):
        if cols <= MAX_COLS and extent % cols == 0:
            return cols
    return max(divisors(extent, MAX_COLS))


def _col_candidates(extent: int, width: int, default: int) -> list[int]:
    """Vector tiles the tuner may pick: multiples of the lane count up to 4 registers that divide the axis."""
    found = [c for c in range(width, 4 * width + 1, width) if extent % c == 0]
    return sorted(set(found or divisors(extent, MAX_COLS)) | {default})


def _tile_rows(extent: int, budget: int, limit: int = 0) -> int:
    """The largest row count within the accumulator budget that divides the axis (no predicated tails); where that
    leaves more than half the budget unused, the largest up to `limit` (34 rows: 17 per tile, not 2; see
    docs/notes/register-tiles.md)."""
    rows = max(divisors(extent, budget))
    return max(divisors(extent, limit)) if 2 * rows < budget and limit > budget else rows


def _register_tile(vectors: list[int], rows: list[int], rows2: list[int], budget: int,
                   row2_in_vector: bool) -> tuple[int, int, int]:
    """(vectors, rows, rows2) of the register tile with the most FMAs per load within the accumulator budget (in
    vectors): a step loads `vectors` vectors of the vector operand, times rows2 when that operand depends on the
    second row axis (a conv's input over output rows), and broadcasts rows (times rows2 otherwise) values of the row
    operand; ties go to wider vectors, then to fewer second rows."""

    tiles = [(v, r, r2) for v in vectors for r in rows for r2 in rows2 if v * r * r2 <= budget]
    return max(tiles, key=lambda t: (_fmas_per_load(t, row2_in_vector), t[0], -t[2]), default=(1, 1, 1))


def _fmas_per_load(tile: tuple[int, int, int], row2_in_vector: bool) -> float:
    """FMAs per load of a (vectors, rows, rows2) register tile (see _register_tile)."""
    v, r, r2 = tile
    return v * r * r2 / (v * r2 + r if row2_in_vector else v + r * r2)


def _channel_vectors(channels: int, reduce_elems: int, width: int, budget: int, dtype: str, target: Target) -> list[int]:
    """Weight vectors a channel-vectorized tile may take: within the budget, dividing the channels, and with a
    packed panel (vectors x width x reduction elements) within panel_bytes where any is."""
    fits = [v for v in range(1, budget + 1) if channels % (v * width) == 0]
    small = [v for v in fits if v * width * reduce_elems * DataType(dtype).bits // 8 <= panel_bytes(target)]
    return small or fits[:1] or [1]


def panel_bytes(target: Target) -> int:
    """A channel tile's packed weight panel is read again for every pixel tile, so it must stay in L2 (a 7x7 512->512
    conv's 64-channel panel, 1.2 MB, streamed from L3 on a 512 KiB L2), and even within L2 larger panels lose
    (CpuModel.panel_bytes). Three quarters of L2 (see docs/notes/register-tiles.md)."""
    return target.model.panel_bytes


def tile_elems(target: Target) -> int:
    """Accumulators (fp32 elements) of the default register tile: half the 32 zmm registers with AVX-512 (8x32; a
    4x32 tile lost, see docs/notes/register-tiles.md), 12 of the 16 ymm registers with AVX2 (3x32); the rest hold
    the loaded operands."""
    return target.model.accumulators * target.model.lanes


def plan(sch: Schedule, main, target: Target, knobs: Knobs = DEFAULT) -> Tiling:
    """Pick the vector axis, the register-row axis and their tile sizes for the reduction block."""
    block = sch.get(main)
    n = spatial_count(sch, main)
    ext = [size(sch, iv.dom.extent) for iv in block.iter_vars]
    width = lanes(write_dtype(sch, main), target)
    depthwise = _depthwise_channels(block, n, ext, width)
    if depthwise is not None:
        return _depthwise_tiling(sch, knobs, main, ext, depthwise, width, target)
    col = _vector_axis(sch, knobs, block, n, ext, width)
    if col != n - 1:  # output channels that are not whole registers take narrower ones (1000 classes: 8 lanes)
        width = register_lanes(ext[col], width)
    vec_reads = _reads_using(block, col)
    used = set().union(*(vars_in(rg.min) for r in vec_reads for rg in r.region)) if vec_reads else set()
    free = [i for i in range(n) if i != col and block.iter_vars[i].var not in used and ext[i] > 1]
    row = free[-1] if free else (col - 1 if col > 0 else None)
    row2, in_vector = _second_row_axis(block, n, ext, col, free[-1]) if free else (None, False)
    panel = _panel_width(block, col, vec_reads)
    if panel and col == n - 1:  # a matmul's register tile reads whole columns of one panel
        default_cols, default_rows = _panel_tile(panel, ext[row] if row is not None else 1, width, target)
        default_rows2 = 1
    elif row is not None and (window := _channels_last_window(block, n, ext, col, row)) is not None:
        default_cols, default_rows = _channels_last_depthwise_tile(ext[col], ext[row], width,
                                                                   window * DataType(write_dtype(sch, main)).bits // 8,
                                                                   target)
        default_rows2 = 1
    else:
        default_cols, default_rows, default_rows2 = _default_tile(ext, n, col, row, row2, in_vector, width, target,
                                                                  write_dtype(sch, main), reuse=bool(free))
        default_cols = _enough_tasks(ext[:n], col, default_cols, row, default_rows, width, target)
    cols = knobs.choose(sch, Knob.COLS, _col_candidates(panel or ext[col], width, default_cols), default_cols)
    # a tile with more accumulators than registers spills every step, and its unrolled body took seconds to build
    registers = target.vector_registers
    vectors = max(1, cols // width)
    rows = rows2 = 1
    if row is not None:
        # rows read from row panels (matmul_packed's x_panel) take whole panels or parts of one: a tile reads one stream
        extent = gcd(ext[row], _panel_width(block, row, _reads_using(block, row)) or ext[row], _whole(sch, block, row))
        default_rows = max(divisors(extent, default_rows))
        rows = knobs.choose(sch, Knob.ROWS, _fitting_rows(extent, vectors, registers, default_rows), default_rows)
    if row2 is not None:
        extent2 = gcd(ext[row2], _whole(sch, block, row2))
        default_rows2 = max(divisors(extent2, default_rows2))
        rows2 = knobs.choose(sch, Knob.ROWS2, _fitting_rows(extent2, vectors * rows, registers, default_rows2),
                             default_rows2)
    pack, perm = _packable(block, n, col, vec_reads) if free else (None, ())
    # a panel packed for a single tile (one row tile, no other spatial axis to reuse it over) is read once: the
    # copy is all cost (the 1024 -> 10 classifier of a batch-32 MLP; see docs/notes/matmul-blocking.md)
    single = row is not None and ext[row] <= rows and prod(e for i, e in enumerate(ext[:n]) if i not in (col, row)) == 1
    if pack is not None and not knobs.choose(sch, Knob.PACK, [0, 1], int(not single)):
        pack, perm = None, ()
    return Tiling(col, cols, row, rows, row2, rows2, pack, perm)


def _whole(sch: Schedule, block, axis: int) -> int:
    """The tiles an axis splits into without a guarded last one: any for a static axis (0), else the largest power of
    two its symbolic extent is a multiple of (a symbolic matmul's padded rows: 8; a batch: 1)."""
    extent = block.iter_vars[axis].dom.extent
    if isinstance(extent, tirx.IntImm):
        return 0
    return next(k for k in (64, 32, 16, 8, 4, 2, 1) if tvm.sym.Analyzer().can_prove(tirx.floormod(extent, k) == 0))


def _depthwise_channels(block, n: int, ext: list[int], width: int) -> int | None:
    """The channel axis of a depthwise conv (every operand is read per channel, none is shared by output rows or
    columns) whose output rows fill less than half a vector register but whose channels fill whole ones: such convs
    vectorize over channels."""
    last = n - 1
    # one input channel per output channel (the first reduced axis), over a window
    if n < 3 or register_lanes(ext[last], width) >= width // 2 or len(block.reads) != 2 or ext[n] != 1 \
            or prod(ext[n:]) == 1:
        return None
    # a strided conv's input is deinterleaved per tile, so rows of whole xmm registers stay the vector axis (see
    # docs/notes/depthwise-conv.md); 7 columns do not
    if register_lanes(ext[last], width) >= MIN_LANES and not _unit_stride(block.iter_vars[last].var, block.reads):
        return None
    used = [c for c in range(last) if ext[c] % width == 0 and len(_reads_using(block, c)) == 2]
    return used[-1] if used and all(_reads_using(block, a) for a in (last - 1, last)) else None


def _depthwise_tiling(sch: Schedule, knobs: Knobs, main, ext: list[int], col: int, width: int, target: Target) -> Tiling:
    """A depthwise conv over channel vectors times output columns, its input copied per channel tile channels last
    (rather than one scalar per output column over rows of 7; see docs/notes/depthwise-conv.md). The copy is the
    input read whose channel index is not a bare iterator: the weights are IHWO, channels last already."""
    block, n = sch.get(main), spatial_count(sch, main)
    row = n - 1
    cols, rows, _ = _channel_tile(ext, n, col, row, width, tile_elems(target) // width, target, write_dtype(sch, main))
    cols = knobs.choose(sch, Knob.COLS, _col_candidates(ext[col], width, cols), cols)
    rows = knobs.choose(sch, Knob.ROWS, _fitting_rows(ext[row], cols // width, target.vector_registers, rows), rows)
    var = block.iter_vars[col].var
    (pack,) = [i for i, r in enumerate(block.reads) if not any(rg.min.same_as(var) for rg in r.region)]
    dim = next(d for d, rg in enumerate(block.reads[pack].region) if var in vars_in(rg.min))
    perm = tuple(d for d in range(len(block.reads[pack].region)) if d != dim) + (dim,)
    return Tiling(col, cols, row, rows, None, 1, pack, perm, per_tile=True)


def _channels_last_window(block, n: int, ext: list[int], col: int, row: int) -> int | None:
    """The input elements per channel that one output row of a channels-last depthwise conv reads (its window's rows
    times the input columns the output row spans), None for other reductions: every operand is read per channel
    (the vector axis, the last), none is shared by the output columns (`row`), and the reduction is a window."""
    if col != n - 1 or prod(ext[n:]) == 1 or not _per_channel(block, col) or _row_operands(block, col):
        return None
    reads = _reads_using(block, row)
    if len(reads) != 1 or len(reads[0].region) < 3:
        return None
    rows = prod(ext[n:]) // ext[-1]  # the window's rows (and its channel axis, of one channel)
    column = reads[0].region[-2].min
    stride = index_step(column, block.iter_vars[row].var) or 1
    dilation = index_step(column, block.iter_vars[-1].var) or 1
    return rows * ((ext[row] - 1) * stride + (ext[-1] - 1) * dilation + 1)


def _channels_last_depthwise_tile(channels: int, columns: int, width: int, window: int,
                                  target: Target) -> tuple[int, int]:
    """(cols, rows) of a channels-last depthwise conv: two registers of channels where the input window a task
    copies for its output row (`window` bytes per channel) keeps them within half of L1 while the tile runs over
    it, else one (the whole channels, 144 of them, streamed that window from L2; see docs/notes/depthwise-conv.md);
    output columns up to half the accumulators (all of them where no divisor is that small: 7 columns), since each
    FMA loads its own input vector: more columns add registers, not reuse."""
    fits = [c for c in (2 * width, width) if channels % c == 0 and window * c <= target.l1d_bytes // 2]
    cols = fits[0] if fits else register_lanes(channels, width)
    vectors = cols // register_lanes(cols, width)
    limit = max(1, min(tile_elems(target) // width, target.vector_registers - 1 - vectors) // vectors)
    return cols, _tile_rows(columns, max(1, limit // 2), limit)


def _enough_tasks(spatial: list[int], col: int, cols: int, row: int | None, rows: int, width: int,
                  target: Target) -> int:
    """Vector tiles halved (down to one register) while the tiles make fewer parallel tasks than cores (a batch-32
    MLP's 1024 -> 10 classifier was one 32 x 10 tile on one core; see docs/notes/matmul-blocking.md)."""
    tiles = prod(-(-e // rows) if i == row else e for i, e in enumerate(spatial) if i != col)
    while cols > width and cols % 2 == 0 and tiles * -(-spatial[col] // cols) < target.num_cores:
        cols //= 2
    return cols


def _panel_tile(panel: int, rows: int, width: int, target: Target) -> tuple[int, int]:
    """(cols, rows) of a tile over a packed panel: the most FMAs per load with the vector registers left for a
    panel row and a broadcast (3 x 8 on AVX-512, 3 x 4 on AVX2: no per-tile copy competes for them)."""
    vectors = [v for v in range(1, panel // width + 1) if panel % (v * width) == 0]
    budget = target.vector_registers - 4
    # the accumulators, a panel row and a broadcast fit the registers: AVX2's 4 x 3 tile over a 32-channel panel
    # spilled every step (see docs/notes/register-tiles.md)
    tiles = [_register_tile([v], divisors(rows, budget), [1], min(budget, target.vector_registers - v - 1), False)
             for v in vectors]
    v, r, _ = max(tiles, key=lambda t: (_fmas_per_load(t, False), t[0]))
    return v * width, r


def _fitting_rows(extent: int, vectors: int, registers: int, default: int) -> list[int]:
    """Register rows the tuner may try: divisors of the axis (up to MAX_ROWS) whose tile of `vectors` accumulators
    per row fits in the register file, and the default."""
    return sorted({r for r in divisors(extent, MAX_ROWS) if r * vectors <= registers} | {default})


def _default_tile(ext: list[int], n: int, col: int, row: int | None, row2: int | None, in_vector: bool, width: int,
                  target: Target, dtype: str, reuse: bool) -> tuple[int, int, int]:
    """The hand-written (cols, rows, rows2): matmul-like tiles take the widest vector tile and the rows that fill the
    accumulator budget; conv tiles (over channels, or with a second row axis) the most FMAs per load. Without
    `reuse` (no operand is shared by the rows: a depthwise conv), a tile spans whole output rows, so each task reads
    and writes contiguous memory (see docs/notes/depthwise-conv.md)."""
    if row is None or (row2 is None and col == n - 1):
        lanes_ = register_lanes(ext[col], width)
        whole = not reuse and lanes_ >= min(4, width) and ext[col] // lanes_ <= tile_elems(target) // width
        cols = ext[col] if whole else _tile_cols(ext[col], width)
        if reuse:
            cols = _panel_in_l1(cols, prod(ext[n:]), width, dtype, target)
        # accumulators count in registers: 28 columns take 7 xmm registers, not 28/16 of a zmm one
        regs = cols // register_lanes(cols, width)
        # the accumulators, a row of vectors and a broadcast in registers: AVX2's 4 x 3 tile spilled (see
        # docs/notes/register-tiles.md)
        budget = max(1, min(tile_elems(target) // width, target.vector_registers - 1 - regs) // regs)
        # rows that share an operand may also take the registers its loads leave (a row of vectors, a broadcast)
        limit = (target.vector_registers - 2) // regs - 1 if reuse else budget
        return cols, (_tile_rows(ext[row], budget, limit) if row is not None else 1), 1
    budget = tile_elems(target) // width
    if col != n - 1:
        return _channel_tile(ext, n, col, row, width, budget, target, dtype)
    # over output columns the widest vector tile that divides them, as matmul, in registers of the lanes that divide it
    cols = _tile_cols(ext[col], width)
    lanes_ = register_lanes(cols, width)
    rows2 = divisors(ext[row2], budget) if row2 is not None else [1]
    v, r, r2 = _register_tile([cols // lanes_], divisors(ext[row], budget), rows2, budget, in_vector)
    return v * lanes_, r, r2


def _panel_in_l1(cols: int, reduce_elems: int, width: int, dtype: str, target: Target) -> int:
    """The vector tile halved, down to two registers, while its panel of the vector operand (the reduction's elements
    times the tile) takes more than half of L1: the panel is read again for every row tile (see
    docs/notes/register-tiles.md)."""
    while cols % (4 * width) == 0 and reduce_elems * cols * DataType(dtype).bits // 8 > target.l1d_bytes // 2:
        cols //= 2
    return cols


def _channel_tile(ext: list[int], n: int, col: int, row: int, width: int, budget: int, target: Target,
                  dtype: str) -> tuple[int, int, int]:
    """A conv tile over output channels: up to CpuModel.channel_vectors weight vectors times the output columns that fill the
    accumulators, in one output row. A 1x1 conv's step is one weight load per vector and a broadcast per column, so
    its accumulators take all registers but those (2 x 14 on AVX-512); wider windows keep the default budget (2 x 7;
    see docs/notes/register-tiles.md)."""
    one_by_one = all(e == 1 for e in ext[n + 1 :])

    def rows(v: int) -> int:
        accumulators = target.vector_registers - v - 2 if one_by_one else budget - 2
        return _tile_rows(ext[row], max(1, accumulators // v))

    # the most accumulators, then the most vectors: 13 output columns take 1 vector x 13, not 2 x 1
    v = max(_channel_vectors(ext[col], prod(ext[n:]), width, target.model.channel_vectors, dtype, target),
            key=lambda v: (v * rows(v), v))
    return v * width, rows(v), 1


def _second_row_axis(block, n: int, ext: list[int], col: int, row: int) -> tuple[int | None, bool]:
    """A spatial axis besides the vector and row axes that only one of their operands depends on (a conv's output
    rows), and whether that is the vector operand; (None, False) when there is none."""
    vec, rows = _reads_using(block, col), _reads_using(block, row)
    for axis in reversed(range(n)):
        reads = _reads_using(block, axis)
        if axis in (col, row) or ext[axis] == 1 or not reads:
            continue
        if all(r in vec for r in reads) != all(r in rows for r in reads):
            return axis, all(r in vec for r in reads)
    return None, False


def _reads_using(block, axis: int) -> list:
    """The block's reads whose index uses the iterator of `axis`."""
    var = block.iter_vars[axis].var
    return [r for r in block.reads if any(var in vars_in(rg.min) for rg in r.region)]


def _vector_axis(sch: Schedule, knobs: Knobs, block, n: int, ext: list[int], width: int) -> int:
    """The output's contiguous axis, or an earlier one whose operand can be packed (a conv's output channels, over
    its weight) when the contiguous axis's operand cannot (a conv's input, read at i*stride+k) or that axis is not a
    whole number of vectors (a 14x14 conv's rows): direct convolutions vectorize over channels. The tuner may pick
    either where both exist; the accumulator tile is laid out with the vector axis last."""
    last = n - 1
    last_reads = _reads_using(block, last)
    if ext[last] % width == 0 and (_packable(block, n, last, last_reads)[0] is not None
                                   or _panel_width(block, last, last_reads)):
        return last
    # (not a symbolic axis: its last vector tile would be guarded)
    reads = {c: _reads_using(block, c) for c in range(last)
             if register_lanes(ext[c], width) >= width // 2 and not _whole(sch, block, c)}
    channel = [c for c, rs in reads.items() if not any(r in last_reads for r in rs)
               and (_packable(block, n, c, rs)[0] is not None or _panel_width(block, c, rs))]
    if not channel:
        return last
    contiguous = ext[last] % width == 0 and _unit_stride(block.iter_vars[last].var, last_reads)
    return knobs.choose(sch, Knob.VECTOR_AXIS, [last, channel[-1]], last if contiguous else channel[-1])


def _unit_stride(var, reads: list) -> bool:
    """Whether each read's innermost index steps by at most one element per step of `var`: vector loads, not the
    gathers of a strided conv's input (see docs/notes/register-tiles.md)."""
    return all(index_step(r.region[-1].min, var) in (0, 1) for r in reads)


def _panel_width(block, col: int, vec_reads: list) -> int:
    """The width of the column panels the vector operand is stored in ([N / p, K, p], indexed [j // p, k, j % p]: a
    matmul_packed's constant weights, its y_panel), 0 when it is not."""
    if len(vec_reads) != 1:
        return 0
    last = vec_reads[0].region[-1].min
    var = block.iter_vars[col].var
    if isinstance(last, tirx.FloorMod) and last.a.same_as(var) and isinstance(last.b, tirx.IntImm):
        return int(last.b)
    return 0


def _packable(block, n: int, col: int, vec_reads: list) -> tuple[int | None, tuple[int, ...]]:
    """The vector operand worth packing: read through plain iterators, some of them reduced and none of them the
    row axis (so a panel serves every row tile); returns its read index and the dims permutation."""
    if len(vec_reads) != 1:
        return None, ()
    region = vec_reads[0].region
    ivars = [iv.var for iv in block.iter_vars]
    index = [region[d].min for d in range(len(region))]
    if not all(i in ivars and int(region[d].extent) == 1 for d, i in enumerate(index)):
        return None, ()
    if not any(ivars.index(i) >= n for i in index):
        return None, ()
    p = index.index(ivars[col])
    perm = tuple(d for d in range(len(index)) if d != p) + (p,)
    return list(block.reads).index(vec_reads[0]), perm


def schedule(sch: Schedule, target: Target, knobs: Knobs = DEFAULT) -> None:
    """Tile the reduction into register blocks, fold the epilogue into the write-back, parallelize the tiles."""
    main = single_reduction(sch)
    producers = {sch.get(b).name_hint for b in sch.get_producers(main)}
    # the reduction's producers (e.g. padding) stay stages: inlined, they would put a branch in the inner loop
    inline_all(sch, keep=lambda b: sch.get(b).name_hint in producers)
    tiling = plan(sch, main, target, knobs)
    width = lanes(write_dtype(sch, main), target)
    view = _padded_view(sch, main)
    write_back = view or sch.cache_write(main, 0, "global")
    _vector_axis_last(sch, main, tiling)
    reverse_inline_all(sch, write_back)
    flat = view is not None and _reads_flat(sch, main, view)
    if flat:
        _flat_rows(sch, main, write_back)
    others = {b.name_hint for b in map(sch.get, blocks(sch))} - {sch.get(write_back).name_hint}
    outside = _outside(sch, knobs, main, tiling, target)
    par, row_outer, loops = _tile(sch, main, tiling, target, knobs, outside)
    pack_outer = tiling.pack is not None and (row_outer is not None or tiling.per_tile)
    if pack_outer:
        _pack(sch, main, tiling, par, width)
    elif tiling.pack is not None and tiling.pack_transposes:
        _pack_once(sch, main, tiling, target)
    # the blocks still to schedule: producers and epilogues that were there before packing (not inlined by it)
    stages = [b for b in blocks(sch) if sch.get(b).name_hint in others and not is_reduction(sch, b)]
    # a symbolic kernel's row tiles may run inside its parallel loop (see _static_parallel): the write-back goes there;
    # a view of whole NCHW rows writes them after all its row tiles (per tile, its rows are 5 guarded columns)
    inside = (pack_outer or NOMINAL_SIZES in sch.mod["main"].attrs) and (view is None or flat)
    if not outside.chunk:  # else the write-back follows the last chunk, a pass of its own
        at = row_outer if inside and row_outer is not None else par
        sch.reverse_compute_at(write_back, at)
        stages = _epilogues_at(sch, write_back, at, stages, width)
    stages = _producer_at_tile(sch, knobs, main if tiling.col == spatial_count(sch, main) - 1 else None, par, stages,
                               producers, width)
    sch.parallel(par)
    unroll(sch, knobs, par, TILED_UNROLL_STEPS)
    if outside.chunk:
        injective(sch, write_back, target)
    else:
        _vectorize_write_back(sch, write_back, tiling, width)
    *reduce_loops, inner_row2, inner_row, inner_col = loops
    for inner in (inner_row2, inner_row):
        if inner is not None:
            sch.unroll(inner)
    vectorize_registers(sch, inner_col, tiling.cols, width)
    if tiling.cols <= register_lanes(tiling.cols, width) and tiling.rows * tiling.rows2 > target.vector_registers // 2:
        sch.annotate(main, NO_PARTIAL_UNROLL, 1)  # one vector and many broadcasts a step: unrolled, they spill
    init = sch.decompose_reduction(main, reduce_loops[0])
    if outside.chunk:  # the init runs before the first chunk, over the tiles: in parallel, inside the batch loops
        sch.parallel(sch.get_loops(init)[len(outside.batches)])
    vectorize_innermost(sch, init, width)
    for stage in stages:  # producers (padding) and epilogues TVM would not inline
        injective(sch, stage, target)


def _epilogues_at(sch: Schedule, write_back, loop, stages: list, width: int) -> list:
    """Attach the epilogues that read the write-back's output (a second output, such as the square an LRN takes of a
    conv's relu) to the write-back's tile, vectorized, so they read it while hot; return the other stages. A pass
    of its own read the whole output again (alexnet's and zfnet's conv + relu + square)."""
    written = sch.get(write_back).writes[0].source
    left = []
    for stage in stages:
        if _elementwise_of(sch.get(stage), written):
            try:
                compute_at_vectorized(sch, stage, loop, width)
                continue
            except ScheduleError:  # a consumer whose reads the tile cannot cover stays a pass of its own
                pass
        left.append(stage)
    return left


def _elementwise_of(block, buffer) -> bool:
    """Whether a block reads only `buffer`, each element where it writes its own (a tile of it then computes the
    tile's elements of the block; a shifted or transposed read would need other tiles')."""
    if [r.source.same_as(buffer) for r in block.reads] != [True]:
        return False
    read, (write,) = block.reads[0].region, block.writes
    analyzer = tvm.sym.Analyzer()
    for iv in block.iter_vars:  # a unit axis is its one value (the batch: x[0, c] is read where y[n, c] is written)
        analyzer.bind(iv.var, tvm.ir.Range.from_min_extent(iv.dom.min, iv.dom.extent))
    return len(read) == len(write.region) and all(analyzer.can_prove_equal(a.min, b.min)
                                                  for a, b in zip(read, write.region, strict=True))


def writes_past_its_view(sch: Schedule) -> bool:
    """Whether the single reduction computes rows past those its sole consumer reads (see _padded_view)."""
    main = single_reduction(sch)
    return main is not None and _padded_view(sch, main) is not None


def _padded_view(sch: Schedule, main):
    """The sole consumer of an intermediate the reduction computes in whole tiles past the rows it reads (a
    channels-last 1x1 conv's pixels, see PIXEL_TILE), which then writes the accumulators back: inlined into a
    cache_write's write-back, it would write those rows past its own buffer's end. None where there is no such one."""
    consumers = sch.get_consumers(main)
    if is_output(sch, main) or len(consumers) != 1:
        return None
    ours = sch.get(main).iter_vars[: spatial_count(sch, main)]
    theirs = sch.get(consumers[0]).iter_vars
    if not all(isinstance(iv.dom.extent, tirx.IntImm) for iv in (*ours, *theirs)):
        return None
    return consumers[0] if prod(int(iv.dom.extent) for iv in theirs) < prod(int(iv.dom.extent) for iv in ours) else None


def _reads_flat(sch: Schedule, main, view) -> bool:
    """Whether a padded view reads the reduction's output at an index that joins several of its axes (i * W + j);
    an NCHW conv's extra columns (conv2d's whole columns) are read axis by axis, and the view keeps its own order, so
    its write-back stores whole output rows, not stores of every channel a plane apart (see
    docs/notes/parallel-loops.md)."""
    read = next(r for r in sch.get(view).reads if r.source.same_as(sch.get(main).writes[0].source))
    return any(len(vars_in(rg.min)) > 1 for rg in read.region)


def _flat_rows(sch: Schedule, main, view) -> None:
    """Iterate a padded view over the index it reads the reduction's output at ([n, i, j, o] of NHWC as [n, i * W + j,
    o]): attached to the tiles, its rows are then inferred from theirs, where TVM cannot invert i * W + j."""
    block = sch.get(view)
    read = next(r for r in block.reads if r.source.same_as(sch.get(main).writes[0].source))
    index = tirx.IndexMap([iv.var for iv in block.iter_vars], [rg.min for rg in read.region], None)
    sch.transform_block_layout(view, index)


def vectorize_registers(sch: Schedule, loop, cols: int, width: int) -> None:
    """Vectorize the tile's vector loop one register at a time, unrolling over its registers: LLVM scalarizes a
    loop-carried accumulator that is not a power of two lanes wide, moving every lane through the stack (48 or 28
    lanes; see docs/notes/register-tiles.md). Registers past MAX_UNROLLED, which no register tile has (a whole
    attention row of 1500 keys in 375 registers of 4 lanes), are a loop around unrolled groups of up to a quarter
    of that: unrolled whole, their build time grew with the keys, and groups of 47 registers (3008 padded keys) in
    three stages outgrew the straight-line budget (see docs/notes/build-time-limits.md)."""
    reg = register_lanes(cols, width)
    if cols > reg:
        registers, loop = sch.split(loop, [None, reg])
        count = size(sch, sch.get(registers).extent)
        if count > MAX_UNROLLED:
            registers = sch.split(registers, [None, max(divisors(count, MAX_UNROLLED // 4))])[1]
        sch.unroll(registers)
    if cols > 1:
        sch.vectorize(loop)


def _producer_at_tile(sch: Schedule, knobs: Knobs, columns, par, stages: list, producers: set[str],
                      width: int) -> list:
    """Compute a lone producer stage (padding) per parallel tile: the tile's input lands in a small contiguous buffer,
    hot in cache (see docs/notes/parallel-loops.md), instead of a full padded copy beforehand; the tuner may
    choose the full copy. `columns` is the reduction block when it is vectorized over output columns (the stage may
    then be deinterleaved), else None. A copy of whole registers is vectorized one register of `width` lanes at a
    time: its padding test over a row of many registers (a channels-last depthwise conv's 144 channels) was
    scalarized, one insert per lane (see docs/notes/depthwise-conv.md). Returns the stages still to schedule on their
    own."""
    mine = [b for b in stages if sch.get(b).name_hint in producers]
    # the row operand of a tile over output columns is read whole by every column tile: computed once, up front
    default = int(columns is None or not _is_row_operand(sch, columns, mine[0])) if len(mine) == 1 else 1
    if len(mine) != 1 or not knobs.choose(sch, Knob.PRODUCER_AT_TILE, [0, 1], default):
        return stages
    phased = columns is not None and deinterleave(sch, columns, mine[0])
    sch.compute_at(mine[0], par)
    if phased:
        copy_in_read_order(sch, mine[0])
    else:
        *_, inner = sch.get_loops(mine[0])
        extent = extents(sch, [inner])[0]
        if extent > width and extent % width == 0:
            vectorize_registers(sch, inner, extent, width)
        else:
            vectorize_innermost(sch, mine[0], width)
    return [b for b in stages if b not in mine]


def _is_row_operand(sch: Schedule, main, stage) -> bool:
    """Whether a stage's output is the reduction's row operand (read without its vector axis, the last one)."""
    block = sch.get(main)
    return any(b.same_as(sch.get(stage).writes[0].source) for b in _row_operands(block, spatial_count(sch, main) - 1))


def _is_windowed(block, n: int, buffer) -> bool:
    """Whether the block reads `buffer` through a window: an index that adds a reduction iterator to a spatial one
    (a conv over flat pixels reads its input at pixel * stride + offset)."""
    spatial = {iv.var for iv in block.iter_vars[:n]}
    reduced = {iv.var for iv in block.iter_vars[n:] if not (isinstance(iv.dom.extent, tirx.IntImm) and iv.dom.extent == 1)}
    return any(r.source.same_as(buffer) and any(vars_in(rg.min) & spatial and vars_in(rg.min) & reduced
                                                for rg in r.region) for r in block.reads)


def _tile(sch: Schedule, main, t: Tiling, target: Target, knobs: Knobs, outside: Outside):
    """Split the axes SSRSRS-style and order the loops: parallel (other spatial, vector tiles), row tiles, outer
    reduce, middle row and vector tiles, inner reduce, second-row, row and vector tiles. Row tiles join the parallel
    loop when there are too few vector tiles. The defaults leave the middle tiles and the outer reduce at extent 1,
    but for a reduction chunked `outside`, whose outer reduce runs around all the tiles, inside the batch loops
    that run `outside` too."""
    loops = sch.get_loops(main)
    n = spatial_count(sch, main)
    col_outer, col_inner = sch.split(loops[t.col], [None, t.cols])
    panel_tiles, chunk = _panel_blocking(sch, main, t, target)
    col_outer, col_mid = _split2(sch, knobs, Knob.COL_SPLIT, col_outer, panel_tiles)
    row_outer = row_mid = row_inner = None
    if t.row is not None:
        row_outer, row_inner = sch.split(loops[t.row], [None, t.rows])
        row_outer, row_mid = _split2(sch, knobs, Knob.ROW_SPLIT, row_outer)
    row2_outer = row2_inner = None
    if t.row2 is not None:
        row2_outer, row2_inner = sch.split(loops[t.row2], [None, t.rows2])
    # the reduction stays whole inside unless chunked
    reduce_outer, reduce_inner = _split2(sch, knobs, Knob.REDUCE_SPLIT, loops[n],
                                         chunk or outside.chunk or size(sch, sch.get(loops[n]).extent))
    spatial = {i: {t.col: col_outer, t.row2: row2_outer}.get(i, loops[i]) for i in range(n) if i != t.row}
    batches = [spatial[i] for i in outside.batches]
    outer = [lp for i, lp in spatial.items() if i not in outside.batches]
    if t.col == n - 1 and _per_channel(sch.get(main), t.col):
        outer = [col_outer, *(lp for lp in outer if lp != col_outer)]
    # vectorized over channels, the spatial axes after them stay serial, so a channel tile's panel is packed once
    cut = outer.index(col_outer) + 1 if t.col != n - 1 else len(outer)
    outer, serial = outer[:cut], outer[cut:] + ([row_outer] if row_outer is not None else [])
    if t.col != n - 1 and row2_outer is not None and _tile_output_spills(sch, main, prod(extents(sch, outer)), target):
        outer, serial = [*outer[:-1], row2_outer], [col_outer, *(lp for lp in serial if lp != row2_outer)]
    rows_parallel = _rows_in_parallel(sch, main, t.col, prod(extents(sch, outer)), target,
                                      rows_in_l2=outside != INSIDE)
    if serial and knobs.choose(sch, Knob.PARALLEL_ROWS, [0, 1], int(rows_parallel)):
        block = _row_block(sch, knobs, main, t, row_outer, target) if serial == [row_outer] else 0
        if block:
            row_block, row_in = sch.split(row_outer, [None, block])
            outer, serial = [*outer[:-1], row_block, outer[-1], row_in], []
        else:
            outer, serial = outer[:-1] + serial + outer[-1:], []
    outer, serial = _static_parallel(sch, outer, serial)
    middle = [lp for lp in (row_mid, col_mid) if lp is not None]
    inner = [lp for lp in (row2_inner, row_inner, col_inner) if lp is not None]
    tiles = [*outer, *serial]
    sch.reorder(*batches, *([reduce_outer, *tiles] if outside.chunk else [*tiles, reduce_outer]), *middle,
                reduce_inner, *loops[n + 1 :], *inner)
    par = sch.fuse(*outer) if len(outer) > 1 else outer[0]
    tiled = [reduce_outer, reduce_inner, *loops[n + 1 :], row2_inner, row_inner, col_inner]
    return par, (serial[-1] if serial else None), tiled


def _per_channel(block, col: int) -> bool:
    """Whether every operand is read per vector channel, none a row operand (a channels-last depthwise conv): its
    parallel tasks then run channel tiles outermost, each core the channels its producer's (a 1x1 conv's channel
    tiles) left in its cache, rather than image rows of every channel (see docs/notes/parallel-loops.md)."""
    return len(operand_reads(block)) >= 2 and not _row_operands(block, col)


def _tile_output_spills(sch: Schedule, main, tiles: int, target: Target) -> bool:
    """Whether each channel tile's share of the output outgrows L2: its accumulators, laid out channels last, would
    reach memory before the write-back transposes them. Output rows then run in parallel, each written back while hot
    (a stem; see docs/notes/parallel-loops.md)."""
    return _output_share(sch, main, tiles) > target.l2_bytes


def _output_share(sch: Schedule, main, tiles: int) -> int:
    """Bytes of the output (the accumulators) one of `tiles` parallel tiles writes."""
    return _bytes(sch, sch.get(main).writes[0].source) // max(1, tiles)


def _rows_in_parallel(sch: Schedule, main, col: int, tiles: int, target: Target, rows_in_l2: bool) -> bool:
    """Whether row tiles should join the parallel loop rather than run serially inside each vector tile: when the
    vector tiles leave the cores unbalanced beyond IMBALANCE (3 channel tiles on 2 cores), or when a reduction
    without window reuse (a 1x1 conv, a matmul) has a row operand larger than L2, which each vector tile would read
    again from memory. Where the input is reused (3x3) or fits in L2, serial rows keep each weight panel hot. A 1x1
    conv vectorized over channels whose tile's share of the output outgrows TRANSPOSED_SHARE of L2 also runs rows in
    parallel, each row tile transposed back to NCHW while hot (see docs/notes/parallel-loops.md)."""
    if not balanced(tiles, target):
        return True
    if rows_in_l2:  # batches or reduction chunks run outside the tiles (_outside): the rows inside fit L2
        return False
    block = sch.get(main)
    n = spatial_count(sch, main)
    if col == n - 1 and any(_is_windowed(block, n, b) for b in _row_operands(block, col)):
        return True
    if any(size(sch, iv.dom.extent) > 1 for iv in block.iter_vars[n + 1 :]):
        return False
    if col != n - 1 and _output_share(sch, main, tiles) > TRANSPOSED_SHARE * target.l2_bytes:
        return True
    return any(_bytes(sch, b) > target.l2_bytes for b in _row_operands(block, col))


def balanced(tasks: int, target: Target) -> bool:
    """Whether `tasks` equal parallel tasks keep the busiest core within IMBALANCE of the average."""
    return -(-tasks // target.num_cores) * target.num_cores <= IMBALANCE * tasks


def _static_parallel(sch: Schedule, outer: list, serial: list) -> tuple[list, list]:
    """A symbolic kernel's parallel loop fuses its loops of static extent only (the first symbolic one where there
    are none), its other symbolic loops running inside: it then has as many tasks at every size (a batch of 1 still
    splits over the column tiles), where the nominal sizes chose the parallel loop for a size it may not have."""
    symbolic = [lp for lp in outer if not is_static(sch, [lp])]
    if not symbolic:
        return outer, serial
    static = [lp for lp in outer if lp not in symbolic]
    return (static, symbolic + serial) if static else (symbolic[:1], symbolic[1:] + serial)


def _outside(sch: Schedule, knobs: Knobs, main, t: Tiling, target: Target) -> Outside:
    """The batches and reduction chunks of a matmul whose row operand outgrows L2 that run outside its parallel
    tiles, so that the rows inside (one batch's, a chunk of the reduction: at most 3/4 of L2) stay hot while every
    core sweeps its columns; the accumulators stay in the output between chunks. BERT-base's FFN-down ([128, 3072] x
    [3072, 768], 1.5 MB of rows) had each vector tile stream the rows from L3, or each block of row tiles every
    panel; batch 8's [8, 128, 768] x [768, 768] streamed the panels per block of 32 rows (see
    docs/notes/matmul-blocking.md)."""
    block = sch.get(main)
    n = spatial_count(sch, main)
    rows = _row_operands(block, t.col)
    if (t.col != n - 1 or t.pack is not None or len(rows) != 1 or sch.get_producers(main)
            or any(size(sch, iv.dom.extent) > 1 for iv in block.iter_vars[n + 1 :])
            or not is_static(sch, sch.get_loops(main)) or _bytes(sch, rows[0]) <= target.l2_bytes):
        return INSIDE
    ext = [size(sch, iv.dom.extent) for iv in block.iter_vars]
    batches = tuple(i for i in range(n) if i not in (t.col, t.row) and ext[i] > 1
                    and any(r.source.same_as(rows[0]) for r in _reads_using(block, i)))
    per_batch = _bytes(sch, rows[0]) // prod(ext[i] for i in batches)
    reduced, budget = ext[n], target.l2_bytes * 3 // 4
    fits = [d for d in divisors(reduced) if (MIN_CHUNK <= d or d == reduced) and d * (per_batch // reduced) <= budget]
    if not fits or not knobs.choose(sch, Knob.OUTSIDE_TILES, [0, 1], 1):
        return INSIDE
    return Outside(batches, 0 if max(fits) == reduced else max(fits))


def _row_block(sch: Schedule, knobs: Knobs, main, t: Tiling, row_outer, target: Target) -> int:
    """Row tiles per block of parallel row tiles, 0 for one block: the vector tiles run inside each block, so each
    weight panel is read once per block rather than once per row tile, and the block's rows stay in L2
    (ROW_BLOCK_SHARE of it), rather than row tiles that each stream every panel from L3 (see
    docs/notes/matmul-blocking.md)."""
    rows = _row_operands(sch.get(main), t.col)
    tiles = size(sch, sch.get(row_outer).extent)
    if len(rows) != 1 or tiles == 1 or not is_static(sch, [row_outer]):  # symbolic tiles: no guarded blocks of them
        return 0
    per_tile = _bytes(sch, rows[0]) / tiles
    fits = [d for d in divisors(tiles) if d < tiles and d * per_tile <= target.l2_bytes * ROW_BLOCK_SHARE]
    default = max(fits, default=0)
    return knobs.choose(sch, Knob.ROW_BLOCK, sorted({0, *fits[-4:], default}), default)


def _row_operands(block, col: int) -> list:
    """The buffers a reduction block reads that do not depend on its vector axis (the row operand)."""
    vector, out = _reads_using(block, col), block.writes[0].source
    return [r.source for r in block.reads if r not in vector and not r.source.same_as(out)]


def _bytes(sch: Schedule, buffer) -> int:
    return prod(size(sch, d) for d in buffer.shape) * DataType(buffer.dtype).bits // 8


def _vector_axis_last(sch: Schedule, main, t: Tiling) -> None:
    """Lay the accumulator tile out with the vector axis last, so the register tile's vectors are contiguous."""
    write = sch.get(main).writes[0].region
    dim = next(d for d, rg in enumerate(write) if sch.get(main).iter_vars[t.col].var in vars_in(rg.min))
    if dim != len(write) - 1:
        sch.transform_layout(main, ("write", 0), lambda *ix: [*ix[:dim], *ix[dim + 1 :], ix[dim]])


def _split2(sch: Schedule, knobs: Knobs, knob: Knob, loop, inner: int = 1) -> list:
    """Split a loop in two tunable levels, by default `inner` iterations inside."""
    extent = size(sch, sch.get(loop).extent)
    return split(sch, loop, knobs.tile(sch, knob, loop, 2, [extent // inner, inner], extent))


def _panel_blocking(sch: Schedule, main, t: Tiling, target: Target) -> tuple[int, int]:
    """(vector tiles, reduced channels) per step of a conv vectorized over output channels whose vector tile is
    narrower than its weight panel (AVX2's 8-lane tiles over IHWO32 panels): the tiles of one panel run inside each
    chunk of the reduction, so each weight line fetched serves them all while the chunk's panel (3/4 of L1) stays
    hot; (1, 0) where there is no such panel. Each tile had streamed its own quarter of every line from L2 (see
    docs/notes/parallel-loops.md)."""
    block = sch.get(main)
    n = spatial_count(sch, main)
    panel = _panel_width(block, t.col, _reads_using(block, t.col))
    tiles = panel // t.cols if t.col != n - 1 and panel > t.cols and panel % t.cols == 0 else 1
    if tiles == 1 or (size(sch, block.iter_vars[t.col].dom.extent) // t.cols) % tiles:
        return 1, 0
    per_channel = prod(size(sch, iv.dom.extent) for iv in block.iter_vars[n + 1 :]) * panel
    per_channel *= DataType(write_dtype(sch, main)).bits // 8
    return tiles, max(divisors(size(sch, block.iter_vars[n].dom.extent), max(1, target.l1d_bytes * 3 // 4 // per_channel)))


def _packed_copy(sch: Schedule, main, t: Tiling):
    """A copy block of the vector operand laid out with the vector axis last (at the root, until moved)."""
    panel = sch.cache_read(main, t.pack, "global")
    if t.pack_transposes:
        sch.transform_layout(panel, ("write", 0), lambda *ix: [ix[d] for d in t.pack_perm])
    return panel


def _pack(sch: Schedule, main, t: Tiling, par, width: int) -> None:
    """Copy the vector operand's panel for this parallel tile into a contiguous buffer (vector axis last); a stage
    that only views the operand differently (a 1x1 conv's flattened input) is read through by the copy, not copied
    first."""
    panel = _packed_copy(sch, main, t)
    for stage in sch.get_producers(panel):
        if len(sch.get_consumers(stage)) == 1 and not is_reduction(sch, stage):
            with contextlib.suppress(ScheduleError):  # a stage TVM cannot substitute stays one
                sch.compute_inline(stage)
    sch.compute_at(panel, par)
    if t.pack_perm[-1] == len(t.pack_perm) - 1:  # contiguous copy: vectorize it
        vectorize_innermost(sch, panel, width)
    elif t.per_tile:  # a depthwise input's transposing copy runs in the order of what it writes: contiguous stores,
        # its padding test per pixel
        dims = [d for d, iv in enumerate(sch.get(panel).iter_vars) if size(sch, iv.dom.extent) > 1]
        loops = dict(zip(dims, sch.get_loops(panel)[-len(dims) :], strict=True))
        sch.reorder(*[loops[d] for d in t.pack_perm if d in loops])


def _pack_once(sch: Schedule, main, t: Tiling, target: Target) -> None:
    """Transpose the whole vector operand once, before the parallel loop, where row tiles run in parallel (no serial
    loop to pack a panel at): unpacked, each vector of a channel-vectorized conv would be a strided gather of weights
    (see docs/notes/register-tiles.md)."""
    injective(sch, _packed_copy(sch, main, t), target)


def _vectorize_write_back(sch: Schedule, write_back, t: Tiling, width: int) -> None:
    """Vectorize the write-back (with its epilogue) over the tile's vector axis."""
    if t.cols > 1:
        vectorize_innermost(sch, write_back, width)


@schedule_rule(TargetKind.CPU, 30)
class Matmul:
    """A matmul or conv with its epilogue: cinn's register tiles by default, the tuner may try generic multi-level
    tiling (cpu_tiling) instead."""

    def applicable(self, sch: Schedule, kind: PatternKind, target: Target, knobs: Knobs) -> bool:
        return kind == PatternKind.OUT_FUSIBLE and is_matmul(sch)

    def apply(self, sch: Schedule, target: Target, knobs: Knobs) -> None:
        # not over a padded view: cpu_tiling's cache_write write-back would store the rows past the view's end (heap
        # corruption)
        tiled = not writes_past_its_view(sch) and knobs.choose(sch, Knob.SKETCH, [0, 1], 0)
        (cpu_tiling.schedule if tiled else schedule)(sch, target, knobs)
