"""Convolutions rewritten into forms the conv kernels run near the FMA peak: a strided 1x1 conv without padding
reads a strided slice of its input, so the slice is taken first (a small copy) and the conv runs at stride 1 on it
(see docs/notes/graph-rewrites.md). (Rows with no register tile of output
columns are computed wider by the conv itself: conv2d's `_whole_columns`.)"""
from __future__ import annotations

import dataclasses
from typing import cast

from cinn.compiler.passes.rewrite import Rewriter, rewrite
from cinn.core.ir import Node, Program
from cinn.core.ops.nn import Conv2dAttrs, PaddingAlgorithm
from cinn.core.ops.shape import SliceAttrs


def conv_forms(program: Program) -> Program:
    """Take strided 1x1 convs' slices first."""
    return rewrite(program, slice_strided_pointwise)


def slice_strided_pointwise(rw: Rewriter, node: Node) -> bool:
    """conv2d 1x1 with strides and no padding -> a strided slice of its input and a stride-1 conv2d."""
    if node.op != "conv2d":
        return False
    a = cast(Conv2dAttrs, node.attrs)
    x, w = rw.inputs(node)
    if (w.shape[2:] != (1, 1) or tuple(a.strides) == (1, 1) or any(a.paddings)
            or a.padding_algorithm is not PaddingAlgorithm.EXPLICIT):
        return False
    h, wd = x.shape[2:]
    (xs,) = rw.emit("slice", [x], SliceAttrs(axes=(2, 3), starts=(0, 0), ends=(h, wd), strides=tuple(a.strides)))
    (y,) = rw.emit("conv2d", [xs, w], dataclasses.replace(a, strides=(1, 1)))
    rw.substitute(node.outputs[0], y)
    return True
