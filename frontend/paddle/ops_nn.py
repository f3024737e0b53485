"""Converters of Paddle neural-network ops: matmul and its relatives, convolutions (transposed too), pooling,
normalizations, embedding, interpolation, pixel shuffles, unfold, unpool/unpool3d, roi_align."""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from cinn.core.ir import Value
from frontend import compose
from frontend.paddle.graph import PaddleImportError
from frontend.paddle.registry import OpContext, attr_of, converter
from frontend.volumetric import Window3d, conv3d, pool3d, window3d


@converter("matmul_v2", "matmul")
def matmul(ctx: OpContext):
    trans_x = bool(attr_of(ctx, ("trans_x", "transpose_x", "transpose_X"), False))
    trans_y = bool(attr_of(ctx, ("trans_y", "transpose_y", "transpose_Y"), False))
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
    x = ctx.input("X", 0)
    ksize = ctx.int_array("ksize", 1, "the kernel size")  # the output size when adaptive
    kind, pads, fmt = ctx.attr("pooling_type"), _paddings(ctx), _data_format(ctx, "data_format")
    flags = {f: bool(ctx.attr(f, False)) for f in ("ceil_mode", "global_pooling", "adaptive")}
    exclusive = bool(ctx.attr("exclusive", True))
    algorithm = ctx.attr("padding_algorithm", "EXPLICIT")
    strides = [int(s) for s in ctx.attr("strides", [1, 1])]
    y = ctx.b.pool2d(x, kind, list(ksize), strides=strides, paddings=pads, exclusive=exclusive, data_format=fmt,
                     padding_algorithm=algorithm, **flags)
    if kind == "avg" and not exclusive and fmt == "NCHW" and algorithm == "EXPLICIT" and \
            not (flags["global_pooling"] or flags["adaptive"]):
        begin, end = (pads, pads) if len(pads) == 2 else (pads[:2], pads[2:])
        y = compose.include_pad_divisor(ctx.b, y, x.shape[2:], ksize, strides, [1, 1], begin, end)
    return [y]


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


@converter("pool3d", "max_pool3d_with_index", outputs=("Out", "Mask"))
def pool3d_op(ctx: OpContext):
    """3-D pooling; max_pool3d_with_index's argmax mask is not produced."""
    x = ctx.input("X", 0)
    kind = ctx.attr("pooling_type", "max")
    if ctx.attr("global_pooling", False):
        return [(ctx.b.reduce_max if kind == "max" else ctx.b.reduce_mean)(x, [2, 3, 4], keep_dim=True)]
    ksize = ctx.int_array("kernel_size" if ctx.pir else "ksize", 1, "the kernel size")
    if ctx.attr("adaptive", False):  # output sizes that divide the input's: windows of in / out, as many strides
        if any(n % o for n, o in zip(x.shape[2:], ksize, strict=True)):
            raise PaddleImportError(f"adaptive pool3d to {tuple(ksize)} is supported where it divides {x.shape[2:]}")
        steps = [n // o for n, o in zip(x.shape[2:], ksize, strict=True)]
        return [pool3d(ctx.b, x, kind, window3d(steps, steps, (1, 1, 1), (0, 0, 0), (0, 0, 0)), False, True)]
    win = _window3d(ctx, ksize)
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
    pads = [int(p) for p in attr_of(ctx, ("paddings", "padding"), [0] * spatial)]
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


# -- matmul relatives ----------------------------------------------------------------------------------
@converter("bmm")
def bmm(ctx: OpContext):
    """Batched matmul."""
    return [ctx.b.matmul(ctx.input("X", 0), ctx.input("Y", 1))]


@converter("dot")
def dot(ctx: OpContext):
    """The inner products along the last axis."""
    x, y = ctx.input("X", 0), ctx.input("Y", 1)
    return [ctx.b.reduce_sum(ctx.b.multiply(x, y), [len(x.shape) - 1])]


@converter("mv")
def mv(ctx: OpContext):
    """Matrix times vector."""
    x, vec = ctx.input("X", 0), ctx.input("Vec", 1)
    return [ctx.b.reshape(ctx.b.matmul(x, ctx.b.reshape(vec, [-1, 1])), [x.shape[0]])]


@converter("addmm")
def addmm(ctx: OpContext):
    """beta * input + alpha * x @ y."""
    alpha, beta = float(attr_of(ctx, ("alpha", "Alpha"), 1.0)), float(attr_of(ctx, ("beta", "Beta"), 1.0))
    product = ctx.b.matmul(ctx.input("X", 1), ctx.input("Y", 2), False, False, alpha)
    return [ctx.b.add(ctx.b.scale(ctx.input("Input", 0), scale=beta), product)]


@converter("kron")
def kron(ctx: OpContext):
    """The Kronecker product: each element of x times the whole of y, laid out block by block."""
    x, y = ctx.input("X", 0), ctx.input("Y", 1)
    rank = max(len(x.shape), len(y.shape))
    xs, ys = ([1] * (rank - len(v.shape)) + list(v.shape) for v in (x, y))
    wide_x = ctx.b.reshape(x, [d for n in xs for d in (n, 1)])
    wide_y = ctx.b.reshape(y, [d for n in ys for d in (1, n)])
    return [ctx.b.reshape(ctx.b.multiply(wide_x, wide_y), [a * c for a, c in zip(xs, ys, strict=True)])]


@converter("cross")
def cross(ctx: OpContext):
    """The cross product of 3-vectors along an axis (the first of size 3 when none is given)."""
    x, y = ctx.input("X", 0), ctx.input("Y", 1)
    axis = attr_of(ctx, ("axis", "dim"), None)
    if axis is None or axis == 9:  # Paddle's default: the first axis of size 3
        axis = next(k for k, d in enumerate(x.shape) if d == 3)
    axis = int(axis) % len(x.shape)
    xs, ys = ([ctx.b.slice(v, [axis], [k], [k + 1]) for k in range(3)] for v in (x, y))
    parts = [ctx.b.subtract(ctx.b.multiply(xs[(k + 1) % 3], ys[(k + 2) % 3]),
                            ctx.b.multiply(xs[(k + 2) % 3], ys[(k + 1) % 3])) for k in range(3)]
    return [ctx.b.concat(parts, axis=axis)]


# -- transposed convolutions ----------------------------------------------------------------------------
@converter("conv2d_transpose", "depthwise_conv2d_transpose", "conv3d_transpose", outputs=("Output",))
def conv_transpose(ctx: OpContext):
    """Paddings (per dim, or before and after each), SAME/VALID, output_padding or output_size; NHWC / NDHWC by
    transposes."""
    x, w = ctx.input("Input", 0), ctx.input("Filter", 1)
    spatial = len(x.shape) - 2
    channels_last = _data_format(ctx, "data_format") in ("NHWC", "NDHWC")
    if channels_last:
        x = ctx.b.transpose(x, [0, spatial + 1, *range(1, spatial + 1)])
    sizes, kernel = x.shape[2:], w.shape[2:]
    strides = [int(v) for v in ctx.attr("strides", [1] * spatial)]
    dil = [int(v) for v in ctx.attr("dilations", [1] * spatial)]
    begin, end = _transposed_pads(ctx, sizes, kernel, strides, dil)
    natural = [(n - 1) * s - b - e + d * (k - 1) + 1
               for n, s, b, e, d, k in zip(sizes, strides, begin, end, dil, kernel, strict=True)]
    wanted = [int(v) for v in ctx.int_array("output_size", 2, "the output size")] if _has_output_size(ctx) else []
    extra = [o - n for o, n in zip(wanted, natural, strict=True)] if wanted else \
        ([int(v) for v in ctx.attr("output_padding", [])] or [0] * spatial)
    bias = ctx.optional_input("Bias", 3) if not ctx.pir else None
    y = compose.conv_transpose(ctx.b, x, w, int(ctx.attr("groups", 1)), strides, dil, begin, end, extra)
    if bias is not None:
        y = ctx.b.add(y, compose.channel_vector(ctx.b, bias, len(y.shape)))
    return [ctx.b.transpose(y, [0, *range(2, spatial + 2), 1]) if channels_last else y]


def _has_output_size(ctx: OpContext) -> bool:
    """Whether the op fixes its output size (PIR: operand 2 with values; legacy: a non-empty attribute)."""
    if ctx.pir:
        return len(ctx.op.inputs) > 2 and bool(ctx.op.inputs[2].names) and \
            bool(ctx.int_array("output_size", 2, "the output size"))
    return bool(ctx.attr("output_size", []))


def _transposed_pads(ctx: OpContext, sizes, kernel, strides, dil) -> tuple[list[int], list[int]]:
    """Pads before and after each spatial dim: explicit (one per dim, or a pair per dim), VALID, or SAME (the
    convolution's padding of the input for an output of ceil(in / stride), dilations 1)."""
    algorithm = ctx.attr("padding_algorithm", "EXPLICIT")
    dims = len(sizes)
    if algorithm == "VALID":
        return [0] * dims, [0] * dims
    if algorithm == "SAME":
        dil[:] = [1] * dims
        totals = [max((-(-n // s) - 1) * s + k - n, 0) for n, s, k in zip(sizes, strides, kernel, strict=True)]
        return [t // 2 for t in totals], [t - t // 2 for t in totals]
    pads = [int(p) for p in ctx.attr("paddings", [0] * dims)]
    if len(pads) == dims:
        return pads, pads
    if len(pads) != 2 * dims:
        raise PaddleImportError(f"paddings {pads} must have {dims} or {2 * dims} values")
    return pads[0::2], pads[1::2]


# -- normalizations ----------------------------------------------------------------------------------
@converter("group_norm", outputs=("Y",))
def group_norm(ctx: OpContext):
    """Standardized over each group of channels with the spatial dims, then per-channel scale and bias (NHWC by
    transposes)."""
    x = ctx.input("X", 0)
    channels_last = _data_format(ctx, "data_format" if ctx.pir else "data_layout") == "NHWC"
    if channels_last:
        x = ctx.b.transpose(x, [0, len(x.shape) - 1, *range(1, len(x.shape) - 1)])
    y = compose.group_standardized(ctx.b, x, int(ctx.attr("groups")), float(ctx.attr("epsilon", 1e-5)))
    y = compose.affine(ctx.b, y, ctx.optional_input("Scale", 1), ctx.optional_input("Bias", 2))
    return [ctx.b.transpose(y, [0, *range(2, len(y.shape)), 1]) if channels_last else y]


@converter("instance_norm", outputs=("Y",))
def instance_norm(ctx: OpContext):
    """Standardized over each sample's channel, then per-channel scale and bias."""
    x = ctx.input("X", 0)
    y, _, _ = compose.standardized(ctx.b, x, list(range(2, len(x.shape))), float(ctx.attr("epsilon", 1e-5)))
    return [compose.affine(ctx.b, y, ctx.optional_input("Scale", 1), ctx.optional_input("Bias", 2))]


# -- embedding ---------------------------------------------------------------------------------------
@converter("embedding", "lookup_table_v2", "lookup_table")
def embedding(ctx: OpContext):
    """Rows of the table by id; ids equal to padding_idx (-1: none) give zeros. Legacy lookup_table's ids end in a
    dim of 1."""
    ids, table = ctx.input("Ids", 0), ctx.input("W", 1)
    if ctx.op.type == "lookup_table" and ids.shape and ids.shape[-1] == 1:
        ids = ctx.b.reshape(ids, list(ids.shape[:-1]))
    rows = ctx.b.gather(table, ids, axis=0)
    pad = int(ctx.attr("padding_idx", -1))
    if pad < 0:
        return [rows]
    blank = ctx.b.reshape(ctx.b.equal(ids, ctx.b.fill_constant((), pad, ids.dtype)), list(ids.shape) + [1])
    return [ctx.b.select(blank, compose.scalar(ctx.b, 0, rows), rows)]


# -- interpolation -----------------------------------------------------------------------------------
_INTERP = {"nearest": "nearest", "bilinear": "linear", "linear": "linear", "trilinear": "linear", "bicubic": "cubic"}


@converter(*(f"{m}_interp{v}" for m in _INTERP for v in ("", "_v2")))
def interpolate(ctx: OpContext):
    """Resize of the spatial dims to out_d/out_h/out_w, a size tensor, or by scales (whose reciprocals are then the
    coordinate ratios); align_corners maps corner to corner, align_mode 1 (linear) uses asymmetric coordinates."""
    x = ctx.input("X", 0)
    method = ctx.op.type.partition("_interp")[0]
    fmt = _data_format(ctx, "data_format" if ctx.pir else "data_layout")
    channels_last = fmt in ("NHWC", "NDHWC", "NWC")
    spatial = len(x.shape) - 2
    if channels_last:
        x = ctx.b.transpose(x, [0, spatial + 1, *range(1, spatial + 1)])
    sizes, scales = _interp_target(ctx, x.shape[2:])
    align = bool(ctx.attr("align_corners", False))
    if align:
        coordinates = "align_corners"
    elif method == "nearest" or (method != "bicubic" and int(ctx.attr("align_mode", 1)) == 1):
        coordinates = "asymmetric"
    else:
        coordinates = "half_pixel"
    y = ctx.b.resize(x, out_shape=sizes, mode=_INTERP[method], scales=scales if not align else [],
                     coordinate_transformation_mode=coordinates,
                     nearest_mode="round_prefer_ceil" if align else "floor", cubic_coeff_a=-0.75)
    return [ctx.b.transpose(y, [0, *range(2, spatial + 2), 1]) if channels_last else y]


def _interp_target(ctx: OpContext, sizes: tuple[int, ...]) -> tuple[list[int], list[float]]:
    """The output sizes and the coordinate scales (empty: out / in), as Paddle's kernel chooses them: a size tensor
    list, else scales (a tensor or the attribute) sizing the output as int(in * scale), overridden by an OutSize
    tensor, else the out_d/out_h/out_w attributes."""
    spatial = len(sizes)
    size_list = ctx.inputs("SizeTensor", 2)
    if size_list:
        return [int(v) for v in ctx.const(tuple(size_list), "the output size").reshape(-1)], []
    scale_tensor = ctx.optional_input("Scale", 3)
    scale = [float(v) for v in (ctx.const(scale_tensor, "the scale").reshape(-1) if scale_tensor is not None
                                else ctx.attr("scale", []) or [])]
    if isinstance(ctx.attr("scale", None), float):  # Paddle 1's interp ops kept one float
        scale = [ctx.attr("scale")]
    scales = (scale * spatial if len(scale) == 1 else scale) if scale and min(scale) > 0 else []
    out = [int(n * s) for n, s in zip(sizes, scales, strict=True)] if scales else \
        [int(ctx.attr(a, -1)) for a in ("out_d", "out_h", "out_w")[3 - spatial:]]
    out_size = ctx.optional_input("OutSize", 1)
    if out_size is not None:
        out = [int(v) for v in ctx.const(out_size, "the output size").reshape(-1)]
    if any(o <= 0 for o in out):
        raise PaddleImportError(f"interpolation output size {out} is not set (sizes or scales)")
    return out, scales


# -- pooling relatives --------------------------------------------------------------------------------
@converter("max_pool2d_with_index", outputs=("Out", "Mask"))
def max_pool2d_with_index(ctx: OpContext):
    """Max pooling (adaptive: ksize is the output size) and, for sliding windows, the mask: where in its channel's
    plane each maximum is (row * W + col, the first of equal ones), as max_unpool reads it."""
    x = ctx.input("X", 0)
    ksize = [int(k) for k in attr_of(ctx, ("kernel_size", "ksize"), [1, 1])]
    strides, pads = [int(s) for s in ctx.attr("strides", [1, 1])], _paddings(ctx)
    flags = {f: bool(ctx.attr(f, False)) for f in ("ceil_mode", "global_pooling", "adaptive")}
    y = ctx.b.pool2d(x, "max", ksize, strides=strides, paddings=pads, **flags)
    if flags["adaptive"]:
        return [y]
    if flags["global_pooling"]:
        ksize, strides, pads = list(x.shape[2:]), [1, 1], [0, 0]
    begin = pads[:2]
    return [y, ctx.b.cast(compose.max_pool_mask(ctx.b, x, ksize, strides, begin, y.shape[2:]), "int32")]


@converter("lp_pool2d")
def lp_pool2d(ctx: OpContext):
    """(sum over each window of x^p)^(1/p): a padded average pool times the window's size."""
    x = ctx.input("x", 0)
    p = float(ctx.attr("norm_type", 2.0))
    ksize = [int(k) for k in ctx.int_array("kernel_size", 1, "the kernel size",
                                           tensor_slots=("KernelSizeTensor", "KernelSizeTensorList"))]
    powered = ctx.b.multiply(x, x) if p == 2.0 else ctx.b.pow(x, compose.scalar(ctx.b, p, x))
    mean = ctx.b.pool2d(powered, "avg", ksize, strides=ctx.attr("strides", [1, 1]), paddings=_paddings(ctx),
                        ceil_mode=bool(ctx.attr("ceil_mode", False)), exclusive=False,
                        data_format=_data_format(ctx, "data_format"))
    total = ctx.b.scale(mean, scale=float(math.prod(ksize)))
    return [ctx.b.pow(total, compose.scalar(ctx.b, 1.0 / p, x))]


@converter("unfold", outputs=("Y",))
def unfold(ctx: OpContext):
    """im2col: [N, C, H, W] -> [N, C * kh * kw, L], the kernel positions of each channel in row-major order."""
    x = ctx.input("X", 0)
    (kh, kw), (sh, sw), (dh, dw) = (tuple(int(v) for v in ctx.attr(a)) for a in ("kernel_sizes", "strides", "dilations"))
    top, left, bottom, right = (int(v) for v in ctx.attr("paddings"))
    if top or left or bottom or right:
        x = ctx.b.pad(x, [(0, 0), (0, 0), (top, bottom), (left, right)])
    n, c, h, w = x.shape
    oh, ow = (h - dh * (kh - 1) - 1) // sh + 1, (w - dw * (kw - 1) - 1) // sw + 1
    taps = [ctx.b.slice(x, [2, 3], [i * dh, j * dw], [i * dh + (oh - 1) * sh + 1, j * dw + (ow - 1) * sw + 1], [sh, sw])
            for i in range(kh) for j in range(kw)]
    stacked = ctx.b.concat([ctx.b.expand_dims(t, [2]) for t in taps], axis=2)
    return [ctx.b.reshape(stacked, [n, c * kh * kw, oh * ow])]


@converter("pixel_shuffle", "pixel_unshuffle", "channel_shuffle")
def pixel_shuffle(ctx: OpContext):
    """Channels to space (pixel_shuffle), space to channels (pixel_unshuffle), or channel groups interleaved."""
    x = ctx.input("X", 0)
    channels_last = _data_format(ctx, "data_format") == "NHWC"
    if channels_last:
        x = ctx.b.transpose(x, [0, 3, 1, 2])
    n, c, h, w = x.shape
    if ctx.op.type == "channel_shuffle":
        g = int(ctx.attr("groups"))
        y = ctx.b.reshape(ctx.b.transpose(ctx.b.reshape(x, [n, g, c // g, h, w]), [0, 2, 1, 3, 4]), [n, c, h, w])
    elif ctx.op.type == "pixel_shuffle":
        r = int(ctx.attr("upscale_factor"))
        y = ctx.b.transpose(ctx.b.reshape(x, [n, c // (r * r), r, r, h, w]), [0, 1, 4, 2, 5, 3])
        y = ctx.b.reshape(y, [n, c // (r * r), h * r, w * r])
    else:
        r = int(ctx.attr("downscale_factor"))
        y = ctx.b.transpose(ctx.b.reshape(x, [n, c, h // r, r, w // r, r]), [0, 1, 3, 5, 2, 4])
        y = ctx.b.reshape(y, [n, c * r * r, h // r, w // r])
    return [ctx.b.transpose(y, [0, 2, 3, 1]) if channels_last else y]


@converter("einsum", outputs=("Out", "InnerCache", "XShape"))
def einsum(ctx: OpContext):
    """Diagonals, one batched matmul for two operands, else broadcast products summed."""
    return [compose.einsum(ctx.b, str(ctx.attr("equation")), ctx.inputs("Operands", 0))]


@converter("bilinear", "bilinear_tensor_product")
def bilinear(ctx: OpContext):
    """out[n, o] = x[n] W[o] y[n] + b[o]: x times the weights laid out [I, O * J], then a product with y summed."""
    x, y, w = ctx.input("X", 0), ctx.input("Y", 1), ctx.input("Weight", 2)
    outs, i, j = w.shape
    xw = ctx.b.matmul(x, ctx.b.reshape(ctx.b.transpose(w, [1, 0, 2]), [i, outs * j]))
    out = ctx.b.reduce_sum(ctx.b.multiply(ctx.b.reshape(xw, [x.shape[0], outs, j]), ctx.b.expand_dims(y, [1])), [2])
    bias = ctx.optional_input("Bias", 3)
    return [ctx.b.add(out, bias) if bias is not None else out]


# -- sampling grids -----------------------------------------------------------------------------------
@converter("affine_grid")
def affine_grid(ctx: OpContext):
    """Sampling grids of theta over output_shape (an attribute, or a constant tensor)."""
    size = ctx.int_array("output_shape", 1, "the output shape", tensor_slots=("OutputShape",))
    return [compose.affine_grid(ctx.b, ctx.input("Theta", 0), size, bool(ctx.attr("align_corners", True)))]


@converter("grid_sample", "grid_sampler")
def grid_sample(ctx: OpContext):
    """4-D bilinear or nearest sampling, zeros / border / reflection padding (the grid's x first)."""
    x, grid = ctx.input("X", 0), ctx.input("Grid", 1)
    mode, padding = ctx.attr("mode", "bilinear"), ctx.attr("padding_mode", "zeros")
    if len(x.shape) != 4 or mode not in ("bilinear", "nearest"):
        raise PaddleImportError(f"grid_sample of a {len(x.shape)}-D input in mode {mode!r} is not supported "
                                "(4-D, bilinear or nearest)")
    return [compose.grid_sample(ctx.b, x, grid, mode == "bilinear", compose.GridPadding(padding),
                                bool(ctx.attr("align_corners", True)))]


@converter("lrn", outputs=("Out", "MidOut"))
def lrn(ctx: OpContext):
    """Paddle's lrn: x / (k + alpha * (sum of x^2 over n channels))^beta (alpha not divided by n)."""
    x = ctx.input("X", 0)
    channels_last = _data_format(ctx, "data_format") == "NHWC"
    if channels_last:
        x = ctx.b.transpose(x, [0, 3, 1, 2])
    y = compose.lrn(ctx.b, x, int(ctx.attr("n", 5)), float(ctx.attr("alpha", 1e-4)), float(ctx.attr("beta", 0.75)),
                    float(ctx.attr("k", 2.0)))
    return [ctx.b.transpose(y, [0, 2, 3, 1]) if channels_last else y]


@converter("affine_channel")
def affine_channel(ctx: OpContext):
    """x * scale + bias per channel (NCHW: axis 1; NHWC: the last)."""
    x, scale, bias = ctx.input("X", 0), ctx.input("Scale", 1), ctx.input("Bias", 2)
    if _data_format(ctx, "data_layout") == "NHWC":
        return [ctx.b.add(ctx.b.multiply(x, scale), bias)]
    return [compose.affine(ctx.b, x, scale, bias)]
