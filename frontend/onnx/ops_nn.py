"""Converters of ONNX neural-network ops: Conv, ConvTranspose, pooling, normalizations, Gemm, MatMul, LRN, Col2Im,
MaxUnpool, RoiAlign."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from cinn.core.ir import Value
from frontend import compose
from frontend.onnx.registry import NodeContext, OnnxImportError, converter
from frontend.volumetric import Window3d, conv3d, pool3d, window3d


def _as_2d(ctx: NodeContext, x: Value) -> Value:
    """1-D spatial ops run as 2-D ones with a height of 1: [N, C, L] -> [N, C, 1, L]."""
    if len(x.shape) == 3:
        return ctx.b.expand_dims(x, [2])
    if len(x.shape) != 4:
        raise OnnxImportError(f"only 1-D, 2-D and 3-D spatial inputs are supported, got shape {x.shape}")
    return x


def _back(ctx: NodeContext, y: Value, spatial: int) -> Value:
    """Undo _as_2d on an output."""
    return ctx.b.squeeze(y, [2]) if spatial == 1 else y


@dataclass(frozen=True)
class _Window:
    """The window attributes of a Conv/Pool node in 2-D form (3-D as they are), pads resolved to explicit
    (top, left, bottom, right)."""

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads: tuple[int, ...]

    def volumetric(self) -> Window3d:
        """The 3-D form of a 3-D window."""
        half = len(self.pads) // 2
        return window3d(self.kernel, self.strides, self.dilations, self.pads[:half], self.pads[half:])


def _per_dim(values, spatial: int, default: int) -> tuple[int, ...]:
    """A per-spatial-dim attribute in 2-D form: a 1-D op gets the neutral `default` for its unit height."""
    values = tuple(int(v) for v in values) if values is not None else (default,) * spatial
    return (default,) * (2 - spatial) + values


def _window(ctx: NodeContext, in_sizes: Sequence[int], kernel, spatial: int) -> _Window:
    """Kernel, strides, dilations and pads (auto_pad resolved as ONNX defines it) in 2-D form (`in_sizes` too)."""
    kernel = _per_dim(kernel, spatial, 1)
    strides = _per_dim(ctx.attr("strides", None), spatial, 1)
    dilations = _per_dim(ctx.attr("dilations", None), spatial, 1)
    dims = len(kernel)
    begin, end = _explicit_pads(ctx, spatial, dims)
    auto_pad = ctx.attr("auto_pad", "NOTSET")
    if auto_pad == "VALID":
        begin, end = [0] * dims, [0] * dims
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = _split_same([max((-(-n // s) - 1) * s + (k - 1) * d + 1 - n, 0)
                                  for n, k, s, d in zip(in_sizes, kernel, strides, dilations, strict=True)], auto_pad)
    elif auto_pad != "NOTSET":
        raise OnnxImportError(f"auto_pad {auto_pad!r} is not supported")
    return _Window(kernel, strides, dilations, (*begin, *end))


def _explicit_pads(ctx: NodeContext, spatial: int, dims: int) -> tuple[list[int], list[int]]:
    """The node's `pads` (begins, then ends; none: zeros) in 2-D form, the unit height of a 1-D op unpadded."""
    pads = ctx.attr("pads", None)
    if pads is None:
        return [0] * dims, [0] * dims
    return list(_per_dim(pads[:spatial], spatial, 0)), list(_per_dim(pads[spatial:], spatial, 0))


def _split_same(totals: Sequence[int], auto_pad: str) -> tuple[list[int], list[int]]:
    """SAME padding totals split as ONNX defines: the odd one at the end (SAME_UPPER) or at the start (SAME_LOWER)."""
    small, big = [t // 2 for t in totals], [t - t // 2 for t in totals]
    return (small, big) if auto_pad == "SAME_UPPER" else (big, small)


@converter("Conv")
def conv(ctx: NodeContext):
    return [convolve(ctx, ctx.input(0), ctx.input(1), ctx.input(2))]


def convolve(ctx: NodeContext, x: Value, w: Value, bias: Value | None) -> Value:
    """The node's convolution (its window attributes) of x with w, plus a per-channel bias."""
    spatial = len(x.shape) - 2
    kernel = ctx.attr("kernel_shape", w.shape[2:])
    if tuple(kernel) != tuple(w.shape[2:]):
        raise OnnxImportError(f"kernel_shape {tuple(kernel)} disagrees with the weights' spatial dims {tuple(w.shape[2:])}")
    if spatial == 3:
        win = _window(ctx, x.shape[2:], kernel, spatial)
        y = conv3d(ctx.b, x, w, win.volumetric(), ctx.attr("group", 1))
    else:
        x2, w2 = _as_2d(ctx, x), _as_2d(ctx, w)
        win = _window(ctx, x2.shape[2:], kernel, spatial)
        y = _back(ctx, ctx.b.conv2d(x2, w2, list(win.strides), list(win.pads), list(win.dilations), ctx.attr("group", 1)), spatial)
    if bias is not None:
        y = ctx.b.add(y, compose.channel_vector(ctx.b, bias, len(y.shape)))
    return y


@converter("ConvTranspose")
def conv_transpose(ctx: NodeContext):
    """A transposed convolution is a convolution of the stride-dilated input with the flipped kernel."""
    x, w, bias = ctx.input(0), ctx.input(1), ctx.input(2)
    spatial = len(x.shape) - 2
    x2, w2 = (x, w) if spatial == 3 else (_as_2d(ctx, x), _as_2d(ctx, w))
    sizes, kernel = x2.shape[2:], w2.shape[2:]
    strides = _per_dim(ctx.attr("strides", None), spatial, 1)
    dil = _per_dim(ctx.attr("dilations", None), spatial, 1)
    extra = _per_dim(ctx.attr("output_padding", None), spatial, 0)
    begin, end = _transposed_pads(ctx, spatial, sizes, kernel, strides, dil, extra)
    y = compose.conv_transpose(ctx.b, x2, w2, ctx.attr("group", 1), strides, dil, begin, end, extra)
    if bias is not None:
        y = ctx.b.add(y, compose.channel_vector(ctx.b, bias, len(y.shape)))
    return [_back(ctx, y, spatial)]


def _transposed_pads(ctx: NodeContext, spatial: int, sizes, kernel, strides, dil, extra) -> tuple[list[int], list[int]]:
    """A ConvTranspose node's pads before and after each spatial dim (in 2-D form for 1-D): explicit, or those that
    give output_shape (auto_pad SAME: the input size times the stride), split as ONNX defines."""
    dims = len(sizes)
    auto_pad = ctx.attr("auto_pad", "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER") or ctx.has_attr("output_shape"):
        target = (_per_dim(ctx.attr("output_shape", None), spatial, 1) if ctx.has_attr("output_shape")
                  else [size * s for size, s in zip(sizes, strides, strict=True)])
        return _split_same([s * (size - 1) + o + (k - 1) * d + 1 - t
                            for s, size, o, k, d, t in zip(strides, sizes, extra, kernel, dil, target, strict=True)],
                           auto_pad)
    if auto_pad == "VALID":
        return [0] * dims, [0] * dims
    return _explicit_pads(ctx, spatial, dims)


def _pool(ctx: NodeContext, pooling_type: str, x: Value | None = None, exclusive: bool | None = None) -> list[Value]:
    """pool2d over the node's window attributes (1-D as 2-D); x and exclusive default to the node's input and
    count_include_pad."""
    x = ctx.input(0) if x is None else x
    spatial = len(x.shape) - 2
    if exclusive is None:
        exclusive = not ctx.attr("count_include_pad", 0)
    ceil_mode = bool(ctx.attr("ceil_mode", 0))
    x2 = x if spatial == 3 else _as_2d(ctx, x)
    win = _window(ctx, x2.shape[2:], ctx.attr("kernel_shape", None), spatial)
    if spatial == 3:
        y = pool3d(ctx.b, x2, pooling_type, win.volumetric(), ceil_mode, exclusive)
    else:
        y = ctx.b.pool2d(x2, pooling_type, list(win.kernel), list(win.strides), list(win.pads), ceil_mode, exclusive,
                         dilations=list(win.dilations))
    if pooling_type == "avg" and not exclusive:
        half = len(win.pads) // 2
        y = compose.include_pad_divisor(ctx.b, y, x2.shape[2:], win.kernel, win.strides, win.dilations,
                                        win.pads[:half], win.pads[half:])
    return [_back(ctx, y, spatial)]


@converter("MaxPool")
def max_pool(ctx: NodeContext):
    if len(ctx.node.output) > 1 and ctx.node.output[1]:
        raise OnnxImportError("MaxPool's Indices output is not supported")
    return _pool(ctx, "max")


@converter("AveragePool")
def average_pool(ctx: NodeContext):
    return _pool(ctx, "avg")


@converter("LpPool")
def lp_pool(ctx: NodeContext):
    """(sum over the window of |x|^p)^(1/p): the window sums of |x|^p (zero padding), then the root."""
    x, p = ctx.input(0), float(ctx.attr("p", 2))
    powered = ctx.b.multiply(x, x) if p == 2 else ctx.b.pow(ctx.b.abs(x), ctx.b.fill_constant((), p, x.dtype))
    (mean,) = _pool(ctx, "avg", powered, exclusive=False)
    total = ctx.b.scale(mean, scale=float(np.prod(ctx.attr("kernel_shape", [1]))))  # the window's sum
    return [ctx.b.sqrt(total) if p == 2 else ctx.b.pow(total, ctx.b.fill_constant((), 1.0 / p, x.dtype))]


@converter("GlobalAveragePool", "GlobalMaxPool")
def global_pool(ctx: NodeContext):
    x = ctx.input(0)
    axes = list(range(2, len(x.shape)))
    op = ctx.b.reduce_mean if ctx.node.op_type == "GlobalAveragePool" else ctx.b.reduce_max
    return [op(x, axes, keep_dim=True)]


@converter("BatchNormalization")
def batch_norm(ctx: NodeContext):
    if ctx.attr("training_mode", 0):
        raise OnnxImportError("training_mode=1 is not supported (inference only)")
    x, scale, bias, mean, var = ctx.inputs[:5]
    return [ctx.b.batchnorm(x, scale, bias, mean, var, epsilon=ctx.attr("epsilon", 1e-5))]


@converter("InstanceNormalization")
def instance_norm(ctx: NodeContext):
    x, scale, bias = ctx.inputs
    y, _, _ = compose.standardized(ctx.b, x, list(range(2, len(x.shape))), ctx.attr("epsilon", 1e-5))
    return [compose.affine(ctx.b, y, scale, bias)]


@converter("GroupNormalization")
def group_norm(ctx: NodeContext):
    """Normalization over each group of channels with its spatial dims; scale and bias per channel (opset 21) or per
    group (opset 18), applied after."""
    x, scale, bias = ctx.input(0), ctx.input(1), ctx.input(2)
    groups, c = int(ctx.attr("num_groups", 0)), x.shape[1]
    y = compose.group_standardized(ctx.b, x, groups, ctx.attr("epsilon", 1e-5))
    scale, bias = (v if v.shape[0] == c else ctx.b.reshape(ctx.b.broadcast_to(ctx.b.reshape(v, [groups, 1]),
                                                                              [groups, c // groups]), [c])
                   for v in (scale, bias))
    return [compose.affine(ctx.b, y, scale, bias)]


@converter("MeanVarianceNormalization")
def mean_variance_norm(ctx: NodeContext):
    """(x - E[x]) / (sqrt(E[x^2] - E[x]^2) + 1e-9) over `axes`, as ONNX's function body computes it."""
    x = ctx.input(0)
    axes = sorted(int(a) % len(x.shape) for a in ctx.attr("axes", [0, 2, 3]))
    mean = ctx.b.reduce_mean(x, axes, keep_dim=True)
    var = ctx.b.subtract(ctx.b.reduce_mean(ctx.b.multiply(x, x), axes, keep_dim=True), ctx.b.multiply(mean, mean))
    std = ctx.b.add(ctx.b.sqrt(var), ctx.b.fill_constant((), 1e-9, x.dtype))
    return [ctx.b.divide(ctx.b.subtract(x, mean), std)]


@converter("LayerNormalization")
def layer_norm(ctx: NodeContext):
    x = ctx.input(0)
    axis = ctx.attr("axis", -1) % len(x.shape)
    return layer_norm_outputs(ctx, x, ctx.input(1), ctx.input(2), axis, ctx.attr("epsilon", 1e-5), ctx.node.output[1:3])


def layer_norm_outputs(ctx: NodeContext, x: Value, scale: Value, bias: Value | None, axis: int, eps: float,
                       stats: Sequence[str]) -> list[Value]:
    """Layer norm over the axes from `axis`, and its mean and inverse standard deviation where `stats` (the names of
    those outputs) asks for them."""
    norm = list(x.shape[axis:])
    scale, bias = (ctx.b.broadcast_to(v, norm) if v.shape != tuple(norm) else v
                   for v in (scale, bias if bias is not None else ctx.b.fill_constant(norm, 0, x.dtype)))
    if not any(stats):
        return [ctx.b.layer_norm(x, scale, bias, begin_norm_axis=axis, epsilon=eps)]
    # Mean and InvStdDev are wanted too: the same decomposition, spelled out to expose them
    normed, mean, inv_std = compose.standardized(ctx.b, x, list(range(axis, len(x.shape))), eps)
    return [ctx.b.add(ctx.b.multiply(normed, scale), bias), mean, inv_std]


@converter("Gemm")
def gemm(ctx: NodeContext):
    a, b, c = ctx.input(0), ctx.input(1), ctx.input(2)
    alpha, beta = ctx.attr("alpha", 1.0), ctx.attr("beta", 1.0)
    y = ctx.b.matmul(a, b, bool(ctx.attr("transA", 0)), bool(ctx.attr("transB", 0)), alpha)
    if c is None or beta == 0.0:
        return [y]
    return [ctx.b.add(y, c if beta == 1.0 else ctx.b.scale(c, scale=beta))]


@converter("MatMul")
def matmul(ctx: NodeContext):
    return [ctx.b.matmul(ctx.input(0), ctx.input(1))]


@converter("LRN")
def lrn(ctx: NodeContext):
    size = ctx.attr("size", None)
    alpha, beta, bias = ctx.attr("alpha", 1e-4), ctx.attr("beta", 0.75), ctx.attr("bias", 1.0)
    return [compose.lrn(ctx.b, ctx.input(0), size, alpha / size, beta, bias)]



def _ints(values) -> list[int]:
    """An ints attribute or constant input as a list (None: empty, the op's default)."""
    return [] if values is None else [int(v) for v in np.asarray(values).reshape(-1)]


@converter("Col2Im")
def col2im(ctx: NodeContext):
    image, block = (_ints(ctx.require_const(i, what)) for i, what in ((1, "image_shape"), (2, "block_shape")))
    return [ctx.b.col2im(ctx.input(0), image, block, _ints(ctx.attr("strides", None)),
                         _ints(ctx.attr("dilations", None)), _ints(ctx.attr("pads", None)))]


@converter("MaxUnpool")
def max_unpool(ctx: NodeContext):
    """MaxPool's values back at its indices. With output_shape, the unpooled tensor of the default size is padded at
    the end to it: the indices address the default size, as in ONNX's reference (onnxruntime reads them in the
    output_shape instead)."""
    x, index = ctx.input(0), ctx.input(1)
    if not ctx.has_attr("kernel_shape"):
        raise OnnxImportError("MaxUnpool needs kernel_shape")
    y = ctx.b.max_unpool(x, index, _ints(ctx.attr("kernel_shape", None)), _ints(ctx.attr("strides", None)),
                         _ints(ctx.attr("pads", None)))
    if ctx.input(2) is None:
        return [y]
    target = tuple(_ints(ctx.require_const(2, "output_shape")))
    if len(target) != len(y.shape) or target[:2] != y.shape[:2] or any(t < d for t, d in zip(target, y.shape, strict=True)):
        raise OnnxImportError(f"output_shape {target} must keep N and C and be at least the unpooled shape {y.shape}")
    return [y if target == y.shape else ctx.b.pad(y, [(0, t - d) for t, d in zip(target, y.shape, strict=True)])]


@converter("RoiAlign")
def roi_align(ctx: NodeContext):
    """coordinate_transformation_mode came in opset 16 with the default half_pixel; before, rois were output_half_pixel."""
    mode = ctx.attr("coordinate_transformation_mode", "half_pixel" if ctx.opset >= 16 else "output_half_pixel")
    return [ctx.b.roi_align(ctx.input(0), ctx.input(1), ctx.input(2), output_height=ctx.attr("output_height", 1),
                            output_width=ctx.attr("output_width", 1), sampling_ratio=ctx.attr("sampling_ratio", 0),
                            spatial_scale=ctx.attr("spatial_scale", 1.0), coordinate_transformation_mode=mode,
                            mode=ctx.attr("mode", "avg"))]
