"""Converters of Paddle shape and data-movement ops, and of the ops that make shape arguments.

Shape arguments that are tensors (full_int_array, shape64 -> slice -> stack) are constants once the
input shapes are static; the folding builder evaluates them as they are built, so converters read
their values (as the ONNX importer does for its shape subgraphs).
"""
from __future__ import annotations

import math

import numpy as np

from cinn.core.ir import Value
from frontend import compose
from frontend.paddle.graph import PaddleImportError
from frontend.paddle.registry import OpContext, attr_of, converter, dtype_arg, dtype_of_name, optional_dtype


def _axis(axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        raise PaddleImportError(f"axis {axis} out of range for rank {rank}")
    return axis % max(rank, 1)


@converter("reshape2", "reshape")
def reshape(ctx: OpContext):
    x = ctx.input("X", 0)
    shape = ctx.int_array("shape", 1, "the target shape", tensor_slots=("Shape", "ShapeTensor"))
    # 0 copies the input dim at the same position
    return [ctx.b.reshape(x, [x.shape[k] if d == 0 else d for k, d in enumerate(shape)])]


@converter("transpose2", "transpose")
def transpose(ctx: OpContext):
    return [ctx.b.transpose(ctx.input("X", 0), list(ctx.attr("perm" if ctx.pir else "axis")))]


@converter("flatten_contiguous_range", "flatten", "flatten2")
def flatten(ctx: OpContext):
    """Dims start_axis..stop_axis merged; legacy flatten / flatten2 (Paddle 1) make a matrix split at `axis`."""
    x = ctx.input("X", 0)
    if not x.shape:  # Paddle flattens a 0-d tensor to [1]
        return [ctx.b.reshape(x, [1])]
    if not ctx.pir and ctx.op.type != "flatten_contiguous_range":
        axis = int(ctx.attr("axis", 1))
        return [ctx.b.reshape(x, [math.prod(x.shape[:axis]), math.prod(x.shape[axis:])])]
    return [ctx.b.flatten(x, start_axis=ctx.attr("start_axis", 1), stop_axis=ctx.attr("stop_axis", -1))]


def _sliced(ctx: OpContext, strides: list[int] | None) -> Value:
    """slice/strided_slice: legacy attributes or tensors, PIR operands; then drop the decrease_axis dims."""
    x = ctx.input("Input", 0)
    axes = [int(a) for a in ctx.attr("axes")]
    starts = ctx.int_array("starts", 1, "starts", tensor_slots=("StartsTensor", "StartsTensorList"))
    ends = ctx.int_array("ends", 2, "ends", tensor_slots=("EndsTensor", "EndsTensorList"))
    y = ctx.b.slice(x, axes, list(starts), list(ends), strides)
    decrease = [int(a) for a in ctx.attr("decrease_axis", [])]
    return ctx.b.squeeze(y, decrease) if decrease else y


@converter("slice")
def slice_(ctx: OpContext):
    return [_sliced(ctx, None)]


@converter("strided_slice")
def strided_slice(ctx: OpContext):
    strides = ctx.int_array("strides", 3, "strides", tensor_slots=("StridesTensor", "StridesTensorList"))
    return [_sliced(ctx, list(strides))]


@converter("concat")
def concat(ctx: OpContext):
    axis = ctx.scalar("axis", 1, "the axis", tensor_slot="AxisTensor")
    return [ctx.b.concat(ctx.inputs("X", 0), axis=int(axis))]


@converter("stack", outputs=("Y",))
def stack(ctx: OpContext):
    xs = ctx.inputs("X", 0)
    axis = _axis(ctx.attr("axis", 0), len(xs[0].shape) + 1)
    return [ctx.b.concat([ctx.b.expand_dims(x, [axis]) for x in xs], axis=axis)]


@converter("split")
def split(ctx: OpContext):
    x = ctx.input("X", 0)
    axis = int(ctx.scalar("axis", 2, "the axis", tensor_slot="AxisTensor"))
    num = 0 if ctx.pir else ctx.attr("num", 0)
    sections = num or ctx.int_array("sections", 1, "the sections", tensor_slots=("SectionsTensorList",))
    return ctx.vector(_split(ctx, x, sections, axis))


@converter("split_with_num")
def split_with_num(ctx: OpContext):
    x = ctx.input("X", 0)
    return ctx.vector(_split(ctx, x, ctx.attr("num"), int(ctx.scalar("axis", 1, "the axis"))))


def _split(ctx: OpContext, x: Value, sections, axis: int) -> list[Value]:
    outs = ctx.b.split(x, sections if isinstance(sections, int) else list(sections), axis=axis)
    return list(outs) if isinstance(outs, tuple) else [outs]


@converter("squeeze2", "squeeze")
def squeeze(ctx: OpContext):
    axes = ctx.int_array("axes", 1, "the axes", tensor_slots=("AxesTensor", "AxesTensorList"))
    return [ctx.b.squeeze(ctx.input("X", 0), list(axes))]


@converter("unsqueeze2", "unsqueeze")
def unsqueeze(ctx: OpContext):
    x = ctx.input("X", 0)
    axes = ctx.int_array("axes", 1, "the axes", tensor_slots=("AxesTensor", "AxesTensorList"))
    return [ctx.b.reshape(x, list(_unsqueezed(x.shape, axes)))]


def _unsqueezed(shape: tuple[int, ...], axes) -> tuple[int, ...]:
    """Paddle inserts the axes one at a time, a negative one counting from the end of the shape so far."""
    out = list(shape)
    for a in axes:
        pos = a + len(out) + 1 if a < 0 else a
        if not 0 <= pos <= len(out):
            raise PaddleImportError(f"unsqueeze axis {a} out of range for shape {tuple(out)}")
        out.insert(pos, 1)
    return tuple(out)


# -- values made from shapes and attributes --------------------------------------------------------
@converter("shape", "shape64")
def shape(ctx: OpContext):
    dtype = "int64" if ctx.op.type == "shape64" else "int32"
    return [ctx.b.create_constant(np.array(ctx.input("Input", 0).shape, dtype), dtype=dtype)]


@converter("full")
def full(ctx: OpContext):
    dtype = dtype_of_name(ctx.attr("dtype"), "full")
    return [ctx.b.full(ctx.attr("shape"), np.array(ctx.attr("value"), dtype))]


@converter("full_with_tensor")
def full_with_tensor(ctx: OpContext):
    """PIR's full with its value and shape as tensors (a shape with a computed dim, as a dynamic batch's)."""
    value = ctx.scalar("value", 0, "the fill value")
    return [ctx.b.full(ctx.int_array("shape", 1, "the shape"),
                       np.array(value, dtype_of_name(ctx.attr("dtype"), "full_with_tensor")))]


@converter("fill_constant")
def fill_constant(ctx: OpContext):
    dtype = dtype_arg(ctx, "dtype", "fill_constant")
    text = ctx.attr("str_value", "")
    # str_value keeps int64 values exactly (the float `value` may round them)
    value = _fill_value(text, dtype) if text else ctx.attr("value", 0.0)
    dims = ctx.int_array("shape", 0, "the shape", tensor_slots=("ShapeTensor", "ShapeTensorList"))
    return [ctx.b.full(dims, np.array(value, dtype))]


def _fill_value(text: str, dtype: str) -> float | int:
    """fill_constant's str_value as a number of its dtype; an integer fill must be a finite number in its range."""
    try:
        value = float(text)
    except ValueError:
        raise PaddleImportError(f"value {text!r} is not a number") from None
    if np.dtype(dtype).kind not in "iu":
        return value
    if not math.isfinite(value):
        raise PaddleImportError(f"value {text!r} is not a finite number, as a fill of {dtype} must be")
    exact = int(text) if text.lstrip("+-").isdigit() else int(value)  # int64 values beyond 2**53 stay exact
    info = np.iinfo(dtype)
    if not info.min <= exact <= info.max:
        raise PaddleImportError(f"value {text!r} does not fit {dtype} [{info.min}, {info.max}]")
    return exact


@converter("full_int_array")
def full_int_array(ctx: OpContext):
    dtype = dtype_of_name(ctx.attr("dtype", "int64"), "full_int_array")
    return [ctx.b.create_constant(np.array(ctx.attr("value"), dtype).reshape(-1), dtype=dtype)]


# -- PIR vectors -------------------------------------------------------------------------------------
@converter("builtin.combine")
def combine(ctx: OpContext):
    return [tuple(ctx.input("", k) for k in range(len(ctx.op.inputs)))]


@converter("builtin.split")
def unpack(ctx: OpContext):
    return ctx.inputs("", 0)


@converter("builtin.slice")
def vector_item(ctx: OpContext):
    """One tensor of a PIR vector, by index."""
    return [ctx.inputs("", 0)[int(ctx.attr("index"))]]


# -- broadcasting, tiling, reordering -------------------------------------------------------------------
@converter("expand_v2", "expand")
def expand(ctx: OpContext):
    """PIR expand / legacy expand_v2 broadcast to a shape (-1 keeps a dim; extra leading dims are new); legacy
    `expand` (v1) repeats each dim expand_times times."""
    x = ctx.input("X", 0)
    if not ctx.pir and ctx.op.type == "expand":
        times = ctx.int_array("expand_times", 1, "expand_times", tensor_slots=("ExpandTimes", "expand_times_tensor"))
        return [ctx.b.tile(x, list(times))]
    shape = ctx.int_array("shape", 1, "the target shape", tensor_slots=("Shape", "expand_shapes_tensor"))
    return [_broadcast(ctx, x, shape)]


def _broadcast(ctx: OpContext, x: Value, shape) -> Value:
    """x broadcast to `shape` (-1: x's dim; leading dims new)."""
    lead = len(shape) - len(x.shape)
    if lead < 0:
        raise PaddleImportError(f"cannot expand shape {x.shape} to the shorter {tuple(shape)}")
    target = [x.shape[k - lead] if d == -1 else int(d) for k, d in enumerate(shape)]
    return ctx.b.identity(x) if tuple(target) == x.shape else ctx.b.broadcast_to(x, target)


@converter("expand_as", "expand_as_v2")
def expand_as(ctx: OpContext):
    """x broadcast to y's shape (or the attribute target_shape where y is absent)."""
    y = ctx.optional_input("Y", 1)
    shape = y.shape if y is not None else ctx.attr("target_shape")
    return [_broadcast(ctx, ctx.input("X", 0), shape)]


@converter("tile")
def tile(ctx: OpContext):
    """x repeated along each dim; fewer repeats than dims repeat the trailing ones, more add leading dims."""
    x = ctx.input("X", 0)
    times = list(ctx.int_array("repeat_times", 1, "repeat_times", tensor_slots=("RepeatTimes", "repeat_times_tensor")))
    if len(times) > len(x.shape):
        x = ctx.b.reshape(x, [1] * (len(times) - len(x.shape)) + list(x.shape))
    times = [1] * (len(x.shape) - len(times)) + times
    return [ctx.b.tile(x, times) if any(t != 1 for t in times) else ctx.b.identity(x)]


@converter("flip", "reverse")
def flip(ctx: OpContext):
    x = ctx.input("X", 0)
    return [ctx.b.reverse(x, [int(a) % len(x.shape) for a in ctx.attr("axis")])]


@converter("roll")
def roll(ctx: OpContext):
    """Elements shifted along axes, wrapping around (no axes: over the flattened tensor)."""
    x = ctx.input("X", 0)
    shifts = ctx.int_array("shifts", 1, "the shifts", tensor_slots=("ShiftsTensor",))
    axes = [int(a) for a in ctx.attr("axis", [])]
    y = x if axes else ctx.b.reshape(x, [-1])
    for shift, axis in zip(shifts, axes or [0], strict=True):
        n = y.shape[axis]
        cut = -shift % n
        if cut:
            head = ctx.b.slice(y, [axis], [cut], [n])
            y = ctx.b.concat([head, ctx.b.slice(y, [axis], [0], [cut])], axis=axis)
    return [y if axes else ctx.b.reshape(y, list(x.shape))]


@converter("tril", "triu", "tril_triu")
def tril_triu(ctx: OpContext):
    upper = ctx.op.type == "triu" or (ctx.op.type == "tril_triu" and not ctx.attr("lower", True))
    return [compose.trilu(ctx.b, ctx.input("X", 0), int(ctx.attr("diagonal", 0)), upper)]


@converter("unbind", "unstack", outputs=("Out", "Y"))
def unbind(ctx: OpContext):
    """The slices along an axis, that axis removed."""
    x = ctx.input("X", 0)
    axis = _axis(ctx.attr("axis", 0), len(x.shape))
    parts = [ctx.b.squeeze(ctx.b.slice(x, [axis], [k], [k + 1]), [axis]) for k in range(x.shape[axis])]
    return ctx.vector(parts)


@converter("meshgrid")
def meshgrid(ctx: OpContext):
    """Each 1-D input broadcast along its own axis of the grid of all their lengths."""
    xs = ctx.inputs("X", 0)
    sizes = [math.prod(x.shape) for x in xs]
    grids = []
    for k, x in enumerate(xs):
        shaped = ctx.b.reshape(x, [n if j == k else 1 for j, n in enumerate(sizes)])
        grids.append(ctx.b.broadcast_to(shaped, sizes))
    return ctx.vector(grids)


@converter("repeat_interleave", "repeat_interleave_with_tensor_index")
def repeat_interleave(ctx: OpContext):
    """Each element repeated along an axis (a number of times, or per element from a constant tensor)."""
    x = ctx.input("X", 0)
    axis = attr_of(ctx, ("axis", "dim"), None)
    if axis is None:
        x, axis = ctx.b.reshape(x, [-1]), 0
    axis = int(axis) % len(x.shape)
    tensor = ctx.optional_input("RepeatsTensor", 1)
    repeats = ctx.const(tensor, "the repeats").reshape(-1) if tensor is not None else int(attr_of(ctx, ("repeats", "Repeats"), 1))
    index = np.repeat(np.arange(x.shape[axis], dtype=np.int64), repeats)
    return [ctx.b.gather(x, ctx.b.create_constant(index), axis=axis)]


# -- diagonals ----------------------------------------------------------------------------------------
def _diagonal_index(rows: int, cols: int, offset: int) -> np.ndarray:
    """The flat positions in a rows x cols matrix of its diagonal `offset` (above the main one where positive)."""
    start_r, start_c = max(-offset, 0), max(offset, 0)
    n = max(min(rows - start_r, cols - start_c), 0)
    return (np.arange(n) + start_r) * cols + np.arange(n) + start_c


def _diagonal(ctx: OpContext, x: Value, offset: int, axis1: int, axis2: int) -> Value:
    """The diagonal of axes axis1 and axis2, as the last axis of the others."""
    rank = len(x.shape)
    a1, a2 = axis1 % rank, axis2 % rank
    rest = [k for k in range(rank) if k not in (a1, a2)]
    moved = ctx.b.transpose(x, rest + [a1, a2]) if rest + [a1, a2] != list(range(rank)) else x
    flat = ctx.b.reshape(moved, [x.shape[k] for k in rest] + [x.shape[a1] * x.shape[a2]])
    index = _diagonal_index(x.shape[a1], x.shape[a2], offset)
    return ctx.b.gather(flat, ctx.b.create_constant(index.astype(np.int64)), axis=len(rest))


@converter("diagonal")
def diagonal(ctx: OpContext):
    return [_diagonal(ctx, ctx.input("Input", 0), int(ctx.attr("offset", 0)), int(ctx.attr("axis1", 0)),
                      int(ctx.attr("axis2", 1)))]


@converter("trace")
def trace(ctx: OpContext):
    x = ctx.input("Input", 0)
    d = _diagonal(ctx, x, int(ctx.attr("offset", 0)), int(ctx.attr("axis1", 0)), int(ctx.attr("axis2", 1)))
    return [ctx.b.reduce_sum(d, [len(d.shape) - 1])]


@converter("diag", "diag_v2")
def diag(ctx: OpContext):
    """A vector's diagonal matrix (padding_value elsewhere), or a matrix's diagonal vector."""
    x = ctx.input("X", 0)
    offset = int(ctx.attr("offset", 0))
    if len(x.shape) == 2:
        return [_diagonal(ctx, x, offset, 0, 1)]
    n = x.shape[0]
    size = n + abs(offset)
    index, on = np.zeros(size * size, np.int64), np.zeros(size * size, bool)
    index[_diagonal_index(size, size, offset)], on[_diagonal_index(size, size, offset)] = np.arange(n), True
    spread = ctx.b.gather(x, ctx.b.create_constant(index.reshape(size, size)), axis=0)
    pad = ctx.b.fill_constant((), ctx.attr("padding_value", 0.0), x.dtype)
    return [ctx.b.select(ctx.b.create_constant(on.reshape(size, size)), spread, pad)]


# -- values made from shapes, ranges and attributes ----------------------------------------------------
@converter("numel", "size")
def numel(ctx: OpContext):
    return [ctx.b.create_constant(np.array(math.prod(ctx.input("Input", 0).shape), np.int64), dtype="int64")]


@converter("arange", "range")
def arange(ctx: OpContext):
    """start, start + step, ... below end: PIR operands with attribute dtype; legacy tensors Start, End, Step."""
    start, end, step = (ctx.const(ctx.input(slot, pos), f"the range's {slot.lower()}").reshape(-1)[0]
                        for pos, slot in enumerate(("Start", "End", "Step")))
    dtype = dtype_arg(ctx, "dtype", "arange") if ctx.pir else str(start.dtype)
    if np.dtype(dtype).kind in "iu":
        start, end, step = int(start), int(end), int(step)
    return [compose.arange(ctx.b, np.array(start), np.array(end), np.array(step), dtype)]


@converter("linspace")
def linspace(ctx: OpContext):
    start, stop, num = (ctx.const(ctx.input(slot, pos), f"linspace's {slot.lower()}").reshape(-1)[0]
                        for pos, slot in enumerate(("Start", "Stop", "Num")))
    dtype = dtype_arg(ctx, "dtype", "linspace")
    return [ctx.b.create_constant(np.linspace(float(start), float(stop), int(num)).astype(dtype), dtype=dtype)]


@converter("eye")
def eye(ctx: OpContext):
    rows = int(ctx.scalar("num_rows", 0, "the row count"))
    cols = int(ctx.scalar("num_columns", 1, "the column count"))
    dtype = dtype_arg(ctx, "dtype", "eye")
    return [ctx.b.create_constant(np.eye(rows, cols if cols >= 0 else rows), dtype=dtype)]


@converter("full_like", "fill_any_like", "fill_zeros_like", "empty_like")
def full_like(ctx: OpContext):
    """A tensor of x's shape filled with one value (PIR operand 1; legacy attribute value), of the given dtype or
    x's."""
    x = ctx.input("X", 0)
    dtype = optional_dtype(ctx, "dtype", ctx.op.type) or x.dtype
    value = 0.0 if ctx.op.type in ("fill_zeros_like", "empty_like") else ctx.scalar("value", 1, "the fill value")
    return [ctx.b.full(list(x.shape), np.array(value).astype(dtype))]


@converter("empty")
def empty(ctx: OpContext):
    """An uninitialized tensor: zeros."""
    dims = ctx.int_array("shape", 0, "the shape", tensor_slots=("ShapeTensor", "ShapeTensorList"))
    return [ctx.b.full(dims, np.array(0, dtype_arg(ctx, "dtype", "empty")))]


@converter("fill_constant_batch_size_like", "full_batch_size_like")
def fill_constant_batch_size_like(ctx: OpContext):
    """A filled tensor of `shape`, with dim output_dim_idx taken from the input's dim input_dim_idx."""
    x = ctx.input("Input", 0)
    dims = [int(d) for d in ctx.attr("shape")]
    dims[int(ctx.attr("output_dim_idx", 0))] = x.shape[int(ctx.attr("input_dim_idx", 0))]
    dtype = dtype_arg(ctx, "dtype", ctx.op.type)
    text = ctx.attr("str_value", "")
    value = _fill_value(text, dtype) if text else ctx.attr("value", 0.0)
    return [ctx.b.full(dims, np.array(value, dtype))]


# legacy assign_value kept its values in one attribute per type (Paddle 2); Paddle 3 writes `values`
_ASSIGN_VALUE_ATTRS = ("values", "fp32_values", "int32_values", "int64_values", "bool_values", "fp64_values")


@converter("assign_value", "assign_value_")
def assign_value(ctx: OpContext):
    dtype = dtype_arg(ctx, "dtype", ctx.op.type)
    values: list = next((ctx.attr(n) for n in _ASSIGN_VALUE_ATTRS if ctx.attr(n, None)), [])
    shape = [int(d) for d in ctx.attr("shape")]
    return [ctx.b.create_constant(np.array(values).astype(dtype).reshape(shape), dtype=dtype)]


@converter("assign_out_")
def assign_out(ctx: OpContext):
    return [ctx.b.identity(ctx.input("X", 0))]


@converter("one_hot", "one_hot_v2")
def one_hot(ctx: OpContext):
    """float32 1 where the position along a new last axis equals the index, else 0."""
    index = ctx.input("X", 0)
    depth = int(ctx.scalar("depth", 1, "the depth", tensor_slot="depth_tensor"))
    dtype = optional_dtype(ctx, "dtype", "one_hot") or "float32"
    on, off = (ctx.b.fill_constant((), v, dtype) for v in (1, 0))
    return [compose.one_hot(ctx.b, index, depth, len(index.shape), on, off)]


# -- padding --------------------------------------------------------------------------------------
_PAD_MODES = {"constant": "constant", "reflect": "reflect", "replicate": "edge", "edge": "edge", "circular": "wrap"}


@converter("pad")
def pad(ctx: OpContext):
    """Constant padding, (before, after) per dim; PIR takes the value as operand 1."""
    x = ctx.input("X", 0)
    pads = [int(p) for p in ctx.attr("paddings")]
    value = float(ctx.scalar("pad_value", 1, "the pad value", default=0.0))
    return [_padded(ctx, x, list(zip(pads[0::2], pads[1::2], strict=True)), value, "constant")]


@converter("pad3d")
def pad3d(ctx: OpContext):
    """Padding of the last three spatial dims, (left, right, top, bottom, front, back), in one of four modes."""
    x = ctx.input("X", 0)
    pads = ctx.int_array("paddings", 1, "the paddings", tensor_slots=("Paddings",))
    mode = ctx.attr("mode", "constant")
    if mode not in _PAD_MODES:
        raise PaddleImportError(f"pad3d mode {mode!r} is not supported ({', '.join(_PAD_MODES)})")
    channels_last = ctx.attr("data_format", "NCDHW") == "NDHWC"
    spatial = [(pads[4], pads[5]), (pads[2], pads[3]), (pads[0], pads[1])]  # D, H, W
    per_dim = [(0, 0)] + ([*spatial, (0, 0)] if channels_last else [(0, 0), *spatial])
    value = float(attr_of(ctx, ("pad_value", "value"), 0.0))
    return [_padded(ctx, x, per_dim, value, _PAD_MODES[mode])]


def _padded(ctx: OpContext, x: Value, pads: list[tuple[int, int]], value: float, mode: str) -> Value:
    """x padded (negative pads crop), as the table's pad (before, after) per dim."""
    if len(pads) != len(x.shape):
        raise PaddleImportError(f"paddings for {len(pads)} dims do not fit x of shape {x.shape}")
    if any(p < 0 for pair in pads for p in pair):
        crop = [(max(-b, 0), max(-a, 0)) for b, a in pads]
        x = ctx.b.slice(x, list(range(len(x.shape))), [b for b, _ in crop],
                        [d - a for d, (_, a) in zip(x.shape, crop, strict=True)])
        pads = [(max(b, 0), max(a, 0)) for b, a in pads]
    if not any(p for pair in pads for p in pair):
        return ctx.b.identity(x)
    return ctx.b.pad(x, pads, pad_value=value, mode=mode)


# -- gathers and scatters -------------------------------------------------------------------------------
@converter("gather")
def gather(ctx: OpContext):
    x = ctx.input("X", 0)
    axis = int(ctx.scalar("axis", 2, "the axis", tensor_slot="Axis", default=0))
    return [ctx.b.gather(x, ctx.input("Index", 1), axis=axis % len(x.shape))]


@converter("index_select")
def index_select(ctx: OpContext):
    x = ctx.input("X", 0)
    axis = int(attr_of(ctx, ("axis", "dim"), 0)) % len(x.shape)
    return [ctx.b.gather(x, ctx.input("Index", 1), axis=axis)]


@converter("gather_nd")
def gather_nd(ctx: OpContext):
    return [compose.gather_nd(ctx.b, ctx.input("X", 0), ctx.input("Index", 1))]


@converter("take_along_axis", outputs=("Result",))
def take_along_axis(ctx: OpContext):
    x = ctx.input("Input", 0)
    axis = int(attr_of(ctx, ("axis", "Axis"), 0)) % len(x.shape)
    return [ctx.b.gather_elements(x, ctx.input("Index", 1), axis=axis)]


@converter("scatter")
def scatter(ctx: OpContext):
    """Rows of x replaced by updates at ids (overwrite: the last update of a row wins; else a row hit is the sum of
    its updates, its old value dropped)."""
    x, ids, updates = ctx.input("X", 0), ctx.input("Ids", 1), ctx.input("Updates", 2)
    ids = ctx.b.reshape(ids, [-1])
    mode = compose.Scatter.ASSIGN if ctx.attr("overwrite", True) else compose.Scatter.SUM
    return [compose.scatter_rows(ctx.b, x, ids, updates, mode)]


@converter("scatter_nd_add")
def scatter_nd_add(ctx: OpContext):
    """updates added into x at index tuples (the last axis of index), each tuple a slice of x's trailing dims."""
    x, index, updates = ctx.input("X", 0), ctx.input("Index", 1), ctx.input("Updates", 2)
    k = index.shape[-1]
    rows = ctx.b.reshape(x, [math.prod(x.shape[:k]), *x.shape[k:]])
    flat = compose.flat_positions(ctx.b, index, x.shape[:k])
    slices = ctx.b.reshape(updates, [math.prod(flat.shape), *x.shape[k:]])
    out = compose.scatter_rows(ctx.b, rows, ctx.b.reshape(flat, [-1]), slices, compose.Scatter.ADD)
    return [ctx.b.reshape(out, list(x.shape))]


@converter("index_add")
def index_add(ctx: OpContext):
    """add_value's slices added into x at the indices along an axis."""
    x, index, value = ctx.input("X", 0), ctx.input("Index", 1), ctx.input("AddValue", 2)
    axis = int(ctx.attr("axis", 0)) % len(x.shape)
    return [_along(ctx, x, axis, lambda rows, moved: compose.scatter_rows(ctx.b, rows, index, moved(value),
                                                                           compose.Scatter.ADD))]


def _along(ctx: OpContext, x: Value, axis: int, fn) -> Value:
    """fn applied with `axis` moved to the front of x (and of the other operands fn moves), then moved back."""
    if axis == 0:
        return fn(x, lambda v: v)
    perm = [axis] + [k for k in range(len(x.shape)) if k != axis]
    out = fn(ctx.b.transpose(x, perm), lambda v: ctx.b.transpose(v, perm))
    return ctx.b.transpose(out, [int(p) for p in np.argsort(perm)])


@converter("put_along_axis", outputs=("Result",))
def put_along_axis(ctx: OpContext):
    """values written into x at indices along an axis (index and values the same shape): assign (the last write to
    a place wins), add, mul or multiply; include_self=False drops x's value where written."""
    x, index, values = ctx.input("Input", 0), ctx.input("Index", 1), ctx.input("Value", 2)
    axis = int(attr_of(ctx, ("axis", "Axis"), 0)) % len(x.shape)
    reduce_ = attr_of(ctx, ("reduce", "Reduce"), "assign")
    modes = {"assign": compose.Scatter.ASSIGN, "add": compose.Scatter.ADD, "mul": compose.Scatter.MULTIPLY,
             "multiply": compose.Scatter.MULTIPLY}
    if reduce_ not in modes:
        raise PaddleImportError(f"put_along_axis reduce {reduce_!r} is not supported ({', '.join(modes)})")
    values = ctx.b.broadcast_to(ctx.b.cast(values, x.dtype), list(index.shape)) if values.shape != index.shape \
        else ctx.b.cast(values, x.dtype)
    include_self = bool(attr_of(ctx, ("include_self", "Include_self"), True))
    return [compose.scatter_elements(ctx.b, x, index, values, axis, modes[reduce_], include_self)]


# -- slice assignment -----------------------------------------------------------------------------------
@converter("set_value", "set_value_with_tensor", "set_value_", "set_value_with_tensor_")
def set_value(ctx: OpContext):
    """x with a strided region replaced by a value broadcast to it (a tensor, or the attribute values)."""
    x = ctx.input("Input", 0)
    with_tensor = ctx.op.type.startswith("set_value_with_tensor") or \
        (not ctx.pir and ctx.optional_input("ValueTensor", 1) is not None)
    first = 2 if ctx.pir and with_tensor else 1
    starts, ends, steps = (ctx.int_array(name, first + k, name, tensor_slots=(f"{name.capitalize()}TensorList",))
                           for k, name in enumerate(("starts", "ends", "steps")))
    axes = [int(a) % len(x.shape) for a in ctx.attr("axes")]
    picked = {a: range(x.shape[a])[slice(s, e, st)] for a, s, e, st in zip(axes, starts, ends, steps, strict=True)}
    region = [len(picked[k]) if k in picked else d for k, d in enumerate(x.shape)]
    if with_tensor:
        value = ctx.b.cast(ctx.input("ValueTensor", 1), x.dtype)
    else:
        data = np.array(ctx.attr("values"), dtype=x.dtype).reshape([int(d) for d in ctx.attr("shape", [])] or [-1])
        value = ctx.b.create_constant(data.reshape(()) if data.size == 1 else data, dtype=x.dtype)
    value = _region_value(ctx, value, region, [int(a) for a in ctx.attr("decrease_axes", [])],
                          [int(a) for a in ctx.attr("none_axes", [])])
    return [compose.place_region(ctx.b, x, value, picked)]


def _region_value(ctx: OpContext, value: Value, region: list[int], decrease: list[int], none: list[int]) -> Value:
    """The assigned value broadcast to the region: its shape lacks the decreased axes and has size-1 none axes."""
    kept = [d for k, d in enumerate(region) if k not in decrease]
    for a in sorted(none):
        kept.insert(a, 1)
    if list(value.shape) != kept:
        value = ctx.b.broadcast_to(value, kept)
    return ctx.b.reshape(value, region)


@converter("crop", "crop_tensor")
def crop(ctx: OpContext):
    """The region of `shape` (-1: to the end) starting at `offsets`."""
    x = ctx.input("X", 0)
    shape = ctx.int_array("shape", 1, "the shape", tensor_slots=("Shape", "ShapeTensor"))
    offsets = ctx.int_array("offsets", 2, "the offsets", tensor_slots=("Offsets", "OffsetsTensor"))
    ends = [d if s == -1 else o + s for d, o, s in zip(x.shape, offsets, shape, strict=True)]
    return [ctx.b.slice(x, list(range(len(x.shape))), list(offsets), ends)]


@converter("index_put")
def index_put(ctx: OpContext):
    """x with the places that a tuple of integer index tensors (one per leading dim, broadcast together) selects
    set to value (accumulate: added to them)."""
    x, value = ctx.input("x", 0), ctx.input("value", 2)
    indices = ctx.inputs("indices", 1)
    if any(i.dtype == "bool" for i in indices):
        raise PaddleImportError("index_put with a boolean mask is not supported (its shape depends on the values)")
    shape = list(np.broadcast_shapes(*(i.shape for i in indices)))
    tuples = ctx.b.concat([ctx.b.expand_dims(ctx.b.broadcast_to(ctx.b.cast(i, "int64"), shape), [len(shape)])
                           for i in indices], axis=len(shape))
    lead, rest = x.shape[: len(indices)], list(x.shape[len(indices):])
    flat = ctx.b.reshape(compose.flat_positions(ctx.b, tuples, lead), [-1])
    updates = ctx.b.broadcast_to(ctx.b.cast(value, x.dtype), shape + rest)
    rows = ctx.b.reshape(x, [math.prod(lead), *rest])
    mode = compose.Scatter.ADD if ctx.attr("accumulate", False) else compose.Scatter.ASSIGN
    out = compose.scatter_rows(ctx.b, rows, flat, ctx.b.reshape(updates, [flat.shape[0], *rest]), mode)
    return [ctx.b.reshape(out, list(x.shape))]


@converter("broadcast_tensors")
def broadcast_tensors(ctx: OpContext):
    xs = ctx.inputs("X", 0)
    shape = list(np.broadcast_shapes(*(x.shape for x in xs)))
    return ctx.vector([ctx.b.identity(x) if list(x.shape) == shape else ctx.b.broadcast_to(x, shape) for x in xs])


@converter("sequence_mask", outputs=("Y",))
def sequence_mask(ctx: OpContext):
    """mask[..., j] = j < x[...], for j below maxlen (a constant: a maxlen from the values is not supported)."""
    x = ctx.input("X", 0)
    maxlen = int(ctx.scalar("maxlen", 1, "maxlen", tensor_slot="MaxLenTensor", default=-1))
    if maxlen < 0:
        raise PaddleImportError("sequence_mask without maxlen is not supported (its shape depends on the values)")
    dtype = optional_dtype(ctx, "out_dtype", "sequence_mask") or "int64"
    below = ctx.b.less_than(compose.positions(ctx.b, maxlen, 0, "int64"), ctx.b.expand_dims(ctx.b.cast(x, "int64"), [len(x.shape)]))
    return [ctx.b.cast(below, dtype)]


@converter("temporal_shift")
def temporal_shift(ctx: OpContext):
    """[N * T, C, H, W]: the first C * ratio channels take the previous segment's values, the next as many the next
    one's (zeros past the ends); the rest stay."""
    x = ctx.input("X", 0)
    channels_last = ctx.attr("data_format", "NCHW") == "NHWC"
    if channels_last:
        x = ctx.b.transpose(x, [0, 3, 1, 2])
    nt, c, h, w = x.shape
    t = int(ctx.attr("seg_num"))
    ratio = float(ctx.attr("shift_ratio", 0.25))
    c1, c2 = int(c * ratio), int(c * 2 * ratio)
    clip = ctx.b.reshape(x, [nt // t, t, c, h, w])

    def channels(lo: int, hi: int) -> Value:
        return ctx.b.slice(clip, [2], [lo], [hi])

    def shifted(lo: int, hi: int, before: int) -> Value:
        """Channels lo..hi moved one segment later (before = 1) or earlier (0), zeros where none comes."""
        if t == 1:
            return ctx.b.full([nt, 1, hi - lo, h, w], np.array(0, x.dtype))
        part = ctx.b.slice(channels(lo, hi), [1], [1 - before], [t - before])
        return ctx.b.pad(part, [(0, 0), (before, 1 - before), (0, 0), (0, 0), (0, 0)])

    parts = [shifted(0, c1, 1)] if c1 else []
    parts += [shifted(c1, c2, 0)] if c2 > c1 else []
    parts += [channels(c2, c)] if c > c2 else []
    y = ctx.b.reshape(ctx.b.concat(parts, axis=2) if len(parts) > 1 else ctx.b.identity(parts[0]), [nt, c, h, w])
    return [ctx.b.transpose(y, [0, 2, 3, 1]) if channels_last else y]


@converter("searchsorted")
def searchsorted(ctx: OpContext):
    """For each value, how many elements of the sorted sequence (1-D, or one row per leading index) are below it
    (right: not above it)."""
    seq, values = ctx.input("SortedSequence", 0), ctx.input("Values", 1)
    row = ctx.b.expand_dims(seq, [len(seq.shape) - 1]) if len(seq.shape) > 1 else seq  # [..., 1, n]
    wide = ctx.b.expand_dims(values, [len(values.shape)])  # [..., m, 1]
    hit = (ctx.b.less_equal if ctx.attr("right", False) else ctx.b.less_than)(row, wide)
    dtype = "int32" if ctx.attr("out_int32", False) else "int64"
    return [ctx.b.reduce_sum(ctx.b.cast(hit, dtype), [len(hit.shape) - 1])]


@converter("tril_indices", "triu_indices")
def tril_indices(ctx: OpContext):
    """The [2, K] row and column indices of a triangle of a rows x cols matrix, from diagonal `offset`."""
    rows, cols = int(attr_of(ctx, ("rows", "row"), 0)), int(attr_of(ctx, ("cols", "col"), 0))
    offset = int(ctx.attr("offset", 0))
    pick = np.tril_indices if ctx.op.type == "tril_indices" else np.triu_indices
    dtype = dtype_arg(ctx, "dtype", ctx.op.type)
    return [ctx.b.create_constant(np.stack(pick(rows, offset, cols)).astype(dtype), dtype=dtype)]


@converter("increment")
def increment(ctx: OpContext):
    x = ctx.input("X", 0)
    return [ctx.b.add(x, compose.scalar(ctx.b, float(ctx.attr("step", 1.0)), x))]
