"""Integer kernels of quantized models: a uint8 x int8 matmul accumulating in int32.

Its weights are stored in the layout of AVX-512 VNNI's vpdpbusd, which multiplies 4 consecutive uint8 of a row by
4 int8 of each of 16 columns and adds each group of 4 products to one int32 lane: [N / 16, K / 4, 16, 4].
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from tvm import te

from cinn.ir import NoAttrs, TensorType
from cinn.ops.registry import DtypeClass as D
from cinn.ops.registry import OpDef, register
from cinn.ops.registry import PatternKind as K

LANES = 16  # int32 lanes of a zmm register: columns per weight group
DEPTH = 4  # uint8 x int8 products summed into one lane


def pack_vnni(w: np.ndarray) -> np.ndarray:
    """[K, N] int8 -> [N / 16, K / 4, 16, 4]: each 64-byte group holds 4 consecutive k of 16 columns."""
    k, n = w.shape
    return np.ascontiguousarray(w.reshape(k // DEPTH, DEPTH, n // LANES, LANES).transpose(2, 0, 3, 1))


def unpack_vnni(w: np.ndarray) -> np.ndarray:
    """[N / 16, K / 4, 16, 4] -> [K, N]."""
    groups, steps = w.shape[:2]
    return w.transpose(1, 3, 0, 2).reshape(steps * DEPTH, groups * LANES)


def _infer(types: Sequence[TensorType], _a: NoAttrs) -> list[TensorType]:
    x, w = types
    if x.dtype != "uint8" or w.dtype != "int8":
        raise TypeError(f"matmul_u8i8: needs uint8 x and int8 weights, got {x.dtype}{x.shape} and {w.dtype}{w.shape}")
    if len(x.shape) < 2 or len(w.shape) != 4 or w.shape[2:] != (LANES, DEPTH) or w.shape[1] * DEPTH != x.shape[-1]:
        raise ValueError(f"matmul_u8i8: x {x.shape} [..., M, K] and weights {w.shape} [N/{LANES}, K/{DEPTH}, {LANES}, "
                         f"{DEPTH}] do not match")
    return [TensorType((*x.shape[:-1], w.shape[0] * LANES), "int32")]


def _compute(tensors, _a: NoAttrs, out_types: Sequence[TensorType]):
    x, w = tensors
    k = te.reduce_axis((0, int(x.shape[-1])), name="k")

    def body(*idx):
        *lead, n = idx
        return te.sum(x(*lead, k).astype("int32") * w[n // LANES, k // DEPTH, n % LANES, k % DEPTH].astype("int32"),
                      axis=k)

    return [te.compute(out_types[0].shape, body, name="matmul_u8i8")]


def _reference(arrays: Sequence[np.ndarray], _a: NoAttrs) -> list[np.ndarray]:
    x, w = arrays
    return [np.matmul(x.astype(np.int64), unpack_vnni(w).astype(np.int64)).astype(np.int32)]


def _flops(types: Sequence[TensorType], _a: NoAttrs, outs: Sequence[TensorType]) -> int:
    return 2 * outs[0].size * types[0].shape[-1]


register(
    OpDef(
        name="matmul_u8i8",
        kind=K.OUT_FUSIBLE,
        infer=_infer,
        compute=_compute,
        reference=_reference,
        flops=_flops,
        num_inputs=2,
        dtypes=D.INT,
        doc="uint8 [..., M, K] times int8 weights in the VNNI layout [N/16, K/4, 16, 4] (`pack_vnni`), exact in int32: "
            "the integer core of a quantized matmul.",
    )
)
