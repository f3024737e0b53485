"""Export a cinn Program (as built, before cinn's passes) to an ONNX model for onnxruntime."""
from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from cinn.core.ir import Node, Program, Value
from cinn.core.symbolic import SymbolicProgram

OPSET = 20  # Gelu is a standard op from opset 20 (onnxruntime >= 1.17 runs it)
IR_VERSION = 10  # onnxruntime rejects models with a newer IR version than it knows


class _Emitter:
    """Collects the ONNX nodes and initializers of one graph, with fresh names for temporaries."""

    def __init__(self, taken: set[str]):
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._taken = set(taken)
        self._counter = itertools.count()

    def fresh(self, prefix: str) -> str:
        """A name not used by any value of the graph."""
        while True:
            name = f"{prefix}__onnx{next(self._counter)}"
            if name not in self._taken:
                self._taken.add(name)
                return name

    def const(self, array: np.ndarray, prefix: str) -> str:
        """Add an initializer holding `array` and return its name."""
        name = self.fresh(prefix)
        self.initializers.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def scalar(self, value: float, like: Value, prefix: str) -> str:
        """A 0-d initializer with the dtype of `like`."""
        return self.const(np.asarray(value, dtype=like.dtype), prefix)

    def emit(self, op_type: str, inputs: Sequence[str], output: str | None = None, prefix: str = "t", **attrs) -> str:
        """Append one ONNX node; returns its (single) output name, fresh unless given."""
        out = output or self.fresh(prefix)
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], **attrs))
        return out


Converter = Callable[[_Emitter, Node], None]

# cinn ops whose semantics (numpy broadcasting included) are exactly one attribute-less ONNX op
_UNARY = {
    "relu": "Relu", "exp": "Exp", "log": "Log", "sqrt": "Sqrt", "tanh": "Tanh", "sigmoid": "Sigmoid", "erf": "Erf",
    "abs": "Abs", "negative": "Neg", "reciprocal": "Reciprocal", "sin": "Sin", "cos": "Cos", "floor": "Floor",
    "ceil": "Ceil", "round": "Round", "sign": "Sign", "identity": "Identity", "logical_not": "Not",
    "is_nan": "IsNaN", "is_inf": "IsInf",
}
_BINARY = {
    "add": "Add", "subtract": "Sub", "multiply": "Mul", "divide": "Div", "max": "Max", "min": "Min", "pow": "Pow",
    "equal": "Equal", "greater_than": "Greater", "less_than": "Less", "greater_equal": "GreaterOrEqual",
    "less_equal": "LessOrEqual", "logical_and": "And", "logical_or": "Or", "logical_xor": "Xor",
}


def _simple(op_type: str) -> Converter:
    """A converter for an op that maps one-to-one onto an attribute-less ONNX op."""

    def convert(e: _Emitter, n: Node) -> None:
        e.emit(op_type, [v.name for v in n.inputs], n.outputs[0].name)

    return convert


def _swap_last_two(e: _Emitter, v: Value) -> str:
    perm = list(range(len(v.shape)))
    perm[-2], perm[-1] = perm[-1], perm[-2]
    return e.emit("Transpose", [v.name], prefix=f"{v.name}_T", perm=perm)


def _matmul(e: _Emitter, n: Node) -> None:
    a = n.attrs
    x, y = n.inputs
    xn = _swap_last_two(e, x) if a.trans_x and len(x.shape) >= 2 else x.name
    yn = _swap_last_two(e, y) if a.trans_y and len(y.shape) >= 2 else y.name
    out = n.outputs[0]
    if a.alpha == 1.0:
        e.emit("MatMul", [xn, yn], out.name)
        return
    prod = e.emit("MatMul", [xn, yn], prefix=f"{out.name}_mm")
    e.emit("Mul", [prod, e.scalar(a.alpha, out, "alpha")], out.name)


def _gelu(e: _Emitter, n: Node) -> None:
    e.emit("Gelu", [n.inputs[0].name], n.outputs[0].name, approximate="tanh" if n.attrs.approximate else "none")


def _scale(e: _Emitter, n: Node) -> None:
    a, x, out = n.attrs, n.inputs[0], n.outputs[0]
    s, b = e.scalar(a.scale, x, "scale"), e.scalar(a.bias, x, "bias")
    if a.bias_after_scale:
        e.emit("Add", [e.emit("Mul", [x.name, s], prefix="scaled"), b], out.name)
    else:
        e.emit("Mul", [e.emit("Add", [x.name, b], prefix="biased"), s], out.name)


def _conv_pad_attrs(a) -> dict:
    """cinn's padding (algorithm, or 2 symmetric / 4 (top, left, bottom, right) values) as ONNX attributes."""
    if a.padding_algorithm == "SAME":
        return {"auto_pad": "SAME_UPPER"}  # extra padding at the bottom/right, as cinn
    if a.padding_algorithm == "VALID":
        return {"auto_pad": "VALID"}
    p = [int(v) for v in a.paddings]
    return {"pads": p + p if len(p) == 2 else p}  # 4 values are already ONNX's begins-then-ends


def _conv2d(e: _Emitter, n: Node) -> None:
    a = n.attrs
    if a.data_format != "NCHW":
        raise NotImplementedError(f"onnx export: conv2d with data_format {a.data_format!r} (only NCHW)")
    x, w = n.inputs
    e.emit(
        "Conv",
        [x.name, w.name],
        n.outputs[0].name,
        kernel_shape=list(w.shape[2:]),
        strides=list(a.strides),
        dilations=list(a.dilations),
        group=int(a.groups),
        **_conv_pad_attrs(a),
    )


def _batchnorm(e: _Emitter, n: Node) -> None:
    if n.attrs.data_layout != "NCHW":
        raise NotImplementedError(f"onnx export: batchnorm with data_layout {n.attrs.data_layout!r} (only NCHW)")
    e.emit("BatchNormalization", [v.name for v in n.inputs], n.outputs[0].name, epsilon=float(n.attrs.epsilon))


def _layer_norm(e: _Emitter, n: Node) -> None:
    a, x = n.attrs, n.inputs[0]
    norm_shape = x.shape[a.begin_norm_axis :]
    inputs = [x.name]
    for v in n.inputs[1:]:
        # Paddle keeps scale/bias flattened over the normalized dims; ONNX wants them broadcastable (a shape operand
        # only where one is reshaped: onnxruntime warns about every initializer no node reads)
        if v.shape == norm_shape:
            inputs.append(v.name)
        else:
            shape = e.const(np.array(norm_shape, np.int64), "shape")
            inputs.append(e.emit("Reshape", [v.name, shape], prefix=v.name))
    e.emit("LayerNormalization", inputs, n.outputs[0].name, axis=int(a.begin_norm_axis), epsilon=float(a.epsilon))


def _softmax_like(op_type: str) -> Converter:
    """softmax/log_softmax: ONNX (opset >= 13) normalizes over exactly one axis."""

    def convert(e: _Emitter, n: Node) -> None:
        axes = tuple(n.attrs.axes)
        if len(axes) != 1:
            raise NotImplementedError(f"onnx export: {n.op} over several axes {axes} (ONNX {op_type} takes one)")
        e.emit(op_type, [n.inputs[0].name], n.outputs[0].name, axis=int(axes[0]))

    return convert


def _reshape(e: _Emitter, n: Node) -> None:
    # the target as written: ONNX's Reshape reads 0 (keep the dim) and -1 (infer it) as cinn does, so a symbolic
    # program's reshapes stay valid at every size
    e.emit("Reshape", [n.inputs[0].name, e.const(np.array(n.attrs.shape, np.int64), "shape")], n.outputs[0].name)


def _transpose(e: _Emitter, n: Node) -> None:
    e.emit("Transpose", [n.inputs[0].name], n.outputs[0].name, perm=[int(p) for p in n.attrs.axis])


def _gather(e: _Emitter, n: Node) -> None:
    e.emit("Gather", [v.name for v in n.inputs], n.outputs[0].name, axis=int(n.attrs.axis))


def _slice(e: _Emitter, n: Node) -> None:
    a = n.attrs
    ints = [e.const(np.array(v, np.int64), label) for v, label in ((a.starts, "starts"), (a.ends, "ends"), (a.axes, "axes"))]
    steps = [e.const(np.array(a.strides, np.int64), "steps")] if a.strides else []
    e.emit("Slice", [n.inputs[0].name, *ints, *steps], n.outputs[0].name)


CONVERTERS: dict[str, Converter] = {
    **{op: _simple(t) for op, t in _UNARY.items()},
    **{op: _simple(t) for op, t in _BINARY.items()},
    "matmul": _matmul,
    "gelu": _gelu,
    "scale": _scale,
    "conv2d": _conv2d,
    "batchnorm": _batchnorm,
    "layer_norm": _layer_norm,
    "softmax": _softmax_like("Softmax"),
    "log_softmax": _softmax_like("LogSoftmax"),
    "reshape": _reshape,
    "transpose": _transpose,
    "gather": _gather,
    "slice": _slice,
}


def _value_info(v: Value, dims: Sequence[int | str | None]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(v.name, helper.np_dtype_to_tensor_dtype(np.dtype(v.dtype)), dims)


def _check_exportable(program: Program) -> None:
    """Raise before emitting anything if some node has no ONNX converter or uses unexported outputs."""
    used = {v.name for n in program.nodes for v in n.inputs} | {v.name for v in program.outputs}
    for n in program.nodes:
        if n.op not in CONVERTERS:
            raise NotImplementedError(f"onnx export: op {n.op!r} (node {n.name!r}) has no ONNX converter")
        extra = [v.name for v in n.outputs[1:] if v.name in used]
        if extra:
            raise NotImplementedError(f"onnx export: op {n.op!r} (node {n.name!r}) exports only its first output, but {extra} are used")
    produced = {v.name for n in program.nodes for v in n.outputs}
    passthrough = [v.name for v in program.outputs if v.name not in produced]
    if passthrough:
        raise NotImplementedError(f"onnx export: outputs {passthrough} are inputs or constants, not computed values")


def to_onnx(model: Program | SymbolicProgram) -> onnx.ModelProto:
    """The ONNX model computing a program: inputs stay inputs, constants become initializers; a symbolic program's
    symbols become dim_params (its outputs' shapes are left to ONNX's inference)."""
    program = model if isinstance(model, Program) else model.specialize(model.probe())
    if not isinstance(program, Program):
        raise NotImplementedError("onnx export: the program runs in stages (sizes known only at run time)")
    _check_exportable(program)
    taken = {v.name for v in program.inputs} | set(program.constants) | {v.name for n in program.nodes for v in n.outputs}
    e = _Emitter(taken)
    input_dims = [v.shape for v in program.inputs] if isinstance(model, Program) else [i.dims for i in model.inputs]
    probes = set() if isinstance(model, Program) else {n for _, n in model.probe().sizes}  # output dims left open
    for node in program.nodes:
        CONVERTERS[node.op](e, node)
    graph = helper.make_graph(
        e.nodes,
        program.name,
        [_value_info(v, d) for v, d in zip(program.inputs, input_dims, strict=True)],
        [_value_info(v, [None if d in probes else d for d in v.shape]) for v in program.outputs],
        [numpy_helper.from_array(np.asarray(a), name) for name, a in program.constants.items()] + e.initializers,
    )
    model = helper.make_model(graph, producer_name="cinn", opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return model


def save_onnx(program: Program | SymbolicProgram, path: str) -> None:
    """Export and write an ONNX file."""
    onnx.save(to_onnx(program), path)


__all__ = ["CONVERTERS", "IR_VERSION", "OPSET", "save_onnx", "to_onnx"]
