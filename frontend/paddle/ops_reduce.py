"""Converters of Paddle reductions (legacy reduce_* and PIR sum/mean/max/...), norms, arg reductions, top-k and
sorting, and prefix sums and products."""
from __future__ import annotations

import math

from cinn.core.ir import Value
from frontend import compose
from frontend.paddle.graph import PaddleImportError
from frontend.paddle.ops_math import add_n
from frontend.paddle.registry import OpContext, attr_of, converter, optional_dtype

# Paddle op (legacy and PIR names) -> the cinn reduction
_REDUCE = {
    "reduce_sum": "reduce_sum", "sum": "reduce_sum", "reduce_mean": "reduce_mean", "mean": "reduce_mean",
    "reduce_max": "reduce_max", "max": "reduce_max", "amax": "reduce_max", "reduce_min": "reduce_min",
    "min": "reduce_min", "amin": "reduce_min", "reduce_prod": "reduce_prod", "prod": "reduce_prod",
    "reduce_all": "reduce_all", "all": "reduce_all", "reduce_any": "reduce_any", "any": "reduce_any",
    "mean_all": "reduce_mean",
}
# max/min of booleans are any/all
_BOOL_REDUCE = {"reduce_max": "reduce_any", "reduce_min": "reduce_all"}


def _keepdim(ctx: OpContext) -> bool:
    return bool(attr_of(ctx, ("keepdim", "keep_dim", "keepdims"), False))


def _axes(ctx: OpContext, x: Value, attr: str = "dim") -> list[int]:
    """The reduced axes: PIR operand 1 or attribute `axis`; legacy `dim` (or an axis tensor); none, or reduce_all,
    mean every axis."""
    rank = len(x.shape)
    if ctx.attr("reduce_all", False):
        return list(range(rank))
    axes = ctx.int_array("axis" if ctx.pir else attr, 1, "the axes", tensor_slots=("AxisTensor", "AxisTensorList"))
    return sorted({a % max(rank, 1) for a in axes}) if axes else list(range(rank))


@converter(*_REDUCE)
def reduce_op(ctx: OpContext):
    if ctx.op.type == "sum" and not ctx.pir:  # legacy `sum` adds a list of tensors
        return add_n(ctx)
    x = ctx.input("X", 0)
    if ctx.op.type == "mean_all" or (ctx.op.type == "mean" and not ctx.pir):  # legacy mean: of every element
        return [ctx.b.reduce_mean(x, list(range(len(x.shape))))]
    op = _REDUCE[ctx.op.type]
    dtype = optional_dtype(ctx, "dtype" if ctx.pir else "out_dtype", "the sum's type")
    if op == "reduce_sum" and dtype is None and x.dtype in ("bool", "int32"):  # Paddle sums these as int64
        dtype = "int64"
    if x.dtype == "bool" and op in _BOOL_REDUCE:
        op = _BOOL_REDUCE[op]
    if dtype is not None and dtype != x.dtype:
        x = ctx.b.cast(x, dtype)
    if x.dtype != "bool" and op in ("reduce_all", "reduce_any"):
        x = ctx.b.not_equal(x, compose.scalar(ctx.b, 0, x))
    return [getattr(ctx.b, op)(x, _axes(ctx, x), keep_dim=_keepdim(ctx))]


@converter("logsumexp")
def logsumexp(ctx: OpContext):
    """log(sum(exp(x))), shifted by the max so exp does not overflow."""
    x = ctx.input("X", 0)
    axes, keep = _axes(ctx, x, "axis"), _keepdim(ctx)
    peak = ctx.b.reduce_max(x, axes, keep_dim=True)
    total = ctx.b.reduce_sum(ctx.b.exp(ctx.b.subtract(x, peak)), axes, keep_dim=keep)
    return [ctx.b.add(ctx.b.log(total), peak if keep else ctx.b.reshape(peak, list(total.shape)))]


@converter("p_norm")
def p_norm(ctx: OpContext):
    """The p-norm along an axis (asvector: of every element): 0 counts non-zeros, +-inf take max / min |x|."""
    x = ctx.input("X", 0)
    keep, porder = _keepdim(ctx), float(ctx.attr("porder", 2.0))
    if ctx.attr("asvector", False):
        x, axes, keep = ctx.b.reshape(x, [-1]), [0], False
    else:
        axes = [int(ctx.attr("axis", -1)) % len(x.shape)]
    return [p_norm_of(ctx, x, porder, axes, keep)]


def p_norm_of(ctx: OpContext, x: Value, p: float, axes: list[int], keep: bool) -> Value:
    """(sum |x|^p)^(1/p) over `axes`, with the special orders 0, 1, 2 and +-inf."""
    b, mag = ctx.b, ctx.b.abs(x)
    if p == math.inf or p == -math.inf:
        return (b.reduce_max if p > 0 else b.reduce_min)(mag, axes, keep_dim=keep)
    if p == 0:
        return b.reduce_sum(b.cast(b.not_equal(x, compose.scalar(b, 0, x)), x.dtype), axes, keep_dim=keep)
    if p == 1:
        return b.reduce_sum(mag, axes, keep_dim=keep)
    if p == 2:
        return b.sqrt(b.reduce_sum(b.multiply(x, x), axes, keep_dim=keep))
    total = b.reduce_sum(b.pow(mag, compose.scalar(b, p, x)), axes, keep_dim=keep)
    return b.pow(total, compose.scalar(b, 1.0 / p, x))


@converter("frobenius_norm")
def frobenius_norm(ctx: OpContext):
    x = ctx.input("X", 0)
    return [p_norm_of(ctx, x, 2.0, _axes(ctx, x), _keepdim(ctx))]


@converter("arg_max", "arg_min", "argmax", "argmin")
def arg_reduce(ctx: OpContext):
    """The index of the first extreme along an axis (flatten: of every element), as int64 unless dtype says int32."""
    x = ctx.input("X", 0)
    keep = _keepdim(ctx)
    if ctx.attr("flatten", False):
        x, axis = ctx.b.reshape(x, [-1]), 0
    else:
        axis = int(ctx.scalar("axis", 1, "the axis")) % max(len(x.shape), 1)
    op = ctx.b.argmax if ctx.op.type.endswith("max") else ctx.b.argmin
    index = op(x, axis=axis, keep_dim=keep and not ctx.attr("flatten", False))
    if ctx.attr("flatten", False) and keep:
        index = ctx.b.reshape(index, [1] * len(ctx.input("X", 0).shape))
    return [ctx.b.cast(index, optional_dtype(ctx, "dtype", "the index type") or "int64")]


@converter("top_k", "top_k_v2", "topk", outputs=("Out", "Indices"))
def top_k(ctx: OpContext):
    """Values and int64 indices, always sorted (an unsorted top-k leaves the order to the implementation)."""
    x = ctx.input("X", 0)
    k = int(ctx.scalar("k", 1, "k", tensor_slot="K"))
    axis = int(ctx.attr("axis", -1))
    return list(ctx.b.topk(x, k, axis=axis, largest=bool(ctx.attr("largest", True))))


@converter("argsort", outputs=("Out", "Indices"))
def argsort(ctx: OpContext):
    """The sorted values and their indices along an axis (ties: the lower index first)."""
    x = ctx.input("X", 0)
    axis = int(ctx.attr("axis", -1)) % len(x.shape)
    return list(ctx.b.topk(x, x.shape[axis], axis=axis, largest=bool(ctx.attr("descending", False))))


@converter("kthvalue", outputs=("Out", "Indices"))
def kthvalue(ctx: OpContext):
    """The k-th smallest value along an axis and its index."""
    x = ctx.input("X", 0)
    axis, k = int(ctx.attr("axis", -1)) % len(x.shape), int(ctx.attr("k"))
    values, indices = ctx.b.topk(x, k, axis=axis, largest=False)
    picked = [ctx.b.slice(v, [axis], [k - 1], [k]) for v in (values, indices)]
    return picked if _keepdim(ctx) else [ctx.b.squeeze(v, [axis]) for v in picked]


@converter("median", outputs=("out", "medians"))
def median(ctx: OpContext):
    """The middle of the sorted values along an axis (all: of every element); an even count takes the mean of the two
    middles (mode avg) or the lower one (mode min)."""
    x = ctx.input("x", 0)
    axes = [a % len(x.shape) for a in ctx.attr("axis", [])] if x.shape else []
    if len(axes) != 1:
        if axes and sorted(axes) != list(range(len(x.shape))):
            raise PaddleImportError(f"median over axes {axes} is not supported (one axis or all)")
        keep_shape = [1] * len(x.shape)
        x, axis = ctx.b.reshape(x, [-1]), 0
    else:
        keep_shape, axis = None, axes[0]
    n = x.shape[axis]
    ordered, _ = ctx.b.topk(x, n, axis=axis, largest=False)
    lower = ctx.b.slice(ordered, [axis], [(n - 1) // 2], [(n - 1) // 2 + 1])
    out = lower
    if n % 2 == 0 and ctx.attr("mode", "avg") == "avg":
        upper = ctx.b.slice(ordered, [axis], [n // 2], [n // 2 + 1])
        out = ctx.b.scale(ctx.b.add(lower, upper), scale=0.5)
    if keep_shape is not None:
        return [ctx.b.reshape(out, keep_shape if _keepdim(ctx) else [])]
    return [out if _keepdim(ctx) else ctx.b.squeeze(out, [axis])]


@converter("cumsum", "cumprod")
def prefix(ctx: OpContext):
    """Prefix sums (cumsum: attribute or operand `axis`, flatten, exclusive, reverse) and products (cumprod: dim)."""
    x = ctx.input("X", 0)
    if ctx.attr("flatten", False):
        x, axis = ctx.b.reshape(x, [-1]), 0
    elif ctx.op.type == "cumprod":
        axis = int(ctx.attr("dim")) % len(x.shape)
    else:
        axis = int(ctx.scalar("axis", 1, "the axis", default=-1)) % len(x.shape)
    keep = compose.prefix_mask(x.shape[axis], bool(ctx.attr("exclusive", False)), bool(ctx.attr("reverse", False)))
    if ctx.op.type == "cumprod":
        return [compose.cumprod(ctx.b, x, axis, keep)]
    if x.dtype == "bool":  # Paddle adds booleans as int64
        x = ctx.b.cast(x, "int64")
    if not x.dtype.startswith("float"):  # a matmul of integers: exact in float64 below 2**53
        return [ctx.b.cast(compose.cumsum(ctx.b, ctx.b.cast(x, "float64"), axis, keep), x.dtype)]
    return [compose.cumsum(ctx.b, x, axis, keep)]


@converter("dist")
def dist(ctx: OpContext):
    """The p-norm of x - y over every element."""
    diff = ctx.b.subtract(ctx.input("X", 0), ctx.input("Y", 1))
    return [p_norm_of(ctx, ctx.b.reshape(diff, [-1]), float(ctx.attr("p", 2.0)), [0], False)]


@converter("cummax", "cummin", outputs=("out", "indices"))
def cummax(ctx: OpContext):
    """Running maxima (minima) along an axis and where each was last reached: the axis matched with itself (n^2
    elements: for short axes)."""
    x = ctx.input("x", 0)
    axis = int(ctx.attr("axis", -1)) % len(x.shape)
    n, trailing = x.shape[axis], len(x.shape) - axis - 1
    keep = ctx.b.create_constant(compose.prefix_mask(n, False, False).reshape((n, n) + (1,) * trailing))
    wide = ctx.b.expand_dims(x, [axis + 1])  # [.., i, j, ..]: element i enters output j
    take_max = ctx.op.type == "cummax"
    worst = ctx.b.fill_constant((), -math.inf if take_max else math.inf, x.dtype) if x.dtype.startswith("float") \
        else compose.scalar(ctx.b, 0, x)
    best = (ctx.b.reduce_max if take_max else ctx.b.reduce_min)(ctx.b.select(keep, wide, worst), [axis])
    reached = ctx.b.logical_and(keep, ctx.b.equal(wide, ctx.b.expand_dims(best, [axis])))
    order = compose.positions(ctx.b, n, trailing + 1, "int64")
    index = ctx.b.reduce_max(ctx.b.select(reached, order, ctx.b.fill_constant((), -1, "int64")), [axis])
    return [best, ctx.b.cast(index, optional_dtype(ctx, "dtype", "the index type") or "int64")]


@converter("logcumsumexp")
def logcumsumexp(ctx: OpContext):
    """log(cumsum(exp(x))), shifted by the axis' max so exp does not overflow."""
    x = ctx.input("X", 0)
    if ctx.attr("flatten", False):
        x, axis = ctx.b.reshape(x, [-1]), 0
    else:
        axis = int(ctx.attr("axis", -1)) % len(x.shape)
    peak = ctx.b.reduce_max(x, [axis], keep_dim=True)
    keep = compose.prefix_mask(x.shape[axis], bool(ctx.attr("exclusive", False)), bool(ctx.attr("reverse", False)))
    total = compose.cumsum(ctx.b, ctx.b.exp(ctx.b.subtract(x, peak)), axis, keep)
    return [ctx.b.add(ctx.b.log(total), peak)]


@converter("renorm")
def renorm(ctx: OpContext):
    """Each slice along an axis scaled down to max_norm where its p-norm exceeds it."""
    x = ctx.input("X", 0)
    axis = int(ctx.attr("axis")) % len(x.shape)
    max_norm = float(ctx.attr("max_norm"))
    norm = p_norm_of(ctx, x, float(ctx.attr("p")), [k for k in range(len(x.shape)) if k != axis], True)
    factor = ctx.b.divide(compose.scalar(ctx.b, max_norm, x), ctx.b.add(norm, compose.scalar(ctx.b, 1e-7, x)))
    over = ctx.b.greater_than(norm, compose.scalar(ctx.b, max_norm, x))
    return [ctx.b.multiply(x, ctx.b.select(over, factor, compose.scalar(ctx.b, 1, x)))]


@converter("norm", outputs=("Out", "Norm"))
def norm(ctx: OpContext):
    """Legacy `norm` (Paddle 1's l2_normalize): x / sqrt(sum(x^2 over axis) + epsilon)."""
    x = ctx.input("X", 0)
    axis = int(ctx.attr("axis", -1)) % len(x.shape)
    total = ctx.b.reduce_sum(ctx.b.multiply(x, x), [axis], keep_dim=True)
    return [ctx.b.multiply(x, ctx.b.rsqrt(ctx.b.add(total, compose.scalar(ctx.b, float(ctx.attr("epsilon", 1e-10)), x))))]
