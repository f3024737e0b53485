"""Quantization: QuantizeLinear and DequantizeLinear (QDQ models), the QOperator forms QLinearMatMul and QLinearConv,
and dynamic quantization's DynamicQuantizeLinear and MatMulInteger.

Quantized tensors are computed on in float32 between a dequantize and a quantize: exact but for the final rounding.
Dequantized constant weights fold to float32 constants at import.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from cinn.core.ir import Value
from frontend.onnx.ops_contrib import MS
from frontend.onnx.ops_nn import convolve, gemm
from frontend.onnx.registry import NodeContext, OnnxImportError, converter, onnx_dtype


def _along(ctx: NodeContext, param: Value, rank: int, axis: int) -> Value:
    """A scale or zero point for a rank-`rank` tensor: a scalar broadcasts, a 1-D one runs along `axis`."""
    if not param.shape or rank == 0:
        return param
    if len(param.shape) != 1:
        raise OnnxImportError(f"a {len(param.shape)}-D scale or zero point needs block_size (block quantization)")
    shape = [1] * rank
    shape[axis % rank] = param.shape[0]
    return ctx.b.reshape(param, shape)


def _blocks(ctx: NodeContext, param: Value, shape: tuple[int, ...], axis: int, block: int) -> Value:
    """A block-quantization scale or zero point (`shape` but ceil(n / block) along axis) repeated over each block."""
    axis %= len(shape)
    expected = tuple(-(-d // block) if k == axis else d for k, d in enumerate(shape))
    if param.shape != expected:
        raise OnnxImportError(f"block_size {block}: a scale or zero point of shape {param.shape} for input {shape} "
                              f"(expected {expected})")
    tiled = [*expected[: axis + 1], block, *expected[axis + 1 :]]
    y = ctx.b.broadcast_to(ctx.b.expand_dims(param, axes=[axis + 1]), tiled)
    y = ctx.b.reshape(y, [*expected[:axis], expected[axis] * block, *expected[axis + 1 :]])
    return y if expected[axis] * block == shape[axis] else ctx.b.slice(y, axes=[axis], starts=[0], ends=[shape[axis]])


def dequantize(ctx: NodeContext, x: Value, scale: Value, zero_point: Value | None, dtype: str | None = None) -> Value:
    """(x - zero_point) * scale, computed in float32 and given as `dtype` (default: the scale's type)."""
    y = ctx.b.cast(x, "float32")
    if zero_point is not None:
        y = ctx.b.subtract(y, ctx.b.cast(zero_point, "float32"))
    y = ctx.b.multiply(y, _f32(ctx, scale))
    out = dtype or scale.dtype
    return y if out == "float32" else ctx.b.cast(y, out)


def quantize(ctx: NodeContext, x: Value, scale: Value, zero_point: Value | None, dtype: str) -> Value:
    """saturate(round(x / scale) + zero_point) as `dtype` (computed in float32, rounding half to even)."""
    y = ctx.b.round(ctx.b.divide(_f32(ctx, x), _f32(ctx, scale)))
    if zero_point is not None:
        y = ctx.b.add(y, ctx.b.cast(zero_point, "float32"))
    info = np.iinfo(dtype)  # saturation: NaN gives the low end (its integer is unspecified in ONNX)
    return ctx.b.cast(ctx.b.clip(y, float(info.min), float(info.max), keep_nan=False), dtype)


def _f32(ctx: NodeContext, v: Value) -> Value:
    return v if v.dtype == "float32" else ctx.b.cast(v, "float32")


def _axis_params(ctx: NodeContext, shape: tuple[int, ...]) -> tuple[Value, Value | None]:
    """Inputs 1 and 2 (scale and zero point) along the node's axis, or repeated over its blocks."""
    axis, block = ctx.attr("axis", 1), ctx.attr("block_size", 0)
    params = (ctx.input(1), ctx.input(2))
    if block:
        scale, zero_point = (None if p is None else _blocks(ctx, p, shape, axis, block) for p in params)
    else:
        scale, zero_point = (None if p is None else _along(ctx, p, len(shape), axis) for p in params)
    assert scale is not None  # a required input (the checker enforces it)
    return scale, zero_point


@converter("QuantizeLinear")
def quantize_linear(ctx: NodeContext):
    x = ctx.input(0)
    scale, zero_point = _axis_params(ctx, x.shape)
    if zero_point is not None:
        dtype = zero_point.dtype
    else:
        dtype = onnx_dtype(ctx.attr("output_dtype", 0), "output_dtype") if ctx.attr("output_dtype", 0) else "uint8"
    return [quantize(ctx, x, scale, zero_point, dtype)]


@converter("DequantizeLinear")
def dequantize_linear(ctx: NodeContext):
    x = ctx.input(0)
    scale, zero_point = _axis_params(ctx, x.shape)
    return [dequantize(ctx, x, scale, zero_point)]


def _requantize(ctx: NodeContext, y: Value, scale_at: int, like: Value) -> Value:
    """y quantized with the scale and zero point at inputs scale_at and scale_at + 1 (the zero point's type, else the
    quantized input's)."""
    zero_point = ctx.input(scale_at + 1)
    return quantize(ctx, y, ctx.input(scale_at), zero_point, zero_point.dtype if zero_point is not None else like.dtype)


@converter("QLinearMatMul")
def qlinear_matmul(ctx: NodeContext):
    """A per-row scale of a runs along its rows, a per-column one of b along its columns."""
    a, b = ctx.input(0), ctx.input(3)
    a_scale, a_zp = (None if v is None else _along(ctx, v, len(a.shape), -2) for v in (ctx.input(1), ctx.input(2)))
    b_scale, b_zp = (None if v is None else _along(ctx, v, len(b.shape), -1) for v in (ctx.input(4), ctx.input(5)))
    assert a_scale is not None and b_scale is not None  # required inputs (the checker enforces them)
    y = ctx.b.matmul(dequantize(ctx, a, a_scale, a_zp, "float32"), dequantize(ctx, b, b_scale, b_zp, "float32"))
    return [_requantize(ctx, y, 6, a)]


@converter("QLinearConv")
def qlinear_conv(ctx: NodeContext):
    """Conv of the dequantized input and weights (a per-output-channel weight scale runs along axis 0), plus the
    int32 bias at scale x_scale * w_scale, quantized."""
    x, w, bias = ctx.input(0), ctx.input(3), ctx.input(8)
    x_scale, w_scale = ctx.input(1), ctx.input(4)
    xf = dequantize(ctx, x, x_scale, ctx.input(2))
    w_zp = ctx.input(5)
    wf = dequantize(ctx, w, _along(ctx, w_scale, len(w.shape), 0),
                    None if w_zp is None else _along(ctx, w_zp, len(w.shape), 0))
    bf = None if bias is None else ctx.b.multiply(ctx.b.cast(bias, x_scale.dtype), ctx.b.multiply(x_scale, w_scale))
    return [_requantize(ctx, convolve(ctx, xf, wf, bf), 6, x)]


@converter("MatMulInteger")
def matmul_integer(ctx: NodeContext):
    """(a - a_zero_point) @ (b - b_zero_point) in int32, accumulated in float32 (exact while |sums| < 2**24; a
    larger one is off by a few units, far below the scale the result is multiplied by)."""
    a, b = ctx.input(0), ctx.input(1)
    one = ctx.b.create_constant(np.float32(1))
    a_zp = None if ctx.input(2) is None else _along(ctx, ctx.input(2), len(a.shape), -2)
    b_zp = None if ctx.input(3) is None else _along(ctx, ctx.input(3), len(b.shape), -1)
    y = ctx.b.matmul(dequantize(ctx, a, one, a_zp), dequantize(ctx, b, one, b_zp))
    return [ctx.b.cast(ctx.b.round(y), "int32")]


@converter("ConvInteger")
def conv_integer(ctx: NodeContext):
    """conv(x - x_zero_point, w - w_zero_point) in int32, accumulated in float32 as MatMulInteger (a per-channel
    weight zero point runs along the output channels)."""
    x, w = ctx.input(0), ctx.input(1)
    one = ctx.b.create_constant(np.float32(1))
    w_zp = None if ctx.input(3) is None else _along(ctx, ctx.input(3), len(w.shape), 0)
    y = convolve(ctx, dequantize(ctx, x, one, ctx.input(2)), dequantize(ctx, w, one, w_zp), None)
    return [ctx.b.cast(ctx.b.round(y), "int32")]


@converter("DynamicQuantizeLinear")
def dynamic_quantize_linear(ctx: NodeContext):
    """uint8 with the scale and zero point that map [min(x, 0), max(x, 0)] onto [0, 255]."""
    x = ctx.input(0)
    axes = list(range(len(x.shape)))
    zero = ctx.b.create_constant(np.zeros((), x.dtype))
    low = ctx.b.min(ctx.b.reduce_min(x, dim=axes), zero)
    high = ctx.b.max(ctx.b.reduce_max(x, dim=axes), zero)
    scale = ctx.b.divide(ctx.b.subtract(high, low), ctx.b.create_constant(np.asarray(255, x.dtype)))
    zero_point = ctx.b.cast(ctx.b.clip(ctx.b.round(ctx.b.divide(ctx.b.negative(low), scale)), 0.0, 255.0), "uint8")
    return [quantize(ctx, x, scale, zero_point, "uint8"), scale, zero_point]


# -- onnxruntime's com.microsoft quantized ops (quantize_static's QOperator format writes them) -------------------


@converter(MS + "QGemm")
def qgemm(ctx: NodeContext):
    """alpha * A'B' + C over dequantized A and B (a per-column scale of B runs along its N axis), C the int32 bias at
    scale a_scale * b_scale; quantized when y_scale is given, else float."""
    a, b, c = ctx.input(0), ctx.input(3), ctx.input(6)
    a_scale, b_scale = ctx.input(1), ctx.input(4)
    n_axis = 0 if ctx.attr("transB", 0) else 1
    b_zp = ctx.input(5)
    af = dequantize(ctx, a, a_scale, ctx.input(2))
    bf = dequantize(ctx, b, _along(ctx, b_scale, 2, n_axis), None if b_zp is None else _along(ctx, b_zp, 2, n_axis))
    cf = None if c is None else ctx.b.multiply(ctx.b.cast(c, a_scale.dtype), ctx.b.multiply(a_scale, b_scale))
    (y,) = gemm(dataclasses.replace(ctx, inputs=(af, bf, cf)))
    return [y if ctx.input(7) is None else _requantize(ctx, y, 7, a)]


@converter(MS + "QLinearGlobalAveragePool")
def qlinear_global_average_pool(ctx: NodeContext):
    x = ctx.input(0)
    if ctx.attr("channels_last", 0):
        raise OnnxImportError("channels_last=1 is not supported")
    xf = dequantize(ctx, x, ctx.input(1), ctx.input(2))
    return [_requantize(ctx, ctx.b.reduce_mean(xf, list(range(2, len(x.shape))), keep_dim=True), 3, x)]


@converter(MS + "QLinearAdd", MS + "QLinearMul")
def qlinear_binary(ctx: NodeContext):
    a, b = ctx.input(0), ctx.input(3)
    af, bf = dequantize(ctx, a, ctx.input(1), ctx.input(2)), dequantize(ctx, b, ctx.input(4), ctx.input(5))
    y = (ctx.b.add if ctx.node.op_type == "QLinearAdd" else ctx.b.multiply)(af, bf)
    return [_requantize(ctx, y, 6, a)]


@converter(MS + "QLinearSigmoid", MS + "QLinearLeakyRelu")
def qlinear_unary(ctx: NodeContext):
    x = ctx.input(0)
    xf = dequantize(ctx, x, ctx.input(1), ctx.input(2))
    y = ctx.b.sigmoid(xf) if ctx.node.op_type == "QLinearSigmoid" else ctx.b.leaky_relu(xf, ctx.attr("alpha", 0.01))
    return [_requantize(ctx, y, 3, x)]
