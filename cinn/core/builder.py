"""NetBuilder: CINN's op-by-op graph builder, and the one emitter that every pass and importer uses.

Every op method comes from the op table. Passes emit nodes through `new_node` with the same naming rule, so a
multi-output op's values are named alike wherever they are made.
"""
from __future__ import annotations

import dataclasses
import itertools
import warnings
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from cinn.core.ir import Attrs, Node, Program, ShapeTooLarge, TensorType, Value, shape_of
from cinn.core.ops import OPS, OpDef, get_op, infer
from cinn.core.symbolic import PROBES, SymbolicInput, SymbolicProgram, reinfer, symbolic_dims


class Names:
    """The value names of one program: claims are checked for repeats, fresh names are numbered."""

    def __init__(self, taken: Iterable[str] = ()):
        self._taken = set(taken)
        self._counter = itertools.count()

    def claim(self, name: str) -> str:
        """Take a name chosen by the user; a repeat raises."""
        if name in self._taken:
            raise ValueError(f"duplicate value name {name!r}")
        self._taken.add(name)
        return name

    def __contains__(self, name: str) -> bool:
        return name in self._taken

    def fresh(self, prefix: str) -> str:
        """An unused name `prefix_N`, taken."""
        while (name := f"{prefix}_{next(self._counter)}") in self._taken:
            pass
        self._taken.add(name)
        return name


def program_names(program: Program) -> set[str]:
    """Every value name a program uses."""
    return {v.name for v in program.inputs} | set(program.constants) | {v.name for n in program.nodes for v in n.outputs}


def new_node(op: str, inputs: Sequence[Value], attrs: Attrs | None, names: Names) -> Node:
    """One typed op application: outputs inferred and named `op_N` (one output) or `op_N_i` (several)."""
    opdef = get_op(op)
    attrs = attrs if attrs is not None else opdef.attrs()
    types = infer(opdef, [v.type for v in inputs], attrs)
    node_name = names.fresh(op)  # taken: it also names a single output
    out_names = [node_name] if len(types) == 1 else [f"{node_name}_{i}" for i in range(len(types))]
    while len(types) > 1 and any(n in names for n in out_names):  # a program built elsewhere may hold them
        node_name = names.fresh(op)
        out_names = [f"{node_name}_{i}" for i in range(len(types))]
    if len(types) > 1:
        out_names = [names.claim(n) for n in out_names]
    outputs = tuple(Value(n, t) for n, t in zip(out_names, types, strict=True))
    return Node(op, tuple(inputs), outputs, attrs, node_name)


class NetBuilder:
    """Builds a Program one op at a time; shapes and dtypes are inferred and checked at each call.

    Every op of the table is a method: tensor inputs first (a list for variadic ops such as concat),
    then the op's attributes in their declared order or by keyword, e.g.
    ``b.reduce_sum(x, dim=[1], keep_dim=True)`` or ``b.conv2d(x, w, strides=[2, 2])``.
    Values belong to the builder that made them: using another builder's value raises.
    """

    def __init__(self, name: str = "program"):
        self.name = name
        self._inputs: list[Value] = []
        self._nodes: list[Node] = []
        self._constants: dict[str, np.ndarray] = {}
        self._names = Names()
        # values are compared by name and type, and names like relu_0 repeat across builders: ownership is by identity
        self._owned: dict[int, Value] = {}
        self._symbolic: dict[str, SymbolicInput] = {}  # inputs with symbolic dims, by name
        self._probes: dict[str, int] = {}  # each symbol's size while the program is written

    @classmethod
    def continuing(cls, program: Program) -> NetBuilder:
        """A builder holding a program's inputs and constants, for passes that re-emit its nodes."""
        b = cls(program.name)
        b._inputs = list(program.inputs)
        b._constants = dict(program.constants)
        b._names = Names(program_names(program))
        b._own(*program.inputs, *program.outputs, *(v for n in program.nodes for v in (*n.inputs, *n.outputs)))
        return b

    def append(self, node: Node) -> None:
        """Append an already-typed node (used by passes)."""
        self._nodes.append(node)
        self._own(*node.inputs, *node.outputs)

    # -- values ---------------------------------------------------------------------------
    def create_input(self, dtype: str, shape: Sequence[int | str], name: str) -> Value:
        """Declare a graph input fed at run time; dims may be symbol names (``("batch", 784)``), which makes the
        program symbolic (see build_symbolic). Values of a symbolic program show each symbol at a probe size."""
        dims = symbolic_dims(shape, f"input {name!r}")
        if any(isinstance(d, str) for d in dims):
            self._symbolic[name] = SymbolicInput(name, str(np.dtype(dtype)), dims)
            shape = [self._probe(d) if isinstance(d, str) else d for d in dims]
        try:
            t = TensorType(shape_of(shape, f"input {name!r}"), dtype)
        except ShapeTooLarge as e:
            raise ShapeTooLarge(f"input {name!r}: {e}") from None
        value = Value(self._names.claim(name), t)
        self._inputs.append(value)
        self._own(value)
        return value

    def create_constant(self, array: Any, name: str | None = None, dtype: str | None = None) -> Value:
        """A compile-time constant (weights, biases); the array is copied."""
        data = np.array(array, dtype=dtype)
        if data.dtype == np.float64 and dtype is None:
            data = data.astype(np.float32)
        return self._add_constant(data, self._names.claim(name) if name else self._names.fresh("constant"))

    def fill_constant(self, shape: Sequence[int], value: float, dtype: str = "float32", name: str | None = None) -> Value:
        """A constant tensor filled with one value."""
        data = np.full(shape_of(shape, "fill_constant"), value, dtype=dtype)
        return self._add_constant(data, self._names.claim(name) if name else self._names.fresh("fill_constant"))

    # -- ops ------------------------------------------------------------------------------
    def op(self, name: str, inputs: Sequence[Value], attrs: Attrs | None = None) -> tuple[Value, ...]:
        """Append one op application and return its output values."""
        for v in inputs:
            self._check_owned(v, f"{name}: input")
        node = new_node(name, inputs, attrs, self._names)
        self.append(node)
        return node.outputs

    def build(self, outputs: Sequence[Value]) -> Program:
        """The finished Program returning `outputs` (in that order)."""
        if self._symbolic:
            raise TypeError(f"build: inputs {sorted(self._symbolic)} of {self.name!r} have symbolic dims; "
                            "build_symbolic() makes their program")
        return self._program(outputs)

    def build_symbolic(self, outputs: Sequence[Value]) -> SymbolicProgram:
        """The finished program of symbolic inputs: at each binding of its symbols every op is inferred again, so
        attributes must not hold a symbol's probe size (reshape takes 0 to keep a dim and -1 to infer one)."""
        program = self._program(outputs)
        _warn_probe_sizes(program, self._probes)
        inputs = tuple(self._symbolic.get(v.name) or SymbolicInput(v.name, v.dtype, v.shape) for v in program.inputs)
        return SymbolicProgram(self.name, inputs, lambda shapes, _: reinfer(program, shapes))

    def input_sources(self, value: Value | None) -> tuple[str, ...]:
        """The graph inputs a value is computed from (an importer names them when it needs the value itself)."""
        producers = {o.name: n for n in self._nodes for o in n.outputs}
        inputs = {v.name for v in self._inputs}
        found: dict[str, None] = {}
        stack, seen = [value] if value is not None else [], set()
        while stack:
            v = stack.pop()
            if v.name in seen:
                continue
            seen.add(v.name)
            if v.name in inputs:
                found[v.name] = None
            elif v.name in producers:
                stack.extend(producers[v.name].inputs)
        return tuple(found)

    def _program(self, outputs: Sequence[Value]) -> Program:
        if isinstance(outputs, Value) or not isinstance(outputs, Sequence):
            raise TypeError(f"build: outputs must be a list of values, got {type(outputs).__name__}")
        if not outputs:
            raise ValueError(f"build: program {self.name!r} needs at least one output")
        for v in outputs:
            self._check_owned(v, "build: output")
        return Program(self.name, tuple(self._inputs), tuple(self._nodes), tuple(outputs), dict(self._constants))

    def _probe(self, symbol: str) -> int:
        if symbol not in self._probes:
            if len(self._probes) == len(PROBES):
                raise ValueError(f"NetBuilder {self.name!r}: at most {len(PROBES)} symbols")
            self._probes[symbol] = PROBES[len(self._probes)]
        return self._probes[symbol]

    def __getattr__(self, name: str):
        if name.startswith("_") or name not in OPS:
            raise AttributeError(f"NetBuilder has no op or attribute {name!r}")
        return _OpMethod(self, OPS[name])

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(OPS))

    # -- helpers --------------------------------------------------------------------------
    def _add_constant(self, data: np.ndarray, name: str) -> Value:
        """Add a constant under a name already taken."""
        self._constants[name] = data
        value = Value(name, TensorType(data.shape, str(data.dtype)))
        self._own(value)
        return value

    def _own(self, *values: Value) -> None:
        for v in values:
            self._owned[id(v)] = v

    def _check_owned(self, v: Any, what: str) -> None:
        if not isinstance(v, Value):
            raise TypeError(f"{what} {v!r} is not a Value")
        if id(v) not in self._owned:
            raise ValueError(f"{what} %{v.name} was made by another builder, not by NetBuilder {self.name!r}: "
                             "values cannot be shared between builders")

    def _as_value(self, x: Any, like: Value | None) -> Value:
        """Python scalars and arrays used as op inputs become constants of the other input's dtype."""
        if isinstance(x, Value):
            return x
        return self.create_constant(x, dtype=like.dtype if like is not None else None)


def _warn_probe_sizes(program: Program, probes: dict[str, int]) -> None:
    """Warn of attributes equal to a symbol's probe size: most likely read from a symbolic value's shape, they would
    stay fixed at every other size (a slice end, a reshape target)."""
    symbol_of = {n: s for s, n in probes.items()}
    for node in program.nodes:
        for f in dataclasses.fields(node.attrs):
            held = [d for d in _ints(getattr(node.attrs, f.name)) if d in symbol_of]
            if held:
                warnings.warn(f"{program.name}: node {node.name} ({node.op}) attribute {f.name} holds {held[0]}, the "
                              f"probe size of symbol {symbol_of[held[0]]}: a size read from a symbolic shape stays "
                              "fixed at other sizes", stacklevel=3)


def _ints(v: Any) -> list[int]:
    if isinstance(v, tuple):
        return [d for x in v for d in _ints(x)]
    return [int(v)] if isinstance(v, (int, np.integer)) and not isinstance(v, bool) else []


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
    values = dict(zip(fields, args, strict=False))  # fewer positional attributes than fields: the rest default
    for k, v in kwargs.items():
        if k not in fields:
            raise TypeError(f"{op.name}: unknown attribute {k!r}; attributes are {fields}")
        if k in values:
            raise TypeError(f"{op.name}: attribute {k!r} given twice")
        values[k] = v
    return op.attrs(**values)
