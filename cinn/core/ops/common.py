"""Shared building blocks for op table entries: inference helpers and entry factories."""
from __future__ import annotations

import enum
from collections.abc import Callable, Sequence

import numpy as np
import tvm
import tvm_ffi
from tvm import te

from cinn.core.ir import Attrs, NoAttrs, TensorType
from cinn.core.ops.registry import DtypeClass, OpDef, PatternKind, register
from cinn.core.ops.te_util import elementwise_compute


def coerce_enum(attrs: Attrs, name: str, enum_cls: type[enum.Enum], op: str) -> None:
    """Turn a string attribute into its enum (attrs are frozen), with a clear error."""
    value = getattr(attrs, name)
    try:
        object.__setattr__(attrs, name, enum_cls(value))
    except ValueError:
        choices = ", ".join(repr(m.value) for m in enum_cls)
        raise ValueError(f"{op}: {name} must be one of {choices}, got {value!r}") from None


def broadcast_shapes(op: str, *shapes: tuple) -> tuple:
    """Numpy broadcasting of shapes, with an error naming the op and the shapes. A symbolic kernel's dims may be TIR
    expressions: such a dim never broadcasts (a size of 1 that it takes at run time broadcasts to itself)."""
    try:  # not numpy's: it refuses dims whose product exceeds 2**63 (the caller's size check names those)
        return tuple(_broadcast_dim([s[len(s) - k] for s in shapes if len(s) >= k])
                     for k in range(max(map(len, shapes), default=0), 0, -1))
    except ValueError:
        raise ValueError(f"{op}: shapes {' and '.join(str(tuple(s)) for s in shapes)} do not broadcast") from None


def same_dims(a: Sequence, b: Sequence) -> bool:
    """Whether two shapes are the same (ints or TIR expressions)."""
    return len(a) == len(b) and all(map(same_dim, a, b))


def same_dim(x: object, y: object) -> bool:
    """Whether two dims are the same: equal ints, or structurally equal TIR expressions of the same symbols."""
    if isinstance(x, int) or isinstance(y, int):
        return x == y if isinstance(x, int) and isinstance(y, int) else False
    return bool(tvm_ffi.structural_equal(x, y))


def _broadcast_dim(dims: Sequence) -> object:
    """The dim that dims of one axis broadcast to (ints or TIR expressions)."""
    wide = [d for d in dims if not (isinstance(d, int) and d == 1)]
    if not all(same_dim(d, wide[0]) for d in wide[1:]):
        raise ValueError(f"dims {dims} do not broadcast")
    return wide[0] if wide else 1


def same_dtype(op: str, types: Sequence[TensorType]) -> str:
    """The common dtype of the inputs; mixed dtypes raise with the op and the shapes."""
    dtypes = {t.dtype for t in types}
    if len(dtypes) != 1:
        detail = ", ".join(f"{t.dtype}{tuple(t.shape)}" for t in types)
        raise TypeError(f"{op}: input dtypes differ ({detail}); insert a cast")
    return dtypes.pop()


def normalize_axis(op: str, axis: int, ndim: int) -> int:
    """A possibly negative axis as a non-negative one, checked against the rank."""
    if not -max(ndim, 1) <= axis < max(ndim, 1):
        raise ValueError(f"{op}: axis {axis} out of range for rank {ndim}")
    return axis % max(ndim, 1)


def normalize_axes(op: str, axes: Sequence[int], ndim: int) -> tuple[int, ...]:
    """Axes as sorted non-negative unique ints."""
    out = sorted({normalize_axis(op, a, ndim) for a in axes})
    return tuple(out)


def elementwise_type(op: str, out_dtype: str | None = None) -> Callable:
    """Inference for n-ary broadcasting ops with a common input dtype."""

    def infer(types: Sequence[TensorType], _attrs: Attrs) -> tuple[TensorType]:
        dtype = same_dtype(op, types)
        return (TensorType(broadcast_shapes(op, *(t.shape for t in types)), out_dtype or dtype),)

    return infer


def register_elementwise(
    name: str,
    te_fn: Callable,
    np_fn: Callable,
    *,
    arity: int = 1,
    dtypes: DtypeClass = DtypeClass.FLOAT,
    out_dtype: str | None = None,
    attrs: type[Attrs] | None = None,
    fast_f32: Callable | None = None,
    doc: str = "",
) -> OpDef:
    """Register a (broadcasting) elementwise op from a scalar TE function and a numpy function.

    te_fn(*scalar_exprs[, attrs]) builds one output element; np_fn(*arrays[, attrs]) is the reference.
    fast_f32(tensor) -> te.Tensor, when given, replaces te_fn for float32 unary inputs: LLVM calls libm
    one element at a time for exp/erf/tanh, while topi's polynomial forms vectorize (8-40x faster,
    relative error < 4e-7).
    """
    with_attrs = attrs is not None

    def reference(arrays: Sequence[np.ndarray], a: Attrs) -> list[np.ndarray]:
        with np.errstate(all="ignore"):  # NaN/inf results are data, as in the kernels
            out = np_fn(*arrays, a) if with_attrs else np_fn(*arrays)
        shape = np.broadcast_shapes(*(x.shape for x in arrays))
        dtype = out_dtype or arrays[0].dtype
        return [np.broadcast_to(np.asarray(out), shape).astype(dtype)]

    def compute(tensors, a: Attrs, out_types: Sequence[TensorType]):
        if fast_f32 is not None and tensors[0].dtype == "float32":
            return [keep_nan(tensors[0], fast_f32(*tensors, a) if with_attrs else fast_f32(*tensors))]
        fn = (lambda *xs: te_fn(*xs, a)) if with_attrs else te_fn
        return [elementwise_compute(name, tensors, out_types[0], fn)]

    return register(
        OpDef(
            name=name,
            kind=PatternKind.ELEMENTWISE,
            infer=elementwise_type(name, out_dtype),
            compute=compute,
            reference=reference,
            attrs=attrs or NoAttrs,
            num_inputs=arity,
            dtypes=dtypes,
            doc=doc,
        )
    )


def keep_nan(x, fast, name: str = ""):
    """A fast float32 form with NaN inputs passed through: its polynomials clamp their argument (exp to +-88), which
    turns NaN into a number."""
    return te.compute(fast.shape, lambda *i: tvm.tirx.Select(tvm.tirx.isnan(x(*i)), x(*i), fast(*i)),
                      name=name or f"{fast.op.name}_nan")
