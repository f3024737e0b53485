"""Convolutions rewritten into forms the conv kernels run near the FMA peak.

- A grouped conv with wide groups becomes one dense conv per group and a concat: each group is then vectorized over
  its output channels (alexnet's 96->256 5x5 conv in 2 groups, vectorized over 26 output columns as 13 pairs of
  lanes, ran at 46 GFLOP/s; as two dense convs, 1.2 ms instead of 8.9).
- A strided 1x1 conv without padding reads a strided slice of its input: the slice is taken first (a small copy),
  and the conv runs at stride 1 on it (resnet50's 1024->2048 downsample: 1.14 ms strided, 0.89 ms on the slice).
- A dense conv whose output rows have no divisor that makes a register tile of output columns (zfnet's 109, a
  prime) computes a few more columns over extra right padding, then slices them off.
"""
from __future__ import annotations

import dataclasses
from typing import cast

from cinn.ir import Node, Program, Value
from cinn.ops.nn import Conv2dAttrs, PaddingAlgorithm, WeightLayout
from cinn.ops.shape import AxisAttrs, SliceAttrs
from cinn.passes.rewrite import Rewriter, rewrite

# a group narrower than this many output channels fills no vector register tile; such convs stay grouped
MIN_GROUP_CHANNELS = 32
# output columns a conv's register tile spans (it takes a divisor of the row, so that no tile needs a bounds test)
TILE_COLUMNS = range(3, 17)


def conv_forms(program: Program) -> Program:
    """Split wide conv groups, take strided 1x1 convs' slices first, widen rows with no tile of columns."""
    return rewrite(rewrite(rewrite(program, split_groups), slice_strided_pointwise), widen_ragged_rows)


def split_groups(rw: Rewriter, node: Node) -> bool:
    """conv2d with 1 < groups < channels and at least MIN_GROUP_CHANNELS output channels per group -> per-group
    conv2d on channel slices, concatenated."""
    if node.op != "conv2d":
        return False
    a = cast(Conv2dAttrs, node.attrs)
    x, w = rw.inputs(node)
    groups, out_channels = a.groups, node.outputs[0].shape[1]
    if a.weight_layout is not WeightLayout.OIHW or not 1 < groups < x.shape[1]:
        return False
    per_group, cg = out_channels // groups, x.shape[1] // groups
    if per_group < MIN_GROUP_CHANNELS:
        return False
    dense = dataclasses.replace(a, groups=1)
    parts: list[Value] = []
    for g in range(groups):
        (xs,) = rw.emit("slice", [x], SliceAttrs(axes=(1,), starts=(g * cg,), ends=((g + 1) * cg,)))
        (ws,) = rw.emit("slice", [w], SliceAttrs(axes=(0,), starts=(g * per_group,), ends=((g + 1) * per_group,)))
        parts.extend(rw.emit("conv2d", [xs, ws], dense))
    (y,) = rw.emit("concat", parts, AxisAttrs(axis=1))
    rw.substitute(node.outputs[0], y)
    return True


def slice_strided_pointwise(rw: Rewriter, node: Node) -> bool:
    """conv2d 1x1 with strides and no padding -> a strided slice of its input and a stride-1 conv2d."""
    if node.op != "conv2d":
        return False
    a = cast(Conv2dAttrs, node.attrs)
    x, w = rw.inputs(node)
    if (a.weight_layout.oihw(w.shape)[2:] != (1, 1) or tuple(a.strides) == (1, 1) or any(a.paddings)
            or a.padding_algorithm is not PaddingAlgorithm.EXPLICIT):
        return False
    h, wd = x.shape[2:]
    (xs,) = rw.emit("slice", [x], SliceAttrs(axes=(2, 3), starts=(0, 0), ends=(h, wd), strides=tuple(a.strides)))
    (y,) = rw.emit("conv2d", [xs, w], dataclasses.replace(a, strides=(1, 1)))
    rw.substitute(node.outputs[0], y)
    return True


def widen_ragged_rows(rw: Rewriter, node: Node) -> bool:
    """A dense conv2d whose output width has no divisor in TILE_COLUMNS -> the conv over the next width that has one
    (extra right padding: the added columns read only zeros), its output sliced back. zfnet's 3->96 7x7/2 stem on
    109 columns took register tiles of 2 vectors x 1 column: 2.3 ms, 148 GFLOP/s."""
    if node.op != "conv2d":
        return False
    a = cast(Conv2dAttrs, node.attrs)
    width = node.outputs[0].shape[3]
    if a.groups != 1 or a.padding_algorithm is not PaddingAlgorithm.EXPLICIT or width <= max(TILE_COLUMNS) \
            or _has_tile(width):
        return False
    wide = next(n for n in range(width + 1, 2 * width) if _has_tile(n))
    top, left, bottom, right = a.paddings if len(a.paddings) == 4 else a.paddings * 2
    padded = dataclasses.replace(a, paddings=(top, left, bottom, right + (wide - width) * a.strides[1]))
    (y,) = rw.emit("conv2d", list(rw.inputs(node)), padded)
    (y,) = rw.emit("slice", [y], SliceAttrs(axes=(3,), starts=(0,), ends=(width,)))
    rw.substitute(node.outputs[0], y)
    return True


def _has_tile(width: int) -> bool:
    return any(width % d == 0 for d in TILE_COLUMNS)
