"""Spatial ops that place or sample values by index: col2im and max_unpool, where each output element gathers from
the few sliding windows that cover it (the scatter of the windows written as a gather), and roi_align, which
samples boxes given at run time bilinearly.
"""
from __future__ import annotations

import enum
import functools
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from tvm import te, tirx

from cinn.core.ir import Attrs, TensorType
from cinn.core.ops.common import coerce_enum, same_dtype
from cinn.core.ops.nn import PoolType
from cinn.core.ops.registry import DtypeClass as D
from cinn.core.ops.registry import OpDef, register
from cinn.core.ops.registry import PatternKind as K
from cinn.core.ops.te_util import cast, const, dims, lowest

INDEX_DTYPES = ("int32", "int64")



def _ravel(idx: Sequence, shape: Sequence[int]):
    """Row-major linear offset of an index (ints or TIR expressions)."""
    linear = 0
    for i, d in zip(idx, shape, strict=True):
        linear = linear * d + i
    return linear


def _clamp(i, n: int):
    """An index read from run-time data kept inside [0, n)."""
    return tirx.max(tirx.min(i, n - 1), 0)


# ---------------------------------------------------------------------------------------------
# sliding windows seen from the positions they cover


@dataclass(frozen=True)
class _Slide:
    """One spatial dim of `count` sliding windows over `size` positions: window l covers positions
    l * stride - pad_begin + t * dilation for its taps t < kernel."""

    size: int
    count: int
    kernel: int
    stride: int
    dilation: int
    pad_begin: int

    def covering(self, o) -> list[tuple]:
        """(window, tap, condition) for each window that may cover position o, in ascending window order; the
        condition says that it does. Window and tap are in range only under it: read at them under an if_then_else,
        not a Select (TVM would simplify a clamp away under the Select's condition, and a Select loads either way)."""
        span = (self.kernel - 1) * self.dilation + 1
        p = o + self.pad_begin
        out = []
        for j in reversed(range(-(-span // self.stride))):  # at most ceil(span / stride) windows hold a position
            window = p // self.stride - j
            offset = p - window * self.stride
            conds = [window >= 0, window < self.count, offset < span]
            if self.dilation > 1:
                conds.append(offset % self.dilation == 0)
            out.append((window, offset // self.dilation, tirx.all(*conds)))
        return out


def _spatial(op: str, name: str, values: Sequence[int], rank: int, default: int, where: str) -> tuple[int, ...]:
    """A per-spatial-dim attribute (empty: `default` for every dim), checked for its length."""
    if not values:
        return (default,) * rank
    if len(values) != rank:
        raise ValueError(f"{op}: {name} {tuple(values)} must have one value per spatial dim ({rank}); {where}")
    return tuple(int(v) for v in values)


def _pads(op: str, pads: Sequence[int], rank: int, where: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(begins, ends) from pads given as begins then ends (empty: no padding)."""
    both = _spatial(op, "pads", pads, 2 * rank, 0, where)
    if any(p < 0 for p in both):
        raise ValueError(f"{op}: pads {both} must be >= 0; {where}")
    return both[:rank], both[rank:]


def _positive(op: str, **named: tuple[int, ...]) -> None:
    for name, values in named.items():
        if any(v < 1 for v in values):
            raise ValueError(f"{op}: {name} {values} must be positive")


# ---------------------------------------------------------------------------------------------
# col2im


@dataclass(frozen=True)
class Col2ImAttrs(Attrs):
    """Sum columns of sliding blocks back into an image (the inverse layout of im2col, ONNX Col2Im): x is
    [N, C * prod(block_shape), blocks], the output [N, C, *image_shape]; pads are the begins then the ends."""

    image_shape: tuple[int, ...]
    block_shape: tuple[int, ...]
    strides: tuple[int, ...] = ()  # empty: 1 per spatial dim
    dilations: tuple[int, ...] = ()  # empty: 1 per spatial dim
    pads: tuple[int, ...] = ()  # empty: none


def _col2im_slides(xs: tuple[int, ...], a: Col2ImAttrs) -> list[_Slide]:
    """Validate col2im and resolve its windows per spatial dim."""
    rank = len(a.image_shape)
    where = f"x {xs}, image_shape {tuple(a.image_shape)}, block_shape {tuple(a.block_shape)}"
    if len(xs) != 3 or rank < 1 or len(a.block_shape) != rank:
        raise ValueError(f"col2im: x must be [N, C * prod(block_shape), blocks] and block_shape one size per image dim; "
                         f"{where}")
    strides = _spatial("col2im", "strides", a.strides, rank, 1, where)
    dilations = _spatial("col2im", "dilations", a.dilations, rank, 1, where)
    begins, ends = _pads("col2im", a.pads, rank, where)
    _positive("col2im", image_shape=tuple(a.image_shape), block_shape=tuple(a.block_shape), strides=strides,
              dilations=dilations)
    slides = []
    for size, k, s, d, pb, pe in zip(a.image_shape, a.block_shape, strides, dilations, begins, ends, strict=True):
        count = (size + pb + pe - (k - 1) * d - 1) // s + 1
        if count < 1:
            raise ValueError(f"col2im: block {k} (dilation {d}) is larger than the padded image dim {size + pb + pe}; "
                             f"{where}")
        slides.append(_Slide(size, count, k, s, d, pb))
    blocks = math.prod(s.count for s in slides)
    if xs[1] % math.prod(a.block_shape) or xs[2] != blocks:
        raise ValueError(f"col2im: x needs a multiple of {math.prod(a.block_shape)} rows (the block size) and {blocks} "
                         f"columns (the blocks of {tuple(s.count for s in slides)}); {where}")
    return slides


def _col2im_infer(types: Sequence[TensorType], a: Col2ImAttrs) -> list[TensorType]:
    (x,) = types
    _col2im_slides(x.shape, a)
    return [TensorType((x.shape[0], x.shape[1] // math.prod(a.block_shape), *a.image_shape), x.dtype)]


def _col2im_compute(tensors, a: Col2ImAttrs, out_types: Sequence[TensorType]):
    (x,) = tensors
    slides = _col2im_slides(dims(x), a)
    block = math.prod(a.block_shape)
    counts = [s.count for s in slides]
    zero = const(0, out_types[0].dtype)

    def body(n, c, *pos):
        terms = []
        for picks in itertools.product(*(s.covering(o) for s, o in zip(slides, pos, strict=True))):
            row = c * block + _ravel([tap for _, tap, _ in picks], a.block_shape)
            value = x[n, row, _ravel([window for window, _, _ in picks], counts)]
            terms.append(tirx.if_then_else(tirx.all(*(cond for _, _, cond in picks)), value, zero))
        return sum(terms[1:], terms[0])

    return [te.compute(out_types[0].shape, body, name="col2im", tag="injective")]


def _col2im_reference(arrays: Sequence[np.ndarray], a: Col2ImAttrs) -> list[np.ndarray]:
    """Every block's values added at the image positions of its taps (padding dropped)."""
    (x,) = arrays
    slides = _col2im_slides(x.shape, a)
    n, rows = x.shape[:2]
    block = tuple(a.block_shape)
    # the padded image: as far as the last window reaches, or the image's end
    reach = [max((s.count - 1) * s.stride + (s.kernel - 1) * s.dilation + 1, s.pad_begin + s.size) for s in slides]
    padded = np.zeros((n, rows // math.prod(block), *reach), np.float64 if x.dtype.kind == "f" else x.dtype)
    cols = x.reshape(n, -1, *block, *(s.count for s in slides))
    for taps in itertools.product(*(range(k) for k in block)):
        region: tuple[Any, ...] = (..., *(slice(t * s.dilation, t * s.dilation + s.count * s.stride, s.stride)
                                          for t, s in zip(taps, slides, strict=True)))
        tap: tuple[Any, ...] = (slice(None), slice(None), *taps)
        padded[region] += cols[tap]
    image: tuple[Any, ...] = (..., *(slice(s.pad_begin, s.pad_begin + s.size) for s in slides))
    return [padded[image].astype(x.dtype)]


register(
    OpDef(
        name="col2im",
        kind=K.INJECTIVE,
        infer=_col2im_infer,
        compute=_col2im_compute,
        reference=_col2im_reference,
        attrs=Col2ImAttrs,
        dtypes=D.NUMBER,
        doc="Sum columns of sliding blocks [N, C * prod(block), blocks] into an image [N, C, *image_shape] (ONNX Col2Im).",
    )
)


# ---------------------------------------------------------------------------------------------
# max_unpool


@dataclass(frozen=True)
class MaxUnpoolAttrs(Attrs):
    """Undo max pooling: x and indices are pooled [N, C, *pooled]; x's values go to the positions indices gives,
    flat over the whole output [N, C, *out_shape], and the rest is 0. out_shape empty: (pooled - 1) * stride + kernel
    - pads per dim. Each output looks for its value among the pooling windows (kernel_size, strides, paddings: begins
    then ends) that cover it, so an index outside its value's window is not found (MaxPool's never are)."""

    kernel_size: tuple[int, ...]
    strides: tuple[int, ...] = ()  # empty: 1 per spatial dim
    paddings: tuple[int, ...] = ()  # empty: none
    out_shape: tuple[int, ...] = ()


def _unpool_slides(xs: tuple[int, ...], index: TensorType, a: MaxUnpoolAttrs) -> list[_Slide]:
    """Validate max_unpool and resolve its windows per spatial dim (each pooled position is one window)."""
    rank = len(xs) - 2
    where = f"x {xs}, indices {index.shape}, kernel_size {tuple(a.kernel_size)}"
    if rank < 1 or index.shape != xs:
        raise ValueError(f"max_unpool: x and indices must have one shape [N, C, *pooled]; {where}")
    if index.dtype not in INDEX_DTYPES:
        raise TypeError(f"max_unpool: indices must be int32 or int64, got {index.dtype}; {where}")
    kernel = _spatial("max_unpool", "kernel_size", a.kernel_size, rank, 1, where)
    strides = _spatial("max_unpool", "strides", a.strides, rank, 1, where)
    begins, ends = _pads("max_unpool", a.paddings, rank, where)
    _positive("max_unpool", kernel_size=kernel, strides=strides)
    default = tuple((p - 1) * s + k - pb - pe for p, s, k, pb, pe in zip(xs[2:], strides, kernel, begins, ends, strict=True))
    out = _spatial("max_unpool", "out_shape", a.out_shape, rank, 0, where) if a.out_shape else default
    if min(out) < 1:
        raise ValueError(f"max_unpool: output dims {out} must be positive; {where}")
    return [_Slide(size, p, k, s, 1, pb) for size, p, k, s, pb in zip(out, xs[2:], kernel, strides, begins, strict=True)]


def _unpool_infer(types: Sequence[TensorType], a: MaxUnpoolAttrs) -> list[TensorType]:
    x, index = types
    slides = _unpool_slides(x.shape, index, a)
    return [TensorType(x.shape[:2] + tuple(s.size for s in slides), x.dtype)]


def _unpool_compute(tensors, a: MaxUnpoolAttrs, out_types: Sequence[TensorType]):
    x, index = tensors
    slides = _unpool_slides(dims(x), TensorType(dims(index), str(index.dtype)), a)
    out = out_types[0]

    def body(n, c, *pos):
        flat = _ravel([cast(i, str(index.dtype)) for i in (n, c, *pos)], out.shape)
        value = const(0, out.dtype)
        # ascending pooled order: where two windows hold this position, the later one wins, as a scatter in order
        for picks in itertools.product(*(s.covering(o) for s, o in zip(slides, pos, strict=True))):
            src = (n, c, *(window for window, _, _ in picks))
            # both loads lazily, under the window's condition (an `and` evaluates both sides too)
            hit = tirx.if_then_else(tirx.all(*(cond for _, _, cond in picks)), index(*src) == flat, tirx.const(False))
            value = tirx.if_then_else(hit, x(*src), value)
        return value

    return [te.compute(out.shape, body, name="max_unpool", tag="injective")]


def _unpool_reference(arrays: Sequence[np.ndarray], a: MaxUnpoolAttrs) -> list[np.ndarray]:
    x, index = arrays
    slides = _unpool_slides(x.shape, TensorType(index.shape, str(index.dtype)), a)
    out = np.zeros(x.shape[:2] + tuple(s.size for s in slides), x.dtype)
    out.reshape(-1)[index.reshape(-1)] = x.reshape(-1)
    return [out]


register(
    OpDef(
        name="max_unpool",
        kind=K.INJECTIVE,
        infer=_unpool_infer,
        compute=_unpool_compute,
        reference=_unpool_reference,
        attrs=MaxUnpoolAttrs,
        num_inputs=2,
        doc="Undo max pooling: x's values at the flat output positions of indices (MaxPool's), zeros elsewhere.",
    )
)


# ---------------------------------------------------------------------------------------------
# roi_align


class RoiCoordinates(enum.StrEnum):
    """How a roi maps onto the feature map (ONNX's coordinate_transformation_mode)."""

    HALF_PIXEL = "half_pixel"  # shifted by -0.5 pixel (Paddle's aligned=True, torchvision's aligned=True)
    OUTPUT_HALF_PIXEL = "output_half_pixel"  # unshifted, at least 1x1 (ONNX before opset 16, aligned=False)


@dataclass(frozen=True)
class RoiAlignAttrs(Attrs):
    """Pool each roi (x1, y1, x2, y2, scaled by spatial_scale) of image batch_indices[r] of an NCHW x into
    output_height x output_width bins, averaging (or taking the max of) bilinear samples on a grid of
    sampling_ratio^2 points per bin; sampling_ratio 0 samples ceil(roi size / bins) per axis, at most
    ceil(H / output_height) x ceil(W / output_width) (the most a roi inside the map needs)."""

    output_height: int = 1
    output_width: int = 1
    sampling_ratio: int = 0
    spatial_scale: float = 1.0
    coordinate_transformation_mode: RoiCoordinates = RoiCoordinates.HALF_PIXEL
    mode: PoolType = PoolType.AVG

    def __post_init__(self):
        super().__post_init__()
        coerce_enum(self, "coordinate_transformation_mode", RoiCoordinates, "roi_align")
        coerce_enum(self, "mode", PoolType, "roi_align")


def _roi_grid(height: int, width: int, a: RoiAlignAttrs) -> tuple[int, int]:
    """The most samples per bin along H and W: sampling_ratio, or the adaptive grid's bound."""
    if a.sampling_ratio > 0:
        return a.sampling_ratio, a.sampling_ratio
    return max(1, -(-height // a.output_height)), max(1, -(-width // a.output_width))


def _roi_align_infer(types: Sequence[TensorType], a: RoiAlignAttrs) -> list[TensorType]:
    x, rois, batch = types
    where = f"x {x.shape}, rois {rois.shape}, batch_indices {batch.shape}"
    if len(x.shape) != 4 or len(rois.shape) != 2 or rois.shape[1] != 4 or batch.shape != rois.shape[:1]:
        raise ValueError(f"roi_align: needs x [N, C, H, W], rois [R, 4] and batch_indices [R]; {where}")
    if not x.dtype.startswith("float") or batch.dtype not in INDEX_DTYPES:
        raise TypeError(f"roi_align: x and rois must be floats and batch_indices int32 or int64, got {x.dtype}, "
                        f"{rois.dtype}, {batch.dtype}; {where}")
    same_dtype("roi_align", types[:2])
    if min(a.output_height, a.output_width) < 1 or a.sampling_ratio < 0:
        raise ValueError(f"roi_align: output sizes ({a.output_height}, {a.output_width}) must be positive and "
                         f"sampling_ratio {a.sampling_ratio} >= 0; {where}")
    return [TensorType((rois.shape[0], x.shape[1], a.output_height, a.output_width), x.dtype)]


@dataclass(frozen=True)
class _RoiAxis:
    """One axis of a roi (float64 expressions): where its bins start, their size, and its samples per bin."""

    start: Any
    bin: Any
    grid: Any  # int32

    def sample(self, o, k):
        """The coordinate of sample k of bin o."""
        return self.start + cast(o, "float64") * self.bin + (cast(k, "float64") + 0.5) * self.bin / cast(self.grid, "float64")


def _roi_axis(lo, hi, bins: int, most: int, a: RoiAlignAttrs) -> _RoiAxis:
    """A roi's axis from its two coordinates (read from rois), ONNX's formulas."""
    shift = 0.5 if a.coordinate_transformation_mode is RoiCoordinates.HALF_PIXEL else 0.0
    start = cast(lo, "float64") * a.spatial_scale - shift
    length = cast(hi, "float64") * a.spatial_scale - shift - start
    if a.coordinate_transformation_mode is RoiCoordinates.OUTPUT_HALF_PIXEL:
        length = tirx.max(length, const(1.0, "float64"))  # malformed rois are 1x1
    if a.sampling_ratio > 0:
        grid = const(a.sampling_ratio, "int32")
    else:
        grid = tirx.min(tirx.max(tirx.ceil(length / bins), const(0.0, "float64")), const(float(most), "float64")).astype("int32")
    return _RoiAxis(start, length / bins, grid)


def _bilinear_axis(v, size: int) -> tuple:
    """(low, high, low weight, high weight, inside) of a sample coordinate along an axis of `size`: ONNX's
    bilinear taps (a coordinate within a pixel of the edge reads the edge; further out the sample is 0)."""
    inside = tirx.all(v >= const(-1.0, "float64"), v <= const(float(size), "float64"))
    clamped = tirx.min(tirx.max(v, const(0.0, "float64")), const(float(size - 1), "float64"))
    low = tirx.floor(clamped).astype("int32")
    frac = clamped - cast(low, "float64")
    return low, tirx.min(low + 1, size - 1), 1.0 - frac, frac, inside


def _roi_align_compute(tensors, a: RoiAlignAttrs, out_types: Sequence[TensorType]):
    x, rois, batch = tensors
    n, _, height, width = dims(x)
    most_h, most_w = _roi_grid(height, width, a)
    is_max = a.mode is PoolType.MAX
    ky, kx = te.reduce_axis((0, most_h), name="ky"), te.reduce_axis((0, most_w), name="kx")

    def axes(r) -> tuple[_RoiAxis, _RoiAxis]:
        return (_roi_axis(rois(r, 1), rois(r, 3), a.output_height, most_h, a),
                _roi_axis(rois(r, 0), rois(r, 2), a.output_width, most_w, a))

    def body(r, c, i, j):
        ay, ax = axes(r)
        y0, y1, wy0, wy1, in_y = _bilinear_axis(ay.sample(i, ky.var), height)
        x0, x1, wx0, wx1, in_x = _bilinear_axis(ax.sample(j, kx.var), width)
        b = _clamp(cast(batch(r), "int32"), n)
        taps = [cast(x(b, c, yy, xx), "float64") * wy * wx
                for yy, wy in ((y0, wy0), (y1, wy1)) for xx, wx in ((x0, wx0), (x1, wx1))]
        # ONNX's max mode takes the largest weighted tap, not the interpolated value
        value = tirx.Select(tirx.all(in_y, in_x), functools.reduce(tirx.max, taps) if is_max else sum(taps[1:], taps[0]),
                            const(0.0, "float64"))
        if a.sampling_ratio == 0:  # an adaptive grid (none for an empty roi) takes the first samples of the bound
            skipped = lowest("float64") if is_max else const(0.0, "float64")
            value = tirx.Select(tirx.all(ky.var < ay.grid, kx.var < ax.grid), value, skipped)
        return (te.max if is_max else te.sum)(value, axis=[ky, kx])

    pooled = te.compute(out_types[0].shape, body, name="roi_align_pool")

    def finish(r, c, i, j):
        ay, ax = axes(r)
        count = ay.grid * ax.grid
        if is_max:  # no samples: 0 (the reduction's identity is -inf)
            return cast(tirx.Select(count > 0, pooled[r, c, i, j], const(0.0, "float64")), out_types[0].dtype)
        return cast(pooled[r, c, i, j] / cast(tirx.max(count, 1), "float64"), out_types[0].dtype)

    return [te.compute(out_types[0].shape, finish, name="roi_align")]


def _roi_align_reference(arrays: Sequence[np.ndarray], a: RoiAlignAttrs) -> list[np.ndarray]:
    """ONNX's reference algorithm, one roi at a time, vectorized over bins and samples (float64)."""
    x, rois, batch = arrays
    _, c, height, width = x.shape
    most = _roi_grid(height, width, a)
    out = np.zeros((len(rois), c, a.output_height, a.output_width))
    shift = 0.5 if a.coordinate_transformation_mode is RoiCoordinates.HALF_PIXEL else 0.0
    for r, roi in enumerate(rois.astype(np.float64) * a.spatial_scale - shift):
        image = x[min(max(int(batch[r]), 0), x.shape[0] - 1)].astype(np.float64)
        per_axis = []
        for lo, hi, bins, size, bound in ((roi[1], roi[3], a.output_height, height, most[0]),
                                          (roi[0], roi[2], a.output_width, width, most[1])):
            length = hi - lo if shift else max(hi - lo, 1.0)
            grid = a.sampling_ratio or min(max(math.ceil(length / bins), 0), bound)
            v = lo + np.arange(bins)[:, None] * (length / bins) + (np.arange(grid) + 0.5) * (length / bins) / max(grid, 1)
            inside = (v >= -1) & (v <= size)
            clamped = np.clip(v, 0, size - 1)
            low = np.floor(clamped).astype(int)
            frac = clamped - low
            per_axis.append((grid, low, np.minimum(low + 1, size - 1), 1 - frac, frac, inside))
        (gy, y0, y1, wy0, wy1, in_y), (gx, x0, x1, wx0, wx1, in_x) = per_axis
        if gy * gx == 0:
            continue  # no samples: 0
        # [c, bins_h, grid_h, bins_w, grid_w] taps
        taps = [image[:, yy[:, :, None, None], xx[None, None]] * (wy[:, :, None, None] * wx[None, None])
                for yy, wy in ((y0, wy0), (y1, wy1)) for xx, wx in ((x0, wx0), (x1, wx1))]
        inside = in_y[:, :, None, None] & in_x[None, None]
        value = np.where(inside, np.maximum.reduce(taps) if a.mode is PoolType.MAX else sum(taps), 0.0)
        out[r] = value.max(axis=(2, 4)) if a.mode is PoolType.MAX else value.sum(axis=(2, 4)) / (gy * gx)
    return [out.astype(x.dtype)]


register(
    OpDef(
        name="roi_align",
        kind=K.NON_FUSIBLE,
        infer=_roi_align_infer,
        compute=_roi_align_compute,
        reference=_roi_align_reference,
        attrs=RoiAlignAttrs,
        num_inputs=3,
        dtypes=D.NUMBER,
        doc="RoiAlign of NCHW x over rois [R, 4] (x1, y1, x2, y2) of images batch_indices [R]: avg or max of bilinear "
            "samples per bin (ONNX RoiAlign).",
    )
)
