"""Values stored inside other values' buffers, so that no kernel copies them:

- Concats written in place: each part of a concat whose parts are contiguous ranges of its output (a batch-1 NCHW
  concat over channels) is stored inside the concat's buffer, so the kernels producing the parts write there
  (densenet's dense blocks concat every layer's 32 new channels onto all earlier ones; squeezenet's fire modules and
  inception's branches end in concats).
- Slices read in place: a slice that is one contiguous range of its input (a batch-1 channel range: shufflenet's
  channel groups) is that range of the input's buffer.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from math import prod
from typing import cast

from cinn.core.ir import Node, Program
from cinn.core.ops.common import normalize_axis
from cinn.core.ops.shape import AxisAttrs, SliceAttrs, slice_ranges


@dataclass(frozen=True)
class View:
    """A value stored inside another value's buffer: the base's name and the byte offset into it."""

    base: str
    offset: int


def find_views(program: Program) -> dict[str, View]:
    """The in-place concats' parts, then the in-place slices (a slice that is a concat's part stays a kernel, one
    that writes the concat's buffer)."""
    found = concat_views(program)
    fixed = _fixed(program)
    for node in program.nodes:
        out = node.outputs[0].name
        if node.op == "slice" and out not in found and out not in fixed and node.inputs[0].name not in fixed:
            offset = _contiguous_slice(node)
            if offset is not None:
                found[out] = View(node.inputs[0].name, offset)
    return found


def _fixed(program: Program) -> set[str]:
    """Values whose memory is not the workspace's: inputs and outputs are the caller's arrays, constants shared."""
    return {v.name for v in program.inputs} | {v.name for v in program.outputs} | set(program.constants)


def _contiguous_slice(node: Node) -> int | None:
    """The byte offset of a slice's output in its input when it is one contiguous range of it, else None."""
    shape = node.inputs[0].shape
    ranges = slice_ranges(shape, cast(SliceAttrs, node.attrs))
    cut = next((d for d, r in enumerate(ranges) if len(r) != shape[d]), None)
    if cut is None or prod(shape[:cut]) != 1 or ranges[cut].step != 1:
        return None
    if any(len(r) != d for r, d in zip(ranges[cut + 1 :], shape[cut + 1 :], strict=True)):
        return None
    return ranges[cut].start * prod(shape[cut + 1 :]) * node.inputs[0].type.nbytes // prod(shape)


def concat_views(program: Program) -> dict[str, View]:
    """The parts of in-place concats, each mapped to the concat output it lives in. A concat is in place when its parts
    are contiguous ranges of its output and each is written by a kernel for this concat alone: no program input,
    output or constant, no part of another in-place concat, no part listed twice. A part may itself be an in-place
    concat (densenet's chains of concats then share one buffer)."""
    producers = program.producers()
    fixed = _fixed(program)
    views: dict[str, View] = {}
    for node in reversed(program.nodes):  # outer concats first: their parts may be concats too
        if not _contiguous_concat(node, fixed):
            continue
        names = [v.name for v in node.inputs]
        if len(set(names)) != len(names) or any(n in views or n in fixed or n not in producers for n in names):
            continue
        if all(producers[n].op == "slice" for n in names):
            # its parts are copies: one concat kernel reading them in place (with the ops after it fused) does in one
            # kernel what a copy per part would (shufflenet's padded per-group convs, sliced back to 68 channels)
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


def kernelless(program: Program, views: Mapping[str, View]) -> frozenset[str]:
    """The outputs of the nodes that take no kernel: in-place concats (their parts wrote them) and in-place slices. A
    concat that is merely the base of a slice view (a batch-2 concat sliced along the batch) still writes itself."""
    def in_place(n: Node) -> bool:
        out = n.outputs[0].name
        if n.op == "concat":
            return all(v.name in views and views[v.name].base == out for v in n.inputs)
        # a slice that is a concat's part is in `views` too, as that part: it stays a kernel that writes it
        return n.op == "slice" and out in views and views[out].base == n.inputs[0].name

    return frozenset(n.outputs[0].name for n in program.nodes if in_place(n))


def resolve(views: Mapping[str, View], name: str) -> View:
    """The buffer a value lives in at last (through nested views) and its byte offset there; itself at 0 if none."""
    offset = 0
    while name in views:
        view = views[name]
        name, offset = view.base, offset + view.offset
    return View(name, offset)
