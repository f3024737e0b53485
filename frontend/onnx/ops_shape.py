"""Converters of ONNX shape and data-movement ops; shape arguments must be constants (folded)."""
from __future__ import annotations

import math

import numpy as np

from cinn.core.ir import Value
from cinn.core.ops.common import broadcast_shapes
from frontend import compose
from frontend.onnx.registry import NodeContext, OnnxImportError, converter


def _axis(axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        raise OnnxImportError(f"axis {axis} out of range for rank {rank}")
    return axis % max(rank, 1)


@converter("Reshape")
def reshape(ctx: NodeContext):
    x = ctx.input(0)
    shape = ctx.ints(1, "shape", 5, "the target shape")
    allow_zero = ctx.attr("allowzero", 0)
    if allow_zero and 0 in shape:  # a dim of size 0 (reshape's 0 keeps the input's): an empty result of an empty x
        if x.type.size or -1 in shape:
            raise OnnxImportError(f"Reshape (allowzero) of {x.shape} to {tuple(shape)}: the sizes differ")
        return [ctx.b.create_constant(np.zeros(shape, x.dtype), dtype=x.dtype)]
    # 0 copies the input dim (unless allowzero)
    target = [x.shape[k] if d == 0 and not allow_zero else d for k, d in enumerate(shape)]
    return [ctx.b.reshape(x, target)]


@converter("Flatten")
def flatten(ctx: NodeContext):
    x = ctx.input(0)
    axis = ctx.attr("axis", 1)
    axis = axis + len(x.shape) if axis < 0 else axis  # in [-rank, rank]
    return [ctx.b.reshape(x, [math.prod(x.shape[:axis]), math.prod(x.shape[axis:])])]


@converter("Transpose")
def transpose(ctx: NodeContext):
    x = ctx.input(0)
    perm = ctx.attr("perm", list(reversed(range(len(x.shape)))))
    return [ctx.b.transpose(x, list(perm))]


@converter("Squeeze")
def squeeze(ctx: NodeContext):
    x = ctx.input(0)
    axes = ctx.ints(1, "axes", 13, "axes") or ()
    bad = [a for a in axes if x.shape[_axis(a, len(x.shape))] != 1]
    if bad:
        raise OnnxImportError(f"cannot squeeze axes {bad} of shape {x.shape} (size is not 1)")
    return [ctx.b.squeeze(x, list(axes))]


@converter("Unsqueeze")
def unsqueeze(ctx: NodeContext):
    return [ctx.b.expand_dims(ctx.input(0), list(ctx.ints(1, "axes", 13, "axes")))]


@converter("Concat")
def concat(ctx: NodeContext):
    return [ctx.b.concat([v for v in ctx.inputs if v is not None], axis=ctx.attr("axis", 0))]


@converter("Split")
def split(ctx: NodeContext):
    x = ctx.input(0)
    axis = _axis(ctx.attr("axis", 0), len(x.shape))
    sizes = ctx.ints(1, "split", 13, "split sizes")
    if sizes is None:
        parts = ctx.attr("num_outputs", len(ctx.node.output))
        chunk = -(-x.shape[axis] // parts)  # opset 18: the last part may be smaller
        sizes = [min(chunk, x.shape[axis] - k * chunk) for k in range(parts)]
    outs = ctx.b.split(x, list(sizes), axis=axis)
    return list(outs) if isinstance(outs, tuple) else [outs]


@converter("Slice")
def slice_(ctx: NodeContext):
    x = ctx.input(0)
    if ctx.opset < 10:
        starts, ends = ctx.attr("starts", None), ctx.attr("ends", None)
        axes, steps = ctx.attr("axes", None), None
    else:
        starts, ends = ctx.ints(1, "", 10, "starts"), ctx.ints(2, "", 10, "ends")
        axes, steps = ctx.ints(3, "", 10, "axes"), ctx.ints(4, "", 10, "steps")
    axes = list(axes) if axes is not None else list(range(len(starts)))
    steps = list(steps) if steps is not None else [1] * len(starts)
    return [ctx.b.slice(x, axes, list(starts), list(ends), steps)]


@converter("Expand")
def expand(ctx: NodeContext):
    x = ctx.input(0)
    shape = ctx.ints(1, "", 8, "the target shape")
    out = broadcast_shapes("Expand", x.shape, tuple(shape))
    return [ctx.b.identity(x) if out == x.shape else ctx.b.broadcast_to(x, list(out))]


@converter("Tile")
def tile(ctx: NodeContext):
    return [ctx.b.tile(ctx.input(0), list(ctx.ints(1, "", 6, "repeats")))]


def _pad_value(ctx: NodeContext) -> float:
    if ctx.opset < 11:
        return float(ctx.attr("value", 0.0))
    return 0.0 if ctx.input(2) is None else ctx.require_const(2, "constant_value").reshape(()).item()


@converter("Pad")
def pad(ctx: NodeContext):
    x = ctx.input(0)
    rank = len(x.shape)
    pads = ctx.ints(1, "pads" if ctx.opset >= 2 else "paddings", 11, "pads")
    axes = ctx.ints(3, "", 18, "axes") if ctx.opset >= 18 else None
    axes = [_axis(a, rank) for a in axes] if axes is not None else list(range(rank))
    if len(pads) != 2 * len(axes):
        raise OnnxImportError(f"pads {pads} need 2 values per padded axis ({len(axes)}) of shape {x.shape}")
    begin, end = [0] * rank, [0] * rank
    for k, a in enumerate(axes):
        begin[a], end[a] = pads[k], pads[k + len(axes)]
    mode = ctx.attr("mode", "constant")
    if mode not in ("constant", "reflect", "edge", "wrap"):
        raise OnnxImportError(f"pad mode {mode!r} is not supported (constant, reflect, edge, wrap)")
    return [_pad_or_crop(ctx, x, begin, end, _pad_value(ctx), mode)]


def _pad_or_crop(ctx: NodeContext, x, begin: list[int], end: list[int], value: float, mode: str):
    """x padded by the positive counts before/after each axis and cropped by the negative ones."""
    grow = [(max(p, 0), max(q, 0)) for p, q in zip(begin, end, strict=False)]
    if any(p or q for p, q in grow):
        x = ctx.b.pad(x, grow, pad_value=value, mode=mode)
    short = [k for k in range(len(begin)) if x.shape[k] + begin[k] + end[k] < 0]
    if short:  # a slice would clamp this to an empty axis; onnxruntime refuses it
        raise OnnxImportError(f"pads {begin + end} remove more than axis {short[0]} of shape {x.shape} has")
    crop = [k for k in range(len(begin)) if begin[k] < 0 or end[k] < 0]  # negative pads remove elements
    if crop:
        x = ctx.b.slice(x, crop, [-min(begin[k], 0) for k in crop], [x.shape[k] + min(end[k], 0) for k in crop])
    return x if any(p or q for p, q in grow) or crop else ctx.b.identity(x)


@converter("CenterCropPad")
def center_crop_pad(ctx: NodeContext):
    """Each listed axis cropped or zero-padded to its size in `shape`, centred (the odd element at the end)."""
    x = ctx.input(0)
    rank = len(x.shape)
    sizes = [int(v) for v in ctx.require_const(1, "shape")]
    axes = [_axis(a, rank) for a in ctx.attr("axes", list(range(rank)))]
    if len(sizes) != len(axes):
        raise OnnxImportError(f"shape {sizes} needs one size per axis of {axes} (input shape {x.shape})")
    begin, end = [0] * rank, [0] * rank
    for a, size in zip(axes, sizes, strict=True):
        grow = size - x.shape[a]
        begin[a] = grow // 2 if grow >= 0 else -(-grow // 2)
        end[a] = grow - begin[a]
    return [_pad_or_crop(ctx, x, begin, end, 0.0, "constant")]


@converter("ReverseSequence")
def reverse_sequence(ctx: NodeContext):
    """The first sequence_lens[b] steps of each batch entry reversed: a gather along the time axis by constant
    indices (the lengths must be constants)."""
    x = ctx.input(0)
    time, batch = ctx.attr("time_axis", 0), ctx.attr("batch_axis", 1)
    if {time, batch} != {0, 1} or len(x.shape) < 2:
        raise OnnxImportError(f"time_axis {time} and batch_axis {batch} must be 0 and 1 (input shape {x.shape})")
    lengths = ctx.require_const(1, "sequence_lens").astype(np.int64).reshape(-1)
    steps = np.arange(x.shape[time])
    by_batch = np.stack([np.where(steps < n, n - 1 - steps, steps) for n in lengths])  # [batch, time]
    index = by_batch if batch == 0 else by_batch.T
    index = np.broadcast_to(index.reshape(index.shape + (1,) * (len(x.shape) - 2)), x.shape)
    return [ctx.b.gather_elements(x, ctx.b.create_constant(np.ascontiguousarray(index), dtype="int64"), axis=time)]


@converter("GatherND")
def gather_nd(ctx: NodeContext):
    return [compose.gather_nd(ctx.b, ctx.input(0), ctx.input(1), ctx.attr("batch_dims", 0))]


# ScatterND/ScatterElements reductions: how an update combines with what is there (none: it replaces it)
_SCATTER_COMBINE = {"none": None, "add": "add", "mul": "multiply", "max": "max", "min": "min"}


def _scatter(ctx: NodeContext, targets: np.ndarray):
    """data with updates written at constant flat `targets` (one per update element, in order), combined by the
    reduction attribute: one gather, combine and select per round of repeated targets (a later duplicate sees the
    earlier ones' result, as ONNX's reference applies them in order)."""
    data, updates = ctx.input(0), ctx.input(2)
    reduction = ctx.attr("reduction", "none")
    if reduction not in _SCATTER_COMBINE:
        raise OnnxImportError(f"reduction {reduction!r} is not supported ({', '.join(_SCATTER_COMBINE)})")
    size = math.prod(data.shape)
    out = ctx.b.reshape(data, [size])
    flat_updates = ctx.b.reshape(updates, [math.prod(updates.shape)])
    seen: dict[int, int] = {}  # writes so far per target
    rounds: list[int] = []  # per update: how many earlier updates hit its target
    for t in targets.tolist():
        rounds.append(seen.get(t, 0))
        seen[t] = seen.get(t, 0) + 1
    for r in range(max(seen.values(), default=0)):
        source, mask = np.zeros(size, np.int64), np.zeros(size, bool)
        chosen = [u for u, k in enumerate(rounds) if k == r]
        source[targets[chosen]], mask[targets[chosen]] = chosen, True
        picked = ctx.b.gather(flat_updates, ctx.b.create_constant(source, dtype="int64"), axis=0)
        op = _SCATTER_COMBINE[reduction]
        combined = picked if op is None else getattr(ctx.b, op)(out, picked)
        out = ctx.b.select(ctx.b.create_constant(mask, dtype="bool"), combined, out)
    return ctx.b.reshape(out, list(data.shape))


@converter("ScatterElements", "Scatter")
def scatter_elements(ctx: NodeContext):
    """updates written into data at constant indices along an axis (each update element's other coordinates kept)."""
    data = ctx.input(0)
    axis = _axis(ctx.attr("axis", 0), len(data.shape))
    index = ctx.require_const(1, "indices").astype(np.int64) % data.shape[axis]
    coords = list(np.indices(index.shape).reshape(len(index.shape), -1))
    coords[axis] = index.reshape(-1)
    return [_scatter(ctx, np.ravel_multi_index(tuple(coords), data.shape))]


@converter("ScatterND")
def scatter_nd(ctx: NodeContext):
    """updates written into data at constant index tuples (each tuple selects a slice of data's trailing axes)."""
    data = ctx.input(0)
    index = ctx.require_const(1, "indices").astype(np.int64)
    k = index.shape[-1]
    tuples = index.reshape(-1, k) % np.array(data.shape[:k], np.int64)
    inner = math.prod(data.shape[k:])
    starts = np.ravel_multi_index(tuple(tuples.T), data.shape[:k]) * inner
    return [_scatter(ctx, (starts[:, None] + np.arange(inner)[None, :]).reshape(-1))]


@converter("Gather")
def gather(ctx: NodeContext):
    return [ctx.b.gather(ctx.input(0), ctx.input(1), axis=ctx.attr("axis", 0))]


@converter("GatherElements")
def gather_elements(ctx: NodeContext):
    return [ctx.b.gather_elements(ctx.input(0), ctx.input(1), axis=ctx.attr("axis", 0))]


@converter("Shape")
def shape(ctx: NodeContext):
    dims = ctx.input(0).shape
    start, end = ctx.attr("start", 0), ctx.attr("end", None)
    return [ctx.b.create_constant(np.array(dims[start:end], np.int64), dtype="int64")]


@converter("Size")
def size(ctx: NodeContext):
    return [ctx.b.create_constant(np.array(math.prod(ctx.input(0).shape), np.int64), dtype="int64")]


@converter("ConstantOfShape")
def constant_of_shape(ctx: NodeContext):
    value = ctx.attr("value", np.zeros(1, np.float32))
    return [ctx.b.full([int(d) for d in ctx.require_const(0, "shape")], value.reshape(()))]


# Constant's value attributes and how each becomes an array
_CONSTANT_ATTRS = {
    "value": lambda v: v,
    "value_float": lambda v: np.array(v, np.float32),
    "value_floats": lambda v: np.array(v, np.float32),
    "value_int": lambda v: np.array(v, np.int64),
    "value_ints": lambda v: np.array(v, np.int64),
}


@converter("Constant")
def constant(ctx: NodeContext):
    for name, to_array in _CONSTANT_ATTRS.items():
        if ctx.has_attr(name):
            data = to_array(ctx.attr(name, None))
            return [ctx.b.create_constant(data, dtype=str(data.dtype))]
    given = [a.name for a in ctx.node.attribute]
    raise OnnxImportError(f"Constant with attribute {given} is not supported (use value, value_float(s), value_int(s))")


@converter("Range")
def range_(ctx: NodeContext):
    """start, start + delta, ... up to limit (constants)."""
    start, limit, delta = (ctx.require_const(i, name).reshape(()) for i, name in enumerate(("start", "limit", "delta")))
    return [compose.arange(ctx.b, start, limit, delta, str(start.dtype))]


@converter("DepthToSpace")
def depth_to_space(ctx: NodeContext):
    x = ctx.input(0)
    n, c, h, w = _nchw(x)
    bs, mode = ctx.attr("blocksize", None), ctx.attr("mode", "DCR")
    if mode not in ("DCR", "CRD"):
        raise OnnxImportError(f"mode {mode!r} is neither DCR nor CRD")
    if mode == "DCR":
        y = ctx.b.transpose(ctx.b.reshape(x, [n, bs, bs, c // bs**2, h, w]), [0, 3, 4, 1, 5, 2])
    else:
        y = ctx.b.transpose(ctx.b.reshape(x, [n, c // bs**2, bs, bs, h, w]), [0, 1, 4, 2, 5, 3])
    return [ctx.b.reshape(y, [n, c // bs**2, h * bs, w * bs])]


@converter("SpaceToDepth")
def space_to_depth(ctx: NodeContext):
    x = ctx.input(0)
    n, c, h, w = _nchw(x)
    bs = ctx.attr("blocksize", None)
    # DCR: output channel (bh * bs + bw) * C + c; CRD (opset 28): c * bs * bs + bh * bs + bw
    perm = [0, 3, 5, 1, 2, 4] if ctx.attr("mode", "DCR") == "DCR" else [0, 1, 3, 5, 2, 4]
    y = ctx.b.transpose(ctx.b.reshape(x, [n, c, h // bs, bs, w // bs, bs]), perm)
    return [ctx.b.reshape(y, [n, c * bs * bs, h // bs, w // bs])]


def _nchw(x: Value) -> tuple[int, int, int, int]:
    if len(x.shape) != 4:
        raise OnnxImportError(f"input must be 4-D NCHW, got shape {x.shape}")
    return x.shape

