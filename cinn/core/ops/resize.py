"""resize: nearest, linear and cubic interpolation of the trailing axes, with ONNX's coordinate modes.

Each resized axis maps output index y to a source coordinate x (float64, the same formulas as ONNX's
reference), then reads a few taps around x with weights. The coordinate and tap code is written once over
a small math namespace, so the TE compute (TIR expressions) and the numpy reference (arrays) share it.
"""
from __future__ import annotations

import enum
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from tvm import te, tirx

from cinn.core.ir import Attrs, TensorType
from cinn.core.ops.common import coerce_enum
from cinn.core.ops.registry import OpDef, PatternKind, register
from cinn.core.ops.te_util import cast, const

MAX_TAPS = 1024  # antialias filters widen as 1 / scale: beyond this an output sums too many inputs


class ResizeMode(enum.StrEnum):
    """Interpolation: CINN's bilinear/bicubic are accepted for linear/cubic."""

    NEAREST = "nearest"
    LINEAR = "linear"
    CUBIC = "cubic"

    @classmethod
    def _missing_(cls, value):
        return {"bilinear": cls.LINEAR, "bicubic": cls.CUBIC}.get(value)


class CoordinateMode(enum.StrEnum):
    """How an output index maps to a source coordinate (ONNX's coordinate_transformation_mode)."""

    HALF_PIXEL = "half_pixel"
    HALF_PIXEL_SYMMETRIC = "half_pixel_symmetric"
    PYTORCH_HALF_PIXEL = "pytorch_half_pixel"
    ALIGN_CORNERS = "align_corners"
    ASYMMETRIC = "asymmetric"
    TF_CROP_AND_RESIZE = "tf_crop_and_resize"


class NearestMode(enum.StrEnum):
    """How nearest mode rounds a source coordinate."""

    ROUND_PREFER_FLOOR = "round_prefer_floor"
    ROUND_PREFER_CEIL = "round_prefer_ceil"
    FLOOR = "floor"
    CEIL = "ceil"


@dataclass(frozen=True)
class ResizeAttrs(Attrs):
    """Resize the trailing len(out_shape) axes of x to out_shape (CINN passes (H, W) of NCHW).

    scales: per resized axis, the factor the coordinate modes divide by (ONNX's `scales` input); empty
    means out / in. roi (tf_crop_and_resize only): normalized starts, then ends, per resized axis.
    """

    out_shape: tuple[int, ...]
    mode: ResizeMode = ResizeMode.NEAREST
    scales: tuple[float, ...] = ()
    coordinate_transformation_mode: CoordinateMode = CoordinateMode.HALF_PIXEL
    nearest_mode: NearestMode = NearestMode.ROUND_PREFER_FLOOR
    cubic_coeff_a: float = -0.75
    exclude_outside: bool = False
    roi: tuple[float, ...] = ()
    extrapolation_value: float = 0.0
    antialias: bool = False  # linear/cubic downsampling: the filter widens to 1 / scale input pixels

    def __post_init__(self):
        super().__post_init__()
        coerce_enum(self, "mode", ResizeMode, "resize")
        coerce_enum(self, "coordinate_transformation_mode", CoordinateMode, "resize")
        coerce_enum(self, "nearest_mode", NearestMode, "resize")


@dataclass(frozen=True)
class _Math:
    """The operations the coordinate code needs, on numpy arrays or on TIR expressions."""

    floor: Callable
    select: Callable  # select(cond, a, b)
    index: Callable  # a float holding an integer -> an integer index
    clip: Callable  # clip(i, lo, hi) of integer indices
    inside: Callable  # inside(i, n): 0 <= i < n
    either: Callable  # logical or of two conditions
    const: Callable  # a float64 constant
    abs: Callable


_NUMPY = _Math(np.floor, np.where, lambda v: v.astype(np.int64), np.clip, lambda i, n: (i >= 0) & (i < n),
               np.logical_or, np.float64, np.abs)


def _tir_math() -> _Math:
    return _Math(tirx.floor, tirx.Select, lambda v: v.astype("int32"), lambda i, lo, hi: tirx.min(tirx.max(i, lo), hi),
                 lambda i, n: tirx.And(i >= 0, i < n), tirx.Or, lambda v: tirx.const(v, "float64"), tirx.abs)


@dataclass(frozen=True)
class _Axis:
    """One resized axis: input and output sizes, the scale, and the roi (start, end) of tf_crop_and_resize."""

    axis: int
    size: int
    out: int
    scale: float
    roi: tuple[float, float]

    def is_identity(self, a: ResizeAttrs) -> bool:
        tf_crop = a.coordinate_transformation_mode == CoordinateMode.TF_CROP_AND_RESIZE
        return self.out == self.size and self.scale == 1.0 and not tf_crop

    def source(self, y, mode: CoordinateMode):
        """The source coordinate of output index y (a float64 array or expression); ONNX's formulas.

        `y * 0.0 + c` is the constant c shaped like y."""
        width = self.scale * self.size  # the unrounded output size
        if mode == CoordinateMode.ALIGN_CORNERS:
            return y * 0.0 if width == 1 else y * (self.size - 1) / (width - 1)
        if mode == CoordinateMode.ASYMMETRIC:
            return y / self.scale
        if mode == CoordinateMode.TF_CROP_AND_RESIZE:
            start, end = self.roi
            if width == 1:
                return y * 0.0 + (end - start) * (self.size - 1) / 2 + start * (self.size - 1)
            return y * (end - start) * (self.size - 1) / (width - 1) + start * (self.size - 1)
        if mode == CoordinateMode.PYTORCH_HALF_PIXEL and width == 1:
            return y * 0.0 - 0.5
        if mode == CoordinateMode.HALF_PIXEL_SYMMETRIC:
            offset = self.size / 2 * (1 - self.out / width)
            return offset + (y + 0.5) / self.scale - 0.5
        return (y + 0.5) / self.scale - 0.5

    def taps(self, y, a: ResizeAttrs, m: _Math) -> tuple[list, list | None]:
        """Input indices and weights (None for nearest: weight 1) that output index y reads."""
        x = self.source(y, a.coordinate_transformation_mode)
        base = m.floor(x)
        r = x - base
        i0 = m.index(base)
        if a.mode == ResizeMode.NEAREST:
            up = m.select(_rounds_up(r, a.nearest_mode), m.const(1.0), m.const(0.0))
            return [m.clip(i0 + m.index(up), 0, self.size - 1)], None
        if self.antialiased(a):
            offsets = self.antialias_offsets(a)
            kernel = _linear_kernel if a.mode == ResizeMode.LINEAR else _cubic_kernel
            raw = [i0 + o for o in offsets]
            weights = [kernel(m.abs((o - r) * self.scale), a.cubic_coeff_a, m) for o in offsets]
            total = sum(weights[1:], weights[0])
            weights = [w / total for w in weights]
        elif a.mode == ResizeMode.LINEAR:
            raw, weights = [i0, i0 + 1], [1.0 - r, r]
        else:
            raw, weights = [i0 - 1, i0, i0 + 1, i0 + 2], _cubic_coeffs(r, a.cubic_coeff_a)
        if a.exclude_outside:  # taps outside the input get no weight; the rest are renormalized
            weights = [m.select(m.inside(i, self.size), w, m.const(0.0)) for i, w in zip(raw, weights, strict=True)]
            total = sum(weights[1:], weights[0])
            weights = [w / total for w in weights]
        return [m.clip(i, 0, self.size - 1) for i in raw], weights  # edge padding

    def antialiased(self, a: ResizeAttrs) -> bool:
        return a.antialias and a.mode != ResizeMode.NEAREST and self.scale < 1.0

    def antialias_offsets(self, a: ResizeAttrs) -> range:
        """Tap offsets from floor(x) of the widened filter (its support is 1 or 2 output pixels each side)."""
        support = 1 if a.mode == ResizeMode.LINEAR else 2
        start = math.floor(-support / self.scale) + 1
        return range(start, 2 - start)

    def extrapolated(self, y, a: ResizeAttrs, m: _Math):
        """Where tf_crop_and_resize's coordinate leaves the input (the output is extrapolation_value), or None."""
        if a.coordinate_transformation_mode != CoordinateMode.TF_CROP_AND_RESIZE:
            return None
        x = self.source(y, a.coordinate_transformation_mode)
        return m.either(x < m.const(0.0), x > m.const(self.size - 1))


def _rounds_up(r, mode: NearestMode):
    """Whether nearest rounding goes up from floor(x), given r = x - floor(x) in [0, 1)."""
    return {
        NearestMode.ROUND_PREFER_FLOOR: r > 0.5,
        NearestMode.ROUND_PREFER_CEIL: r >= 0.5,
        NearestMode.FLOOR: r < 0.0,  # never
        NearestMode.CEIL: r > 0.0,
    }[mode]


def _linear_kernel(t, _a: float, m: _Math):
    """The triangle filter at distance t >= 0."""
    return m.select(t < m.const(1.0), 1.0 - t, m.const(0.0))


def _cubic_kernel(t, a: float, m: _Math):
    """Keys' cubic filter at distance t >= 0 (coefficient a)."""
    near = ((a + 2) * t - (a + 3)) * t * t + 1
    far = ((a * t - 5 * a) * t + 8 * a) * t - 4 * a
    return m.select(t <= m.const(1.0), near, m.select(t < m.const(2.0), far, m.const(0.0)))


def _cubic_coeffs(r, a: float) -> list:
    """Keys' cubic convolution weights of taps floor(x) - 1 .. floor(x) + 2 (ONNX's formula, coefficient a)."""
    s = 1.0 - r
    return [
        ((a * (r + 1) - 5 * a) * (r + 1) + 8 * a) * (r + 1) - 4 * a,
        ((a + 2) * r - (a + 3)) * r * r + 1,
        ((a + 2) * s - (a + 3)) * s * s + 1,
        ((a * (s + 1) - 5 * a) * (s + 1) + 8 * a) * (s + 1) - 4 * a,
    ]


def _axes(shape: tuple[int, ...], a: ResizeAttrs) -> list[_Axis]:
    """The resized (trailing) axes, validated."""
    n, rank = len(a.out_shape), len(shape)
    where = f"x {tuple(shape)}, out_shape {tuple(a.out_shape)}"
    if not 1 <= n <= rank or any(d < 1 for d in a.out_shape):
        raise ValueError(f"resize: out_shape must have 1 to {rank} positive sizes (of the trailing axes); {where}")
    if a.scales and (len(a.scales) != n or not all(math.isfinite(s) and s > 0 for s in a.scales)):
        raise ValueError(f"resize: scales {tuple(a.scales)} must be {n} positive finite factors; {where}")
    tf_crop = a.coordinate_transformation_mode == CoordinateMode.TF_CROP_AND_RESIZE
    if tf_crop and len(a.roi) != 2 * n:
        raise ValueError(f"resize: tf_crop_and_resize needs a roi of {2 * n} values (starts, ends), got {tuple(a.roi)}; {where}")
    lead = rank - n
    scales = a.scales or tuple(o / shape[lead + k] for k, o in enumerate(a.out_shape))
    roi = a.roi if tf_crop else (0.0,) * n + (1.0,) * n
    axes = [_Axis(lead + k, shape[lead + k], o, float(scales[k]), (roi[k], roi[n + k])) for k, o in enumerate(a.out_shape)]
    taps = math.prod(len(ax.antialias_offsets(a)) for ax in axes if ax.antialiased(a))
    if taps > MAX_TAPS:
        raise ValueError(f"resize: antialias with scales {tuple(ax.scale for ax in axes)} reads {taps} inputs per output"
                         f" (at most {MAX_TAPS}); {where}")
    return axes


def _infer(types: Sequence[TensorType], a: ResizeAttrs) -> list[TensorType]:
    x = types[0]
    axes = _axes(x.shape, a)
    if a.mode != ResizeMode.NEAREST and not x.dtype.startswith("float"):
        raise TypeError(f"resize: {a.mode} interpolation needs a float input, got {x.dtype}{x.shape} (use nearest)")
    return [TensorType(x.shape[: axes[0].axis] + tuple(ax.out for ax in axes), x.dtype)]


def _compute(tensors, a: ResizeAttrs, out_types: Sequence[TensorType]):
    (x,) = tensors
    out = out_types[0]
    axes = [ax for ax in _axes(tuple(int(d) for d in x.shape), a) if not ax.is_identity(a)]
    m = _tir_math()

    def body(*idx):
        index, terms = list(idx), [((), None)]
        outside = None
        for ax in axes:
            y = cast(idx[ax.axis], "float64")
            taps, weights = ax.taps(y, a, m)
            weights = weights or [None]
            # every combination of this axis's taps with the taps chosen so far
            terms = [(prev + ((ax.axis, i),), w if pw is None else pw * w)
                     for prev, pw in terms for i, w in zip(taps, weights, strict=True)]
            flag = ax.extrapolated(y, a, m)
            outside = flag if outside is None else outside if flag is None else m.either(outside, flag)
        total = None
        for picks, w in terms:
            point = list(index)
            for axis, i in picks:
                point[axis] = i
            value = x(*point) if w is None else cast(x(*point), "float64") * w
            total = value if total is None else total + value
        total = cast(total, out.dtype)
        if outside is None:
            return total
        return tirx.Select(outside, const(a.extrapolation_value, out.dtype), total)

    return [te.compute(out.shape, body, name="resize", tag="injective")]


def _reference(arrays: Sequence[np.ndarray], a: ResizeAttrs) -> list[np.ndarray]:
    """Separable: one axis at a time, in float64 (ONNX's reference does the same)."""
    (x,) = arrays
    result = x if a.mode == ResizeMode.NEAREST else x.astype(np.float64)
    mask = np.zeros((), bool)
    for ax in _axes(x.shape, a):
        if ax.is_identity(a):
            continue
        y = np.arange(ax.out, dtype=np.float64)
        taps, weights = ax.taps(y, a, _NUMPY)
        shape = (1,) * ax.axis + (ax.out,) + (1,) * (x.ndim - ax.axis - 1)
        picked = [np.take(result, i, axis=ax.axis) for i in taps]
        result = picked[0] if weights is None else sum(p * w.reshape(shape) for p, w in zip(picked, weights, strict=True))
        flag = ax.extrapolated(y, a, _NUMPY)
        if flag is not None:
            mask = mask | flag.reshape(shape)
    result = np.where(mask, a.extrapolation_value, result) if mask.any() else result
    return [np.asarray(result).astype(x.dtype)]


register(
    OpDef(
        name="resize",
        kind=PatternKind.INJECTIVE,
        infer=_infer,
        compute=_compute,
        reference=_reference,
        attrs=ResizeAttrs,
        doc="Resize the trailing axes (nearest, linear or cubic; ONNX Resize's coordinate modes).",
    )
)
