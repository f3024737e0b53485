"""Generic CPU scheduling steps shared by the specialised schedules."""
from __future__ import annotations

from tvm.s_tir import Schedule

from cinn.schedules.analysis import blocks, inline_all, is_reduction, spatial_count, write_dtype
from cinn.schedules.knobs import DEFAULT, Knob, Knobs, unroll
from cinn.target import Target

PARALLEL_MIN = 4096  # elements below which a thread fork costs more than it saves


def lanes(dtype: str, target: Target) -> int:
    """Vector lanes of one of the target's widest registers for a dtype (bool counts as 8 bits)."""
    bits = int("".join(ch for ch in dtype if ch.isdigit()) or 8)
    return max(1, target.vector_bits // bits)


def generic(sch: Schedule, target: Target, knobs: Knobs = DEFAULT) -> None:
    """Inline producers, then parallelize every remaining block and vectorize the injective ones."""
    inline_all(sch)
    for block in blocks(sch):
        if is_reduction(sch, block):
            parallel_spatial(sch, block)
        else:
            injective(sch, block, target, knobs)


def injective(sch: Schedule, block, target: Target, knobs: Knobs = DEFAULT) -> None:
    """Fuse a spatial block's loops, vectorize the inner lanes and parallelize the rest when large."""
    loops = sch.get_loops(block)
    if not loops:
        return
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    extent = int(sch.get(fused).extent)
    width = vector_width(sch, knobs, lanes(write_dtype(sch, block), target), extent, 4)
    if width:
        fused, inner = sch.split(fused, [None, width])
        sch.vectorize(inner)
    if extent > 1 and knobs.choose(sch, Knob.PARALLEL, [0, 1], int(extent >= PARALLEL_MIN)):
        sch.parallel(fused)
    unroll(sch, knobs, fused)


def vector_width(sch: Schedule, knobs: Knobs, width: int, extent: int, min_vectors: int = 1) -> int:
    """The vector width of a loop: one register by default, up to four for the tuner; 0 when the loop is too short
    (under `min_vectors` registers) or not a multiple of the lanes."""
    fits = [w for w in (width, 2 * width, 4 * width) if extent >= min_vectors * w and extent % w == 0]
    return knobs.choose(sch, Knob.VECTOR, [0, *fits], fits[0]) if fits else 0


def parallel_spatial(sch: Schedule, block) -> None:
    """Parallelize the leading spatial loops of a fresh reduction block (loops map 1:1 to iterators)."""
    loops = sch.get_loops(block)
    n = spatial_count(sch, block)
    if n:
        sch.parallel(sch.fuse(*loops[:n]) if n > 1 else loops[0])
