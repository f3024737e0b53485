"""uint8 x int8 matmuls on AVX-512 VNNI: register tiles of rows x 16-lane int32 vectors, each step one vpdpbusd
per (row, vector) over 4 values of k (1800 GOP/s on a 128x768x768 matmul here: 3.4x this machine's float32 FMA peak).
"""
from __future__ import annotations

import functools

from tvm.s_tir import Schedule, TensorIntrin
from tvm.script import tirx as T

from cinn.ops.quant import DEPTH, LANES
from cinn.schedules.analysis import blocks, inline_all, is_reduction, reverse_inline_all
from cinn.schedules.cpu_common import injective
from cinn.schedules.cpu_matmul import vectorize_innermost
from cinn.schedules.knobs import DEFAULT, Knob, Knobs, divisors
from cinn.target import Target

INTRIN = "cinn_vnni_16x4"
ROWS, VECTORS = 4, 4  # the default register tile: 16 accumulators, 4 weight loads and 4 broadcasts per step


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


def _main_block(sch: Schedule):
    found = [b for b in blocks(sch) if is_reduction(sch, b)]
    return found[0] if len(found) == 1 else None


def applicable(sch: Schedule, target: Target) -> bool:
    """A single matmul_u8i8 reduction (uint8 rows, VNNI-packed int8 weights) on a CPU with VNNI."""
    main = _main_block(sch)
    if main is None or not target.has_vnni:
        return False
    block = sch.get(main)
    dtypes = sorted(str(r.source.dtype) for r in block.reads)
    weights = [r.source for r in block.reads if str(r.source.dtype) == "int8"]
    return (dtypes == ["int32", "int8", "uint8"] or dtypes == ["int8", "uint8"]) and len(weights) == 1 \
        and [int(d) for d in weights[0].shape[2:]] == [LANES, DEPTH]


def schedule(sch: Schedule, target: Target, knobs: Knobs = DEFAULT) -> None:
    """Tile rows x vectors in registers, k in steps of 4 (tensorized), tiles in parallel; the epilogue (dequantize,
    bias, requantize) runs in the write-back of each tile."""
    main = _main_block(sch)
    producers = {sch.get(b).name_hint for b in sch.get_producers(main)}
    inline_all(sch, keep=lambda b: sch.get(b).name_hint in producers)
    write_back = sch.cache_write(main, 0, "global")
    reverse_inline_all(sch, write_back)
    *lead, m, n, k = sch.get_loops(main)
    rows_ext, groups = (int(sch.get(lp).extent) for lp in (m, n))
    groups //= LANES
    rows = knobs.choose(sch, Knob.ROWS, divisors(rows_ext, 8), max(divisors(rows_ext, ROWS)))
    vectors = knobs.choose(sch, Knob.COLS, divisors(groups, 8), max(divisors(groups, VECTORS)))
    m_out, m_in = sch.split(m, [None, rows])
    n_out, n_vec, n_in = sch.split(n, [None, vectors, LANES])
    k_out, k_in = sch.split(k, [None, DEPTH])
    sch.reorder(*lead, n_out, m_out, k_out, m_in, n_vec, n_in, k_in)
    par = sch.fuse(*lead, n_out, m_out)  # a weight panel stays hot across consecutive row tiles
    sch.parallel(par)
    sch.reverse_compute_at(write_back, par)
    init = sch.decompose_reduction(main, k_out)
    sch.tensorize(n_in, _register())
    sch.unroll(m_in)
    sch.unroll(n_vec)
    vectorize_innermost(sch, init)
    wb_loops = sch.get_loops(write_back)
    _, lanes_loop = sch.split(wb_loops[-1], [None, LANES])
    sch.vectorize(lanes_loop)
    for block in blocks(sch):  # producers kept as stages (e.g. a quantize that several kernels read)
        if sch.get(block).name_hint in producers:
            injective(sch, block, target)

