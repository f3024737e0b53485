"""Split grouped convolutions with wide groups into one convolution per group and a concat: each group is then a
dense convolution that the conv kernels vectorize over its output channels (alexnet's 96->256 5x5 conv in 2 groups,
vectorized over 26 output columns as 13 pairs of lanes, ran at 46 GFLOP/s)."""
from __future__ import annotations

import dataclasses
from typing import cast

from cinn.ir import Node, Program, Value
from cinn.ops.nn import Conv2dAttrs, WeightLayout
from cinn.ops.shape import AxisAttrs, SliceAttrs
from cinn.passes.rewrite import Rewriter, rewrite

# a group narrower than this many output channels fills no vector register tile; such convs stay grouped
MIN_GROUP_CHANNELS = 32


def split_groups(program: Program) -> Program:
    """conv2d with 1 < groups < channels and at least MIN_GROUP_CHANNELS output channels per group -> per-group
    conv2d on channel slices, concatenated."""
    return rewrite(program, _split)


def _split(rw: Rewriter, node: Node) -> bool:
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
