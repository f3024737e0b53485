"""Cases for reductions: axis subsets, negative axes, keep_dim, all axes, size-1 dims and 0-d inputs."""
from __future__ import annotations

import numpy as np

from tests.cases import Case

F, I, B = "float32", "int32", "bool"
# float sums accumulate sequentially (numpy sums pairwise): a few ulps of the partial sums apart
_SUM_TOL = {"rtol": 1e-5, "atol": 1e-5}


def _reduce(op, shape, dtype, dim, keep_dim=False, **kw):
    return Case(op, ((shape, dtype),), {"dim": dim, "keep_dim": keep_dim}, id=_id(op, shape, dtype, dim, keep_dim), **kw)


def _id(op, shape, dtype, axes, keep_dim) -> str:
    dims = "x".join(map(str, shape)) or "scalar"
    return f"{op}-{dims}:{dtype}-dim{list(axes) if isinstance(axes, (list, tuple)) else axes}{'-keep' if keep_dim else ''}"


def _sparse_bools(p):
    """Bools mostly False (p = probability of True), so reduce_any/all see both outcomes per row."""
    return lambda rng: [rng.random((3, 4, 5)) < p]


def _with_infinities(dtype):
    """Rows that are all -inf, all +inf, mixed with infinities, and finite."""
    inf = np.inf
    return lambda rng: [np.array([[-inf, -inf, -inf], [inf, inf, inf], [1.0, -inf, inf], [-1.0, 2.0, 0.5]], dtype)]


def _int_limits(rng):
    """A column of int32 extremes (a reduction must not start from 0 or clip them)."""
    info = np.iinfo(np.int32)
    return [np.array([[info.min, info.max], [info.min, info.max]], np.int32)]


CASES = [
    _reduce("reduce_sum", (4, 6), F, (1,), **_SUM_TOL),
    _reduce("reduce_sum", (2, 3, 4), F, (0, 2), True, **_SUM_TOL),
    _reduce("reduce_sum", (2, 3, 4), F, (), **_SUM_TOL),
    _reduce("reduce_sum", (3, 1, 5), I, (-2,)),
    _reduce("reduce_sum", (4, 5), I, (), True),
    _reduce("reduce_sum", (), F, ()),
    _reduce("reduce_mean", (4, 6), F, (-1,), **_SUM_TOL),
    _reduce("reduce_mean", (2, 3, 4), F, (1, 2), True, **_SUM_TOL),
    _reduce("reduce_mean", (1, 5), F, (), **_SUM_TOL),
    _reduce("reduce_mean", (), F, (), True),
    _reduce("reduce_max", (4, 6), F, (1,)),
    _reduce("reduce_max", (2, 3, 4), I, (0,), True),
    _reduce("reduce_max", (5,), F, ()),
    _reduce("reduce_min", (3, 4, 2), F, (0, 2)),
    _reduce("reduce_min", (4, 1), I, (1,), True),
    _reduce("reduce_min", (), I, ()),
    Case("reduce_max", attrs={"dim": (1,)}, make=_with_infinities(F), id="reduce_max-infinities"),
    Case("reduce_min", attrs={"dim": (1,)}, make=_with_infinities(F), id="reduce_min-infinities"),
    Case("reduce_max", attrs={"dim": (0,), "keep_dim": True}, make=_int_limits, id="reduce_max-int-limits"),
    Case("reduce_min", attrs={"dim": (0,)}, make=_int_limits, id="reduce_min-int-limits"),
    _reduce("reduce_prod", (4, 3), F, (1,), **_SUM_TOL),
    _reduce("reduce_prod", (2, 2, 3), I, (0, 2), True),
    _reduce("reduce_prod", (1, 4), F, (), **_SUM_TOL),
    _reduce("reduce_all", (4, 3), B, (1,)),
    _reduce("reduce_all", (2, 1, 3), B, (), True),
    Case("reduce_all", attrs={"dim": (2,)}, make=lambda rng: [rng.random((3, 4, 5)) < 0.9], id="reduce_all-mostly-true"),
    _reduce("reduce_any", (4, 5), B, (0,)),
    _reduce("reduce_any", (), B, ()),
    Case("reduce_any", attrs={"dim": (-1,)}, make=_sparse_bools(0.1), id="reduce_any-mostly-false"),
    # int inputs in [-5, 5] have ties: the first index wins, as in numpy
    Case("argmax", (((4, 6), F),), {"axis": 1}),
    Case("argmax", (((3, 8), I),), {"axis": 0, "keep_dim": True}),
    Case("argmax", (((2, 3, 4), F),), {"axis": -1}),
    Case("argmax", (((), F),), id="argmax-scalar"),
    Case("argmin", (((4, 6), F),), {"axis": 0}),
    Case("argmin", (((3, 8), I),), {"axis": 1}),
    Case("argmin", (((1, 5), F),), {"axis": 0, "keep_dim": True}, id="argmin-size1-keep"),
]
