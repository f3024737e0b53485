"""Converters of Paddle shape and data-movement ops, and of the ops that make shape arguments.

Shape arguments that are tensors (full_int_array, shape64 -> slice -> stack) are constants once the
input shapes are static; the folding builder evaluates them as they are built, so converters read
their values (as the ONNX importer does for its shape subgraphs).
"""
from __future__ import annotations

import math

import numpy as np

from cinn.core.ir import Value
from frontend.paddle.graph import PaddleImportError
from frontend.paddle.registry import OpContext, converter, dtype_arg, dtype_of_name


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


@converter("flatten_contiguous_range", "flatten")
def flatten(ctx: OpContext):
    x = ctx.input("X", 0)
    if not x.shape:  # Paddle flattens a 0-d tensor to [1]
        return [ctx.b.reshape(x, [1])]
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
