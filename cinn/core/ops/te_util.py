"""TE helpers shared by op computes."""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import tvm
from tvm import te
from tvm.tirx.analysis import undefined_vars

from cinn.core.ir import TensorType


def dims(t: te.Tensor) -> tuple:
    """A tensor's shape: Python ints for static dims, TIR expressions for symbolic ones (a symbolic kernel's)."""
    return tuple(int(d) if isinstance(d, tvm.tirx.IntImm) else d for d in t.shape)


def dim_at(dim, sizes: Mapping[str, int]) -> int:
    """A dim (an int, or a TIR expression of symbols) at sizes of the symbols, by name."""
    if isinstance(dim, int | tvm.tirx.IntImm):
        return int(dim)
    analyzer = tvm.sym.Analyzer()
    for var in undefined_vars(dim):
        analyzer.bind(var, tvm.tirx.const(int(sizes[var.name]), str(var.ty)))
    return int(analyzer.simplify(dim))


def whole_tiles(extent, tile: int) -> tuple:
    """Rows computed in whole tiles (a symbolic kernel's, or a static axis's without a fitting tile height): the extent
    rounded up to them, and the row index read at each (the last row again past the extent, then dropped by
    leading_rows). A guarded last tile would make TVM 0.27
    size the tile's buffers wrongly (a negative allocation)."""
    return (extent + tile - 1) // tile * tile, lambda i: tvm.tirx.min(i, extent - 1)


ROW_PAD_MAX = 1 / 8  # of a static axis's rows that computing them in whole tiles may add (thin_rows)


def thin_rows(rows: int, tile: int) -> bool:
    """Whether a static axis of `rows` register-tile rows is computed in whole tiles of `tile` rows (see whole_tiles):
    no divisor of it is at least half a tile (197 tokens, a prime, would take tiles one row high), and the padding
    adds at most ROW_PAD_MAX of the rows."""
    return tile > 1 and 2 * max(d for d in range(1, tile + 1) if rows % d == 0) < tile and -rows % tile <= rows * ROW_PAD_MAX


def leading_rows(padded: te.Tensor, shape: Sequence, name: str) -> te.Tensor:
    """The rows there are of a tensor computed in whole tiles (see whole_tiles)."""
    return te.compute(shape, lambda *i: padded(*i), name=name)  # noqa: PLW0108 (te reads the lambda's arity)


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
