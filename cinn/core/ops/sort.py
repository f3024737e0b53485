"""topk: the k largest (or smallest) elements along an axis and their int64 indices.

tvm.topi.topk is a te.extern calling the runtime's packed sort function: not schedulable TIR, so the
default schedules and the tuner could not handle it. Here it is plain TE instead, by ranks: an element's
rank is the number of elements ordered before it (ties: the lower index first, as ONNX TopK and a stable
sort), and output position r takes the element whose rank is r. That is O(n^2) per row along the axis,
fine for the class-score axes topk is used on.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from tvm import te, tirx

from cinn.core.ir import Attrs, TensorType
from cinn.core.ops.common import normalize_axis
from cinn.core.ops.registry import DtypeClass, OpDef, PatternKind, register
from cinn.core.ops.te_util import const

INDEX_DTYPE = "int64"  # ONNX TopK and Paddle's top_k return int64 indices


@dataclass(frozen=True)
class TopKAttrs(Attrs):
    """k elements along axis, the largest (else the smallest) first; ties in ascending index order."""

    k: int
    axis: int = -1
    largest: bool = True


def _axis(shape: tuple[int, ...], a: TopKAttrs) -> int:
    """The normalized axis, with k checked against its size."""
    if not shape:
        raise ValueError(f"topk: x must have rank >= 1, got shape {shape}")
    ax = normalize_axis("topk", a.axis, len(shape))
    if not 1 <= a.k <= shape[ax]:
        raise ValueError(f"topk: k={a.k} must be in [1, {shape[ax]}] for axis {a.axis} of shape {shape}")
    return ax


def _infer(types: Sequence[TensorType], a: TopKAttrs) -> list[TensorType]:
    x = types[0]
    ax = _axis(x.shape, a)
    shape = x.shape[:ax] + (a.k,) + x.shape[ax + 1 :]
    return [TensorType(shape, x.dtype), TensorType(shape, INDEX_DTYPE)]


def _compute(tensors, a: TopKAttrs, out_types: Sequence[TensorType]):
    (x,) = tensors
    ax = _axis(tuple(int(d) for d in x.shape), a)
    n = int(x.shape[ax])

    def at(idx, i):
        """idx with its axis entry replaced by i."""
        return [i if k == ax else v for k, v in enumerate(idx)]

    def rank_body(*idx):
        other = te.reduce_axis((0, n), name="other")
        mine, theirs = x(*idx), x(*at(idx, other))
        ahead = theirs > mine if a.largest else theirs < mine
        before = tirx.Or(ahead, tirx.And(theirs == mine, other < idx[ax]))
        return te.sum(tirx.Select(before, const(1, "int32"), const(0, "int32")), axis=other)

    rank = te.compute(x.shape, rank_body, name="topk_rank")

    def index_body(*idx):
        j = te.reduce_axis((0, n), name="j")
        hit = rank(*at(idx, j)) == idx[ax]
        return te.sum(tirx.Select(hit, j.var.astype(INDEX_DTYPE), const(0, INDEX_DTYPE)), axis=j)

    index = te.compute(out_types[1].shape, index_body, name="topk_indices")
    values = te.compute(out_types[0].shape, lambda *idx: x(*at(idx, index(*idx))), name="topk_values")
    return [values, index]


def _reference(arrays: Sequence[np.ndarray], a: TopKAttrs) -> list[np.ndarray]:
    (x,) = arrays
    ax = _axis(x.shape, a)
    if a.largest:
        # a stable descending order with ties in ascending index: sort the flipped axis, read it backwards
        flipped = np.argsort(np.flip(x, ax), axis=ax, kind="stable")
        order = x.shape[ax] - 1 - np.flip(flipped, ax)
    else:
        order = np.argsort(x, axis=ax, kind="stable")
    index = np.take(order, np.arange(a.k), axis=ax)
    return [np.take_along_axis(x, index, axis=ax), index.astype(INDEX_DTYPE)]


register(
    OpDef(
        name="topk",
        kind=PatternKind.NON_FUSIBLE,
        infer=_infer,
        compute=_compute,
        reference=_reference,
        attrs=TopKAttrs,
        dtypes=DtypeClass.NUMBER,
        doc="topk(x, k, axis=-1, largest=True) -> (values, int64 indices), sorted, ties by ascending index.",
    )
)
