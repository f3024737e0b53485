"""Concats written in place: each part of a concat whose parts are contiguous ranges of its output (a batch-1 NCHW
concat over channels) is stored inside the concat's buffer, so the kernels producing the parts write there and no
kernel copies them (densenet's dense blocks concat every layer's 32 new channels onto all earlier ones; squeezenet's
fire modules and inception's branches end in concats)."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from math import prod
from typing import cast

from cinn.ir import Node, Program
from cinn.ops.common import normalize_axis
from cinn.ops.shape import AxisAttrs


@dataclass(frozen=True)
class View:
    """A value stored inside another value's buffer: the base's name and the byte offset into it."""

    base: str
    offset: int


def concat_views(program: Program) -> dict[str, View]:
    """The parts of in-place concats, each mapped to the concat output it lives in. A concat is in place when its parts
    are contiguous ranges of its output and each is written by a kernel for this concat alone: no program input,
    output or constant, no part of another in-place concat, no part listed twice. A part may itself be an in-place
    concat (densenet's chains of concats then share one buffer)."""
    producers = program.producers()
    fixed = {v.name for v in program.inputs} | {v.name for v in program.outputs} | set(program.constants)
    views: dict[str, View] = {}
    for node in reversed(program.nodes):  # outer concats first: their parts may be concats too
        if not _contiguous_concat(node, fixed):
            continue
        names = [v.name for v in node.inputs]
        if len(set(names)) != len(names) or any(n in views or n in fixed or n not in producers for n in names):
            continue
        offset = 0
        for v in node.inputs:
            views[v.name] = View(node.outputs[0].name, offset)
            offset += v.type.nbytes
    return views


def _contiguous_concat(node: Node, fixed: set[str]) -> bool:
    """A concat whose output is written by a kernel and whose parts each fill a contiguous range of it."""
    if node.op != "concat" or node.outputs[0].name in fixed:
        return False
    shape = node.outputs[0].shape
    return prod(shape[: normalize_axis("concat", cast(AxisAttrs, node.attrs).axis, len(shape))]) == 1


def resolve(views: Mapping[str, View], name: str) -> View:
    """The buffer a value lives in at last (through nested views) and its byte offset there; itself at 0 if none."""
    offset = 0
    while name in views:
        view = views[name]
        name, offset = view.base, offset + view.offset
    return View(name, offset)
