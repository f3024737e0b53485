"""The ONNX op-mapper table: one converter per ONNX op type, and the context a converter reads."""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from cinn.core.ir import DTYPES, Value
from frontend.folding import FoldingBuilder


class OnnxImportError(ValueError):
    """A model that cannot be converted (bad file, missing shapes, an op used in an unsupported way)."""


NEEDS_CONSTANT = "must be a constant or computable from static shapes"


class NeedsConstant(OnnxImportError):
    """An argument the importer must know (a shape, axes, pads) that is computed from graph inputs at run time; the
    loader reads those inputs by value."""

    def __init__(self, message: str, sources: tuple[str, ...] = ()):
        super().__init__(message, sources)  # both in args: wrappers that add context re-raise with *args[1:]

    @property
    def sources(self) -> tuple[str, ...]:
        """The graph inputs the argument is computed from."""
        return self.args[1]

    def __str__(self) -> str:
        return self.args[0]


@dataclass
class SubgraphBudget:
    """The nodes one import may convert from subgraphs (If's branches, Loop's and Scan's bodies, each run converting
    its nodes once more): those the model holds and `extra` more, shared by the whole model, so that nested loops
    cannot multiply past it. Each subgraph's initializers become constants once, however often it runs."""

    own: int
    extra: int
    converted: int = 0
    # id of a subgraph -> (the subgraph, kept alive so that no other message takes its id; its constants)
    _constants: dict[int, tuple[onnx.GraphProto, Mapping[str, Value]]] = field(default_factory=dict)

    def constants(self, graph: onnx.GraphProto, make: Callable[[], Mapping[str, Value]]) -> Mapping[str, Value]:
        """The subgraph's initializers as constants: made by `make` on its first run, the same values after."""
        if id(graph) not in self._constants:
            self._constants[id(graph)] = (graph, make())
        return self._constants[id(graph)][1]

    def charge(self, nodes: int, what: str) -> None:
        """Count one run of a subgraph of `nodes` nodes, refused past the budget."""
        self.converted += max(nodes, 1)  # an empty body's runs cost time too (a loop of 10**9 iterations)
        if self.converted > self.own + self.extra:
            raise OnnxImportError(f"{what} ({nodes} nodes) would take the nodes converted from subgraphs over "
                                  f"{self.own + self.extra} (the model's {self.own} and {self.extra} more), counted "
                                  "over every Loop, Scan and If, nested ones included")


@dataclass(frozen=True)
class NodeContext:
    """One ONNX node being converted: its inputs as Values (None for omitted optional ones), attributes, opset, the
    values in scope (what a subgraph of the node may read by name) and the import's subgraph budget."""

    b: FoldingBuilder
    node: onnx.NodeProto
    inputs: tuple[Value | None, ...]
    opset: int
    scope: Mapping[str, Value]
    budget: SubgraphBudget

    def attr(self, name: str, default: Any) -> Any:
        """An attribute's value (strings decoded, tensors as numpy arrays), or `default` when absent."""
        for a in self.node.attribute:
            if a.name == name:
                value = onnx.helper.get_attribute_value(a)
                if isinstance(value, bytes):
                    return value.decode()
                if isinstance(value, onnx.TensorProto):
                    return tensor_to_array(value)
                return value
        return default

    def has_attr(self, name: str) -> bool:
        return any(a.name == name for a in self.node.attribute)

    def input(self, i: int) -> Value | None:
        """Input i, or None when it is omitted (absent or empty name)."""
        return self.inputs[i] if i < len(self.inputs) else None

    def const(self, i: int) -> np.ndarray | None:
        """The data of input i when it is a (folded) constant, else None."""
        return self.b.constant_of(self.input(i))

    def require_const(self, i: int, what: str) -> np.ndarray:
        """The data of input i, which this importer needs at conversion time (a shape, axes, pads...)."""
        data = self.const(i)
        if data is None:
            raise NeedsConstant(f"{what} (input {i}) {NEEDS_CONSTANT}", self.b.input_sources(self.inputs[i]))
        return data

    def ints(self, i: int, attr: str, since: int, what: str) -> tuple[int, ...] | None:
        """A list of ints that is attribute `attr` before opset `since` and constant input i from it."""
        if self.opset < since:
            value = self.attr(attr, None)
            return None if value is None else tuple(int(v) for v in value)
        if self.input(i) is None:
            return None
        return tuple(int(v) for v in np.asarray(self.require_const(i, what)).reshape(-1))


Converter = Callable[[NodeContext], Sequence[Value]]
# keyed by op type for ONNX's own domain, by "domain.OpType" for others ("com.microsoft.SkipLayerNormalization")
CONVERTERS: dict[str, Converter] = {}
DEFAULT_DOMAINS = ("", "ai.onnx")


def converter_key(node: onnx.NodeProto) -> str:
    """The CONVERTERS key of a node: its op type, prefixed by its domain outside ONNX's own."""
    return node.op_type if node.domain in DEFAULT_DOMAINS else f"{node.domain}.{node.op_type}"


def converter(*op_types: str) -> Callable[[Converter], Converter]:
    """Register a function as the converter of some ONNX op types."""

    def register(fn: Converter) -> Converter:
        for t in op_types:
            if t in CONVERTERS:
                raise ValueError(f"ONNX op {t} has two converters")
            CONVERTERS[t] = fn
        return fn

    return register


def onnx_dtype(elem_type: int, what: str) -> str:
    """The cinn dtype of an ONNX TensorProto element type, or a clear error."""
    try:
        dtype = str(onnx.helper.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, ValueError, TypeError):
        dtype = None
    if dtype not in DTYPES:
        name = onnx.TensorProto.DataType.Name(elem_type) if elem_type in onnx.TensorProto.DataType.values() else elem_type
        raise OnnxImportError(f"{what}: element type {name} is not supported (supported: {', '.join(DTYPES)})")
    return dtype


def tensor_to_array(t: onnx.TensorProto) -> np.ndarray:
    """An ONNX tensor (initializer, Constant value) as a numpy array of a supported dtype."""
    onnx_dtype(t.data_type, f"tensor {t.name!r}")
    if t.data_location == onnx.TensorProto.EXTERNAL:  # to_array would read the file from the working directory
        where = {e.key: e.value for e in t.external_data}.get("location", "?")
        raise OnnxImportError(f"tensor {t.name!r} keeps its data in the external file {where!r}, which was not loaded: "
                              "pass the model's path (external data is read beside it) or load_onnx(..., base_dir=)")
    try:
        return onnx.numpy_helper.to_array(t)
    except ValueError as e:  # raw data shorter than the dims say
        raise OnnxImportError(f"tensor {t.name!r}: {e}") from None
