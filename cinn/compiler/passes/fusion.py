"""Op fusion in CINN's two steps: op fusion by pattern kind, then fusion merge of sibling groups."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from cinn.core.ir import Node, Program, Value
from cinn.core.ops import PatternKind as K
from cinn.core.ops import get_op, op_flops
from cinn.core.ops.common import normalize_axes

_LIGHT = (K.ELEMENTWISE, K.BROADCAST, K.INJECTIVE)


@dataclass(frozen=True)
class Group:
    """A fused set of nodes that becomes one kernel."""

    nodes: tuple[Node, ...]
    inputs: tuple[Value, ...]
    outputs: tuple[Value, ...]
    kind: K

    @property
    def name(self) -> str:
        return "fused_" + "_".join(n.op for n in self.nodes)[:80] if len(self.nodes) > 1 else self.nodes[0].op

    @property
    def flops(self) -> int:
        """The arithmetic of the group's nodes (a multiply-add counts 2)."""
        return sum(op_flops(get_op(n.op), [v.type for v in n.inputs], n.attrs, [v.type for v in n.outputs])
                   for n in self.nodes)

    def traffic(self, params: Sequence[Value]) -> int:
        """The bytes a kernel of the group over `params` moves at least: each parameter once, but an input that only
        index ops read (an embedding table) no more than the rows they gather."""
        gathered: dict[str, int] = {}
        whole: set[str] = set()
        for n in self.nodes:
            op = get_op(n.op)
            for i, v in enumerate(n.inputs):
                if op.reads_gathered(i):
                    gathered[v.name] = gathered.get(v.name, 0) + n.outputs[0].type.size * np.dtype(v.dtype).itemsize
                else:
                    whole.add(v.name)
        return sum(min(v.type.nbytes, gathered[v.name]) if v.name in gathered and v.name not in whole
                   else v.type.nbytes for v in params)


@dataclass
class _Draft:
    """A group being grown: its nodes and the reduction domain (input shape, axes) it is tied to."""

    nodes: list[Node]
    kind: K
    domain: tuple | None = None


def fuse(program: Program, in_place: frozenset[str] = frozenset()) -> list[Group]:
    """Partition the program's nodes into fused groups, in a valid execution order; the nodes whose outputs are named
    in `in_place` take no kernel (concats whose parts are written into their buffer, slices that are a range of their
    input's: passes.views)."""
    nodes = {id(n) for n in program.nodes if n.outputs[0].name not in in_place}
    writers = _writers(program, nodes)
    # a kernel that reads a view must not also write what it views: it would read it unwritten
    part_writers = {name: {id(w) for w in writers[name]} for name in in_place}
    drafts = _op_fusion(program, in_place, part_writers)
    drafts = _fusion_merge(program, drafts, part_writers)
    return _finalize(program, drafts)


def unfused(program: Program) -> list[Group]:
    """One group per node: the op-by-op baseline."""
    return _finalize(program, [_Draft([n], get_op(n.op).kind, _domain(n)) for n in program.nodes])


def _domain(node: Node) -> tuple | None:
    """The reduction domain of a reduction node: its input shape and reduced axes."""
    if get_op(node.op).kind != K.REDUCTION:
        return None
    shape = node.inputs[0].shape
    dims = getattr(node.attrs, "dim", None)
    if dims is None:
        dims = (node.attrs.axis,) if hasattr(node.attrs, "axis") else ()
    return (shape, normalize_axes(node.op, dims or range(len(shape)), len(shape)))


def _op_fusion(program: Program, in_place: frozenset[str], part_writers: dict[str, set[int]]) -> list[_Draft]:
    """Step 1: grow groups along producer -> consumer edges by the kind rules."""
    producers = program.producers()
    owner: dict[int, _Draft] = {}  # id(node) -> draft
    drafts: list[_Draft] = []
    for node in program.nodes:
        if node.outputs[0].name in in_place:
            continue
        draft = _Draft([node], get_op(node.op).kind, _domain(node))
        drafts.append(draft)
        owner[id(node)] = draft
        for value in node.inputs:
            prod = producers.get(value.name)
            if prod is None or id(prod) not in owner:
                continue
            pd = owner[id(prod)]
            if pd is draft or not _can_fuse(pd, node, draft) or _reads_own_part(pd, draft, part_writers):
                continue
            if _creates_cycle(program, owner, pd, draft):
                continue
            _merge_into(pd, draft, owner, drafts)
            draft = pd
    return drafts


def _can_fuse(producer: _Draft, node: Node, consumer: _Draft) -> bool:
    """Whether the consumer node's group may merge with its producer's group (CINN's kind rules)."""
    if producer.kind in _LIGHT:
        if consumer.kind in _LIGHT:
            return True
        # an elementwise producer is inlined into a reduction's input, never into matmul/conv
        return consumer.kind == K.REDUCTION and get_op(node.op).kind == K.REDUCTION
    if consumer.kind not in _LIGHT:
        # two reductions over the same rows (softmax's max and sum) share one kernel; a gate conv joins a vector chain
        return (producer.kind == consumer.kind == K.REDUCTION and producer.domain == consumer.domain) \
            or (consumer.nodes == [node] and _is_gate(node) and _is_vector_chain(producer))
    shapes = {n.outputs[0].shape for n in consumer.nodes}
    if _is_vector_chain(producer) and producer.domain is not None and _scales(consumer, producer.domain[0]):
        return True
    if not all(get_op(n.op).kind in (K.ELEMENTWISE, K.BROADCAST) for n in consumer.nodes):
        return False
    if producer.kind == K.REDUCTION:
        return all(_row_compatible(producer.domain, s) for s in shapes)
    if producer.kind == K.OUT_FUSIBLE:
        # elementwise epilogue (bias, batch norm, activation, residual) of the anchor's shape
        return shapes == {_anchor(producer).outputs[0].shape}
    return False


def _scales(consumer: _Draft, shape: tuple[int, ...]) -> bool:
    """Whether a light group is a vector chain's scale of the tensor its pool reduced (`shape`): elementwise ops of
    that shape, and index ops of the gate's vectors (the slice back of its padded channels)."""
    return all(n.outputs[0].shape == shape if get_op(n.op).kind in (K.ELEMENTWISE, K.BROADCAST)
               else _is_vector(n.outputs[0].shape) for n in consumer.nodes)


def _anchor(draft: _Draft) -> Node:
    """A group's last node that is no elementwise op (a matmul or conv whose epilogue the rest is)."""
    return next((n for n in reversed(draft.nodes) if get_op(n.op).kind not in _LIGHT), draft.nodes[0])


def _is_vector(shape: tuple[int, ...]) -> bool:
    """A batch of vectors: at most one dim after the first above 1 (channels pooled over their pixels)."""
    return sum(d > 1 for d in shape[1:]) <= 1


def _is_gate(node: Node) -> bool:
    """A conv of a batch of channel vectors (1x1 maps) to another: a squeeze-excite gate's fully connected layer."""
    return node.op == "conv2d_packed" and _is_vector(node.inputs[0].shape) and _is_vector(node.outputs[0].shape)


def _is_vector_chain(draft: _Draft) -> bool:
    """A group of vector computations (a global pool, gate convs, their activations), one kernel of small loops: a
    squeeze-excite block's pool, two fully connected layers and activation, rather than a kernel for each."""
    heavy = [n for n in draft.nodes if get_op(n.op).kind not in _LIGHT]
    return bool(heavy) and all(_is_vector(n.outputs[0].shape) for n in draft.nodes) \
        and all(_is_gate(n) or get_op(n.op).kind == K.REDUCTION for n in heavy)


def _row_compatible(domain: tuple | None, shape: tuple[int, ...]) -> bool:
    """An elementwise consumer of a reduction fuses when it iterates the same domain or the reduced rows."""
    if domain is None:
        return False
    in_shape, axes = domain
    if shape == in_shape:
        return True
    kept = tuple(1 if i in axes else d for i, d in enumerate(in_shape))
    dropped = tuple(d for i, d in enumerate(in_shape) if i not in axes)
    return shape in (kept, dropped)


def _merge_into(target: _Draft, source: _Draft, owner: dict[int, _Draft], drafts: list[_Draft]) -> None:
    target.nodes.extend(source.nodes)
    target.kind = max(target.kind, source.kind)
    target.domain = target.domain or source.domain
    for n in source.nodes:
        owner[id(n)] = target
    drafts.remove(source)


def _creates_cycle(program: Program, owner: dict[int, _Draft], a: _Draft, b: _Draft) -> bool:
    """Whether merging drafts a and b would put a path a -> other -> b (or back) through another group."""
    succ = _draft_successors(program, owner)
    return _reaches_via_other(succ, a, b) or _reaches_via_other(succ, b, a)


def _draft_successors(program: Program, owner: dict[int, _Draft]) -> dict[int, set[int]]:
    writers = _writers(program, set(owner))
    succ: dict[int, set[int]] = {}
    for n in program.nodes:
        if id(n) not in owner:
            continue
        for v in n.inputs:
            for p in writers.get(v.name, ()):
                if owner[id(p)] is not owner[id(n)]:
                    succ.setdefault(id(owner[id(p)]), set()).add(id(owner[id(n)]))
    return succ


def _writers(program: Program, kernel_nodes: set[int]) -> dict[str, list[Node]]:
    """The kernel nodes that write each value: its producer, or for a view (an in-place concat or slice: no kernel
    node) the writers of what it views."""
    writers: dict[str, list[Node]] = {}
    for n in program.nodes:
        if id(n) in kernel_nodes:
            written = [n]
        elif n.op in ("concat", "slice"):  # a view (lowering skips it): its inputs' writers
            written = list(dict.fromkeys(w for p in n.inputs for w in writers.get(p.name, ())))
        else:
            written = []
        for v in n.outputs:
            writers[v.name] = written
    return writers


def _reaches_via_other(succ: dict[int, set[int]], a: _Draft, b: _Draft) -> bool:
    stack = [s for s in succ.get(id(a), ()) if s != id(b)]
    seen = set(stack)
    while stack:
        cur = stack.pop()
        if cur == id(b):
            return True
        for s in succ.get(cur, ()):
            if s not in seen:
                seen.add(s)
                stack.append(s)
    return False


def _reads_own_part(a: _Draft, b: _Draft, part_writers: dict[str, set[int]]) -> bool:
    """Whether either draft reads a view (an in-place concat or slice) of what the other writes."""
    def reads(x: _Draft, y: _Draft) -> bool:
        written = {id(n) for n in y.nodes}
        return any(part_writers.get(v.name, set()) & written for n in x.nodes for v in n.inputs)

    return reads(a, b) or reads(b, a)


def _fusion_merge(program: Program, drafts: list[_Draft], part_writers: dict[str, set[int]]) -> list[_Draft]:
    """Step 2: merge sibling light groups of the same shape that read a common input."""
    owner = {id(n): d for d in drafts for n in d.nodes}
    changed = True
    while changed:
        changed = False
        for a, b in _sibling_pairs(drafts):
            if not _creates_cycle(program, owner, a, b) and not _reads_own_part(a, b, part_writers):
                _merge_into(a, b, owner, drafts)
                changed = True
                break
    return drafts


def _sibling_pairs(drafts: list[_Draft]):
    light = [d for d in drafts if d.kind in _LIGHT]
    for i, a in enumerate(light):
        for b in light[i + 1 :]:
            if _out_shape(a) == _out_shape(b) and _reads(a) & _reads(b):
                yield a, b


def _out_shape(d: _Draft) -> tuple[int, ...]:
    return d.nodes[-1].outputs[0].shape


def _reads(d: _Draft) -> set[str]:
    inside = {v.name for n in d.nodes for v in n.outputs}
    return {v.name for n in d.nodes for v in n.inputs if v.name not in inside and np.prod(v.shape) > 1}


def _finalize(program: Program, drafts: list[_Draft]) -> list[Group]:
    """Order groups topologically and compute each group's external inputs and outputs."""
    position = {id(n): i for i, n in enumerate(program.nodes)}
    consumers = program.consumers()
    program_outputs = {v.name for v in program.outputs}
    groups = []
    for d in drafts:
        nodes = sorted(d.nodes, key=lambda n: position[id(n)])
        members = {id(n) for n in nodes}
        made = {v.name for n in nodes for v in n.outputs}
        inputs = list(dict.fromkeys(v for n in nodes for v in n.inputs if v.name not in made))
        outputs = [
            v
            for n in nodes
            for v in n.outputs
            if v.name in program_outputs or any(id(c) not in members for c in consumers.get(v.name, ()))
        ]
        groups.append(Group(tuple(nodes), tuple(inputs), tuple(outputs), d.kind))
    writers = _writers(program, {id(n) for d in drafts for n in d.nodes})
    return _topo_sort(groups, writers)


def _topo_sort(groups: list[Group], writers: dict[str, list[Node]]) -> list[Group]:
    made_by = {id(n): i for i, g in enumerate(groups) for n in g.nodes}
    deps = [{made_by[id(w)] for v in g.inputs for w in writers.get(v.name, ())} for g in groups]
    order: list[int] = []
    done: set[int] = set()
    while len(order) < len(groups):
        ready = [i for i in range(len(groups)) if i not in done and deps[i] <= done]
        if not ready:
            raise RuntimeError("fusion produced a cyclic group graph")
        i = ready[0]
        order.append(i)
        done.add(i)
    return [groups[i] for i in order]
