"""Block classification helpers shared by the schedules."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import prod

import tvm_ffi
from tvm import tirx
from tvm.s_tir import Schedule, ScheduleError
from tvm.s_tir.schedule.analysis import is_output_block
from tvm.tirx.analysis import undefined_vars

from cinn.core.ops.common import same_dims
from cinn.core.ops.te_util import dim_at

REDUCE_ITER = 2  # tvm IterVar.CommReduce
# a symbolic kernel's PrimFunc attribute: the sizes of its symbols its schedule is chosen for (its loops and tiles
# stay valid at every size: splits of symbolic loops guard their last tile)
NOMINAL_SIZES = "cinn.nominal_sizes"
# and of one whose default schedule does not apply at symbolic sizes: it got the plain loop nest instead
PLAIN_SCHEDULE = "cinn.plain_schedule"


@dataclass(frozen=True)
class StraightLine:
    """The straight-line code a scheduled kernel asks LLVM to compile, which its build time grows with: the lanes of
    its widest vectorized loop, the steps of its longest unrolled one, and its stores counted once per lane and
    unrolled step (times the extents of the vectorized and unrolled loops around each one)."""

    widest_vector: int
    longest_unroll: int
    unrolled_stores: int


def straight_line(func) -> StraightLine:
    """The StraightLine of a scheduled PrimFunc (a symbolic loop counts as one step)."""
    around: list[int] = []
    longest = {tirx.ForKind.VECTORIZED: 1, tirx.ForKind.UNROLLED: 1}
    stores = 0

    def loop(node, visitor) -> None:
        extent = int(node.extent) if node.kind in longest and isinstance(node.extent, tirx.IntImm) else 1
        if node.kind in longest:
            longest[node.kind] = max(longest[node.kind], extent)
        around.append(extent)
        visitor.default_visit(node)
        around.pop()

    def store(node, visitor) -> None:
        nonlocal stores
        stores += prod(around)

    tvm_ffi.structural_visit(func, [(tirx.For, loop), (tirx.BufferStore, store)])
    return StraightLine(longest[tirx.ForKind.VECTORIZED], longest[tirx.ForKind.UNROLLED], stores)


def blocks(sch: Schedule) -> list:
    """The child blocks of the root, in program order."""
    return list(sch.get_child_blocks(sch.get_sblock("root")))


def is_reduction(sch: Schedule, block) -> bool:
    """Whether the block has a reduction iterator."""
    return any(iv.iter_type == REDUCE_ITER for iv in sch.get(block).iter_vars)


def single_reduction(sch: Schedule):
    """The group's single reduction block (a matmul's or conv's), or None when it has none or several."""
    found = [b for b in blocks(sch) if is_reduction(sch, b)]
    return found[0] if len(found) == 1 else None


def is_output(sch: Schedule, block) -> bool:
    """Whether the block writes a function parameter (a kernel output)."""
    return is_output_block(sch, block)


def size(sch: Schedule, expr) -> int:
    """A loop extent or buffer dim as an int: a symbolic kernel's at its nominal sizes (see NOMINAL_SIZES)."""
    return dim_at(expr, {} if isinstance(expr, int | tirx.IntImm) else sch.mod["main"].attrs[NOMINAL_SIZES])


def is_static(sch: Schedule, loops) -> bool:
    """Whether loops have constant extents (a symbolic kernel's may not)."""
    return all(isinstance(sch.get(loop).extent, tirx.IntImm) for loop in loops)


def split(sch: Schedule, loop, factors: Sequence) -> list:
    """sch.split, where a symbolic loop's outer factor is left to TVM (the factors chosen at its nominal size do not
    multiply to its extent): its last tile is guarded."""
    return sch.split(loop, factors if is_static(sch, [loop]) else [None, *factors[1:]])


def extents(sch: Schedule, loops) -> list[int]:
    """Extents of loops (a symbolic kernel's at its nominal sizes)."""
    return [size(sch, sch.get(loop).extent) for loop in loops]


def is_fresh(sch: Schedule, block) -> bool:
    """Whether the block's loops still map 1:1, in order, onto its iterators (as te.create_prim_func makes them)."""
    loops = sch.get_loops(block)
    iters = sch.get(block).iter_vars
    return len(loops) == len(iters) and extents(sch, loops) == [size(sch, iv.dom.extent) for iv in iters]


def spatial_count(sch: Schedule, block) -> int:
    """The number of leading spatial iterators (te puts reduce iterators last)."""
    iters = sch.get(block).iter_vars
    n = 0
    while n < len(iters) and iters[n].iter_type != REDUCE_ITER:
        n += 1
    return n


def vars_in(expr) -> set:
    """The variables an index expression uses."""
    return set(undefined_vars(expr))


def is_matmul(sch: Schedule) -> bool:
    """A matmul or conv: one fresh reduction block with spatial and reduce iterators whose last spatial iterator
    indexes the output's last dimension."""
    main = single_reduction(sch)
    if main is None or not is_fresh(sch, main):
        return False
    n = spatial_count(sch, main)
    block = sch.get(main)
    if n == 0 or n == len(block.iter_vars) or len(block.writes) != 1:
        return False
    last = block.writes[0].region[-1].min
    return vars_in(last) == {block.iter_vars[n - 1].var}


def operand_reads(block) -> list:
    """A reduction block's reads of its operands: not its own accumulator, and not 0-d scalars (a broadcast value
    indexes no axis, so it says nothing about strides or contiguity)."""
    return [r for r in block.reads if not r.source.same_as(block.writes[0].source) and len(r.region)]


def is_gemv(sch: Schedule) -> bool:
    """One reduction block with a single non-unit spatial axis whose operands are all contiguous along the reduction
    (a batch-1 fully connected layer with [N, K] weights): a dot product per output, not a register tile."""
    main = single_reduction(sch)
    if main is None or not is_fresh(sch, main):
        return False
    block = sch.get(main)
    n = spatial_count(sch, main)
    reduced = {iv.var for iv in block.iter_vars[n:]}
    operands = operand_reads(block)
    return (sum(size(sch, iv.dom.extent) > 1 for iv in block.iter_vars[:n]) == 1 and bool(operands)
            and all(vars_in(r.region[-1].min) & reduced for r in operands))


def output_anchor(sch: Schedule):
    """The single output block, or None."""
    outs = [b for b in blocks(sch) if is_output(sch, b)]
    return outs[0] if len(outs) == 1 else None


def _nonunit(values: list[int]) -> list[int]:
    return [v for v in values if v != 1]


def row_depth(sch: Schedule, anchor) -> int | None:
    """How many leading anchor loops are rows: the non-unit spatial extents of every reduction block must equal
    the anchor's leading extents, and the rest of the anchor must be reduced. None when they disagree."""
    anchor_ext = extents(sch, sch.get_loops(anchor))
    if is_reduction(sch, anchor):
        anchor_ext = anchor_ext[: spatial_count(sch, anchor)]
    depth = None
    for block in blocks(sch):
        if not is_reduction(sch, block):
            continue
        if not is_fresh(sch, block):
            return None
        spatial = _nonunit(extents(sch, sch.get_loops(block))[: spatial_count(sch, block)])
        d = len(spatial)
        while d <= len(anchor_ext) and _nonunit(anchor_ext[:d]) != spatial:
            d += 1
        if d > len(anchor_ext) or (depth is not None and depth != d):
            return None
        depth = d
    return depth


def is_row_reduction(sch: Schedule, per_row_work: bool = True) -> bool:
    """One fresh output block whose leading loops are the rows of every reduction (at least one row loop); with
    `per_row_work`, the output block also has work inside a row (it reduces, or has loops besides the rows)."""
    anchor = output_anchor(sch)
    if anchor is None or not is_fresh(sch, anchor):
        return False
    depth = row_depth(sch, anchor)
    if depth is None or depth == 0:
        return False
    return not per_row_work or is_reduction(sch, anchor) or depth < len(sch.get_loops(anchor))


def row_stage(sch: Schedule, block) -> bool:
    """Whether a row schedule keeps a spatial block as a stage (computed once per row) instead of inlining it: several
    blocks read it and it has loops. A block without loops is a scalar (the epsilon that two fused layer norms share,
    folded in as a constant): inlined it costs one expression per use, and as a stage it would sit at the root outside
    every loop, which rfactor cannot step over (TVM fails `block_realize == old_block_realize_`)."""
    return len(sch.get_consumers(block)) > 1 and bool(sch.get_loops(block))


# Characters of TIR text a producer may put into its consumers by inlining: an expression read k times by its
# consumer is copied k times, so chained polynomial forms grew exponentially (three tanh-GELUs in a row, each reading
# its input 9 times, took minutes to build; see docs/notes/build-time-limits.md); past this the producer stays a stage.
INLINE_MAX_CHARS = 12_000


def inline_all(sch: Schedule, keep=lambda block: False) -> None:
    """Inline every non-output spatial block (except those `keep` holds, and those whose inlining would copy a
    large expression many times) into its consumers, where TVM allows."""
    changed = True
    while changed:
        changed = False
        for block in blocks(sch):
            if is_output(sch, block) or is_reduction(sch, block) or keep(block) or _inline_too_large(sch, block):
                continue
            try:
                sch.compute_inline(block)
                changed = True
            except ScheduleError:  # e.g. a producer TVM cannot substitute (opaque access) stays a stage
                continue


def _inline_too_large(sch: Schedule, block) -> bool:
    """Whether inlining the block would copy more than INLINE_MAX_CHARS of expression into its consumers."""
    stmt = sch.get(block)
    size = len(str(stmt.body))
    if size * 2 <= INLINE_MAX_CHARS:  # cheap enough even if read twice: skip the text scan of the consumers
        return False
    name = stmt.writes[0].source.name
    uses = sum(str(sch.get(c).body).count(f"{name}[") for c in sch.get_consumers(block))
    return size * uses > INLINE_MAX_CHARS


def reverse_inline_all(sch: Schedule, block) -> None:
    """Inline the elementwise consumers of `block` into it, one after another, while TVM allows."""
    while True:
        consumers = list(sch.get_consumers(block))
        if len(consumers) != 1 or is_output(sch, block) or not _same_symbolic_domain(sch, block, consumers[0]):
            return
        try:
            sch.reverse_compute_inline(consumers[0])
        except ScheduleError:  # a consumer that is not elementwise in this block's output stays a stage
            return


def _same_symbolic_domain(sch: Schedule, producer, consumer) -> bool:
    """Whether a consumer of symbolic extents covers exactly its producer's domain: TVM inlines one that covers part
    of it (a symbolic matmul's padded rows) without guarding the rest, writing past the consumer's buffer."""
    ours, theirs = (tuple(iv.dom.extent for iv in sch.get(b).iter_vars) for b in (producer, consumer))
    if all(isinstance(e, tirx.IntImm) for e in (*ours, *theirs)):
        return True
    spatial = [e for e, iv in zip(ours, sch.get(producer).iter_vars, strict=True) if iv.iter_type != REDUCE_ITER]
    return same_dims(spatial, theirs)


def write_dtype(sch: Schedule, block) -> str:
    """The dtype of the (first) buffer a block writes."""
    return str(sch.get(block).writes[0].source.dtype)


def compute_at_row(sch: Schedule, anchor, depth: int) -> tuple:
    """Fuse the anchor's leading `depth` loops into one row loop and compute every other block inside it.

    Returns the row loop and the other blocks (in program order)."""
    loops = sch.get_loops(anchor)
    row = sch.fuse(*loops[:depth]) if depth > 1 else loops[0]
    anchor_name = sch.get(anchor).name_hint
    others = [b for b in blocks(sch) if sch.get(b).name_hint != anchor_name]
    for block in reversed(others):  # consumers first, so each producer lands before its consumers in the row
        sch.compute_at(block, row, preserve_unit_loops=True)
    return row, others
