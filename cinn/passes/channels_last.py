"""Depthwise convolutions whose output rows are no whole vectors, and the 1x1 convolutions around them, computed
channels last (NHWC), so that the layout carries from one conv to the next.

In NCHW such a depthwise conv vectorizes over channels anyway: each parallel task copied its input channels last
and its output back, two transposing copies per kernel, and the 1x1 convs around it transposed their accumulators
back to NCHW as well. Channels last, each conv reads and writes whole channel vectors in place. The convs are
rewritten between two transposes (to NHWC and back), which then sink through the elementwise ops between them
(bias, relu6, residual add) and cancel where two meet (sink_transposes); only the chain's ends keep one.

Measured (2 cores, AVX-512, each kernel alone, ms, NCHW -> NHWC): mobilenet_v2's 384-channel 3x3 on 14x14
0.034-0.048 -> 0.028, its 960-channel 3x3 on 7x7 0.025-0.043 -> 0.019-0.024, the 192-channel one on 28x28
0.059-0.078 -> 0.062, the 144-channel 3x3/2 on 56x56 0.066-0.082 -> 0.065; the 1x1 convs as fast as before; the
whole model 5.21 -> 4.69 ms (interleaved runs, on a VM at half the FMA peak of the one measured elsewhere).
Dense kxk convs stay NCHW: channels last, their reduction over channels reads the input at a stride of a whole
pixel (256->256 3x3 on 14x14: 0.57 -> 1.31 ms).
"""
from __future__ import annotations

import dataclasses
from typing import cast

from cinn.ir import Node, Program
from cinn.ops import PatternKind, get_op
from cinn.ops.nn import TO_NCHW, TO_NHWC, Conv2dAttrs, DataFormat
from cinn.ops.shape import TransposeAttrs
from cinn.passes.rewrite import Rewriter, rewrite
from cinn.passes.sink_transposes import sink_transposes


def channels_last(program: Program, lanes: int) -> Program:
    """Compute the depthwise convs whose output rows are not whole half-vectors of `lanes` floats (the CPU's vector
    width) and that have 1x1 convs on both sides, through elementwise ops, channels last with those 1x1 convs."""
    chosen = _chosen(program, lanes)
    if not chosen:
        return program
    return sink_transposes(rewrite(program, lambda rw, node: node.outputs[0].name in chosen and _to_nhwc(rw, node)))


def _chosen(program: Program, lanes: int) -> set[str]:
    """The output names of the convs to compute channels last: each such depthwise conv with the 1x1 convs that
    feed it and that it feeds, where both exist (a lone depthwise conv would keep a transpose on each side: shufflenet's,
    between channel shuffles, took 3.0 -> 4.0 ms)."""
    producers, consumers = program.producers(), program.consumers()
    chosen: set[str] = set()
    for conv in program.nodes:
        if not (_is_depthwise(conv) and conv.outputs[0].shape[3] % (lanes // 2)):
            continue
        before = [n for n in _joined(conv, producers, consumers, True) if _is_pointwise(n)]
        after = [n for n in _joined(conv, producers, consumers, False) if _is_pointwise(n)]
        if before and after:
            chosen |= {n.outputs[0].name for n in (conv, *before, *after)}
    return chosen


def _joined(conv: Node, producers: dict[str, Node], consumers: dict[str, list[Node]], upstream: bool) -> list[Node]:
    """The convs reached from a conv's input upstream, or from its output downstream, through elementwise ops."""
    found, seen = [], set()
    stack = [p for v in conv.inputs[:1] if (p := producers.get(v.name))] if upstream else \
        list(consumers.get(conv.outputs[0].name, []))
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if node.op == "conv2d":
            found.append(node)
        elif get_op(node.op).kind is PatternKind.ELEMENTWISE and len(node.outputs) == 1:
            stack += [producers[v.name] for v in node.inputs if v.name in producers] if upstream else \
                consumers.get(node.outputs[0].name, [])
    return found


def _is_depthwise(node: Node) -> bool:
    if not _is_nchw_float_conv(node):
        return False
    channels = node.inputs[0].shape[1]
    return cast(Conv2dAttrs, node.attrs).groups == channels == node.outputs[0].shape[1]


def _is_pointwise(node: Node) -> bool:
    a = cast(Conv2dAttrs, node.attrs)
    return _is_nchw_float_conv(node) and a.groups == 1 and a.weight_layout.oihw(node.inputs[1].shape)[2:] == (1, 1)


def _is_nchw_float_conv(node: Node) -> bool:
    return (node.op == "conv2d" and node.outputs[0].dtype == "float32"
            and cast(Conv2dAttrs, node.attrs).data_format is DataFormat.NCHW)


def _to_nhwc(rw: Rewriter, node: Node) -> bool:
    """conv(x) -> transpose(conv_nhwc(transpose(x, to NHWC)), to NCHW)."""
    x, w = rw.inputs(node)
    (xt,) = rw.emit("transpose", [x], TransposeAttrs(TO_NHWC))
    (y,) = rw.emit("conv2d", [xt, w], dataclasses.replace(cast(Conv2dAttrs, node.attrs), data_format=DataFormat.NHWC))
    (yt,) = rw.emit("transpose", [y], TransposeAttrs(TO_NCHW))
    rw.substitute(node.outputs[0], yt)
    return True
