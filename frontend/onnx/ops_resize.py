"""Converters of ONNX Resize and Upsample to the table's resize (scales, sizes, roi must be constants)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from cinn.core.ir import Value
from frontend.onnx.registry import NodeContext, OnnxImportError, converter

TF_CROP = "tf_crop_and_resize"


@dataclass(frozen=True)
class _Plan:
    """Per input dim: the output size, the coordinate scale and the roi (start, end)."""

    sizes: tuple[int, ...]
    scales: tuple[float, ...]
    roi: tuple[tuple[float, float], ...]


def _per_dim(values, axes: list[int], rank: int, fill) -> list:
    """Values given for `axes` spread over all dims (the others get `fill(dim)`)."""
    out = [fill(d) for d in range(rank)]
    for a, v in zip(axes, values, strict=False):
        out[a] = v
    return out


def _plan(ctx: NodeContext, x: Value, scales, sizes, roi, axes: list[int]) -> _Plan:
    """Output sizes and coordinate scales as ONNX's reference derives them from scales or sizes."""
    rank, shape = len(x.shape), x.shape
    if sizes is not None:
        if len(sizes) != len(axes):
            raise OnnxImportError(f"sizes {tuple(sizes)} need one value per resized axis {tuple(axes)}")
        out = _per_dim([int(s) for s in sizes], axes, rank, lambda d: shape[d])
        factors = [o / n for o, n in zip(out, shape, strict=False)]
        policy = ctx.attr("keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":
            if policy not in ("not_larger", "not_smaller"):
                raise OnnxImportError(f"keep_aspect_ratio_policy {policy!r} is not supported")
            scale = (min if policy == "not_larger" else max)(factors[a] for a in axes)
            factors = [scale if d in axes else 1.0 for d in range(rank)]
            out = [int(scale * shape[d] + 0.5) if d in axes else shape[d] for d in range(rank)]
    elif scales is not None:
        if len(scales) != len(axes):
            raise OnnxImportError(f"scales {tuple(scales)} need one value per resized axis {tuple(axes)}")
        factors = _per_dim(_finite("scales", scales, positive=True), axes, rank, lambda d: 1.0)
        out = [math.floor(f * n) for f, n in zip(factors, shape, strict=False)]
    else:
        raise OnnxImportError("one of scales and sizes must be given")
    starts = roi[: len(axes)] if roi is not None else [0.0] * len(axes)
    ends = roi[len(axes):] if roi is not None else [1.0] * len(axes)
    spans = _per_dim(list(zip(_finite("roi", starts), _finite("roi", ends), strict=False)), axes, rank, lambda d: (0.0, 1.0))
    return _Plan(tuple(out), tuple(factors), tuple(spans))


def _finite(what: str, values, positive: bool = False) -> tuple[float, ...]:
    """Float attribute values, refused unless finite (and positive for scale factors): inf or nan gave bare
    OverflowErrors when the output size was computed."""
    values = tuple(float(v) for v in values)
    if not all(math.isfinite(v) and (v > 0 or not positive) for v in values):
        raise OnnxImportError(f"{what} {values} must be finite{' and positive' if positive else ''}")
    return values


def _optional(ctx: NodeContext, i: int, what: str) -> np.ndarray | None:
    """A constant optional input; an omitted or empty one is None."""
    if ctx.input(i) is None:
        return None
    data = np.asarray(ctx.require_const(i, what)).reshape(-1)
    return data if data.size else None


def _resize(ctx: NodeContext, plan: _Plan, mode: str, coordinates: str, nearest: str) -> list[Value]:
    """resize of the trailing dims from the first one that changes (an unchanged input is copied)."""
    x = ctx.input(0)
    changed = [d for d in range(len(x.shape)) if plan.sizes[d] != x.shape[d] or plan.scales[d] != 1.0
               or (coordinates == TF_CROP and plan.roi[d] != (0.0, 1.0))]
    if not changed:
        return [ctx.b.identity(x)]
    dims = range(changed[0], len(x.shape))
    roi = [plan.roi[d][0] for d in dims] + [plan.roi[d][1] for d in dims] if coordinates == TF_CROP else []
    return [ctx.b.resize(
        x, out_shape=[plan.sizes[d] for d in dims], mode=mode, scales=[plan.scales[d] for d in dims],
        coordinate_transformation_mode=coordinates, nearest_mode=nearest,
        cubic_coeff_a=_finite("cubic_coeff_a", [ctx.attr("cubic_coeff_a", -0.75)])[0], exclude_outside=bool(ctx.attr("exclude_outside", 0)),
        roi=roi, extrapolation_value=ctx.attr("extrapolation_value", 0.0), antialias=bool(ctx.attr("antialias", 0)),
    )]


def _legacy_nearest(scales) -> str:
    """Before opset 11 nearest truncated the asymmetric coordinate, or rounded it up when downsampling (as ORT)."""
    return "ceil" if any(float(s) < 1.0 for s in scales) else "floor"


@converter("Resize")
def resize(ctx: NodeContext):
    x = ctx.input(0)
    rank = len(x.shape)
    mode = ctx.attr("mode", "nearest")
    if ctx.opset < 11:
        scales = ctx.require_const(1, "scales").reshape(-1)
        plan = _plan(ctx, x, scales, None, None, list(range(rank)))
        return _resize(ctx, plan, mode, "asymmetric", _legacy_nearest(scales))
    axes = [a % rank for a in ctx.attr("axes", range(rank))]
    roi, scales, sizes = (_optional(ctx, i, what) for i, what in ((1, "roi"), (2, "scales"), (3, "sizes")))
    plan = _plan(ctx, x, scales if sizes is None else None, sizes, roi, axes)
    coordinates = ctx.attr("coordinate_transformation_mode", "half_pixel")
    return _resize(ctx, plan, mode, coordinates, ctx.attr("nearest_mode", "round_prefer_floor"))


@converter("Upsample")
def upsample(ctx: NodeContext):
    """Deprecated Upsample (opsets 7-9): Resize with asymmetric coordinates."""
    x = ctx.input(0)
    scales = ctx.attr("scales", None) if ctx.opset < 9 else ctx.require_const(1, "scales").reshape(-1)
    plan = _plan(ctx, x, scales, None, None, list(range(len(x.shape))))
    return _resize(ctx, plan, ctx.attr("mode", "nearest"), "asymmetric", _legacy_nearest(scales))
