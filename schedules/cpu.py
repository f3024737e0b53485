"""Default CPU schedules: parallel outer loops, vectorized inner loops."""
from __future__ import annotations

from tvm.s_tir import Schedule

from cinn.ops import PatternKind
from cinn.target import Target
from schedules.analysis import REDUCE_ITER, blocks, inline_all, is_reduction

VECTOR_BYTES = 32  # AVX2


def schedule(sch: Schedule, kind: PatternKind, target: Target) -> None:
    """Schedule every remaining block: inline producers, then parallelize and vectorize."""
    inline_all(sch)
    for block in blocks(sch):
        if is_reduction(sch, block):
            _parallel_spatial(sch, block)
        else:
            _injective(sch, block, target)


def _injective(sch: Schedule, block, target: Target) -> None:
    loops = sch.get_loops(block)
    if not loops:
        return
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    extent = int(sch.get(fused).extent)
    lanes = VECTOR_BYTES // 4
    if extent >= 4 * lanes and extent % lanes == 0:
        outer, inner = sch.split(fused, [None, lanes])
        sch.vectorize(inner)
        fused = outer
    if extent >= 1024:
        sch.parallel(fused)


def _parallel_spatial(sch: Schedule, block) -> None:
    """Parallelize the leading spatial loops of a fresh reduction block (loops map 1:1 to iterators)."""
    loops = sch.get_loops(block)
    iters = sch.get(block).iter_vars
    n = 0
    while n < len(iters) and iters[n].iter_type != REDUCE_ITER:
        n += 1
    if n:
        sch.parallel(sch.fuse(*loops[:n]) if n > 1 else loops[0])
