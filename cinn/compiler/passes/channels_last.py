"""Depthwise convolutions whose output rows are no whole vectors, and the 1x1 convolutions around them, computed
channels last (NHWC), so that the layout carries from one conv to the next.

In NCHW such a depthwise conv vectorizes over channels anyway: each parallel task copied its input channels last
and its output back, two transposing copies per kernel, and the 1x1 convs around it transposed their accumulators
back to NCHW as well. Channels last, each conv reads and writes whole channel vectors in place. The convs are
rewritten between two transposes (to NHWC and back), which then sink through the elementwise ops between them
(bias, relu6, residual add) and cancel where two meet (sink_transposes); only the chain's ends keep one.

Dense 1x1 convs over pixels that are no whole vectors vectorize over output channels in NCHW with few accumulators
where the CPU has few vector registers; channels last they are matmuls over flat pixels in whole register tiles
(CpuModel.pixel_tile). Such convs joined through elementwise ops go channels last together where the time they gain,
estimated from the target's FMA peak, exceeds that of the transposes left at the ends, estimated from its memory
bandwidth. Strided dense convs over many input channels join them (channels last they read each output pixel's
window in place); stride-1 kxk convs gain nothing and a 3-channel stem loses: they stay NCHW. With many registers
(AVX-512) the NCHW tile is near the FMA peak already: those convs stay NCHW there.

A depthwise conv between integer convs (which compute channels last: integer_kernels) reads a tensor transposed to
NCHW and hands its result, through its epilogue and the next conv's quantize step, to a transpose back: any such
depthwise conv goes channels last, and both transposes cancel. The measurements are in docs/notes/channels-last.md.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import cast

from cinn.compiler.passes.rewrite import Rewriter, rewrite
from cinn.compiler.passes.sink_transposes import sink_transposes
from cinn.core.ir import Node, Program, Value
from cinn.core.ops import PatternKind, get_op, op_flops
from cinn.core.ops.nn import TO_NCHW, TO_NHWC, Conv2dAttrs, DataFormat
from cinn.core.ops.reduction import ReduceAttrs, reduced_axes
from cinn.core.ops.shape import TransposeAttrs
from cinn.core.target import Target

# input channels from which a strided dense conv gains channels last (its inner loop runs over them)
STRIDED_CHANNELS = 32
# a dense conv's FLOP/s, as a share of the FMA peak, with few registers: NCHW over ragged pixels, and channels last
NCHW_EFFICIENCY, NHWC_EFFICIENCY = 0.375, 0.52
TRANSPOSED_SIZE = 8  # bytes a transpose moves per float32 element: read and written


def channels_last(program: Program, target: Target) -> Program:
    """Compute the depthwise convs whose output rows are not whole half-vectors (of the target's fp32 lanes) and that
    have 1x1 convs on both sides, through elementwise ops, channels last with those 1x1 convs and the squeeze-excite
    gates over them (_gate_convs); with few registers,
    also the flat candidates that gain (_flat_chosen)."""
    cpu = target.model
    chosen = _chosen(program, cpu.lanes) | _between_transposes(program)
    chosen |= _flat_chosen(program, target) if cpu.few_registers else set()
    if not chosen:
        return program
    transposed: dict[str, Value] = {}  # convs reading one tensor share its transpose
    return sink_transposes(rewrite(program, lambda rw, node: node.outputs[0].name in chosen
                                   and _to_nhwc(rw, node, transposed)))


def _chosen(program: Program, lanes: int) -> set[str]:
    """The output names of the convs to compute channels last: each such depthwise conv with the 1x1 convs that
    feed it and that it feeds, where both exist (a lone depthwise conv would keep a transpose on each side, which
    costs more than it gains: docs/notes/channels-last.md)."""
    producers, consumers = program.producers(), program.consumers()
    chosen: set[str] = set()
    for conv in program.nodes:
        if not (_is_depthwise(conv) and conv.outputs[0].shape[3] % (lanes // 2)):
            continue
        before = [n for n in _joined(conv, producers, consumers, True)[0] if _is_pointwise(n)]
        after = [n for n in _joined(conv, producers, consumers, False)[0] if _is_pointwise(n)]
        if before and after:
            chosen |= {n.outputs[0].name for n in (conv, *before, *after, *_gate_convs(conv, consumers))}
    return chosen


def _between_transposes(program: Program) -> set[str]:
    """The output names of the depthwise convs whose input is transposed from channels last and whose output reaches,
    through elementwise ops, only transposes back to it (the integer convs around them): channels last, those
    transposes cancel (sink_transposes)."""
    producers, consumers = program.producers(), program.consumers()
    outputs = {v.name for v in program.outputs}
    return {conv.outputs[0].name for conv in program.nodes
            if _is_depthwise(conv) and _from_transposes(conv.inputs[0], producers, program.constants)
            and _to_transposes(conv.outputs[0], consumers, program.constants, outputs)}


def _from_transposes(value: Value, producers: dict[str, Node], constants: Mapping[str, object]) -> bool:
    """Whether `value` is computed by elementwise ops from constants and tensors transposed to NCHW alone."""
    stack = [value]
    while stack:
        v = stack.pop()
        node = producers.get(v.name)
        if node is None:
            if v.name not in constants:
                return False  # a graph input
        elif node.op == "transpose":
            if cast(TransposeAttrs, node.attrs).axis != TO_NCHW:
                return False
        elif get_op(node.op).kind is PatternKind.ELEMENTWISE and len(node.outputs) == 1:
            stack += list(node.inputs)
        else:
            return False
    return True


def _to_transposes(value: Value, consumers: dict[str, list[Node]], constants: Mapping[str, object],
                   outputs: set[str]) -> bool:
    """Whether `value` reaches, through elementwise ops of no other computed operand, only transposes to NHWC."""
    stack = [value]
    while stack:
        v = stack.pop()
        users = consumers.get(v.name, [])
        if v.name in outputs or not users:
            return False
        for node in users:
            if node.op == "transpose" and cast(TransposeAttrs, node.attrs).axis == TO_NHWC:
                continue
            joined = any(u.name != v.name and u.name not in constants for u in node.inputs)
            if get_op(node.op).kind is not PatternKind.ELEMENTWISE or len(node.outputs) != 1 or joined:
                return False
            stack += list(node.outputs)
    return True


def _gate_convs(conv: Node, consumers: dict[str, list[Node]]) -> list[Node]:
    """The pointwise convs over 1x1 maps that a conv's output reaches through elementwise ops, global pools and
    such convs: a squeeze-excite block's two fully connected layers, whose gate scales the conv's output. Channels
    last with it, the pool reads that output in place and the gate broadcasts over it, no transpose between."""
    found: list[Node] = []
    seen: set[int] = set()
    stack = list(conv.outputs)
    while stack:
        for node in consumers.get(stack.pop().name, []):
            if id(node) in seen:
                continue
            seen.add(id(node))
            gate = _is_pointwise(node) and node.outputs[0].shape[2:] == (1, 1)
            if gate:
                found.append(node)
            if gate or _is_global_pool(node) or (get_op(node.op).kind is PatternKind.ELEMENTWISE
                                                 and len(node.outputs) == 1):
                stack += list(node.outputs)
    return found


def _is_global_pool(node: Node) -> bool:
    """A reduction of an NCHW tensor over its spatial axes that keeps them (a global average or max pool)."""
    return (isinstance(node.attrs, ReduceAttrs) and node.attrs.keep_dim and len(node.inputs[0].shape) == 4
            and reduced_axes(node.op, node.attrs.dim, node.inputs[0].shape) == (2, 3))


@dataclasses.dataclass(frozen=True)
class _Walks:
    """A candidate conv and what `_joined` finds from it: the convs upstream and downstream, and whether each walk
    also ends elsewhere."""

    conv: Node
    up: list[Node]
    up_ends: bool
    down: list[Node]
    down_ends: bool


def _flat_chosen(program: Program, target: Target) -> set[str]:
    """The output names of the dense convs to compute channels last over flat pixels (_is_flat_candidate): each set of
    them joined through elementwise ops whose estimated gain (their FLOPs at NCHW_EFFICIENCY against NHWC_EFFICIENCY
    of the target's FMA peak) exceeds the transposes left where the set meets other ops (their bytes at its memory
    bandwidth)."""
    producers, consumers = program.producers(), program.consumers()
    outputs = {v.name for v in program.outputs}
    walks = {n.outputs[0].name: _Walks(n, *_joined(n, producers, consumers, True, outputs),
                                       *_joined(n, producers, consumers, False, outputs))
             for n in program.nodes if _is_flat_candidate(n, target.model.tile_columns)}
    chosen: set[str] = set()
    per_flop = (1 / NCHW_EFFICIENCY - 1 / NHWC_EFFICIENCY) / target.peak_flops
    for component in _components(walks):
        gain = sum(_flops(w.conv) for w in component) * per_flop
        if gain > _boundary_elements(component) * TRANSPOSED_SIZE / target.bandwidth:
            chosen |= {w.conv.outputs[0].name for w in component}
    return chosen


def _components(walks: dict[str, _Walks]) -> list[list[_Walks]]:
    """The candidate convs grouped by the elementwise paths that join them."""
    groups: list[list[_Walks]] = []
    placed: set[str] = set()
    for name in walks:
        if name in placed:
            continue
        group, stack = [], [name]
        placed.add(name)
        while stack:
            walk = walks[stack.pop()]
            group.append(walk)
            for n in (*walk.up, *walk.down):
                if (o := n.outputs[0].name) in walks and o not in placed:
                    placed.add(o)
                    stack.append(o)
        groups.append(group)
    return groups


def _boundary_elements(component: list[_Walks]) -> int:
    """The elements of the transposes left around a set of convs computed channels last: an input none of them
    produces, an output that also reaches another op (a kxk conv, a pool, a concat, the graph's output)."""
    members = {id(w.conv) for w in component}
    inputs: dict[str, int] = {}
    elements = 0
    for w in component:
        if w.up_ends or not any(id(n) in members for n in w.up):
            inputs[w.conv.inputs[0].name] = w.conv.inputs[0].type.size
        if w.down_ends or any(id(n) not in members for n in w.down):
            elements += w.conv.outputs[0].type.size
    return elements + sum(inputs.values())


def _joined(conv: Node, producers: dict[str, Node], consumers: dict[str, list[Node]], upstream: bool,
            outputs: frozenset[str] | set[str] = frozenset()) -> tuple[list[Node], bool]:
    """The convs reached from a conv's input upstream, or from its output downstream, through elementwise ops; and
    whether the walk also ends elsewhere (another op, a graph input, or one of `outputs`)."""
    found, seen, ends = [], set(), False
    start = conv.inputs[:1] if upstream else conv.outputs
    stack: list[Value] = list(start)
    while stack:
        value = stack.pop()
        if upstream:
            nodes = [p] if (p := producers.get(value.name)) else []
        else:
            nodes = consumers.get(value.name, [])
        ends |= not nodes or (not upstream and value.name in outputs)
        for node in nodes:
            if id(node) in seen:
                continue
            seen.add(id(node))
            if node.op == "conv2d":
                found.append(node)
            elif get_op(node.op).kind is PatternKind.ELEMENTWISE and len(node.outputs) == 1:
                stack += list(node.inputs) if upstream else list(node.outputs)
            else:
                ends = True
    return found, ends


def _is_flat_candidate(node: Node, columns: int) -> bool:
    """A dense conv that NCHW has few accumulators or gathers its input and channels last computes over flat pixels
    (CpuModel.pixel_tile): a 1x1 at stride 1 without padding over pixels that are no whole register-tile rows of
    `columns`, or a strided one over at least STRIDED_CHANNELS input channels."""
    a = cast(Conv2dAttrs, node.attrs)
    if not (_is_nchw_float_conv(node) and a.groups == 1):
        return False
    if max(a.strides) > 1:
        return node.inputs[0].shape[1] >= STRIDED_CHANNELS
    h, w = node.outputs[0].shape[2:]
    return _is_pointwise(node) and not any(a.paddings) and h * w % columns != 0


def _flops(node: Node) -> int:
    return op_flops(get_op(node.op), [v.type for v in node.inputs], node.attrs, [v.type for v in node.outputs])


def _is_depthwise(node: Node) -> bool:
    if not _is_nchw_float_conv(node):
        return False
    channels = node.inputs[0].shape[1]
    return cast(Conv2dAttrs, node.attrs).groups == channels == node.outputs[0].shape[1]


def _is_pointwise(node: Node) -> bool:
    a = cast(Conv2dAttrs, node.attrs)
    return _is_nchw_float_conv(node) and a.groups == 1 and node.inputs[1].shape[2:] == (1, 1)


def _is_nchw_float_conv(node: Node) -> bool:
    return (node.op == "conv2d" and node.outputs[0].dtype == "float32"
            and cast(Conv2dAttrs, node.attrs).data_format is DataFormat.NCHW)


def _to_nhwc(rw: Rewriter, node: Node, transposed: dict[str, Value]) -> bool:
    """conv(x) -> transpose(conv_nhwc(transpose(x, to NHWC)), to NCHW), x's transpose shared by convs reading x."""
    x, w = rw.inputs(node)
    if x.name not in transposed:
        (transposed[x.name],) = rw.emit("transpose", [x], TransposeAttrs(TO_NHWC))
    xt = transposed[x.name]
    (y,) = rw.emit("conv2d", [xt, w], dataclasses.replace(cast(Conv2dAttrs, node.attrs), data_format=DataFormat.NHWC))
    (yt,) = rw.emit("transpose", [y], TransposeAttrs(TO_NCHW))
    rw.substitute(node.outputs[0], yt)
    return True
