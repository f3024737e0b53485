"""Generic GPU scheduling steps: every block bound to blockIdx/threadIdx, shared by the specialised CUDA schedules.

A PrimFunc left with an unbound block compiles for CUDA as host code without complaint, so every path here ends
with each block under a thread binding; `unbound_blocks` lets the build check that.
"""
from __future__ import annotations

from math import prod

import tvm
from tvm.s_tir import Schedule, ScheduleError

from cinn.core.ops import PatternKind, TargetKind
from cinn.core.target import Target
from schedules.analysis import blocks, extents, inline_all, is_reduction, spatial_count, write_dtype
from schedules.knobs import DEFAULT, Knob, Knobs
from schedules.registry import FALLBACK, schedule_rule

THREADS = 256  # threads per block for injective kernels and cross-thread reductions
WARP = 32
VECTOR = 4  # float4 loads/stores: 16 bytes per thread per access
VECTOR_DTYPES = ("float32",)  # dtypes whose 4-lane vectors CUDA has as one 16-byte type
NO_CROSS_THREAD = ("bool",)  # TVM's cross-thread all-reduce has no identity element for logical and/or
CROSS_THREAD_MIN = 64  # reduce extent from which threads share one output's reduction
FEW_OUTPUTS = 2048  # outputs below which a thread per output leaves the GPU mostly idle
TWO_STAGE_MIN = 8192  # reduce extent per output from which a single block is too little parallelism
STAGE_BLOCKS = 64  # blocks of the first stage of a two-stage reduction
TUNE_THREADS = (64, 128, 256, 512, 1024)  # block sizes the tuner may pick


def threads_for(extent: int, cap: int = THREADS) -> int:
    """A whole number of warps covering `extent` threads, at most `cap`."""
    return min(cap, max(WARP, -(-extent // WARP) * WARP))


def tuned_threads(sch: Schedule, knobs: Knobs, extent: int) -> int:
    """Threads per block for `extent` parallel items: a whole number of warps (threads_for) or a tuned count."""
    default = threads_for(extent)
    options = {t for t in TUNE_THREADS if t <= max(WARP, extent)} | {default}
    return knobs.choose(sch, Knob.THREADS, sorted(options), default)


def generic(sch: Schedule, target: Target, knobs: Knobs = DEFAULT) -> None:
    """Inline producers, then bind every remaining block: injective ones over threads, reductions per output or
    across threads."""
    inline_all(sch)
    for block in blocks(sch):
        if is_reduction(sch, block):
            reduction(sch, block, knobs)
        else:
            injective(sch, block, knobs)


def injective(sch: Schedule, block, knobs: Knobs = DEFAULT) -> None:
    """Fuse a spatial block's loops and split them into blocks of THREADS threads (float4 lanes when aligned)."""
    loops = sch.get_loops(block)
    fused = _fuse(sch, block, loops)
    extent = int(sch.get(fused).extent)
    aligned = write_dtype(sch, block) in VECTOR_DTYPES and extent % (VECTOR * WARP) == 0
    lanes = knobs.choose(sch, Knob.VECTOR, [1, VECTOR], VECTOR) if aligned else 1
    threads = tuned_threads(sch, knobs, extent // lanes)
    if lanes > 1:
        bx, tx, vec = sch.split(fused, [None, threads, lanes])
        sch.vectorize(vec)
    else:
        bx, tx = sch.split(fused, [None, threads])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")


def reduction(sch: Schedule, block, knobs: Knobs = DEFAULT) -> None:
    """Bind a fresh reduction block: a thread per output when there are many outputs or short reductions, a block
    per output with a cross-thread reduction when there are few, and two stages when even that is too serial."""
    loops = sch.get_loops(block)
    n = spatial_count(sch, block)
    outputs, reduce = prod(extents(sch, loops[:n])), prod(extents(sch, loops[n:]))
    if reduce < CROSS_THREAD_MIN or outputs >= FEW_OUTPUTS or not cross_thread_ok(sch, block):
        spatial = _fuse(sch, block, loops[:n])
        bx, tx = sch.split(spatial, [None, tuned_threads(sch, knobs, outputs)])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
        return
    if reduce >= TWO_STAGE_MIN and outputs * STAGE_BLOCKS <= FEW_OUTPUTS and _two_stage(sch, block):
        return
    cross_thread(sch, block, _fuse(sch, block, loops[:n]) if n else None, loops[n:], knobs)


def cross_thread_ok(sch: Schedule, block) -> bool:
    """Whether TVM can lower the block's reduction across threads."""
    return write_dtype(sch, block) not in NO_CROSS_THREAD


def cross_thread(sch: Schedule, block, outer, reduce_loops, knobs: Knobs = DEFAULT) -> None:
    """Bind `outer` (or a new unit loop) to blockIdx.x and split the fused reduce loops over threadIdx.x: TVM lowers
    the partial results to a warp-shuffle / shared-memory all-reduce."""
    if outer is None:  # a full reduction: one thread block, its loop above the reduce loops
        outer = sch.add_unit_loop(reduce_loops[0])
    extent = prod(extents(sch, reduce_loops))
    fused = sch.fuse(*reduce_loops) if len(reduce_loops) > 1 else reduce_loops[0]
    _, tx = sch.split(fused, [None, tuned_threads(sch, knobs, extent)])
    sch.bind(outer, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")


def _two_stage(sch: Schedule, block) -> bool:
    """Reduce each output in STAGE_BLOCKS chunks (rfactor) across blocks, then the chunks in one block per output.
    False (schedule untouched) when TVM cannot factor the reducer."""
    loops = sch.get_loops(block)
    n = spatial_count(sch, block)
    reduce_loops = loops[n:]
    fused = sch.fuse(*reduce_loops) if len(reduce_loops) > 1 else reduce_loops[0]
    chunk, _ = sch.split(fused, [STAGE_BLOCKS, None])
    try:
        partial = sch.rfactor(chunk, factor_axis=0)
    except ScheduleError:  # a reducer without a commutative rfactor form (e.g. argmax's tuple) stays one-stage
        return False
    # the partial block: chunk (spatial now), the outputs' loops, the chunk's reduce loop
    p_loops = sch.get_loops(partial)
    outer = sch.fuse(*p_loops[:-1])
    cross_thread(sch, partial, outer, p_loops[-1:])
    f_loops = sch.get_loops(block)
    f_n = len(f_loops) - 1
    cross_thread(sch, block, sch.fuse(*f_loops[:f_n]) if f_n else None, f_loops[f_n:])
    return True


def _fuse(sch: Schedule, block, loops):
    """Fuse loops into one; a block without loops gets a unit loop to bind."""
    if not loops:
        return sch.add_unit_loop(block)
    return sch.fuse(*loops) if len(loops) > 1 else loops[0]


def thread_inner(sch: Schedule, block, loops, threads: int) -> None:
    """Split a block's non-unit inner loops (fused) over `threads` threads bound to threadIdx.x."""
    # a shared-memory fetch's loops can have non-constant extents (a tile clipped at the edge): they count as wide
    wide = [lp for lp in loops if not isinstance(sch.get(lp).extent, tvm.tirx.IntImm) or int(sch.get(lp).extent) > 1]
    wide = wide or list(loops[-1:])
    fused = _fuse(sch, block, wide)
    _, tx = sch.split(fused, [None, threads])
    sch.bind(tx, "threadIdx.x")


def unbound_blocks(sch: Schedule) -> list[str]:
    """Names of the blocks not under a blockIdx/threadIdx binding (they would run as host code)."""
    return [sch.get(b).name_hint for b in _all_blocks(sch, sch.get_sblock("root")) if not is_bound(sch, b)]


def is_bound(sch: Schedule, block) -> bool:
    """Whether a loop above the block is bound to a GPU thread axis."""
    return any(sch.get(lp).thread_binding is not None for lp in sch.get_loops(block))


def _all_blocks(sch: Schedule, parent) -> list:
    """Every block below `parent`, nested ones included."""
    out = []
    for child in sch.get_child_blocks(parent):
        out += [child, *_all_blocks(sch, child)]
    return out


@schedule_rule(TargetKind.CUDA, FALLBACK)
class CudaGeneric:
    """Every kernel (the fallback): producers inlined, every other block bound to blocks and threads."""

    def applicable(self, sch: Schedule, kind: PatternKind, target: Target, knobs: Knobs) -> bool:
        return True

    def apply(self, sch: Schedule, target: Target, knobs: Knobs) -> None:
        generic(sch, target, knobs)
