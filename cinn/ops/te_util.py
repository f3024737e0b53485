"""TE helpers shared by op computes."""
from __future__ import annotations

from collections.abc import Callable, Sequence

import tvm
from tvm import te

from cinn.ir import TensorType


def dims(t: te.Tensor) -> tuple:
    """A tensor's shape: Python ints for static dims, TIR expressions for symbolic ones (a symbolic kernel's)."""
    return tuple(int(d) if isinstance(d, tvm.tirx.IntImm) else d for d in t.shape)


def broadcast_index(t: te.Tensor, out_idx: Sequence) -> list:
    """Indices into `t` for an output index under numpy broadcasting."""
    shape = dims(t)
    offset = len(out_idx) - len(shape)
    return [0 if d == 1 else out_idx[offset + i] for i, d in enumerate(shape)]


def elementwise_compute(name: str, tensors: Sequence[te.Tensor], out: TensorType, fn: Callable) -> te.Tensor:
    """A broadcasting elementwise te.compute applying `fn` to one scalar of each input."""

    def body(*idx):
        return cast(fn(*(t(*broadcast_index(t, idx)) for t in tensors)), out.dtype)

    return te.compute(out.shape, body, name=name, tag="elemwise")


def cast(expr, dtype: str):
    """Cast a scalar expression when its dtype differs."""
    if isinstance(expr, (int, float, bool)):
        return tvm.tirx.const(expr, dtype)
    return expr if dtype_of(expr) == dtype else expr.astype(dtype)


def dtype_of(expr) -> str:
    """The dtype of a TIR expression (TVM 0.27 calls it `ty`)."""
    return str(expr.ty)


def const(value, dtype: str):
    """A TIR constant of the given dtype."""
    return tvm.tirx.const(value, dtype)


def lowest(dtype: str):
    """The smallest value of a dtype: -inf for floats (max pooling's padding), the dtype's minimum for ints."""
    if dtype.startswith("float"):
        return const(float("-inf"), dtype)
    return tvm.tirx.min_value(dtype)
