"""Reductions over axes (reduce_sum, reduce_mean, ...) and argmax/argmin."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import te, topi

from cinn.core.ir import Attrs, TensorType
from cinn.core.ops.common import normalize_axes, normalize_axis
from cinn.core.ops.registry import DtypeClass as D
from cinn.core.ops.registry import OpDef, PatternKind, register
from cinn.core.ops.te_util import const


@dataclass(frozen=True)
class ReduceAttrs(Attrs):
    """The reduced axes (empty: all of them) and whether they stay as size-1 dims."""

    dim: tuple[int, ...] = ()
    keep_dim: bool = False

    def __post_init__(self):
        super().__post_init__()
        if isinstance(self.dim, int):  # reduce_sum(x, 1) means dim=(1,)
            object.__setattr__(self, "dim", (self.dim,))


@dataclass(frozen=True)
class ArgReduceAttrs(Attrs):
    """The axis argmax/argmin search along, and whether it stays as a size-1 dim."""

    axis: int = 0
    keep_dim: bool = False


def reduced_axes(op: str, dim: Sequence[int], shape: Sequence[int]) -> tuple[int, ...]:
    """The sorted non-negative axes a reduction removes; empty `dim` means every axis."""
    ndim = len(shape)
    try:
        axes = normalize_axes(op, dim or range(ndim), ndim)
    except ValueError as e:
        raise ValueError(f"{e} (input shape {tuple(shape)})") from None
    return axes if ndim else ()  # a 0-d tensor has no axis to remove (axis 0/-1 is accepted as a no-op)


def reduced_shape(shape: tuple[int, ...], axes: Sequence[int], keep_dim: bool) -> tuple[int, ...]:
    """The output shape of a reduction over `axes`."""
    if keep_dim:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def _reduce_infer(op: str):
    def infer(types: Sequence[TensorType], a: ReduceAttrs) -> tuple[TensorType]:
        x = types[0]
        axes = reduced_axes(op, a.dim, x.shape)
        return (TensorType(reduced_shape(x.shape, axes, a.keep_dim), x.dtype),)

    return infer


def _topi_reduce(topi_name: str):
    """A TE reduction by tvm.topi.<topi_name>: te_fn(x, axes, keep_dim) -> tensor."""

    def te_fn(x, axes: tuple[int, ...], keep_dim: bool):
        if not axes:  # a 0-d input: still a fresh output, never the input tensor itself
            return te.compute(x.shape, lambda *i: x(*i), name=f"{x.op.name}_red")  # noqa: PLW0108 (x itself is no fcompute)
        return getattr(topi, topi_name)(x, axis=list(axes), keepdims=keep_dim)

    return te_fn


def _extreme_reduce(is_max: bool):
    """max/min; a float input is reduced as order-preserving integer keys, so NaN propagates as numpy's (TVM's float
    max is select(a > b, a, b), which drops NaN) while the reducer stays a plain integer max/min, which TVM's rfactor
    and cross-thread reductions recognise. A NaN's key is the integer extreme, above every other key."""
    topi_fn = _topi_reduce("max" if is_max else "min")

    def te_fn(x, axes: tuple[int, ...], keep_dim: bool):
        dtype = str(x.dtype)
        if not axes or not dtype.startswith("float"):
            return topi_fn(x, axes, keep_dim)
        itype = f"int{tvm.DataType(dtype).bits}"
        flip = const(2 ** (tvm.DataType(dtype).bits - 1) - 1, itype)
        nan_key = (tvm.tirx.max_value if is_max else tvm.tirx.min_value)(itype)

        def ordered(bits):  # float bits -> an integer of the same order (negative floats: magnitude bits flipped)
            return tvm.tirx.Select(bits < const(0, itype), tvm.tirx.bitwise_xor(bits, flip), bits)

        def key(*i):
            return tvm.tirx.Select(tvm.tirx.isnan(x(*i)), nan_key, ordered(tvm.tirx.reinterpret(itype, x(*i))))

        keys = te.compute(x.shape, key, name=f"{x.op.name}_key")
        reduced = topi_fn(keys, axes, keep_dim)

        def value(*i):
            k = reduced(*i)
            return tvm.tirx.Select(k == nan_key, const(float("nan"), dtype), tvm.tirx.reinterpret(dtype, ordered(k)))

        return te.compute(reduced.shape, value, name=f"{x.op.name}_value")

    return te_fn


def _mean_te(x, axes: tuple[int, ...], keep_dim: bool):
    total = _topi_reduce("sum")(x, axes, keep_dim)
    count = const(int(np.prod([int(x.shape[i]) for i in axes])), x.dtype)
    return te.compute(total.shape, lambda *i: total(*i) / count, name=f"{x.op.name}_mean")


def _register_reduce(name: str, te_fn: Callable, np_fn: Callable, dtypes: D) -> None:
    """A reduction op from te_fn(x, axes, keep_dim) and its numpy reference np_fn(x, axis=, keepdims=)."""

    def compute(tensors, a: ReduceAttrs, out_types: Sequence[TensorType]):
        x = tensors[0]
        return [te_fn(x, reduced_axes(name, a.dim, x.shape), a.keep_dim)]

    def reference(arrays: Sequence[np.ndarray], a: ReduceAttrs) -> list[np.ndarray]:
        x = arrays[0]
        axes = reduced_axes(name, a.dim, x.shape)
        return [np.asarray(np_fn(x, axis=axes, keepdims=a.keep_dim)).astype(x.dtype)]

    register(
        OpDef(
            name=name,
            kind=PatternKind.REDUCTION,
            infer=_reduce_infer(name),
            compute=compute,
            reference=reference,
            attrs=ReduceAttrs,
            dtypes=dtypes,
            doc=f"{name}(x, dim=(), keep_dim=False): reduce over `dim` (empty: all axes).",
        )
    )


def _int_exact(np_fn: Callable) -> Callable:
    """A numpy reduction that keeps the input dtype (np.sum/np.prod widen int32 to int64)."""
    return lambda x, axis, keepdims: np_fn(x, axis=axis, keepdims=keepdims, dtype=x.dtype)


def _np_extreme(np_fn: Callable, is_max: bool) -> Callable:
    """numpy's max or min, which also reduces an empty set: to -inf or inf, an integer type's least or greatest value
    (ONNX's ReduceMax/ReduceMin of an empty set)."""

    def fn(x: np.ndarray, axis, keepdims: bool):
        if x.dtype.kind == "f":
            initial = -np.inf if is_max else np.inf
        else:
            initial = np.iinfo(x.dtype).min if is_max else np.iinfo(x.dtype).max
        return np_fn(x, axis=axis, keepdims=keepdims, initial=initial)

    return fn


def _np_mean(x: np.ndarray, axis, keepdims: bool):
    """numpy's mean; an empty set's is NaN (numpy's, without its warning)."""
    if x.size:
        return np.mean(x, axis=axis, keepdims=keepdims)
    return np.full(np.sum(x, axis=axis, keepdims=keepdims).shape, np.nan, x.dtype)


_register_reduce("reduce_sum", _topi_reduce("sum"), _int_exact(np.sum), D.NUMBER)
# an integer mean would have to pick a rounding: cast to float first
_register_reduce("reduce_mean", _mean_te, _np_mean, D.FLOAT)
_register_reduce("reduce_prod", _topi_reduce("prod"), _int_exact(np.prod), D.NUMBER)
_register_reduce("reduce_max", _extreme_reduce(True), _np_extreme(np.max, True), D.NUMBER)
_register_reduce("reduce_min", _extreme_reduce(False), _np_extreme(np.min, False), D.NUMBER)
_register_reduce("reduce_all", _topi_reduce("all"), np.all, D.BOOL)
_register_reduce("reduce_any", _topi_reduce("any"), np.any, D.BOOL)


def _register_arg_reduce(name: str, topi_name: str, np_fn: Callable) -> None:
    """argmax/argmin along one axis, int32 indices; ties pick the first index, as numpy."""

    def infer(types: Sequence[TensorType], a: ArgReduceAttrs) -> tuple[TensorType]:
        x = types[0]
        axes = reduced_axes(name, (a.axis,), x.shape)
        return (TensorType(reduced_shape(x.shape, axes, a.keep_dim), "int32"),)

    def compute(tensors, a: ArgReduceAttrs, out_types: Sequence[TensorType]):
        x = tensors[0]
        if not x.shape:
            return [te.compute((), lambda: const(0, "int32"), name=f"{x.op.name}_{name}")]
        axis = normalize_axis(name, a.axis, len(x.shape))
        index = getattr(topi, topi_name)(x, axis=axis, keepdims=a.keep_dim)
        return [index if index.dtype == "int32" else topi.cast(index, "int32")]

    def reference(arrays: Sequence[np.ndarray], a: ArgReduceAttrs) -> list[np.ndarray]:
        x = arrays[0]
        if x.ndim == 0:
            return [np.zeros((), np.int32)]
        return [np_fn(x, axis=a.axis, keepdims=a.keep_dim).astype(np.int32)]

    register(
        OpDef(
            name=name,
            kind=PatternKind.REDUCTION,
            infer=infer,
            compute=compute,
            reference=reference,
            attrs=ArgReduceAttrs,
            dtypes=D.NUMBER,
            doc=f"{name}(x, axis=0, keep_dim=False): int32 index of the first extreme along `axis`.",
        )
    )


_register_arg_reduce("argmax", "argmax", np.argmax)
_register_arg_reduce("argmin", "argmin", np.argmin)
