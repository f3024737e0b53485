"""Where each element of a value lies in another value's row-major storage, through the ops that only move elements:
reshapes, transposes, gathers of one constant index and slices. The attention pass reads q, k and v through such
chains in place, however an exporter wrote them (heads split through 4-D or 3-D shapes, batch and heads merged, one
fused projection cut in three by a gather).

An axis's index is written in the mixed radix of its digits (most significant first), each digit a size and a
stride in elements, so a reshape that merges axes whose strides do not line up still has a map (numpy would copy).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from math import prod
from typing import cast

import numpy as np

from cinn.compiler.passes.simplify import RESHAPE_LIKE, transpose_perm
from cinn.core.ir import Node, Value
from cinn.core.ops.common import normalize_axis
from cinn.core.ops.shape import SliceAttrs, slice_ranges

# ops whose output is a view of their first input (gather only with one constant index)
VIEW_OPS = (*RESHAPE_LIKE, "transpose", "gather", "slice")


@dataclass(frozen=True)
class Digit:
    """One factor of an axis's index: `size` values, `stride` elements apart."""

    size: int
    stride: int


Digits = tuple[Digit, ...]


@dataclass(frozen=True)
class IndexMap:
    """Element (i_0, ..., i_n) of a value lies at `offset` + the sum over axes of their digits' values times their
    strides in a base value's row-major storage. Digits of size 1 are left out (a unit axis has none)."""

    axes: tuple[Digits, ...]
    offset: int = 0

    @staticmethod
    def of(shape: Sequence[int]) -> IndexMap:
        """The map of a value onto itself."""
        strides = [prod(shape[k + 1 :]) for k in range(len(shape))]
        return IndexMap(tuple((Digit(n, s),) if n > 1 else () for n, s in zip(shape, strides, strict=True)))

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(prod(d.size for d in axis) for axis in self.axes)

    def transpose(self, perm: Sequence[int]) -> IndexMap:
        return IndexMap(tuple(self.axes[p] for p in perm), self.offset)

    def reshape(self, shape: Sequence[int]) -> IndexMap | None:
        """The same elements in row-major order as `shape`; None where an axis of it does not fall on whole digits
        (a digit of 6 read as axes of 4)."""
        digits = list(merged([d for axis in self.axes for d in axis]))
        axes = []
        for extent in shape:
            taken: list[Digit] = []
            n = extent
            while n > 1:
                if not digits:
                    return None
                d = digits[0]
                if n % d.size == 0:
                    taken.append(digits.pop(0))
                    n //= d.size
                elif d.size % n == 0:  # the axis takes the digit's top part
                    taken.append(Digit(n, d.stride * (d.size // n)))
                    digits[0], n = Digit(d.size // n, d.stride), 1
                else:
                    return None
            axes.append(tuple(taken))
        return IndexMap(tuple(axes), self.offset) if not digits else None

    def take(self, axis: int, index: int, rank: int) -> IndexMap:
        """Element `index` of `axis`, the axis replaced by `rank` unit axes (a gather's index shape)."""
        offset = self.offset
        for d in reversed(self.axes[axis]):
            index, digit = divmod(index, d.size)
            offset += digit * d.stride
        return IndexMap((*self.axes[:axis], *((),) * rank, *self.axes[axis + 1 :]), offset)

    def slice(self, ranges: Sequence[range]) -> IndexMap | None:
        """The elements at `ranges` of each axis; None where a partial range cuts an axis of several digits."""
        result = self
        for axis, r in enumerate(ranges):
            digits = merged(result.axes[axis])
            if r == range(prod(d.size for d in digits)):
                continue
            if len(r) == 1:
                result = result.take(axis, r.start, 1)
            elif len(digits) == 1:
                (d,) = digits
                axes = (*result.axes[:axis], (Digit(len(r), d.stride * r.step),), *result.axes[axis + 1 :])
                result = IndexMap(axes, result.offset + r.start * d.stride)
            else:
                return None
        return result


def merged(digits: Sequence[Digit]) -> Digits:
    """Adjacent digits joined where one runs on from the next (a [2, 3] block of a contiguous axis is one digit)."""
    out: list[Digit] = []
    for d in digits:
        if out and out[-1].stride == d.stride * d.size:
            out[-1] = Digit(out[-1].size * d.size, d.stride)
        else:
            out.append(d)
    return tuple(out)


def forward(node: Node, source: IndexMap, constant: Callable[[Value], np.ndarray | None]) -> IndexMap | None:
    """The map of a view op's output given its input's; None where the op is no view of its input."""
    shape = node.inputs[0].shape
    if node.op in RESHAPE_LIKE:
        return source.reshape(node.outputs[0].shape)
    if node.op == "transpose":
        return source.transpose(transpose_perm(node))
    if node.op == "slice":
        return source.slice(slice_ranges(shape, cast(SliceAttrs, node.attrs)))
    if node.op == "gather":
        index = constant(node.inputs[1])
        axis = normalize_axis("gather", node.attrs.axis, len(shape))
        if index is None or index.size != 1 or not -shape[axis] <= int(index.reshape(())) < shape[axis]:
            return None
        return source.take(axis, int(index.reshape(())) % shape[axis], index.ndim)
    return None


def backward(node: Node, target: IndexMap) -> IndexMap | None:
    """The map of a reshape's or transpose's input given its output's (the op run backwards)."""
    if node.op in RESHAPE_LIKE:
        return target.reshape(node.inputs[0].shape)
    if node.op == "transpose":
        return target.transpose([int(p) for p in np.argsort(transpose_perm(node))])
    return None
