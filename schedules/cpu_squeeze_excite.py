"""Kernels of vector computations (fusion's vector chains): a squeeze-excite block's global pool, its fully connected
layers (1x1 convs over one pixel) with their activations, and the scale of the pooled tensor by the gate, in one
kernel rather than one per op.

Each reduction is its own loop nest at the root, vectorized over its outputs where everything it reads is
contiguous along them (a pool of channels-last pixels, a conv over IHWO weights), else over its reduction (a pool of
NCHW rows); a vector computed once and read many times (the pooled means, an activation between the layers, the
gate) stays a stage rather than being recomputed at each read; the scale runs in parallel over the tensor.
"""
from __future__ import annotations

from math import prod

from tvm.s_tir import Schedule, ScheduleError

from cinn.core.cpu_model import MIN_LANES
from cinn.core.ops import PatternKind, TargetKind
from cinn.core.target import Target
from schedules.analysis import (
    blocks,
    extents,
    inline_all,
    is_fresh,
    is_reduction,
    spatial_count,
    vars_in,
    write_dtype,
)
from schedules.cpu_common import PARALLEL_MIN, index_step, injective, lanes, register_lanes
from schedules.knobs import DEFAULT, Knobs
from schedules.registry import schedule_rule

ACCUMULATORS = 4  # output vectors a reduction step updates: independent FMA chains that hide the FMA's latency


def applicable(sch: Schedule) -> bool:
    """Two or more fresh reductions, each of a batch of pooled vectors (_pooled_vectors)."""
    reductions = [b for b in blocks(sch) if is_reduction(sch, b)]
    return len(reductions) >= 2 and all(is_fresh(sch, b) and _pooled_vectors(sch, b) for b in reductions)


def schedule(sch: Schedule, target: Target, knobs: Knobs = DEFAULT) -> None:
    """Inline what each value's readers would not recompute, then schedule every block at the root in turn."""
    inline_all(sch, keep=lambda b: _recomputed(sch, b))
    for block in blocks(sch):
        if is_reduction(sch, block):
            _reduction(sch, block, target)
        else:
            injective(sch, block, target, knobs)


def _recomputed(sch: Schedule, block) -> bool:
    """Whether inlining the block would compute it more often: a reader iterates more than it does (a conv reads
    each input channel once per output channel, the scale reads the gate once per pixel)."""
    own = prod(extents(sch, sch.get_loops(block)))
    return any(prod(extents(sch, sch.get_loops(c))) > own for c in sch.get_consumers(block))


def _pooled_vectors(sch: Schedule, block) -> bool:
    """Whether a reduction computes a batch of pooled vectors: after the first (the batch), every output axis but
    one is 1, and one at least (a map pooled to one pixel; two matmuls in a row are no such chain)."""
    rest = extents(sch, sch.get_loops(block))[1 : spatial_count(sch, block)]
    return 1 in rest and rest.count(1) >= len(rest) - 1


def _reduction(sch: Schedule, block, target: Target) -> None:
    """Vector lanes over the outputs where the reads allow it (_over_outputs), else over the reduction: lane-wise
    partial sums per output (rfactor), parallel over the outputs."""
    axis = _output_axis(sch, block, target)
    if axis is not None:
        _over_outputs(sch, block, axis, target)
        return
    work = prod(extents(sch, sch.get_loops(block)))
    n = spatial_count(sch, block)
    partial = _partial_sums(sch, block, target)
    # the loops of its outputs: after rfactor, all but the lanes the block now sums
    loops = sch.get_loops(block)[: -1 if partial is not None else n]
    par = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    if work >= PARALLEL_MIN:
        sch.parallel(par)
    if partial is not None:
        sch.compute_at(partial, par)
        *_, lane, step = sch.get_loops(partial)  # its lanes, then the reduction's steps
        sch.reorder(step, lane)
        sch.vectorize(lane)  # before decompose_reduction, after which the update alone is no reduction
        init = sch.decompose_reduction(partial, step)
        sch.vectorize(sch.get_loops(init)[-1])


def _partial_sums(sch: Schedule, block, target: Target):
    """The block's reduction split into lane-wise partial sums (rfactor) over the widest register whose lanes divide
    it (4 lanes over a 14x14 map's 196 pixels), then summed over the lanes; None where no register of MIN_LANES
    divides it or TVM cannot factor the reducer."""
    reduce_loops = sch.get_loops(block)[spatial_count(sch, block) :]
    width = register_lanes(prod(extents(sch, reduce_loops)), lanes(write_dtype(sch, block), target))
    if width < MIN_LANES:
        return None
    fused = sch.fuse(*reduce_loops) if len(reduce_loops) > 1 else reduce_loops[0]
    _, lane = sch.split(fused, [None, width])
    try:
        return sch.rfactor(lane, factor_axis=0)
    except ScheduleError:
        return None


def _output_axis(sch: Schedule, block, target: Target) -> int | None:
    """The innermost output axis above 1 along which every read is contiguous or does not vary, over whole registers
    of at least MIN_LANES lanes; None otherwise (a pool of NCHW rows would gather one element per channel)."""
    n = spatial_count(sch, block)
    ext = extents(sch, sch.get_loops(block))
    axes = [d for d in range(n) if ext[d] > 1]
    if not axes or register_lanes(ext[axes[-1]], lanes(write_dtype(sch, block), target)) < MIN_LANES:
        return None
    var = sch.get(block).iter_vars[axes[-1]].var
    out = sch.get(block).writes[0].source
    reads = [[rg.min for rg in r.region] for r in sch.get(block).reads if not r.source.same_as(out)]
    return axes[-1] if all(_contiguous_or_broadcast(index, var) for index in reads) else None


def _contiguous_or_broadcast(index: list, var) -> bool:
    """Whether a read steps by one element along `var` in its last dim and by none in the others, or not at all."""
    used = [var in vars_in(i) for i in index]
    return not any(used) or (not any(used[:-1]) and index_step(index[-1], var) == 1)


def _over_outputs(sch: Schedule, block, axis: int, target: Target) -> None:
    """Each reduction step updates up to ACCUMULATORS vectors of outputs, a chunk of them per parallel task."""
    loops = sch.get_loops(block)
    n = spatial_count(sch, block)
    work = prod(extents(sch, loops))
    extent = extents(sch, loops)[axis]
    width = register_lanes(extent, lanes(write_dtype(sch, block), target))
    vectors = max(v for v in range(1, ACCUMULATORS + 1) if extent // width % v == 0)
    outer, regs, lane = sch.split(loops[axis], [None, vectors, width])
    sch.reorder(*loops[:axis], outer, *loops[axis + 1 : n], *loops[n:], regs, lane)
    par = sch.fuse(*loops[:axis], outer) if axis else outer
    if work >= PARALLEL_MIN and extents(sch, [par])[0] > 1:
        sch.parallel(par)
    sch.unroll(regs)
    sch.vectorize(lane)
    init = sch.decompose_reduction(block, loops[n])
    sch.vectorize(sch.get_loops(init)[-1])


@schedule_rule(TargetKind.CPU, 44)
class SqueezeExcite:
    """A vector chain (a squeeze-excite block's pool, gate convs and scale): each stage at the root, vectorized."""

    def applicable(self, sch: Schedule, kind: PatternKind, target: Target, knobs: Knobs) -> bool:
        return kind == PatternKind.OUT_FUSIBLE and applicable(sch)

    def apply(self, sch: Schedule, target: Target, knobs: Knobs) -> None:
        schedule(sch, target, knobs)
