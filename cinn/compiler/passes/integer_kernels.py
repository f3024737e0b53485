"""Quantized matmuls and convolutions in integers: matmul(dequantize(q), W) with q uint8 and W constant weights that
are int8 values times a per-tensor or per-column scale (a dequantized int8 weight, as QDQ models hold them) becomes
matmul_u8i8 on q and the int8 values, exact in int32, minus the zero point's share, times the two scales; a conv2d
likewise becomes conv2d_u8i8 on q laid out channels last and padded with its zero point. For CPUs with AVX-512
VNNI, where the integer products run at 3-4x the float ones. The weights' groups are as wide as the CPU's vectors
(CpuModel.lanes int32 lanes)."""
from __future__ import annotations

import numpy as np

from cinn.compiler.passes.rewrite import Rewriter, rewrite
from cinn.core.cpu_model import CpuModel
from cinn.core.ir import Node, Program, Value
from cinn.core.ops.elementwise import CastAttrs
from cinn.core.ops.nn import TO_NCHW, TO_NHWC, Conv2dAttrs, DataFormat, conv_windows
from cinn.core.ops.quant import DEPTH, IntConvAttrs, pack_vnni, pack_vnni_conv
from cinn.core.ops.shape import PadAttrs, SliceAttrs, TransposeAttrs


def integer_kernels(program: Program, cpu: CpuModel) -> Program:
    """Rewrite every matmul and conv2d of a dequantized uint8 tensor and int8-valued constant weights (see the
    module) for a CPU with VNNI."""
    lanes = cpu.lanes
    return rewrite(program, lambda rw, node: _integer_matmul(rw, node, lanes) or _integer_conv(rw, node, lanes))


def _integer_matmul(rw: Rewriter, node: Node, lanes: int) -> bool:
    if node.op != "matmul" or node.attrs.trans_x or node.attrs.alpha != 1.0:
        return False
    x, w = rw.inputs(node)
    weights = rw.constant(w)
    dequantized = _dequantized_uint8(rw, x)
    if weights is None or weights.ndim != 2 or dequantized is None or weights.dtype != np.float32 or len(x.shape) < 2:
        return False  # (a vector times a matrix stays float: matmul_u8i8 takes rows)
    weights = weights.T if node.attrs.trans_y else weights
    k, n = weights.shape
    split = int8_weights(weights)
    if split is None or k % DEPTH:
        return False
    q, zero, scale = dequantized
    values, w_scale = split
    # columns padded to whole vectors with zero weights (1000 classes), sliced off again
    packed = pack_vnni(np.pad(values, ((0, 0), (0, -n % lanes))), lanes)
    (acc,) = rw.emit("matmul_u8i8", [q, rw.new_constant(packed, "w_u8i8")])
    if n % lanes:
        (acc,) = rw.emit("slice", [acc], SliceAttrs((len(acc.shape) - 1,), (0,), (n,)))
    _rescale(rw, node, acc, zero * values.astype(np.int64).sum(axis=0), np.float32(scale) * w_scale)
    return True


def _integer_conv(rw: Rewriter, node: Node, lanes: int) -> bool:
    a = node.attrs
    if node.op != "conv2d" or not isinstance(a, Conv2dAttrs) or a.groups != 1 or a.data_format is not DataFormat.NCHW:
        return False
    x, w = rw.inputs(node)
    weights = rw.constant(w)
    dequantized = _dequantized_uint8(rw, x)
    if weights is None or dequantized is None or weights.dtype != np.float32:
        return False
    oc, c = weights.shape[:2]
    split = int8_weights(weights.reshape(oc, -1).T)  # one scale per output channel at most
    if split is None:
        return False
    q, zero, scale = dequantized
    values, w_scale = split[0].T.reshape(weights.shape), split[1]
    rows, cols = conv_windows(x.shape, weights.shape, a)
    (nhwc,) = rw.emit("transpose", [q], TransposeAttrs(TO_NHWC))
    # padding is the zero point (a real zero); channels are padded to whole steps of 4 with zero weights (an RGB stem)
    extra = -c % DEPTH
    pads = ((0, 0), (rows.pad_begin, rows.pad_end), (cols.pad_begin, cols.pad_end), (0, extra))
    if any(p for pair in pads for p in pair):
        (nhwc,) = rw.emit("pad", [nhwc], PadAttrs(pads, float(zero)))
    attrs = IntConvAttrs((rows.stride, cols.stride), (rows.dilation, cols.dilation))
    # output channels padded to whole vectors with zero weights (1000 classes), sliced off again
    packed = pack_vnni_conv(np.pad(values, ((0, -oc % lanes), (0, extra), (0, 0), (0, 0))), lanes)
    (acc,) = rw.emit("conv2d_u8i8", [nhwc, rw.new_constant(packed, "w_u8i8")], attrs)
    if oc % lanes:
        (acc,) = rw.emit("slice", [acc], SliceAttrs((3,), (0,), (oc,)))
    (acc,) = rw.emit("transpose", [acc], TransposeAttrs(TO_NCHW))  # sink_transposes moves it to NCHW consumers
    per_channel = (oc, 1, 1)
    shift = zero * values.astype(np.int64).sum(axis=(1, 2, 3)).reshape(per_channel)
    _rescale(rw, node, acc, shift, (np.float32(scale) * w_scale).reshape(per_channel))
    return True


def _rescale(rw: Rewriter, node: Node, acc: Value, shift: np.ndarray, scale: np.ndarray) -> None:
    """Replace node's output by (acc - shift) * scale: the zero point's share of the integer sums (exact in int32),
    then the product of the input's and the weights' scales."""
    if shift.any():
        (acc,) = rw.emit("subtract", [acc, rw.new_constant(shift.astype(np.int32), "zero_shift")])
    (y,) = rw.emit("cast", [acc], CastAttrs("float32"))
    (y,) = rw.emit("multiply", [y, rw.new_constant(scale.astype(np.float32), "scale")])
    rw.substitute(node.outputs[0], y)


def _dequantized_uint8(rw: Rewriter, x: Value) -> tuple[Value, int, float] | None:
    """(q, zero point, scale) when x = (cast(q: uint8) - zero point) * scale with scalar constants, else None."""
    mul = rw.producer(x)
    if mul is None or mul.op != "multiply":
        return None
    shifted, scale = rw.inputs(mul)
    scale_data = rw.constant(scale)
    if scale_data is None or scale_data.size != 1:
        return None
    zero, producer = 0, rw.producer(shifted)
    if producer is not None and producer.op == "subtract":  # the zero point (absent: 0)
        shifted, point = rw.inputs(producer)
        point_data = rw.constant(point)
        if point_data is None or point_data.size != 1 or not float(point_data.item()).is_integer():
            return None
        zero, producer = int(point_data.item()), rw.producer(shifted)
    if producer is None or producer.op != "cast" or rw.inputs(producer)[0].dtype != "uint8":
        return None
    return rw.inputs(producer)[0], zero, float(scale_data.item())


def int8_weights(w: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(int8 values [K, N], float32 scale [N]) whose products are exactly w: w itself when it holds int8 integers,
    else one scale for the tensor, then one per column: the largest magnitude over 127 (the symmetric int8
    quantization that writes such weights) or a float32 next to it; None when w is not such a product."""
    magnitude = np.abs(w)
    if np.all(np.mod(w, 1) == 0) and w.min() >= -128 and w.max() <= 127:  # integers already (MatMulInteger)
        return w.astype(np.int8), np.ones(w.shape[1], np.float32)
    for largest in (magnitude.max(keepdims=True), magnitude.max(axis=0, keepdims=True)):
        scale = _exact_scale(w, (largest / np.float32(127)).astype(np.float32))
        if scale is not None:
            return np.round(w / scale).astype(np.int8), np.broadcast_to(scale, (1, w.shape[1])).reshape(-1).copy()
    return None


def _exact_scale(w: np.ndarray, guess: np.ndarray) -> np.ndarray | None:
    """Per entry of `guess` ([1, 1] or [1, N]): it or a neighbouring float32 whose int8 multiples are exactly w's
    values (the guess divides a rounded product: it can be one unit in the last place off)."""
    guess = np.where(guess == 0, np.float32(1), guess)
    scale, found = guess.copy(), np.zeros(guess.shape, bool)
    for candidate in (guess, np.nextafter(guess, np.float32(np.inf)), np.nextafter(guess, np.float32(0))):
        values = np.round(w / candidate)
        exact = (np.abs(values) <= 127) & ((values.astype(np.float32) * candidate).astype(np.float32) == w)
        exact = exact.all(axis=0, keepdims=True) if guess.shape[1] > 1 else exact.all(keepdims=True)
        scale = np.where(exact & ~found, candidate, scale)
        found |= exact
    return scale if found.all() else None
