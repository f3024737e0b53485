"""uint8 x int8 matmuls and convolutions on AVX-512 VNNI: register tiles of rows x 16-lane int32 vectors, each step one
vpdpbusd per (row, vector) over 4 values of k, several times the float32 FMA rate (see docs/notes/vnni-kernels.md).
"""
from __future__ import annotations

import functools

from tvm.s_tir import Schedule, TensorIntrin
from tvm.script import tirx as T

from cinn.core.ops import PatternKind, TargetKind
from cinn.core.ops.quant import DEPTH, tiles_columns
from cinn.core.target import Target
from schedules.analysis import blocks, inline_all, reverse_inline_all, single_reduction, spatial_count
from schedules.cpu_common import injective, vectorize_innermost
from schedules.knobs import DEFAULT, Knob, Knobs, divisors
from schedules.registry import schedule_rule

INTRIN = "cinn_vnni_16x4"
VNNI_BITS = 512  # vpdpbusd.512: the intrinsic's 16 int32 lanes
# the default register tiles: a matmul's 4 rows x 4 vectors (16 accumulators, 4 weight loads and 4 broadcasts per
# step), a conv's up to the CpuModel's widest int8_columns output columns x the vectors that keep three quarters of
# the registers accumulating; pixels with no divisor among int8_columns (13x13 = 169) as many pixels x one vector as
# the default tile has accumulators
ROWS = 4


@T.prim_func(s_tir=True)
def _dot_16x4(a: T.Buffer((4,), "uint8", offset_factor=1, align=1),  # type: ignore[valid-type]
              b: T.Buffer((16, 4), "int8", offset_factor=1, align=1),  # type: ignore[valid-type]
              c: T.Buffer((16,), "int32", offset_factor=1, align=1)) -> None:  # type: ignore[valid-type]
    # what the intrinsic computes; the kernels' buffers are element-aligned (TVM's own intrinsics ask for 64 bytes)
    with T.sblock("root"):
        T.reads(c[0:16], a[0:4], b[0:16, 0:4])
        T.writes(c[0:16])
        for i, j in T.grid(16, 4):
            with T.sblock("update"):
                vi, vj = T.axis.remap("SR", [i, j])
                c[vi] = c[vi] + T.cast(a[vj], "int32") * T.cast(b[vi, vj], "int32")


@T.prim_func(s_tir=True)
def _vnni_16x4(a: T.Buffer((4,), "uint8", offset_factor=1, align=1),  # type: ignore[valid-type]
               b: T.Buffer((16, 4), "int8", offset_factor=1, align=1),  # type: ignore[valid-type]
               c: T.Buffer((16,), "int32", offset_factor=1, align=1)) -> None:  # type: ignore[valid-type]
    # TVM's own VNNI intrinsic passes i32 vectors where this LLVM's vpdpbusd takes <64 x i8>
    with T.sblock("root"):
        T.reads(c[0:16], a[0:4], b[0:16, 0:4])
        T.writes(c[0:16])
        row = T.reinterpret(a.vload([0], "uint8x4"), dtype="int32")
        c[T.ramp(T.int32(0), 1, 16)] = T.call_llvm_pure_intrin(
            T.llvm_lookup_intrinsic_id("llvm.x86.avx512.vpdpbusd.512"), c.vload([0], dtype="int32x16"),
            T.reinterpret(T.broadcast(row, 16), dtype="int8x64"), b.vload([0, 0], dtype="int8x64"), dtype="int32x16")


@functools.cache
def _register() -> str:
    TensorIntrin.register(INTRIN, _dot_16x4, _vnni_16x4)
    return INTRIN


def applicable(sch: Schedule, target: Target) -> bool:
    """A single matmul_u8i8 or conv2d_u8i8 reduction (uint8 rows, VNNI-packed int8 weights) on a CPU with VNNI."""
    main = single_reduction(sch)
    if main is None or not target.has_vnni or target.vector_bits != VNNI_BITS:
        return False
    block = sch.get(main)
    dtypes = sorted(str(r.source.dtype) for r in block.reads)
    weights = [r.source for r in block.reads if str(r.source.dtype) == "int8"]
    return (dtypes == ["int32", "int8", "uint8"] or dtypes == ["int8", "uint8"]) and len(weights) == 1 \
        and [int(d) for d in weights[0].shape[-2:]] == [target.model.lanes, DEPTH]


def schedule(sch: Schedule, target: Target, knobs: Knobs = DEFAULT) -> None:
    """Tile rows (a matmul's rows, a conv's output columns) x 16-lane vectors of output channels in registers, the
    reduction in steps of 4 (tensorized), tiles in parallel; the epilogue (dequantize, bias, requantize) runs in
    the write-back of each tile."""
    register_tiles(sch, target, knobs, _register(), DEPTH)


def register_tiles(sch: Schedule, target: Target, knobs: Knobs, intrin: str, depth: int) -> None:
    """schedule's register tiles, the reduction tensorized by `intrin` in steps of `depth` (also the bf16 kernels')."""
    main = single_reduction(sch)
    producers = {sch.get(b).name_hint for b in sch.get_producers(main)}
    inline_all(sch, keep=lambda b: sch.get(b).name_hint in producers)
    write_back = sch.cache_write(main, 0, "global")
    reverse_inline_all(sch, write_back)
    own = {sch.get(main).name_hint, sch.get(write_back).name_hint}
    stages = [sch.get(b).name_hint for b in blocks(sch) if sch.get(b).name_hint not in own]
    loops = sch.get_loops(main)
    reduce = loops[spatial_count(sch, main):]  # a conv's kh, kw, c; a matmul's k
    *spatial, row, col = loops[: -len(reduce)]  # a conv's [n, oh], ow or [n], pixel; a matmul's batch, m
    extent = int(sch.get(row).extent)
    conv = len(reduce) == 3
    columns = target.model.int8_columns
    limit = ROWS if not conv else columns[-1] if tiles_columns(extent, columns) else target.model.accumulators
    rows = _choose(sch, knobs, Knob.ROWS, extent, limit)
    lanes = target.model.lanes
    accumulators = target.vector_registers * 3 // 4
    vectors = _choose(sch, knobs, Knob.COLS, int(sch.get(col).extent) // lanes, max(1, accumulators // rows))
    col_out, col_vec, col_in = sch.split(col, [None, vectors, lanes])
    row_out, row_in = sch.split(row, [None, rows])
    *reduce_out, reduce_depth = reduce
    depth_out, depth_in = sch.split(reduce_depth, [None, depth])
    sch.reorder(col_out, *spatial, row_out, *reduce_out, depth_out, row_in, col_vec, col_in, depth_in)
    par = sch.fuse(col_out, *spatial, row_out)  # a weight panel stays hot across consecutive tiles
    sch.parallel(par)
    sch.reverse_compute_at(write_back, par)
    init = sch.decompose_reduction(main, (reduce_out or [depth_out])[0])
    sch.tensorize(col_in, intrin)
    sch.unroll(row_in)
    sch.unroll(col_vec)
    vectorize_innermost(sch, init, lanes)
    vectorize_innermost(sch, write_back, lanes)
    for name in stages:  # producers kept as stages; epilogues TVM would not inline (a second output) run per tile
        block = sch.get_sblock(name)
        if name in producers:
            injective(sch, block, target)
        else:
            sch.reverse_compute_at(block, par)
            vectorize_innermost(sch, block, lanes)


def _choose(sch: Schedule, knobs: Knobs, knob: Knob, extent: int, limit: int) -> int:
    """The largest divisor of `extent` up to `limit`; the tuner may take any divisor up to `limit` or 8."""
    return knobs.choose(sch, knob, divisors(extent, max(limit, 8)), max(divisors(extent, limit)))


@schedule_rule(TargetKind.CPU, 50)
class Int8:
    """An integer matmul or conv on a CPU with VNNI."""

    def applicable(self, sch: Schedule, kind: PatternKind, target: Target, knobs: Knobs) -> bool:
        return kind == PatternKind.OUT_FUSIBLE and applicable(sch, target)

    def apply(self, sch: Schedule, target: Target, knobs: Knobs) -> None:
        schedule(sch, target, knobs)
