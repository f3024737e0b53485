"""NetBuilder: CINN's op-by-op graph builder; every op method comes from the op table."""
from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

from cinn.ir import Attrs, Node, Program, TensorType, Value
from cinn.ops import OPS, OpDef, get_op, infer


class NetBuilder:
    """Builds a Program one op at a time; shapes and dtypes are inferred and checked at each call.

    Every op of the table is a method: tensor inputs first (a list for variadic ops such as concat),
    then the op's attributes in their declared order or by keyword, e.g.
    ``b.reduce_sum(x, dim=[1], keep_dim=True)`` or ``b.conv2d(x, w, strides=[2, 2])``.
    """

    def __init__(self, name: str = "program"):
        self.name = name
        self._inputs: list[Value] = []
        self._nodes: list[Node] = []
        self._constants: dict[str, np.ndarray] = {}
        self._names: set[str] = set()
        self._counter = itertools.count()

    @classmethod
    def continuing(cls, program: Program) -> NetBuilder:
        """A builder holding a program's inputs and constants, for passes that re-emit its nodes."""
        b = cls(program.name)
        b._inputs = list(program.inputs)
        b._constants = dict(program.constants)
        b._names = {v.name for v in program.inputs} | set(program.constants) | {v.name for n in program.nodes for v in n.outputs}
        return b

    def append(self, node: Node) -> None:
        """Append an already-typed node (used by passes)."""
        self._nodes.append(node)

    # -- values ---------------------------------------------------------------------------
    def create_input(self, dtype: str, shape: Sequence[int], name: str) -> Value:
        """Declare a graph input fed at run time."""
        value = Value(self._claim(name), TensorType(tuple(shape), dtype))
        self._inputs.append(value)
        return value

    def create_constant(self, array: Any, name: str | None = None, dtype: str | None = None) -> Value:
        """A compile-time constant (weights, biases); the array is copied."""
        data = np.array(array, dtype=dtype)
        if data.dtype == np.float64 and dtype is None:
            data = data.astype(np.float32)
        name = self._claim(name or self._fresh("constant"))
        value = Value(name, TensorType(data.shape, data.dtype))
        self._constants[name] = data
        return value

    def fill_constant(self, shape: Sequence[int], value: float, dtype: str = "float32", name: str | None = None) -> Value:
        """A constant tensor filled with one value."""
        return self.create_constant(np.full(tuple(shape), value, dtype=dtype), name or self._fresh("fill_constant"))

    # -- ops ------------------------------------------------------------------------------
    def op(self, name: str, inputs: Sequence[Value], attrs: Attrs | None = None) -> tuple[Value, ...]:
        """Append one op application and return its output values."""
        opdef = get_op(name)
        attrs = attrs if attrs is not None else opdef.attrs()
        types = [v.type for v in inputs]
        out_types = infer(opdef, types, attrs)
        node_name = self._fresh(name)
        outputs = tuple(Value(self._claim(node_name if len(out_types) == 1 else f"{node_name}_{i}"), t) for i, t in enumerate(out_types))
        self._nodes.append(Node(name, tuple(inputs), outputs, attrs, node_name))
        return outputs

    def build(self, outputs: Sequence[Value]) -> Program:
        """The finished Program returning `outputs` (in that order)."""
        known = {v.name for v in self._inputs} | set(self._constants) | {v.name for n in self._nodes for v in n.outputs}
        for v in outputs:
            if not isinstance(v, Value) or v.name not in known:
                raise ValueError(f"build: output {v!r} is not a value of this builder")
        return Program(self.name, tuple(self._inputs), tuple(self._nodes), tuple(outputs), dict(self._constants))

    def __getattr__(self, name: str):
        if name.startswith("_") or name not in OPS:
            raise AttributeError(f"NetBuilder has no op or attribute {name!r}")
        return _OpMethod(self, OPS[name])

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(OPS))

    # -- helpers --------------------------------------------------------------------------
    def _fresh(self, prefix: str) -> str:
        while True:
            name = f"{prefix}_{next(self._counter)}"
            if name not in self._names:
                return name

    def _claim(self, name: str) -> str:
        if name in self._names:
            raise ValueError(f"duplicate value name {name!r}")
        self._names.add(name)
        return name

    def _as_value(self, x: Any, like: Value | None) -> Value:
        """Python scalars and arrays used as op inputs become constants of the other input's dtype."""
        if isinstance(x, Value):
            return x
        return self.create_constant(x, dtype=like.dtype if like is not None else None)


class _OpMethod:
    """A bound op of the table, called like a CINN NetBuilder method."""

    def __init__(self, builder: NetBuilder, opdef: OpDef):
        self._b, self._op = builder, opdef
        self.__doc__ = opdef.doc or f"Apply op {opdef.name}."

    def __call__(self, *args, **kwargs):
        op = self._op
        if op.num_inputs is None:
            tensors, rest = list(args[0]), args[1:]
        else:
            tensors, rest = list(args[: op.num_inputs]), args[op.num_inputs :]
        if op.num_inputs is not None and len(tensors) < op.num_inputs:
            raise TypeError(f"{op.name}: expects {op.num_inputs} tensor inputs, got {len(tensors)}")
        like = next((t for t in tensors if isinstance(t, Value)), None)
        tensors = [self._b._as_value(t, like) for t in tensors]
        outs = self._b.op(op.name, tensors, _make_attrs(op, rest, kwargs))
        return outs[0] if len(outs) == 1 else outs


def _make_attrs(op: OpDef, args: Sequence[Any], kwargs: dict[str, Any]) -> Attrs:
    fields = [f.name for f in dataclasses.fields(op.attrs)]
    if len(args) > len(fields):
        raise TypeError(f"{op.name}: too many arguments; attributes are {fields}")
    values = dict(zip(fields, args))
    for k, v in kwargs.items():
        if k not in fields:
            raise TypeError(f"{op.name}: unknown attribute {k!r}; attributes are {fields}")
        if k in values:
            raise TypeError(f"{op.name}: attribute {k!r} given twice")
        values[k] = v
    return op.attrs(**values)
