"""Generic CPU scheduling steps shared by the specialised schedules."""
from __future__ import annotations

from tvm.s_tir import Schedule

from cinn.target import Target
from schedules.analysis import blocks, inline_all, is_reduction, spatial_count, write_dtype

PARALLEL_MIN = 4096  # elements below which a thread fork costs more than it saves


def lanes(dtype: str, target: Target) -> int:
    """Vector lanes of one of the target's widest registers for a dtype (bool counts as 8 bits)."""
    bits = int("".join(ch for ch in dtype if ch.isdigit()) or 8)
    return max(1, target.vector_bits // bits)


def generic(sch: Schedule, target: Target) -> None:
    """Inline producers, then parallelize every remaining block and vectorize the injective ones."""
    inline_all(sch)
    for block in blocks(sch):
        if is_reduction(sch, block):
            parallel_spatial(sch, block)
        else:
            injective(sch, block, target)


def injective(sch: Schedule, block, target: Target) -> None:
    """Fuse a spatial block's loops, vectorize the inner lanes and parallelize the rest when large."""
    loops = sch.get_loops(block)
    if not loops:
        return
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    extent = int(sch.get(fused).extent)
    width = lanes(write_dtype(sch, block), target)
    if extent >= 4 * width and extent % width == 0:
        fused, inner = sch.split(fused, [None, width])
        sch.vectorize(inner)
    if extent >= PARALLEL_MIN:
        sch.parallel(fused)


def parallel_spatial(sch: Schedule, block) -> None:
    """Parallelize the leading spatial loops of a fresh reduction block (loops map 1:1 to iterators)."""
    loops = sch.get_loops(block)
    n = spatial_count(sch, block)
    if n:
        sch.parallel(sch.fuse(*loops[:n]) if n > 1 else loops[0])
