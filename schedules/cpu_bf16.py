"""bf16 matmuls on AVX512_BF16: the register tiles of the VNNI kernels (schedules/cpu_int8.py), rows x 16-lane float32
vectors, each step one vdpbf16ps per (row, vector) over a pair of k: twice the float32 FMA's products a cycle (see
docs/notes/bf16-kernels.md). The input's rounding to bf16 runs as a stage of the kernel before the tiles.

TVM's LLVM codegen has no bf16 vectors: the intrinsic calls STAND_IN, an intrinsic of the same vector widths on integer
vectors that cinn emits nowhere else, which cinn.compiler.llvm_calls replaces in the module's LLVM IR by vdpbf16ps on
`<32 x bfloat>`. A stand-in, not an extern placeholder: LLVM optimizes around an intrinsic it knows to read no
memory (the register tile's accumulators stay in registers; around an opaque extern call they were loaded and
stored at every step: docs/notes/bf16-kernels.md).
"""
from __future__ import annotations

import functools

from tvm.s_tir import Schedule, TensorIntrin
from tvm.script import tirx as T

from cinn.core.ops import PatternKind, TargetKind
from cinn.core.ops.bf16 import BITS, PAIR
from cinn.core.target import Target
from schedules.analysis import single_reduction
from schedules.cpu_int8 import register_tiles
from schedules.knobs import DEFAULT, Knobs
from schedules.registry import schedule_rule

INTRIN = "cinn_bf16_16x2"
STAND_IN = "llvm.x86.avx512.vpdpwssds.512"  # (<16 x i32>, <32 x i16>, <32 x i16>): llvm_calls makes it vdpbf16ps
BF16_BITS = 512  # vdpbf16ps.512: the intrinsic's 16 float32 lanes


@T.prim_func(s_tir=True)
def _dot_16x2(a: T.Buffer((2,), "uint16", offset_factor=1, align=1),  # type: ignore[valid-type]
              b: T.Buffer((16, 2), "uint16", offset_factor=1, align=1),  # type: ignore[valid-type]
              c: T.Buffer((16,), "float32", offset_factor=1, align=1)) -> None:  # type: ignore[valid-type]
    # what the intrinsic computes: the matmul_bf16 compute's product of bf16 bit patterns widened to float32
    with T.sblock("root"):
        T.reads(c[0:16], a[0:2], b[0:16, 0:2])
        T.writes(c[0:16])
        for i, j in T.grid(16, 2):
            with T.sblock("update"):
                vi, vj = T.axis.remap("SR", [i, j])
                c[vi] = c[vi] + T.reinterpret("float32", T.shift_left(T.Cast("uint32", a[vj]), T.uint32(16))) \
                    * T.reinterpret("float32", T.shift_left(T.Cast("uint32", b[vi, vj]), T.uint32(16)))


@T.prim_func(s_tir=True)
def _dpbf16_16x2(a: T.Buffer((2,), "uint16", offset_factor=1, align=1),  # type: ignore[valid-type]
                 b: T.Buffer((16, 2), "uint16", offset_factor=1, align=1),  # type: ignore[valid-type]
                 c: T.Buffer((16,), "float32", offset_factor=1, align=1)) -> None:  # type: ignore[valid-type]
    # the stand-in's operands as its types; llvm_calls casts them back around vdpbf16ps
    with T.sblock("root"):
        T.reads(c[0:16], a[0:2], b[0:16, 0:2])
        T.writes(c[0:16])
        pair = T.reinterpret(a.vload([0], "uint16x2"), dtype="uint32")
        c[T.ramp(T.int32(0), 1, 16)] = T.reinterpret(T.call_llvm_pure_intrin(
            T.llvm_lookup_intrinsic_id(STAND_IN), T.reinterpret(c.vload([0], dtype="float32x16"), dtype="int32x16"),
            T.reinterpret(T.broadcast(pair, 16), dtype="int16x32"),
            T.reinterpret(b.vload([0, 0], dtype="uint16x32"), dtype="int16x32"), dtype="int32x16"), dtype="float32x16")


@functools.cache
def _register() -> str:
    TensorIntrin.register(INTRIN, _dot_16x2, _dpbf16_16x2)
    return INTRIN


def applicable(sch: Schedule, target: Target) -> bool:
    """A single matmul_bf16 reduction (bf16 rows, pair-packed bf16 weights) on a CPU with AVX512_BF16."""
    main = single_reduction(sch)
    if main is None or not target.model.bf16 or target.vector_bits != BF16_BITS:
        return False
    block = sch.get(main)
    reads = [r.source for r in block.reads if str(r.source.dtype) == BITS]
    return len(reads) == 2 and len(block.reads) - len(reads) <= 1 \
        and [int(d) for d in reads[-1].shape[-2:]] == [target.model.lanes, PAIR]


@schedule_rule(TargetKind.CPU, 52)
class Bf16:
    """A bf16 matmul on a CPU with AVX512_BF16."""

    def applicable(self, sch: Schedule, kind: PatternKind, target: Target, knobs: Knobs) -> bool:
        return kind == PatternKind.OUT_FUSIBLE and not target.is_cuda and applicable(sch, target)

    def apply(self, sch: Schedule, target: Target, knobs: Knobs = DEFAULT) -> None:
        register_tiles(sch, target, knobs, _register(), PAIR)
