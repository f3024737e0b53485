"""Store constant weights in the layout the kernels read: each kernel then reads them in place, and the transposition
is paid once at compile time instead of on every run (resnet50's 2048->512 1x1 conv: 1.15 -> 0.49 ms)."""
from __future__ import annotations

import dataclasses
from typing import cast

import numpy as np

from cinn.ir import Node, Program
from cinn.ops.nn import Conv2dAttrs, MatmulAttrs, WeightLayout
from cinn.passes.rewrite import Rewriter, rewrite


def pack_weights(program: Program) -> Program:
    """conv2d weights go OIHW -> IHWO (output channels contiguous: the conv kernels' vector axis); matmul's constant
    transposed operands are transposed back (trans_y), so the output columns are contiguous."""
    return rewrite(program, _pack)


def _pack(rw: Rewriter, node: Node) -> bool:
    if node.op not in ("conv2d", "matmul"):
        return False
    x, w = rw.inputs(node)
    data = rw.constant(w)
    if data is None:
        return False
    if node.op == "conv2d" and (conv := cast(Conv2dAttrs, node.attrs)).weight_layout is WeightLayout.OIHW:
        packed = rw.new_constant(np.moveaxis(data, 0, 3), f"{w.name}_ihwo")
        rw.keep(node, inputs=(x, packed), attrs=dataclasses.replace(conv, weight_layout=WeightLayout.IHWO))
        return True
    if node.op == "matmul" and (mm := cast(MatmulAttrs, node.attrs)).trans_y and data.ndim >= 2:
        packed = rw.new_constant(np.swapaxes(data, -1, -2), f"{w.name}_t")
        rw.keep(node, inputs=(x, packed), attrs=dataclasses.replace(mm, trans_y=False))
        return True
    return False
