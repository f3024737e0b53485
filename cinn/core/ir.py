"""The HLIR: typed values, op nodes and the Program graph that every front door produces."""
from __future__ import annotations

import dataclasses
import enum
import functools
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np

DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32", "float64")
# kernels index tensors with 32-bit integers (TVM's default): a larger tensor would overflow them or fail to allocate
MAX_ELEMENTS = 2**31 - 1


class ShapeTooLarge(ValueError):
    """A tensor shape with more elements than a kernel can index."""


def shape_of(shape: object, what: str) -> tuple[int, ...]:
    """A user-given shape as a tuple of ints; anything else (2.5, '34', a bare int) raises naming `what`."""
    if isinstance(shape, (str, bytes)) or not hasattr(shape, "__iter__"):
        raise TypeError(f"{what}: shape must be a sequence of ints, got {shape!r}")
    dims = tuple(shape)
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)):
            raise TypeError(f"{what}: shape {dims!r} has a non-integer dimension {d!r}")
    return tuple(int(d) for d in dims)


@dataclass(frozen=True)
class TensorType:
    """Static shape and dtype of a tensor."""

    shape: tuple[int, ...]
    dtype: str

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        object.__setattr__(self, "dtype", str(np.dtype(self.dtype)))
        if self.dtype not in DTYPES:
            raise ValueError(f"unsupported dtype {self.dtype!r}; supported: {', '.join(DTYPES)}")
        if any(d < 0 for d in self.shape):
            raise ValueError(f"negative dimension in shape {self.shape}")
        if self.size > MAX_ELEMENTS:
            raise ShapeTooLarge(f"shape {self.shape} has {self.size:.3g} elements; a tensor may have at most "
                                f"{MAX_ELEMENTS} (2**31 - 1)")

    @property
    def size(self) -> int:
        return math.prod(self.shape)  # exact: numpy's int64 product wraps (2**32 * 2**32 is 0)

    @property
    def nbytes(self) -> int:
        return self.size * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class SymbolicType:
    """A tensor type of a symbolic kernel: dims are ints or TIR expressions of the symbols (``batch * seq``), as the
    op table's computes see them when a kernel is lowered for every size at once."""

    shape: tuple[Any, ...]
    dtype: str
    # rows of the whole tiles a matmul with symbolic rows computes (the last tile reads the last row again; 1: no
    # padding, for rows fewer than a tile: batch 1)
    tile_rows: int = 8


@dataclass(frozen=True)
class Value:
    """A named SSA tensor value of a Program."""

    name: str
    type: TensorType

    @property
    def shape(self) -> tuple[int, ...]:
        return self.type.shape

    @property
    def dtype(self) -> str:
        return self.type.dtype


@dataclass(frozen=True)
class Attrs:
    """Base of every op's typed attributes: frozen, hashable (lists become tuples)."""

    if TYPE_CHECKING:  # code handed a node's attrs reads its op's fields, which each op's subclass declares

        def __getattr__(self, name: str) -> Any: ...

    def __post_init__(self):
        hints = field_types(type(self))
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, list):
                v = _freeze(v)
                object.__setattr__(self, f.name, v)
            if not conforms(v, hints[f.name]):
                raise TypeError(f"{type(self).__name__}: attribute {f.name!r} must be {type_name(hints[f.name])}, "
                                f"got {v!r}")


def _freeze(v):
    return tuple(_freeze(x) for x in v) if isinstance(v, (list, tuple)) else v


@functools.cache
def field_types(cls: type) -> dict[str, Any]:
    """The resolved type hints of a dataclass's fields, by name."""
    return typing.get_type_hints(cls)


def conforms(value: Any, hint: Any) -> bool:
    """Whether an attribute value has its declared type: ints for int (not bools), numbers for float, tuples of the
    element type, one of a union's members; an enum field also takes its values' strings (ops convert them)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        return any(conforms(value, a) for a in args)
    if origin is tuple:
        if not isinstance(value, tuple):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(conforms(x, args[0]) for x in value)
        return len(value) == len(args) and all(conforms(x, a) for x, a in zip(value, args, strict=True))
    if hint is Any or origin is not None:
        return True
    if hint is float:
        return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, (int, np.integer)) and not isinstance(value, bool)
    if hint is type(None):
        return value is None
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return isinstance(value, (hint, str))
    return isinstance(value, hint) if isinstance(hint, type) else True


def type_name(hint: Any) -> str:
    """A type hint as messages show it."""
    return hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")


@dataclass(frozen=True)
class NoAttrs(Attrs):
    """Attributes of an op that has none."""


@dataclass(frozen=True)
class Node:
    """One op application: inputs and outputs are Values, attrs the op's typed attributes."""

    op: str
    inputs: tuple[Value, ...]
    outputs: tuple[Value, ...]
    attrs: Attrs = NoAttrs()
    name: str = ""


@dataclass(frozen=True)
class Program:
    """A graph of nodes in topological order with its inputs, constants and outputs."""

    name: str
    inputs: tuple[Value, ...]
    nodes: tuple[Node, ...]
    outputs: tuple[Value, ...]
    constants: Mapping[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "constants", MappingProxyType(dict(self.constants)))

    def __reduce__(self):
        # (for the worker transport and users' own processes: cinn keeps no pickle on disk, cinn.core.ir_json is its format)
        # pickle cannot take the read-only mapping proxy: the constants travel as a plain dict
        return Program, (self.name, self.inputs, self.nodes, self.outputs, dict(self.constants))

    def replace(self, **changes) -> Program:
        """Return a copy with some fields changed."""
        return dataclasses.replace(self, **changes)

    @property
    def const_values(self) -> tuple[Value, ...]:
        """The constants as typed Values."""
        return tuple(Value(k, TensorType(a.shape, str(a.dtype))) for k, a in self.constants.items())

    def producers(self) -> dict[str, Node]:
        """Map each node-produced value name to its node."""
        return {v.name: n for n in self.nodes for v in n.outputs}

    def consumers(self) -> dict[str, list[Node]]:
        """Map each value name to the nodes that read it (in order, without repeats)."""
        users: dict[str, list[Node]] = {}
        for n in self.nodes:
            for name in dict.fromkeys(v.name for v in n.inputs):
                users.setdefault(name, []).append(n)
        return users

    def __str__(self) -> str:
        def fmt(v: Value) -> str:
            return f"%{v.name}:{v.dtype}{list(v.shape)}"

        lines = [f"program {self.name}(" + ", ".join(fmt(v) for v in self.inputs) + ")"]
        lines += [f"  const {fmt(v)}" for v in self.const_values]
        for n in self.nodes:
            attrs = "" if isinstance(n.attrs, NoAttrs) else f" {n.attrs}"
            lines.append(f"  {', '.join(fmt(v) for v in n.outputs)} = {n.op}({', '.join('%' + v.name for v in n.inputs)}){attrs}")
        lines.append("  return " + ", ".join("%" + v.name for v in self.outputs))
        return "\n".join(lines)
