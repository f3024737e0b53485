"""Generic CPU scheduling steps shared by the specialised schedules."""
from __future__ import annotations

from math import prod

from tvm.s_tir import Schedule

from cinn.schedules.analysis import blocks, extents, inline_all, is_reduction, spatial_count, write_dtype
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
    """Vectorize a spatial block's inner lanes and parallelize the rest (fused) when large."""
    loops = sch.get_loops(block)
    if not loops:
        return
    extent = prod(extents(sch, loops))
    width = lanes(write_dtype(sch, block), target)
    cut = _vector_suffix(extents(sch, loops), width)
    outer, inner = loops[:cut], loops[cut:]
    inner_loop = sch.fuse(*inner) if len(inner) > 1 else inner[0]
    width = vector_width(sch, knobs, width, int(sch.get(inner_loop).extent), 4 if not outer else 1)
    if width:
        rest, lane = sch.split(inner_loop, [None, width])
        sch.vectorize(lane)
        outer = [*outer, rest]
    elif inner:
        outer = [*outer, inner_loop]
    fused = sch.fuse(*outer) if len(outer) > 1 else outer[0]
    if extent > 1 and knobs.choose(sch, Knob.PARALLEL, [0, 1], int(extent >= PARALLEL_MIN)):
        sch.parallel(fused)
    unroll(sch, knobs, fused)


def _vector_suffix(ext: list[int], width: int) -> int:
    """Where the vectorized (fused) inner loops start: the shortest suffix whose elements are a whole number of
    vectors, so lanes never straddle an outer index (a concat's or a padding's select on the channel would make every
    load a gather: shufflenet's concat + slices over 34-channel groups took 0.29 ms for 106K elements); all loops
    when no suffix is."""
    total = 1
    for i in range(len(ext) - 1, 0, -1):
        total *= ext[i]
        if total % width == 0:
            return i
    return 0


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
