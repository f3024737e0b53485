"""Reductions over axes (reduce_sum, reduce_mean, ...) and argmax/argmin."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from cinn.ir import Attrs, TensorType
from cinn.ops.common import normalize_axes, normalize_axis
from cinn.ops.registry import DtypeClass as D
from cinn.ops.registry import OpDef, PatternKind, register


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


def reduced_axes(op: str, dim: Sequence[int], ndim: int) -> tuple[int, ...]:
    """The sorted non-negative axes a reduction removes; empty `dim` means every axis."""
    axes = normalize_axes(op, dim or range(ndim), ndim)
    return axes if ndim else ()  # a 0-d tensor has no axis to remove (axis 0/-1 is accepted as a no-op)


def reduced_shape(shape: tuple[int, ...], axes: Sequence[int], keep_dim: bool) -> tuple[int, ...]:
    """The output shape of a reduction over `axes`."""
    if keep_dim:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def _reduce_infer(op: str, out_dtype: str | None = None):
    def infer(types: Sequence[TensorType], a: ReduceAttrs) -> tuple[TensorType]:
        x = types[0]
        axes = reduced_axes(op, a.dim, len(x.shape))
        return (TensorType(reduced_shape(x.shape, axes, a.keep_dim), out_dtype or x.dtype),)

    return infer


def _copy(x):
    """A copy compute: reducing over no axis (0-d input) must still produce a fresh output."""
    from tvm import te

    return te.compute(x.shape, lambda *i: x(*i), name=f"{x.op.name}_red")


def _register_reduce(name: str, topi_name: str, np_fn: Callable, dtypes: D) -> None:
    """A reduction computed by tvm.topi.<topi_name> with numpy reference np_fn(x, axis, keepdims)."""

    def compute(tensors, a: ReduceAttrs, out_types: Sequence[TensorType]):
        from tvm import topi

        x = tensors[0]
        axes = reduced_axes(name, a.dim, len(x.shape))
        if not axes:
            return [_copy(x)]
        return [getattr(topi, topi_name)(x, axis=list(axes), keepdims=a.keep_dim)]

    def reference(arrays: Sequence[np.ndarray], a: ReduceAttrs) -> list[np.ndarray]:
        x = arrays[0]
        axes = reduced_axes(name, a.dim, x.ndim)
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


_register_reduce("reduce_sum", "sum", _int_exact(np.sum), D.NUMBER)
_register_reduce("reduce_prod", "prod", _int_exact(np.prod), D.NUMBER)
_register_reduce("reduce_max", "max", np.max, D.NUMBER)
_register_reduce("reduce_min", "min", np.min, D.NUMBER)
_register_reduce("reduce_all", "all", np.all, D.BOOL)
_register_reduce("reduce_any", "any", np.any, D.BOOL)


def _mean_compute(tensors, a: ReduceAttrs, out_types: Sequence[TensorType]):
    from tvm import te, topi

    from cinn.ops.te_util import const

    x = tensors[0]
    axes = reduced_axes("reduce_mean", a.dim, len(x.shape))
    if not axes:
        return [_copy(x)]
    total = topi.sum(x, axis=list(axes), keepdims=a.keep_dim)
    count = const(int(np.prod([int(x.shape[i]) for i in axes])), x.dtype)
    return [te.compute(total.shape, lambda *i: total(*i) / count, name=f"{x.op.name}_mean")]


def _mean_reference(arrays: Sequence[np.ndarray], a: ReduceAttrs) -> list[np.ndarray]:
    x = arrays[0]
    axes = reduced_axes("reduce_mean", a.dim, x.ndim)
    return [np.asarray(np.mean(x, axis=axes, keepdims=a.keep_dim)).astype(x.dtype)]


register(
    OpDef(
        name="reduce_mean",
        kind=PatternKind.REDUCTION,
        infer=_reduce_infer("reduce_mean"),
        compute=_mean_compute,
        reference=_mean_reference,
        attrs=ReduceAttrs,
        # an integer mean would have to pick a rounding: cast to float first
        dtypes=D.FLOAT,
        doc="reduce_mean(x, dim=(), keep_dim=False): mean over `dim` (empty: all axes).",
    )
)


def _register_arg_reduce(name: str, topi_name: str, np_fn: Callable) -> None:
    """argmax/argmin along one axis, int32 indices; ties pick the first index, as numpy."""

    def infer(types: Sequence[TensorType], a: ArgReduceAttrs) -> tuple[TensorType]:
        x = types[0]
        axes = reduced_axes(name, (a.axis,), len(x.shape))
        return (TensorType(reduced_shape(x.shape, axes, a.keep_dim), "int32"),)

    def compute(tensors, a: ArgReduceAttrs, out_types: Sequence[TensorType]):
        from tvm import te, topi

        from cinn.ops.te_util import const

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
