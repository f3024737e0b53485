"""Converters of ONNX reductions, ArgMax/ArgMin, TopK, Softmax/LogSoftmax, CumSum and CumProd."""
from __future__ import annotations

import math

import numpy as np

from cinn.core.ir import Value
from frontend import compose
from frontend.onnx.registry import NodeContext, converter

# ONNX op -> (cinn reduction, elementwise op applied before it or None, after it or None)
_REDUCE = {
    "ReduceSum": ("reduce_sum", None, None),
    "ReduceMean": ("reduce_mean", None, None),
    "ReduceMax": ("reduce_max", None, None),
    "ReduceMin": ("reduce_min", None, None),
    "ReduceProd": ("reduce_prod", None, None),
    "ReduceL1": ("reduce_sum", "abs", None),
    "ReduceL2": ("reduce_sum", "square", "sqrt"),
    "ReduceSumSquare": ("reduce_sum", "square", None),
    "ReduceLogSum": ("reduce_sum", None, "log"),
    "ReduceLogSumExp": ("reduce_sum", "exp", "log"),
}
# max/min of booleans are any/all
_BOOL_REDUCE = {"reduce_max": "reduce_any", "reduce_min": "reduce_all"}
# the opset from which `axes` is an input instead of an attribute
_AXES_INPUT_SINCE = {"ReduceSum": 13}


def _elementwise(ctx: NodeContext, op: str | None, x: Value) -> Value:
    if op is None:
        return x
    return ctx.b.multiply(x, x) if op == "square" else getattr(ctx.b, op)(x)


@converter(*_REDUCE)
def reduce(ctx: NodeContext):
    op, before, after = _REDUCE[ctx.node.op_type]
    x = ctx.input(0)
    axes = ctx.ints(1, "axes", _AXES_INPUT_SINCE.get(ctx.node.op_type, 18), "axes") or ()
    if not axes and ctx.attr("noop_with_empty_axes", 0):
        return [ctx.b.identity(x)]
    keep = bool(ctx.attr("keepdims", 1))
    if x.dtype == "bool" and op in _BOOL_REDUCE:
        op = _BOOL_REDUCE[op]
    if ctx.node.op_type == "ReduceLogSumExp":  # shift by the max so exp does not overflow
        peak = ctx.b.reduce_max(x, list(axes), keep_dim=True)
        total = ctx.b.reduce_sum(ctx.b.exp(ctx.b.subtract(x, peak)), list(axes), keep_dim=keep)
        peak = peak if keep else ctx.b.reshape(peak, list(total.shape))
        return [ctx.b.add(ctx.b.log(total), peak)]
    y = getattr(ctx.b, op)(_elementwise(ctx, before, x), list(axes), keep_dim=keep)
    return [_elementwise(ctx, after, y)]


@converter("ArgMax", "ArgMin")
def arg_reduce(ctx: NodeContext):
    x = ctx.input(0)
    axis = ctx.attr("axis", 0) % max(len(x.shape), 1)
    keep = bool(ctx.attr("keepdims", 1))
    op = getattr(ctx.b, ctx.node.op_type.lower())
    if not ctx.attr("select_last_index", 0):
        return [ctx.b.cast(op(x, axis=axis, keep_dim=keep), dtype="int64")]
    # the last extreme: the first one of the reversed axis, mapped back
    index = op(ctx.b.reverse(x, [axis]), axis=axis, keep_dim=keep)
    last = ctx.b.fill_constant((), x.shape[axis] - 1, "int32")
    return [ctx.b.cast(ctx.b.subtract(last, index), dtype="int64")]


@converter("TopK")
def top_k(ctx: NodeContext):
    """Values and int64 indices, always sorted (sorted=0 leaves the order to the implementation)."""
    x = ctx.input(0)
    k = ctx.attr("k", None) if ctx.opset < 10 else int(ctx.require_const(1, "k").reshape(()))
    axis = ctx.attr("axis", -1)
    if k == 0:  # empty results (a detector's top min(k, count) of no candidate)
        shape = list(x.shape)
        shape[axis] = 0
        return [ctx.b.create_constant(np.zeros(shape, x.dtype)), ctx.b.create_constant(np.zeros(shape, np.int64))]
    values, indices = ctx.b.topk(x, k, axis=axis, largest=bool(ctx.attr("largest", 1)))
    return [values, indices]


def _softmax(ctx: NodeContext, op: str):
    x = ctx.input(0)
    rank = len(x.shape)
    if ctx.opset >= 13:
        return [getattr(ctx.b, op)(x, [ctx.attr("axis", -1)])]
    # before opset 13 the input is coerced to 2-D [prod(dims < axis), prod(dims >= axis)]
    axis = ctx.attr("axis", 1) % max(rank, 1)
    flat = ctx.b.reshape(x, [math.prod(x.shape[:axis]), math.prod(x.shape[axis:])])
    return [ctx.b.reshape(getattr(ctx.b, op)(flat, [-1]), list(x.shape))]


@converter("Softmax")
def softmax(ctx: NodeContext):
    return _softmax(ctx, "softmax")


@converter("LogSoftmax")
def log_softmax(ctx: NodeContext):
    return _softmax(ctx, "log_softmax")


@converter("CumSum")
def cumsum(ctx: NodeContext):
    return [compose.cumsum(ctx.b, *_prefix(ctx))]


@converter("CumProd")
def cumprod(ctx: NodeContext):
    return [compose.cumprod(ctx.b, *_prefix(ctx))]


def _prefix(ctx: NodeContext) -> tuple[Value, int, np.ndarray]:
    """A prefix op's input, its axis, and keep[i, j]: whether element i enters output j (exclusive, reverse)."""
    x = ctx.input(0)
    axis = int(ctx.require_const(1, "axis").reshape(())) % len(x.shape)
    return x, axis, compose.prefix_mask(x.shape[axis], bool(ctx.attr("exclusive", 0)), bool(ctx.attr("reverse", 0)))
