"""Integer kernels of quantized models: uint8 x int8 matmuls and convolutions accumulating in int32.

Their weights are stored in the layout of AVX-512 VNNI's vpdpbusd, which multiplies 4 consecutive uint8 of a row by
4 int8 of each of L columns (L: the int32 lanes of a vector register, the CpuModel's lanes; 16 on AVX-512) and adds
each group of 4 products to one int32 lane: [N / L, K / 4, L, 4] for a matmul, [OC / L, KH, KW, C / 4, L, 4] for a
convolution, whose input and output are channels last (NHWC, a channel vector contiguous) and whose input is padded
already. The weights' shape says L.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from tvm import te

from cinn.core.cpu_model import lowering_model
from cinn.core.ir import Attrs, NoAttrs, TensorType
from cinn.core.ops.registry import DtypeClass as D
from cinn.core.ops.registry import OpDef, register
from cinn.core.ops.registry import PatternKind as K

DEPTH = 4  # uint8 x int8 products vpdpbusd sums into one int32 lane
def tiles_columns(extent: int, columns: range) -> bool:
    """Whether `extent` output columns (or pixels) divide into register tiles of one of `columns` (the CpuModel's
    int8_columns); rows with none of them tile flat pixels."""
    return any(extent % d == 0 for d in columns)


def pack_vnni(w: np.ndarray, lanes: int, depth: int = DEPTH) -> np.ndarray:
    """[K, N] int8 -> [N / L, K / 4, L, 4] (L: `lanes`): each group holds 4 consecutive k of L columns (`depth` of
    them: bf16 weights take pairs)."""
    k, n = w.shape
    return np.ascontiguousarray(w.reshape(k // depth, depth, n // lanes, lanes).transpose(2, 0, 3, 1))


def unpack_vnni(w: np.ndarray) -> np.ndarray:
    """[N / L, K / depth, L, depth] -> [K, N]."""
    groups, steps, lanes, depth = w.shape
    return w.transpose(1, 3, 0, 2).reshape(steps * depth, groups * lanes)


def _check_dtypes(op: str, x: TensorType, w: TensorType) -> None:
    if x.dtype != "uint8" or w.dtype != "int8":
        raise TypeError(f"{op}: needs uint8 x and int8 weights, got {x.dtype}{x.shape} and {w.dtype}{w.shape}")


def _infer(types: Sequence[TensorType], _a: NoAttrs) -> list[TensorType]:
    x, w = types
    _check_dtypes("matmul_u8i8", x, w)
    return [packed_matmul_type("matmul_u8i8", x, w, DEPTH, "int32")]


def packed_matmul_type(op: str, x: TensorType, w: TensorType, depth: int, dtype: str) -> TensorType:
    """The output of rows x [..., M, K] by weights packed [N/L, K/depth, L, depth]; ValueError where they differ."""
    if len(x.shape) < 2 or len(w.shape) != 4 or w.shape[3] != depth or w.shape[1] * depth != x.shape[-1]:
        raise ValueError(f"{op}: x {x.shape} [..., M, K] and weights {w.shape} [N/L, K/{depth}, L, {depth}] do "
                         "not match")
    return TensorType((*x.shape[:-1], w.shape[0] * w.shape[2]), dtype)


def _compute(tensors, _a: NoAttrs, out_types: Sequence[TensorType]):
    x, w = tensors
    k = te.reduce_axis((0, int(x.shape[-1])), name="k")

    lanes = int(w.shape[2])

    def body(*idx):
        *lead, n = idx
        return te.sum(x(*lead, k).astype("int32") * w[n // lanes, k // DEPTH, n % lanes, k % DEPTH].astype("int32"),
                      axis=k)

    return [te.compute(out_types[0].shape, body, name="matmul_u8i8")]


def _reference(arrays: Sequence[np.ndarray], _a: NoAttrs) -> list[np.ndarray]:
    x, w = arrays
    return [np.matmul(x.astype(np.int64), unpack_vnni(w).astype(np.int64)).astype(np.int32)]


def packed_matmul_flops(types: Sequence[TensorType], _a: NoAttrs, outs: Sequence[TensorType]) -> int:
    """The FLOP count of a matmul of [..., M, K] rows by packed weights (K is the rows' last dim)."""
    return 2 * outs[0].size * types[0].shape[-1]


register(
    OpDef(
        name="matmul_u8i8",
        kind=K.OUT_FUSIBLE,
        infer=_infer,
        compute=_compute,
        reference=_reference,
        flops=packed_matmul_flops,
        num_inputs=2,
        dtypes=D.INT,
        doc="uint8 [..., M, K] times int8 weights in the VNNI layout [N/L, K/4, L, 4] (`pack_vnni`), exact in int32: "
            "the integer core of a quantized matmul.",
    )
)


def pack_vnni_conv(w: np.ndarray, lanes: int, depth: int = DEPTH) -> np.ndarray:
    """OIHW int8 weights -> [OC / L, KH, KW, C / 4, L, 4] (L: `lanes`; 4: `depth`, bf16 weights take pairs)."""
    oc, c, kh, kw = w.shape
    return np.ascontiguousarray(w.reshape(oc // lanes, lanes, c // depth, depth, kh, kw).transpose(0, 4, 5, 2, 1, 3))


def unpack_vnni_conv(w: np.ndarray) -> np.ndarray:
    """[OC / L, KH, KW, C / depth, L, depth] -> OIHW."""
    groups, kh, kw, steps, lanes, depth = w.shape
    return w.transpose(0, 4, 3, 5, 1, 2).reshape(groups * lanes, steps * depth, kh, kw)


@dataclass(frozen=True)
class IntConvAttrs(Attrs):
    """Strides and dilations (height, width) of conv2d_u8i8; its input is padded already."""

    strides: tuple[int, int] = (1, 1)
    dilations: tuple[int, int] = (1, 1)


def conv_out(x: tuple[int, ...], w: tuple[int, ...], a: IntConvAttrs) -> tuple[int, int]:
    """The output rows and columns of a conv of NHWC x by weights [OC/L, KH, KW, ...]."""
    return tuple((size - d * (k - 1) - 1) // s + 1 for size, k, s, d in zip(x[1:3], w[1:3], a.strides, a.dilations,
                                                                           strict=True))  # type: ignore[return-value]


def _conv_infer(types: Sequence[TensorType], a: IntConvAttrs) -> list[TensorType]:
    x, w = types
    _check_dtypes("conv2d_u8i8", x, w)
    return [packed_conv_type("conv2d_u8i8", x, w, a, DEPTH, "int32")]


def packed_conv_type(op: str, x: TensorType, w: TensorType, a: IntConvAttrs, depth: int, dtype: str) -> TensorType:
    """The NHWC output of x [N, H, W, C] by weights packed [OC/L, KH, KW, C/depth, L, depth]; ValueError where they
    differ or the window does not fit."""
    if len(x.shape) != 4 or len(w.shape) != 6 or w.shape[5] != depth or w.shape[3] * depth != x.shape[3]:
        raise ValueError(f"{op}: x {x.shape} [N, H, W, C] and weights {w.shape} [OC/L, KH, KW, C/{depth}, L, "
                         f"{depth}] do not match")
    oh, ow = conv_out(x.shape, w.shape, a)
    if oh < 1 or ow < 1:
        raise ValueError(f"{op}: the window {w.shape[1:3]} does not fit the input {x.shape}")
    return TensorType((x.shape[0], oh, ow, w.shape[0] * w.shape[4]), dtype)


def _conv_compute(tensors, a: IntConvAttrs, out_types: Sequence[TensorType]):
    x, w = tensors
    return window_conv(x, w, a, out_types[0], "conv2d_u8i8", lambda e: e.astype("int32"))


def window_conv(x: te.Tensor, w: te.Tensor, a: IntConvAttrs, out_type: TensorType, name: str,
                widen: Callable) -> list[te.Tensor]:
    """The conv of a padded NHWC x by weights [OC/L, KH, KW, C/D, L, D], the product of the operands `widen`ed (to
    int32; a bf16's float32). Output rows with no divisor of 4-8 columns (13x13) are computed over one flat pixel
    axis, then viewed as NHWC, so that a register tile of pixels may span rows (elsewhere the per-pixel division costs
    more than it saves: docs/notes/cpu-model.md)."""
    kh, kw, c = (te.reduce_axis((0, int(e)), name=n) for e, n in ((w.shape[1], "kh"), (w.shape[2], "kw"),
                                                                   (x.shape[3], "c")))
    (sh, sw), (dh, dw) = a.strides, a.dilations
    batch, oh, ow, oc = out_type.shape
    lanes, depth = int(w.shape[4]), int(w.shape[5])

    def product(n, i, j, o):
        pixel = widen(x[n, i * sh + kh * dh, j * sw + kw * dw, c])
        return te.sum(pixel * widen(w[o // lanes, kh, kw, c // depth, o % lanes, c % depth]), axis=[kh, kw, c])

    if tiles_columns(ow, lowering_model().int8_columns):
        return [te.compute(out_type.shape, product, name=name)]
    flat = te.compute((batch, oh * ow, oc), lambda n, p, o: product(n, p // ow, p % ow, o), name=name)
    return [te.compute(out_type.shape, lambda n, i, j, o: flat[n, i * ow + j, o], name=f"{name}_nhwc")]


def _conv_reference(arrays: Sequence[np.ndarray], a: IntConvAttrs) -> list[np.ndarray]:
    x, packed = arrays
    return [window_reference(x.astype(np.int64), unpack_vnni_conv(packed).astype(np.int64), a).astype(np.int32)]


def window_reference(x: np.ndarray, oihw: np.ndarray, a: IntConvAttrs) -> np.ndarray:
    """The conv of a padded NHWC x by OIHW weights, in their dtype, NHWC out."""
    oh, ow = conv_out(x.shape, (oihw.shape[0], *oihw.shape[2:]), a)
    (sh, sw), (dh, dw) = a.strides, a.dilations
    out = np.zeros((x.shape[0], oh, ow, oihw.shape[0]), oihw.dtype)
    for i in range(oihw.shape[2]):
        for j in range(oihw.shape[3]):
            window = x[:, i * dh : i * dh + sh * (oh - 1) + 1 : sh, j * dw : j * dw + sw * (ow - 1) + 1 : sw]
            out += np.einsum("nhwc,oc->nhwo", window, oihw[:, :, i, j])
    return out


def packed_conv_flops(depth: int) -> Callable[[Sequence[TensorType], IntConvAttrs, Sequence[TensorType]], int]:
    """The FLOP count of a conv whose weights [OC/L, KH, KW, C/depth, L, depth] pack `depth` channels a lane."""
    def flops(types: Sequence[TensorType], _a: IntConvAttrs, outs: Sequence[TensorType]) -> int:
        w = types[1].shape
        return 2 * outs[0].size * w[1] * w[2] * w[3] * depth
    return flops


register(
    OpDef(
        name="conv2d_u8i8",
        kind=K.OUT_FUSIBLE,
        infer=_conv_infer,
        compute=_conv_compute,
        reference=_conv_reference,
        flops=packed_conv_flops(DEPTH),
        attrs=IntConvAttrs,
        num_inputs=2,
        dtypes=D.INT,
        doc="Convolution of a padded uint8 NHWC input with int8 weights in the VNNI layout [OC/L, KH, KW, C/4, L, 4] "
            "(`pack_vnni_conv`), exact in int32, NHWC out: the integer core of a quantized convolution.",
    )
)
