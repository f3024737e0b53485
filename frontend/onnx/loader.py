"""cinn.load_onnx: each ONNX node becomes NetBuilder calls (as CINN's op mappers), giving a Program."""
from __future__ import annotations

import collections
import dataclasses
import enum
import math
import os
from collections.abc import Mapping, Sequence

import numpy as np
import onnx

from cinn.core.builder import program_names
from cinn.core.host_ops import HostOp, output_dims
from cinn.core.ir import Node, Program, Value, shape_of
from cinn.core.ops.common import normalize_axis
from cinn.core.symbolic import Dim, StagedProgram, SymbolicInput, SymbolicProgram, symbol_name
from frontend.folding import FoldingBuilder
from frontend.onnx import (  # noqa: F401  (register converters)
    ops_attention,
    ops_contrib,
    ops_dynamic,
    ops_elementwise,
    ops_extra,
    ops_nn,
    ops_quant,
    ops_reduce,
    ops_resize,
    ops_rnn,
    ops_shape,
)
from frontend.onnx.registry import (
    CONVERTERS,
    DEFAULT_DOMAINS,
    NEEDS_CONSTANT,
    NeedsConstant,
    NodeContext,
    OnnxImportError,
    SubgraphBudget,
    converter,
    converter_key,
    onnx_dtype,
    tensor_to_array,
)

# 7-21 is the contract; the newer opsets only added element types to the ops converted here (the
# conformance test runs their cases)
MIN_OPSET, MAX_OPSET = 7, 28


def load_onnx(model: str | os.PathLike | onnx.ModelProto, input_shapes: Mapping[str, Sequence[int]] | None = None, *,
              base_dir: str | os.PathLike | None = None) -> Program | StagedProgram | SymbolicProgram:
    """Convert an ONNX model (a path or a ModelProto) to a Program; initializers become constants.

    Symbolic input dims (dim_params, unnamed dims) give a SymbolicProgram over them, unless input_shapes fixes them
    (it may also override static dims). Ops whose output size is known only at run time (NonZero,
    NonMaxSuppression, Compress) give a StagedProgram: the model is cut after them (see _Stage). External tensor data
    is read only beside the model file, or, for a ModelProto, from `base_dir` when given (never from the working
    directory). The model must pass onnx.checker's full check.
    """
    proto = _read(model, base_dir)
    _check_supported(proto.graph)
    opset = _opset(proto)
    inputs = _symbolic_inputs(proto.graph, dict(input_shapes or {}))
    name = proto.graph.name or "onnx_model"

    def shape_function(shapes: Mapping[str, Sequence[int]], values: Mapping[str, np.ndarray]) -> Program | StagedProgram:
        return _import(proto, opset, shapes, values)

    try:
        return SymbolicProgram(name, inputs, shape_function).static_or_probed()
    except NeedsConstant as e:
        by_value = [i.name for i in inputs if i.name in e.sources and _maybe_by_value(i)]
        if not by_value:
            raise
    # an argument computed from graph inputs at run time (a shape, axes, pads, scatter indices): specialized to each
    # value fed of its inputs, and of every 0-D and 1-D input (the next such argument shows only once this one's
    # value is known)
    by_value += [i.name for i in inputs if _maybe_by_value(i) and len(i.dims) <= 1]
    inputs = tuple(dataclasses.replace(i, by_value=i.name in by_value) for i in inputs)
    return SymbolicProgram(name, inputs, shape_function)


def _maybe_by_value(i: SymbolicInput) -> bool:
    """An input to specialize on: a static shape, at most 1-D or of integers (indices), at most 2**16 elements."""
    dims = [d for d in i.dims if isinstance(d, int)]
    small = len(dims) == len(i.dims) and math.prod(dims) <= 2**16
    return small and (len(dims) <= 1 or np.dtype(i.dtype).kind in "iu")


def _import(proto: onnx.ModelProto, opset: int, shapes: Mapping[str, Sequence[int]],
            values: Mapping[str, np.ndarray]) -> Program | StagedProgram:
    """The Program of a checked model with static input shapes (staged where it has run-time sizes); inputs given
    by value are constants."""
    graph = proto.graph
    b = FoldingBuilder(graph.name or "onnx_model")
    env = _graph_inputs(b, graph, shapes, values)
    stage = _Stage(graph.name or "onnx_model", opset, tuple(o.name for o in graph.output), _subgraph_nodes(graph))
    return stage.convert(b, list(graph.node), env)


@dataclasses.dataclass(frozen=True)
class _Cut:
    """A run-time sized node held for the host: its host op, over the names of its inputs."""

    op: HostOp
    key: tuple  # its kind, attributes and inputs: a node that repeats one (NonZero of the same mask) shares its run


@dataclasses.dataclass(frozen=True)
class _Stage:
    """Converts nodes in order into one static program; where a node's output size is known only at run time
    (NonZero of a computed mask), the model is cut.

    Such a node becomes a host op; it and every node that reads, however indirectly, a value of run-time size are
    held back, and the others go on converting, so that the host ops of one stage run together (torchvision's
    detection post-processing: one NonZero per class, then NonMaxSuppression over every class's boxes: three
    stages). What was converted is the head of a StagedProgram; the held nodes are its tail, converted again at each
    binding of the host ops' sizes by this same loop (so it may be cut again). An If whose chosen branch holds such a
    node is inlined node by node, and Compress is expanded into NonZero and Gather, so that they can be cut too.
    """

    name: str
    opset: int
    outputs: tuple[str, ...]  # the graph's
    subgraph_nodes: int  # of the model's subgraphs (its SubgraphBudget)

    def convert(self, b: FoldingBuilder, nodes: Sequence[onnx.NodeProto], env: dict[str, Value]) -> Program | StagedProgram:
        """The program of `nodes` over the values in `env` (which it extends), staged where they need a run-time
        size."""
        budget = SubgraphBudget(self.subgraph_nodes, MAX_UNROLLED_NODES)
        held: list[onnx.NodeProto] = []
        pending: set[str] = set()  # the values held nodes and host ops make
        cuts: dict[tuple, _Cut] = {}
        aliases: dict[str, str] = {}  # a repeated host op's output -> the first one's
        queue = collections.deque(nodes)
        while queue:
            node = queue.popleft()
            if _reads(node) & pending:
                held.append(node)
                pending.update(o for o in node.output if o)
                continue
            expanded = _expanded(b, node, env, budget)
            if expanded is not None:
                queue.extendleft(reversed(expanded))
            elif converter_key(node) in ops_dynamic.RUN_TIME_SIZED and _run_time(b, node, env):
                cut = _cut(node, env, len(cuts))
                first = cuts.setdefault(cut.key, cut)
                aliases.update((o, t) for o, t in zip(node.output, first.op.outputs, strict=False) if o != t and o)
                pending.update(o for o in node.output if o)
            else:
                _convert(b, node, env, self.opset, budget)
        if not cuts:
            missing = [o for o in self.outputs if o not in env]
            if missing:
                raise OnnxImportError(f"graph outputs {missing} are not produced by any node")
            return _named_outputs(b, [(o, env[o]) for o in self.outputs])
        return self._staged(b, env, held, [c.op for c in cuts.values()], aliases)

    def _staged(self, b: FoldingBuilder, env: Mapping[str, Value], held: Sequence[onnx.NodeProto],
                host_ops: Sequence[HostOp], aliases: Mapping[str, str]) -> StagedProgram:
        """The head converted so far, the host ops, and the held nodes as the tail, a SymbolicProgram over the
        values it reads from the head and the host ops' outputs."""
        read = dict.fromkeys(n for node in held for n in sorted(_reads(node)))
        read.update(dict.fromkeys(self.outputs))
        known = [n for n in read if n in env]
        constants = {n: a for n in known if (a := b.constant_of(env[n])) is not None}
        computed = [n for n in known if n not in constants]
        links = tuple(dict.fromkeys([*computed, *(n for op in host_ops for n in op.inputs if n)]))
        inputs = [SymbolicInput(n, env[n].dtype, env[n].shape) for n in computed]
        inputs += [SymbolicInput(op.outputs[0], "int64",
                                 output_dims(op.kind, [env[n].shape if n else None for n in op.inputs],
                                             symbol_name(op.outputs[0]))) for op in host_ops]

        def resume(shapes: Mapping[str, Sequence[int]], _: Mapping[str, np.ndarray]) -> Program | StagedProgram:
            tail = FoldingBuilder(self.name)
            tail_env = {n: tail.create_constant(a, dtype=str(a.dtype)) for n, a in constants.items()}
            tail_env.update((i.name, tail.create_input(i.dtype, shapes[i.name], i.name)) for i in inputs)
            tail_env.update((alias, tail_env[first]) for alias, first in aliases.items())
            return self.convert(tail, held, tail_env)

        head = _named_outputs(b, [(n, env[n]) for n in links])
        return StagedProgram(self.name, head, links, tuple(host_ops), SymbolicProgram(self.name, tuple(inputs), resume))


def _run_time(b: FoldingBuilder, node: onnx.NodeProto, env: Mapping[str, Value]) -> bool:
    """Whether a run-time sized node's inputs are computed at run time (else its converter folds it)."""
    return any(b.constant_of(env[n]) is None for n in node.input if n)


def _cut(node: onnx.NodeProto, env: Mapping[str, Value], index: int) -> _Cut:
    """The host op of a run-time sized node (its one output, as its schema has)."""
    kind = ops_dynamic.RUN_TIME_SIZED[converter_key(node)]
    attrs = ops_dynamic.host_attrs(node)
    op = HostOp(kind, tuple(node.input), (node.output[0],), attrs, node.name or f"{node.op_type}#{index}")
    return _Cut(op, (kind, attrs, tuple(env[n].name if n else "" for n in node.input)))


def _reads(node: onnx.NodeProto) -> set[str]:
    """The values a node reads: its inputs, and the enclosing values its subgraphs read by name."""
    return {n for n in node.input if n}.union(*(_free_names(g) for g in _subgraphs(node)))


def _subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    """A node's graph attributes (If's branches, Loop's and Scan's bodies)."""
    return [g for a in node.attribute for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else a.graphs)]


def _free_names(graph: onnx.GraphProto) -> set[str]:
    """The enclosing values a subgraph reads by name."""
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    defined |= {o for n in graph.node for o in n.output}
    used = {o.name for o in graph.output} | set().union(*(_reads(n) for n in graph.node))
    return used - defined


def _expanded(b: FoldingBuilder, node: onnx.NodeProto, env: Mapping[str, Value],
              budget: SubgraphBudget) -> list[onnx.NodeProto] | None:
    """The nodes that stand for a node so that a run-time sized op inside can be cut: Compress's NonZero and Gather,
    or the branch an If picks when it holds such an op (None: the node converts as it is)."""
    if converter_key(node) == "Compress":
        return ops_dynamic.expand_compress(node)
    if converter_key(node) != "If":
        return None
    cond = b.constant_of(env[node.input[0]])
    if cond is None or cond.size != 1:
        return None  # the converter says why
    branch = next(a.g for a in node.attribute if a.name == ("then_branch" if bool(cond.reshape(-1)[0]) else "else_branch"))
    if not _has_run_time_sized(branch):
        return None
    budget.charge(len(branch.node), f"If's branch {branch.name!r}")
    constants = [onnx.helper.make_node("Constant", [], [t.name], value=t) for t in branch.initializer]
    # the branch's names stay: the checker refuses one that the graph made before the If (and exporters name each
    # value once)
    results = [onnx.helper.make_node("Identity", [o.name], [r]) for o, r in zip(branch.output, node.output, strict=True)]
    return [*constants, *branch.node, *results]


def _has_run_time_sized(graph: onnx.GraphProto) -> bool:
    """Whether a graph (or a subgraph of it) holds a node whose output size is known only at run time."""
    return any(converter_key(n) in ops_dynamic.RUN_TIME_SIZED or converter_key(n) == "Compress" or
               any(map(_has_run_time_sized, _subgraphs(n))) for n in graph.node)


def _read(model, base_dir) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        source = "model"
        if base_dir is not None:
            model = _with_external_data(model, os.fspath(base_dir))
        proto = model
    else:
        source = path = os.fspath(model)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path}: no such ONNX file")
        try:
            proto = onnx.load(path)  # external data is resolved relative to the file
        except Exception as e:  # protobuf's DecodeError, RuntimeWarning-as-error, external-data OSError...
            raise OnnxImportError(f"{path}: not a valid ONNX model ({type(e).__name__}: {e})") from None
    if not proto.HasField("graph") or (not proto.graph.node and not proto.graph.output):
        raise OnnxImportError(f"{source}: not a valid ONNX model (no graph)")
    _check(proto, source)
    return proto


def _with_external_data(model: onnx.ModelProto, base_dir: str) -> onnx.ModelProto:
    """A copy of the model with its external tensor data read from base_dir."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    try:
        onnx.external_data_helper.load_external_data_for_model(copy, base_dir)
    except (OSError, ValueError) as e:
        raise OnnxImportError(f"external data under {base_dir}: {type(e).__name__}: {e}") from None
    return copy


def _check(proto: onnx.ModelProto, source: str) -> None:
    """onnx.checker (schemas, SSA form) and strict type and shape inference, as onnxruntime refuses the
    same models; its messages name the node ('node name: n' or '==> Context: ... Name: n')."""
    proto = _initializers_declared(proto)
    try:
        onnx.checker.check_model(proto)
    except onnx.checker.ValidationError as e:
        # a value declared with a type but no shape is refused by the checker yet accepted by onnxruntime (exporters
        # write such outputs): only that is let through
        if not str(e).startswith(_NO_SHAPE):
            _refuse(e, source)
    try:
        onnx.shape_inference.infer_shapes(proto, check_type=True, strict_mode=True)
    except onnx.shape_inference.InferenceError as e:
        _refuse(e, source)


_NO_SHAPE = "Field 'shape' of 'type' is required but missing"


def _initializers_declared(proto: onnx.ModelProto) -> onnx.ModelProto:
    """The model to check: at IR < 4 the checker wants every initializer of the main graph to be a graph input too,
    yet onnxruntime and OpenVINO read one that is not as a constant (as IR 4 does, and as the loader reads every
    initializer), so a copy declares those as inputs. A subgraph's inputs are positional (a Loop body's iteration
    number, condition, state): one of its initializers missing from them stays refused."""
    listed = {i.name for i in proto.graph.input}
    missing = [t for t in proto.graph.initializer if t.name not in listed]
    if proto.ir_version >= 4 or not missing:
        return proto
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    copy.graph.input.extend(onnx.helper.make_tensor_value_info(t.name, t.data_type, t.dims) for t in missing)
    return copy


def _refuse(e: Exception, source: str) -> None:
    """An invalid-model error with the checker's whole message, which names the node."""
    message = " ".join(line.strip() for line in str(e).splitlines() if line.strip())
    raise OnnxImportError(f"{source}: invalid ONNX model: {message}") from None


def _opset(proto: onnx.ModelProto) -> int:
    versions = [o.version for o in proto.opset_import if o.domain in DEFAULT_DOMAINS]
    version = versions[0] if versions else MAX_OPSET
    if not MIN_OPSET <= version <= MAX_OPSET:
        # older opsets differ in ways this importer does not model; newer ones may change ops silently
        raise OnnxImportError(f"opset {version} is not supported (supported: {MIN_OPSET} to {MAX_OPSET})")
    return version


def _check_supported(graph: onnx.GraphProto) -> None:
    """One error listing every unsupported op type with the nodes that use it, before converting anything."""
    unsupported: dict[str, list[str]] = {}
    for i, node in enumerate(graph.node):
        if converter_key(node) not in CONVERTERS:
            unsupported.setdefault(converter_key(node), []).append(node.name or f"#{i}")
    if unsupported:
        detail = "; ".join(f"{op} (nodes {', '.join(repr(n) for n in nodes)})" for op, nodes in sorted(unsupported.items()))
        raise NotImplementedError(f"unsupported ONNX op{'s' if len(unsupported) > 1 else ''}: {detail}")


def _runtime_inputs(graph: onnx.GraphProto) -> list[onnx.ValueInfoProto]:
    """The graph inputs fed at run time (old exports also list initializers as inputs)."""
    initialized = {t.name for t in graph.initializer}
    return [i for i in graph.input if i.name not in initialized]


def _symbolic_inputs(graph: onnx.GraphProto, shapes: dict[str, Sequence[int]]) -> tuple[SymbolicInput, ...]:
    """Each run-time input with its dims: given by input_shapes, else the model's (symbols where it names none)."""
    inputs = _runtime_inputs(graph)
    unknown = sorted(set(shapes) - {i.name for i in inputs})
    if unknown:
        raise OnnxImportError(f"input_shapes names {unknown}, which are not graph inputs; inputs: {[i.name for i in inputs]}")
    return tuple(SymbolicInput(i.name, onnx_dtype(i.type.tensor_type.elem_type, f"graph input {i.name!r}"),
                               _input_dims(i.name, i.type.tensor_type, shapes.get(i.name))) for i in inputs)


def _graph_inputs(b: FoldingBuilder, graph: onnx.GraphProto, shapes: Mapping[str, Sequence[int]],
                  values: Mapping[str, np.ndarray]) -> dict[str, Value]:
    """Initializers and inputs given by value become constants; the run-time inputs take the given static shapes."""
    env = {t.name: b.create_constant(tensor_to_array(t), t.name, onnx_dtype(t.data_type, f"initializer {t.name!r}"))
           for t in graph.initializer}
    for i in _runtime_inputs(graph):
        dtype = onnx_dtype(i.type.tensor_type.elem_type, f"graph input {i.name!r}")
        if i.name in values:
            env[i.name] = b.create_constant(values[i.name], i.name, dtype)
            continue
        env[i.name] = b.create_input(dtype, shapes[i.name], i.name)
    return env


def _input_dims(name: str, tensor: onnx.TypeProto.Tensor, given: Sequence[int] | None) -> tuple[Dim, ...]:
    """A graph input's dims: from input_shapes when given, else the model's; a dim_param (or a dim the model leaves
    unnamed) is a symbol."""
    dims = tensor.shape.dim if tensor.HasField("shape") else None
    if given is not None:
        given = shape_of(given, f"input_shapes[{name!r}]")
        if dims is not None and len(dims) != len(given):
            raise OnnxImportError(f"input_shapes[{name!r}] = {tuple(given)} has rank {len(given)}, the model's input has rank {len(dims)}")
        return given
    if dims is None:
        raise OnnxImportError(f"graph input {name!r} has no shape in the model; pass input_shapes={{{name!r}: (...)}}")
    return tuple(d.dim_value if d.HasField("dim_value") else symbol_name(d.dim_param or f"{name}_{k}")
                 for k, d in enumerate(dims))


def _convert(b: FoldingBuilder, node: onnx.NodeProto, env: dict[str, Value], opset: int, budget: SubgraphBudget) -> None:
    """Convert one node, binding its outputs; errors name the node."""
    where = f"ONNX node {node.name or '(unnamed)'!r} ({node.op_type})"
    undefined = [n for n in node.input if n and n not in env]
    if undefined:
        raise OnnxImportError(f"{where}: reads undefined values {undefined}")
    ctx = NodeContext(b, node, tuple(env[n] if n else None for n in node.input), opset, env, budget)
    try:
        outputs = list(CONVERTERS[converter_key(node)](ctx))
    except (ValueError, TypeError, NotImplementedError) as e:
        raise type(e)(f"{where}: {e}", *e.args[1:]) from None
    for k, name in enumerate(node.output):
        if not name:
            continue
        if k >= len(outputs):
            raise NotImplementedError(f"{where}: output {k} ({name!r}) is not supported")
        env[name] = outputs[k]


def _named_outputs(b: FoldingBuilder, outputs: list[tuple[str, Value]]) -> Program:
    """Build the Program with its outputs renamed to the ONNX output names (inputs and repeats are copied)."""
    values = b.distinct([v for _, v in outputs])
    program = b.build(values)
    taken = program_names(program)
    renames = {v.name: name for (name, _), v in zip(outputs, values, strict=True) if name not in taken}
    return _rename(program, renames)


def _rename(program: Program, renames: dict[str, str]) -> Program:
    """A copy of the program with some node-produced or constant values renamed."""
    def value(v: Value) -> Value:
        return Value(renames[v.name], v.type) if v.name in renames else v

    def node(n: Node) -> Node:
        return Node(n.op, tuple(map(value, n.inputs)), tuple(map(value, n.outputs)), n.attrs, n.name)

    return program.replace(
        nodes=tuple(map(node, program.nodes)),
        outputs=tuple(map(value, program.outputs)),
        constants={renames.get(k, k): a for k, a in program.constants.items()},
    )


# a Loop or Scan becomes one copy of its body per iteration, and nested loops multiply: the nodes converted from
# subgraphs may exceed those the model holds in subgraphs by this many, counted over the whole model
MAX_UNROLLED_NODES = 4096


def _subgraph_nodes(graph: onnx.GraphProto) -> int:
    """The nodes of every subgraph in a graph, nested ones included."""
    return sum(len(g.node) + _subgraph_nodes(g) for node in graph.node for g in _subgraphs(node))


class Direction(enum.IntEnum):
    """Which end of its axis Scan's first iteration reads a scan input from or writes a scan output to."""

    FORWARD = 0
    REVERSE = 1


Scanned = tuple[int, Direction]  # a scan input's or output's axis and direction


@dataclasses.dataclass
class _Body:
    """A subgraph (If's branch, Loop's or Scan's body) converted inline, once per run: it reads the enclosing scope's
    values by name, and each run binds its inputs in a copy of that scope, so its own names neither leak out nor
    collide between iterations."""

    ctx: NodeContext
    graph: onnx.GraphProto
    what: str
    constants: Mapping[str, Value]

    @classmethod
    def of(cls, ctx: NodeContext, attr: str, what: str) -> _Body:
        """The node's graph attribute `attr`, refused up front when it uses an unsupported op."""
        graph = ctx.attr(attr, None)
        _check_supported(graph)
        constants = ctx.budget.constants(graph, lambda: {t.name: ctx.b.create_constant(tensor_to_array(t))
                                                         for t in graph.initializer})
        return cls(ctx, graph, f"{what} {graph.name!r}", constants)

    def run(self, inputs: Sequence[Value]) -> list[Value]:
        """The body's outputs, its inputs bound to `inputs`; each run is charged to the import's subgraph budget."""
        self.ctx.budget.charge(len(self.graph.node), self.what)
        env = {**self.ctx.scope, **self.constants}
        env.update((i.name, v) for i, v in zip(self.graph.input, inputs, strict=True))
        for node in self.graph.node:
            _convert(self.ctx.b, node, env, self.ctx.opset, self.ctx.budget)
        missing = [o.name for o in self.graph.output if o.name not in env]
        if missing:
            raise OnnxImportError(f"{self.what} does not produce its outputs {missing}")
        return [env[o.name] for o in self.graph.output]


def _one(data: np.ndarray, what: str) -> np.generic:
    """The single value of a known condition or count."""
    if data.size != 1:
        raise OnnxImportError(f"{what} must hold one value, got shape {data.shape}")
    return data.reshape(-1)[0]


@converter("If")
def if_(ctx: NodeContext):
    """The branch its condition picks, inlined: the condition must be known when converting (a constant, computed
    from shapes, or a graph input read by value: the model is then specialized per value, as for a shape input)."""
    cond = _one(ctx.require_const(0, "If's condition"), "If's condition")
    return _Body.of(ctx, "then_branch" if bool(cond) else "else_branch", "If's branch").run([])


@converter("Loop")
def loop(ctx: NodeContext):
    """Unrolled: the trip count and the condition before each iteration must be known when converting (as If's
    condition; the body may compute it from constants and the iteration number); the loop-carried values end as
    the outputs, and each scan output is its values of every iteration stacked along a new axis 0."""
    body = _Body.of(ctx, "body", "Loop's body")
    if ctx.input(0) is None and ctx.input(1) is None:
        raise OnnxImportError("Loop has neither a trip count nor a condition: it never ends")
    what = "Loop is unrolled when converting: its trip count"
    trips = math.inf if ctx.input(0) is None else int(_one(ctx.require_const(0, what), "Loop's trip count"))
    cond, n_carried = ctx.input(1), len(ctx.inputs) - 2
    carried, steps = list(ctx.inputs[2:]), list[list[Value]]()
    while len(steps) < trips and (cond is None or _known_condition(ctx.b, cond, len(steps))):
        iteration, cond_in = ctx.b.create_constant(np.int64(len(steps))), ctx.b.create_constant(np.bool_(True))
        outputs = body.run([iteration, cond_in, *carried])
        # without a condition input the body's is ignored (a for loop)
        cond = None if ctx.input(1) is None else outputs[0]
        carried = outputs[1 : n_carried + 1]
        steps.append(outputs[n_carried + 1 :])
    n_scanned = len(body.graph.output) - 1 - n_carried
    return carried + _stacked(ctx, steps, [(0, Direction.FORWARD)] * n_scanned, ctx.node.output[n_carried:])


def _known_condition(b: FoldingBuilder, cond: Value, iteration: int) -> bool:
    """Loop's condition before an iteration (its input, then what the body computed), which unrolling must know."""
    data = b.constant_of(cond)
    if data is None:
        raise NeedsConstant(f"Loop is unrolled when converting: its condition before iteration {iteration} "
                            f"{NEEDS_CONSTANT}", b.input_sources(cond))
    return bool(_one(data, "Loop's condition"))


@converter("Scan")
def scan(ctx: NodeContext):
    """Unrolled over the scanned axis (its static length): each iteration reads one slice of every scan input
    (from the end where its direction is reverse) and the state; each scan output stacks its iterations along its
    axis. Opset 8's batched form (axis 0 a batch, axis 1 scanned) unrolls every batch element."""
    body = _Body.of(ctx, "body", "Scan's body")
    n_inputs = ctx.attr("num_scan_inputs", None)
    if ctx.opset < 9:
        return _batched_scan(ctx, body, n_inputs)
    n_states = len(ctx.inputs) - n_inputs
    xs = ctx.inputs[n_states:]
    axes = ctx.attr("scan_input_axes", [0] * n_inputs)
    if len(axes) != n_inputs:
        raise OnnxImportError(f"Scan's scan_input_axes {list(axes)} must hold {n_inputs} axes, one per scan input")
    reads = list(zip((normalize_axis("Scan", a, len(x.shape)) for a, x in zip(axes, xs, strict=True)),
                     _directions(ctx, "scan_input_directions", n_inputs), strict=True))
    n_outputs = len(body.graph.output) - n_states
    writes = list(zip(ctx.attr("scan_output_axes", [0] * n_outputs), _directions(ctx, "scan_output_directions", n_outputs),
                      strict=True))
    return _unrolled_scan(ctx, body, list(ctx.inputs[:n_states]), list(xs), reads, writes)


def _directions(ctx: NodeContext, attr: str, count: int) -> list[Direction]:
    """A Scan attribute listing one direction (0 forward, 1 reverse) per scan input or output."""
    values = list(ctx.attr(attr, [0] * count))
    if len(values) != count or not set(values) <= set(Direction):
        raise OnnxImportError(f"Scan's {attr} {values} must hold {count} directions, each 0 (forward) or 1 (reverse)")
    return [Direction(v) for v in values]


def _unrolled_scan(ctx: NodeContext, body: _Body, states: list[Value], xs: list[Value], reads: list[Scanned],
                   writes: list[Scanned]) -> list[Value]:
    """The final states and the stacked scan outputs of Scan's body run over the scanned axes of xs."""
    lengths = sorted({x.shape[axis] for x, (axis, _) in zip(xs, reads, strict=True)})
    if len(lengths) != 1:
        raise OnnxImportError(f"Scan's inputs {[x.shape for x in xs]} differ in length along their scanned axes "
                              f"{[axis for axis, _ in reads]}")
    slices = [_unstack(ctx.b, x, axis)[:: -1 if d is Direction.REVERSE else 1] for x, (axis, d) in zip(xs, reads, strict=True)]
    steps = []
    for t in range(lengths[0]):
        outputs = body.run([*states, *(s[t] for s in slices)])
        states = outputs[: len(states)]
        steps.append(outputs[len(states) :])
    return states + _stacked(ctx, steps, writes, ctx.node.output[len(ctx.node.output) - len(writes) :])


def _batched_scan(ctx: NodeContext, body: _Body, n_inputs: int) -> list[Value]:
    """Opset 8's Scan: every input's axis 0 is a batch, each element scanned along its next axis; every sequence
    must be full length (sequence_lens omitted, or all the scanned length)."""
    values = list(ctx.inputs[1:])
    if ctx.input(0) is not None:
        lengths = ctx.require_const(0, "Scan's sequence_lens")
        if np.any(lengths != values[-1].shape[1]):
            raise OnnxImportError(f"Scan's sequence_lens {lengths.tolist()} are not all the scanned length "
                                  f"{values[-1].shape[1]}: variable-length sequences are not supported")
    n_states = len(values) - n_inputs
    reads = [(0, d) for d in _directions(ctx, "directions", n_inputs)]
    writes = [(0, Direction.FORWARD)] * (len(body.graph.output) - n_states)
    elements = [_unstack(ctx.b, v, 0) for v in values]
    results = [_unrolled_scan(ctx, body, [e[i] for e in elements[:n_states]], [e[i] for e in elements[n_states:]],
                              reads, writes) for i in range(values[0].shape[0])]
    return _stacked(ctx, results, [(0, Direction.FORWARD)] * len(results[0]), ctx.node.output)


def _unstack(b: FoldingBuilder, x: Value, axis: int) -> list[Value]:
    """x's slices along an axis, that axis dropped."""
    n = x.shape[axis]
    parts = b.split(x, [1] * n, axis=axis) if n > 1 else (x,)
    return [b.squeeze(p, [axis]) for p in parts]


def _stacked(ctx: NodeContext, steps: list[list[Value]], writes: list[Scanned], names: Sequence[str]) -> list[Value]:
    """Each scan output: its value of every iteration (steps[i][k]) stacked along a new axis, last first where its
    direction is reverse; every iteration's value must have one shape."""
    if writes and not steps:
        raise OnnxImportError(f"{ctx.node.op_type} runs no iteration, so its scan outputs {list(names)} would be empty, "
                              "with shapes no iteration gives: zero-size tensors of unknown shape are not supported")
    outputs = []
    for k, ((axis, direction), name) in enumerate(zip(writes, names, strict=True)):
        values = [step[k] for step in steps][:: -1 if direction is Direction.REVERSE else 1]
        shapes = list(dict.fromkeys(v.shape for v in values))
        if len(shapes) > 1:
            raise OnnxImportError(f"{ctx.node.op_type}'s scan output {name!r} changes shape between iterations "
                                  f"({shapes[0]}, then {shapes[1]}): its iterations cannot be stacked")
        parts = [ctx.b.expand_dims(v, [axis]) for v in values]
        outputs.append(ctx.b.concat(parts, axis=axis) if len(parts) > 1 else parts[0])
    return outputs
