"""cinn.load_onnx: each ONNX node becomes NetBuilder calls (as CINN's op mappers), giving a Program."""
from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping, Sequence

import numpy as np
import onnx

from cinn.builder import program_names
from cinn.frontend.folding import FoldingBuilder
from cinn.frontend.onnx import (  # noqa: F401  (register converters)
    ops_attention,
    ops_contrib,
    ops_elementwise,
    ops_extra,
    ops_nn,
    ops_quant,
    ops_reduce,
    ops_resize,
    ops_rnn,
    ops_shape,
)
from cinn.frontend.onnx.registry import (
    CONVERTERS,
    DEFAULT_DOMAINS,
    NeedsConstant,
    NodeContext,
    OnnxImportError,
    converter,
    converter_key,
    onnx_dtype,
    tensor_to_array,
)
from cinn.ir import Node, Program, Value, shape_of
from cinn.symbolic import Dim, SymbolicInput, SymbolicProgram, symbol_name

# 7-21 is the contract; the newer opsets only added element types to the ops converted here (the
# conformance test runs their cases)
MIN_OPSET, MAX_OPSET = 7, 28


def load_onnx(model: str | os.PathLike | onnx.ModelProto, input_shapes: Mapping[str, Sequence[int]] | None = None, *,
              base_dir: str | os.PathLike | None = None) -> Program | SymbolicProgram:
    """Convert an ONNX model (a path or a ModelProto) to a Program; initializers become constants.

    Symbolic input dims (dim_params, unnamed dims) give a SymbolicProgram over them, unless input_shapes fixes them
    (it may also override static dims). External tensor data is read only beside the model file, or, for a
    ModelProto, from `base_dir` when given (never from the working directory). The model must pass onnx.checker's
    full check.
    """
    proto = _read(model, base_dir)
    _check_supported(proto.graph)
    opset = _opset(proto)
    inputs = _symbolic_inputs(proto.graph, dict(input_shapes or {}))
    name = proto.graph.name or "onnx_model"

    def shape_function(shapes: Mapping[str, Sequence[int]], values: Mapping[str, np.ndarray]) -> Program:
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
            values: Mapping[str, np.ndarray]) -> Program:
    """The Program of a checked model with static input shapes; inputs given by value are constants."""
    graph = proto.graph
    b = FoldingBuilder(graph.name or "onnx_model")
    env = _graph_inputs(b, graph, shapes, values)
    for node in graph.node:
        _convert(b, node, env, opset)
    missing = [o.name for o in graph.output if o.name not in env]
    if missing:
        raise OnnxImportError(f"graph outputs {missing} are not produced by any node")
    return _named_outputs(b, [(o.name, env[o.name]) for o in graph.output])


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
        _check_not_empty(b, env[i.name], f"graph input {i.name!r}")
    return env


def _check_not_empty(b: FoldingBuilder, v: Value, what: str) -> None:
    """Zero-size tensors computed at run time have no kernels (empty constants, such as no axes, are fine)."""
    if 0 in v.shape and b.constant_of(v) is None:
        raise OnnxImportError(f"{what} has shape {v.shape}: zero-size tensors are not supported")


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


def _convert(b: FoldingBuilder, node: onnx.NodeProto, env: dict[str, Value], opset: int) -> None:
    """Convert one node, binding its outputs; errors name the node."""
    where = f"ONNX node {node.name or '(unnamed)'!r} ({node.op_type})"
    undefined = [n for n in node.input if n and n not in env]
    if undefined:
        raise OnnxImportError(f"{where}: reads undefined values {undefined}")
    ctx = NodeContext(b, node, tuple(env[n] if n else None for n in node.input), opset, env)
    try:
        outputs = list(CONVERTERS[converter_key(node)](ctx))
    except (ValueError, TypeError, NotImplementedError) as e:
        raise type(e)(f"{where}: {e}", *e.args[1:]) from None
    for k, name in enumerate(node.output):
        if not name:
            continue
        if k >= len(outputs):
            raise NotImplementedError(f"{where}: output {k} ({name!r}) is not supported")
        _check_not_empty(b, outputs[k], f"{where}: output {name!r}")
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


@converter("If")
def if_(ctx: NodeContext):
    """The branch its condition picks, inlined: the condition must be known when converting (a constant, computed
    from shapes, or a graph input read by value: the model is then specialized per value, as for a shape input)."""
    cond = ctx.require_const(0, "If's condition")
    if cond.size != 1:
        raise OnnxImportError(f"If's condition must hold one value, got shape {cond.shape}")
    branch = ctx.attr("then_branch" if bool(cond.reshape(-1)[0]) else "else_branch", None)
    _check_supported(branch)
    env = dict(ctx.scope)  # the branch reads the enclosing graph's values by name; its own names stay inside
    env.update((t.name, ctx.b.create_constant(tensor_to_array(t))) for t in branch.initializer)
    for node in branch.node:
        _convert(ctx.b, node, env, ctx.opset)
    missing = [o.name for o in branch.output if o.name not in env]
    if missing:
        raise OnnxImportError(f"If's branch {branch.name!r} does not produce its outputs {missing}")
    return [env[o.name] for o in branch.output]
