"""Converters of Paddle neural-network ops: matmul, mul, conv2d/3d, pool2d/3d, batch_norm, layer_norm, unpool/unpool3d,
roi_align."""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from cinn.core.ir import Value
from frontend.paddle.graph import PaddleImportError
from frontend.paddle.registry import OpContext, converter
from frontend.volumetric import Window3d, conv3d, pool3d, window3d


def _attr_of(ctx: OpContext, names: Sequence[str], default):
    """The first present attribute among spellings of one setting (matmul_v2, PIR matmul, legacy matmul)."""
    return next((ctx.attr(n) for n in names if n in ctx.op.attrs), default)


@converter("matmul_v2", "matmul")
def matmul(ctx: OpContext):
    trans_x = bool(_attr_of(ctx, ("trans_x", "transpose_x", "transpose_X"), False))
    trans_y = bool(_attr_of(ctx, ("trans_y", "transpose_y", "transpose_Y"), False))
    return [ctx.b.matmul(ctx.input("X", 0), ctx.input("Y", 1), trans_x, trans_y, float(ctx.attr("alpha", 1.0)))]


@converter("mul")
def mul(ctx: OpContext):
    """Legacy mul: x flattened to 2-D at x_num_col_dims, y at y_num_col_dims, then a matmul."""
    x, y = ctx.input("X", 0), ctx.input("Y", 1)
    xn, yn = ctx.attr("x_num_col_dims", 1), ctx.attr("y_num_col_dims", 1)
    x2 = ctx.b.reshape(x, [math.prod(x.shape[:xn]), math.prod(x.shape[xn:])]) if len(x.shape) != 2 else x
    y2 = ctx.b.reshape(y, [math.prod(y.shape[:yn]), math.prod(y.shape[yn:])]) if len(y.shape) != 2 else y
    out = ctx.b.matmul(x2, y2)
    shape = list(x.shape[:xn]) + list(y.shape[yn:])
    return [ctx.b.reshape(out, shape) if tuple(shape) != out.shape else out]


def _paddings(ctx: OpContext) -> list[int]:
    """Paddle's paddings, (h, w) or (top, bottom, left, right), in the table's (h, w) or (top, left, bottom, right)."""
    pads = [int(p) for p in ctx.attr("paddings", [0, 0])]
    if len(pads) == 4:
        top, bottom, left, right = pads
        return [top, left, bottom, right]
    if len(pads) != 2:
        raise PaddleImportError(f"paddings {pads} must have 2 or 4 values")
    return pads


def _data_format(ctx: OpContext, attr: str) -> str:
    fmt = ctx.attr(attr, "NCHW")
    return "NCHW" if fmt == "AnyLayout" else fmt


@converter("conv2d", "depthwise_conv2d", outputs=("Output",))
def conv2d(ctx: OpContext):
    return [ctx.b.conv2d(ctx.input("Input", 0), ctx.input("Filter", 1), strides=ctx.attr("strides", [1, 1]),
                         paddings=_paddings(ctx), dilations=ctx.attr("dilations", [1, 1]),
                         groups=ctx.attr("groups", 1), data_format=_data_format(ctx, "data_format"),
                         padding_algorithm=ctx.attr("padding_algorithm", "EXPLICIT"))]


@converter("pool2d")
def pool2d(ctx: OpContext):
    ksize = ctx.int_array("ksize", 1, "the kernel size")  # the output size when adaptive
    return [ctx.b.pool2d(ctx.input("X", 0), ctx.attr("pooling_type"), list(ksize), strides=ctx.attr("strides", [1, 1]),
                         paddings=_paddings(ctx), ceil_mode=bool(ctx.attr("ceil_mode", False)),
                         exclusive=bool(ctx.attr("exclusive", True)),
                         global_pooling=bool(ctx.attr("global_pooling", False)),
                         data_format=_data_format(ctx, "data_format"), adaptive=bool(ctx.attr("adaptive", False)),
                         padding_algorithm=ctx.attr("padding_algorithm", "EXPLICIT"))]


def _window3d(ctx: OpContext, kernel: Sequence[int]) -> Window3d:
    """A conv3d/pool3d window: paddings (d, h, w) or (front, back, top, bottom, left, right), NCDHW, explicit."""
    fmt = _data_format(ctx, "data_format")
    if fmt not in ("NCHW", "NCDHW"):
        raise PaddleImportError(f"data_format {fmt!r} is not supported (NCDHW only)")
    algorithm = ctx.attr("padding_algorithm", "EXPLICIT")
    pads = [int(p) for p in ctx.attr("paddings", [0, 0, 0])] if algorithm == "EXPLICIT" else [0, 0, 0]
    if algorithm not in ("EXPLICIT", "VALID"):
        raise PaddleImportError(f"padding_algorithm {algorithm!r} is not supported for 3-D ops (EXPLICIT or VALID)")
    if len(pads) not in (3, 6):
        raise PaddleImportError(f"paddings {pads} must have 3 or 6 values")
    begin, end = (pads, pads) if len(pads) == 3 else (pads[0::2], pads[1::2])
    return window3d(kernel, ctx.attr("strides", [1, 1, 1]), ctx.attr("dilations", [1, 1, 1]), begin, end)


@converter("conv3d", outputs=("Output",))
def conv3d_op(ctx: OpContext):
    x, w = ctx.input("Input", 0), ctx.input("Filter", 1)
    return [conv3d(ctx.b, x, w, _window3d(ctx, w.shape[2:]), ctx.attr("groups", 1))]


@converter("pool3d")
def pool3d_op(ctx: OpContext):
    x = ctx.input("X", 0)
    kind = ctx.attr("pooling_type")
    if ctx.attr("global_pooling", False):
        return [(ctx.b.reduce_max if kind == "max" else ctx.b.reduce_mean)(x, [2, 3, 4], keep_dim=True)]
    if ctx.attr("adaptive", False):
        raise PaddleImportError("adaptive pool3d is not supported")
    win = _window3d(ctx, ctx.int_array("ksize", 1, "the kernel size"))
    return [pool3d(ctx.b, x, kind, win, bool(ctx.attr("ceil_mode", False)), bool(ctx.attr("exclusive", True)))]


def _optional_vector(ctx: OpContext, slot: str, pos: int, size: int, fill: float, like: Value) -> Value:
    """An optional per-channel/per-feature vector input, or `fill` where the layer has none (affine off)."""
    v = ctx.optional_input(slot, pos)
    return v if v is not None else ctx.b.fill_constant([size], fill, like.dtype)


@converter("batch_norm", "batch_norm_", outputs=("Y",))
def batch_norm(ctx: OpContext):
    if not (ctx.attr("is_test", False) or ctx.attr("use_global_stats", False)):
        raise PaddleImportError("training-mode batch_norm (is_test=False) is not supported; save the model in eval mode")
    layout = _data_format(ctx, "data_format" if ctx.pir else "data_layout")
    x = ctx.input("X", 0)
    channels = x.shape[1 if layout == "NCHW" else -1]
    scale = _optional_vector(ctx, "Scale", 3, channels, 1.0, x)
    bias = _optional_vector(ctx, "Bias", 4, channels, 0.0, x)
    return [ctx.b.batchnorm(x, scale, bias, ctx.input("Mean", 1), ctx.input("Variance", 2),
                            epsilon=float(ctx.attr("epsilon", 1e-5)), data_layout=layout)]


@converter("layer_norm", outputs=("Y",))
def layer_norm(ctx: OpContext):
    x = ctx.input("X", 0)
    axis = ctx.attr("begin_norm_axis", 1)
    size = math.prod(x.shape[axis:])
    scale = _optional_vector(ctx, "Scale", 1, size, 1.0, x)
    bias = _optional_vector(ctx, "Bias", 2, size, 0.0, x)
    return [ctx.b.layer_norm(x, scale, bias, begin_norm_axis=axis, epsilon=float(ctx.attr("epsilon", 1e-5)))]


@converter("unpool", "unpool3d")
def unpool(ctx: OpContext):
    """Max unpooling. Paddle's indices count within each channel's plane of the output: offset by the plane's start
    to index the whole output, as the table's max_unpool does."""
    if ctx.attr("unpooling_type", "max") != "max":
        raise PaddleImportError(f"unpooling_type {ctx.attr('unpooling_type')!r} is not supported (max only)")
    if _data_format(ctx, "data_format") not in ("NCHW", "NCDHW"):
        raise PaddleImportError(f"data_format {ctx.attr('data_format')!r} is not supported (channels first only)")
    x, index = ctx.input("X", 0), ctx.input("Indices", 1)
    (n, c, *pooled), spatial = x.shape, len(x.shape) - 2
    ksize, strides = [int(k) for k in ctx.attr("ksize")], [int(s) for s in ctx.attr("strides", [1] * spatial)]
    pads = [int(p) for p in _attr_of(ctx, ("paddings", "padding"), [0] * spatial)]
    size = [d for d in ctx.int_array("output_size", 2, "the output size")[-spatial:] if d > 0] or \
        [(p - 1) * s - 2 * pad + k for p, s, pad, k in zip(pooled, strides, pads, ksize, strict=True)]
    planes = np.arange(n * c, dtype=np.int64).reshape(n, c, *[1] * spatial) * math.prod(size)
    flat = ctx.b.add(ctx.b.cast(index, "int64"), ctx.b.create_constant(planes))
    return [ctx.b.max_unpool(x, flat, ksize, strides, pads + pads, out_shape=size)]


@converter("roi_align")
def roi_align(ctx: OpContext):
    """aligned shifts the rois by half a pixel (ONNX's half_pixel); a sampling_ratio <= 0 is adaptive."""
    x, rois = ctx.input("X", 0), ctx.input("ROIs", 1)
    images = _roi_images(ctx, rois.shape[0], x.shape[0], ctx.optional_input("RoisNum", 2))
    return [ctx.b.roi_align(x, rois, images, output_height=int(ctx.attr("pooled_height", 1)),
                            output_width=int(ctx.attr("pooled_width", 1)),
                            sampling_ratio=max(int(ctx.attr("sampling_ratio", -1)), 0),
                            spatial_scale=float(ctx.attr("spatial_scale", 1.0)),
                            coordinate_transformation_mode="half_pixel" if ctx.attr("aligned", False) else "output_half_pixel")]


def _roi_images(ctx: OpContext, rois: int, images: int, counts: Value | None) -> Value:
    """The image of each roi: Paddle groups the rois by image, counts[b] of image b (no counts: one image)."""
    if counts is None:
        if images != 1:
            raise PaddleImportError(f"roi_align without RoisNum needs a batch of one image, got {images} (LoD is not read)")
        return ctx.b.fill_constant([rois], 0, "int64")
    # where each image's rois end: a running sum of the counts, as a masked row sum
    before = ctx.b.create_constant(np.tril(np.ones((images, images), np.int64)))
    ends = ctx.b.reduce_sum(ctx.b.multiply(before, ctx.b.cast(counts, "int64")), [1])
    # roi r belongs to the image after every image that ends at or before it
    positions = ctx.b.create_constant(np.arange(rois, dtype=np.int64).reshape(rois, 1))
    return ctx.b.reduce_sum(ctx.b.cast(ctx.b.greater_equal(positions, ends), "int64"), [1])
