"""bf16 kernels of a bf16 precision policy (cinn.core.precision): float32 activations times bf16 weights, accumulated
in float32, for CPUs with AVX512_BF16.

vdpbf16ps multiplies 2 consecutive bf16 of a row by 2 bf16 of each of L columns (L: the float32 lanes of a vector
register, the CpuModel's lanes) and adds each pair of products to one float32 lane. The weights are stored so, as
bf16 bit patterns in uint16 (TVM's LLVM codegen has no bf16 vectors): [N / L, K / 2, L, 2] for a matmul, [OC / L,
KH, KW, C / 2, L, 2] for a convolution (as the VNNI kernels' weights, cinn.core.ops.quant, with pairs for groups of
4), whose input and output are channels last and whose input is padded already. The kernel rounds its float32 input
to bf16 (to nearest, ties to even) in a stage of its own before the products; its output is float32.
"""
from __future__ import annotations

from collections.abc import Sequence

import ml_dtypes
import numpy as np
import tvm
from tvm import te

from cinn.core.ir import NoAttrs, TensorType
from cinn.core.ops.quant import (
    IntConvAttrs,
    pack_vnni,
    pack_vnni_conv,
    packed_conv_flops,
    packed_conv_type,
    packed_matmul_flops,
    packed_matmul_type,
    unpack_vnni,
    unpack_vnni_conv,
    window_conv,
    window_reference,
)
from cinn.core.ops.registry import DtypeClass as D
from cinn.core.ops.registry import OpDef, register
from cinn.core.ops.registry import PatternKind as K

PAIR = 2  # bf16 products vdpbf16ps sums into one float32 lane
BITS = "uint16"  # how TIR stores a bf16
ROUND_NAME = "bf16_round"


def to_bf16(a: np.ndarray) -> np.ndarray:
    """float32 -> the bf16 bit patterns (uint16) nearest, ties to even."""
    return np.asarray(a, np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)


def from_bf16(bits: np.ndarray) -> np.ndarray:
    """bf16 bit patterns (uint16) -> float32, exactly."""
    return np.asarray(bits, np.uint16).view(ml_dtypes.bfloat16).astype(np.float32)


def pack_bf16(w: np.ndarray, lanes: int) -> np.ndarray:
    """[K, N] float32 -> bf16 bits [N / L, K / 2, L, 2] (L: `lanes`): each group holds a pair of consecutive k of L
    columns."""
    return pack_vnni(to_bf16(w), lanes, PAIR)


def pack_bf16_conv(oihw: np.ndarray, lanes: int) -> np.ndarray:
    """OIHW float32 -> bf16 bits [OC / L, KH, KW, C / 2, L, 2] (L: `lanes`)."""
    return pack_vnni_conv(to_bf16(oihw), lanes, PAIR)


def rounded_bits(x):
    """TIR: a float32's nearest bf16 (ties to even) as uint16; a NaN stays a quiet NaN of its sign (the rounding add
    could carry a signalling NaN's payload into infinity). Integer ops: they vectorize."""
    u = tvm.tirx.reinterpret("uint32", x)
    one = tvm.tirx.const(1, "uint32")
    half = tvm.tirx.const(0x7FFF, "uint32") + ((u >> 16) & one)
    nan = (u & tvm.tirx.const(0x7FFFFFFF, "uint32")) > tvm.tirx.const(0x7F800000, "uint32")
    quiet = (u >> 16) | tvm.tirx.const(0x40, "uint32")
    return tvm.tirx.Select(nan, quiet, (u + half) >> 16).astype(BITS)


def bf16_value(bits):
    """TIR: the float32 a bf16 (uint16 bits) is, exactly."""
    return tvm.tirx.reinterpret("float32", bits.astype("uint32") << tvm.tirx.const(16, "uint32"))


def _infer(types: Sequence[TensorType], _a: NoAttrs) -> list[TensorType]:
    x, w = types
    _check_dtypes("matmul_bf16", x, w)
    return [packed_matmul_type("matmul_bf16", x, w, PAIR, "float32")]


def _rounded(x: te.Tensor) -> te.Tensor:
    """The stage that rounds a kernel's float32 input to bf16 bits."""
    return te.compute(x.shape, lambda *i: rounded_bits(x(*i)), name=ROUND_NAME)


def _check_dtypes(op: str, x: TensorType, w: TensorType) -> None:
    if x.dtype != "float32" or w.dtype != BITS:
        raise TypeError(f"{op}: needs float32 x and bf16 ({BITS}) weights, got {x.dtype}{x.shape} and {w.dtype}{w.shape}")


def _compute(tensors, _a: NoAttrs, out_types: Sequence[TensorType]):
    x, w = tensors
    rounded = _rounded(x)
    k = te.reduce_axis((0, int(x.shape[-1])), name="k")
    lanes = int(w.shape[2])

    def body(*idx):
        *lead, n = idx
        return te.sum(bf16_value(rounded(*lead, k)) * bf16_value(w[n // lanes, k // PAIR, n % lanes, k % PAIR]),
                      axis=k)

    return [te.compute(out_types[0].shape, body, name="matmul_bf16")]


def _reference(arrays: Sequence[np.ndarray], _a: NoAttrs) -> list[np.ndarray]:
    x, w = arrays
    rounded = from_bf16(to_bf16(x)).astype(np.float64)
    return [np.matmul(rounded, from_bf16(unpack_vnni(w)).astype(np.float64)).astype(np.float32)]


register(
    OpDef(
        name="matmul_bf16",
        kind=K.OUT_FUSIBLE,
        infer=_infer,
        compute=_compute,
        reference=_reference,
        flops=packed_matmul_flops,
        num_inputs=2,
        dtypes=D.NUMBER,
        doc="float32 [..., M, K], rounded to bf16, times bf16 weights (uint16 bits) in the layout [N/L, K/2, L, 2] "
            "(`pack_bf16`), accumulated in float32: a dense layer of a bf16 precision policy.",
    )
)


def _conv_infer(types: Sequence[TensorType], a: IntConvAttrs) -> list[TensorType]:
    x, w = types
    _check_dtypes("conv2d_bf16", x, w)
    return [packed_conv_type("conv2d_bf16", x, w, a, PAIR, "float32")]


def _conv_compute(tensors, a: IntConvAttrs, out_types: Sequence[TensorType]):
    x, w = tensors
    return window_conv(_rounded(x), w, a, out_types[0], "conv2d_bf16", bf16_value)


def _conv_reference(arrays: Sequence[np.ndarray], a: IntConvAttrs) -> list[np.ndarray]:
    x, packed = arrays
    rounded = from_bf16(to_bf16(x)).astype(np.float64)
    return [window_reference(rounded, from_bf16(unpack_vnni_conv(packed)).astype(np.float64), a).astype(np.float32)]


register(
    OpDef(
        name="conv2d_bf16",
        kind=K.OUT_FUSIBLE,
        infer=_conv_infer,
        compute=_conv_compute,
        reference=_conv_reference,
        flops=packed_conv_flops(PAIR),
        attrs=IntConvAttrs,
        num_inputs=2,
        dtypes=D.NUMBER,
        doc="Convolution of a padded float32 NHWC input, rounded to bf16, with bf16 weights (uint16 bits) in the layout "
            "[OC/L, KH, KW, C/2, L, 2] (`pack_bf16_conv`), accumulated in float32, NHWC out: a convolution of a bf16 "
            "precision policy (strides and dilations as conv2d_u8i8's).",
    )
)
