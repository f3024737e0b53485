"""The Paddle op-mapper table: one converter per op type, and the context a converter reads.

The two formats name an op's inputs differently: legacy ops have named slots (`X`, `Filter`) and
keep shape arguments as attributes or optional tensor slots; PIR ops take positional operands and
pass shape arguments as tensors (made by `full_int_array`, or computed and folded). A converter
asks for `ctx.input("X", 0)` (slot for legacy, position for PIR) and `ctx.int_array(...)`, and so
serves both formats where the op has the same meaning in each.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Union

import numpy as np

from cinn.core.ir import DTYPES, Value
from frontend.folding import FoldingBuilder
from frontend.paddle.graph import Operand, PaddleImportError, PaddleOp
from frontend.paddle.schema import DTYPE_OF_CODE, UNSUPPORTED_CODES

# what a value key is bound to while converting: a tensor, a PIR vector (builtin.combine), or an
# output no converter produces (reading it is an error naming the op)
Bound = Union[Value, tuple[Value, ...], "Unavailable"]
_REQUIRED = object()


@dataclass(frozen=True)
class Unavailable:
    """An op output that the converter does not produce (XShape, batch-norm statistics, masks)."""

    op: PaddleOp
    slot: str


@dataclass(frozen=True)
class OpContext:
    """One op being converted: its slots resolved against the values converted so far."""

    b: FoldingBuilder
    op: PaddleOp
    pir: bool
    env: Mapping[str, Bound]

    # -- inputs ---------------------------------------------------------------------------
    def input(self, slot: str, pos: int) -> Value:
        """The single tensor of legacy slot `slot` or PIR operand `pos`."""
        value = self.optional_input(slot, pos)
        if value is None:
            raise PaddleImportError(f"input {self._where(slot, pos)} is missing")
        return value

    def optional_input(self, slot: str, pos: int) -> Value | None:
        """Like input, but None when the model omits it (an optional input)."""
        values = self._operand(slot, pos)
        if len(values) > 1 or any(isinstance(v, tuple) for v in values):
            raise PaddleImportError(f"input {self._where(slot, pos)} is a list where one tensor is expected")
        return values[0] if values else None

    def inputs(self, slot: str, pos: int) -> list[Value]:
        """The tensors of a list input: a legacy slot's arguments, or a PIR vector operand."""
        values = self._operand(slot, pos)
        return [v for item in values for v in (item if isinstance(item, tuple) else (item,))]

    def _where(self, slot: str, pos: int) -> str:
        return f"#{pos}" if self.pir else slot

    def _operand(self, slot: str, pos: int) -> list:
        if self.pir:
            operand = self.op.inputs[pos] if pos < len(self.op.inputs) else Operand("", ())
        else:
            operand = next((o for o in self.op.inputs if o.slot == slot), Operand(slot, ()))
        return [self._read(name) for name in operand.names]

    def _read(self, name: str):
        value = self.env.get(name)
        if value is None:
            raise PaddleImportError(f"reads {name!r}, which no earlier op produces")
        if isinstance(value, Unavailable):
            raise PaddleImportError(f"reads {name!r}, output {value.slot} of {value.op.type} {value.op.name!r}, "
                                    "which is not supported (only its main output is)")
        return value

    # -- attributes -----------------------------------------------------------------------
    def attr(self, name: str, default: Any = _REQUIRED) -> Any:
        """An attribute's value, or `default` when absent (absent without default is an error)."""
        if name in self.op.attrs:
            return self.op.attrs[name]
        if default is _REQUIRED:
            raise PaddleImportError(f"attribute {name!r} is missing")
        return default

    # -- arguments that are attributes (legacy) or tensors (PIR, optional legacy slots) ---------
    def const(self, v: Value | tuple[Value, ...], what: str) -> np.ndarray:
        """The data of a (folded) constant, or of a vector of constants concatenated; else a clear error."""
        parts = v if isinstance(v, tuple) else (v,)
        arrays = [self.b.constant_of(p) for p in parts]
        if any(a is None for a in arrays):
            raise PaddleImportError(f"{what} must be constant or computable from static input shapes"
                                    " (give input_shapes for dynamic dims)")
        return np.concatenate([np.asarray(a).reshape(-1) for a in arrays]) if isinstance(v, tuple) else np.asarray(arrays[0])

    def int_array(self, attr: str, pos: int, what: str, tensor_slots: Sequence[str] = ()) -> tuple[int, ...]:
        """A list of ints: PIR operand `pos`; legacy: the first non-empty tensor slot; else attribute `attr`."""
        if self.pir:
            tensors = self._vector(pos)
        else:
            tensors = next((tuple(self.inputs(s, pos)) for s in tensor_slots if self.inputs(s, pos)), None)
        if tensors is None:
            return tuple(int(d) for d in self.attr(attr))
        return tuple(int(d) for d in np.asarray(self.const(tensors, what)).reshape(-1))

    def scalar(self, attr: str, pos: int, what: str, tensor_slot: str | None = None, default: Any = _REQUIRED):
        """A number: PIR operand `pos` (a folded tensor); legacy: tensor slot when given and present, else `attr`."""
        if self.pir:
            tensor = self._vector(pos)
        else:
            tensor = self.optional_input(tensor_slot, pos) if tensor_slot is not None else None
        if tensor is None:
            return self.attr(attr, default)
        return np.asarray(self.const(tensor, what)).reshape(-1)[0].item()

    def _vector(self, pos: int):
        """PIR operand `pos` as bound: a tensor or a vector of tensors (None when absent)."""
        values = self._operand("", pos)
        return values[0] if values else None

    # -- outputs --------------------------------------------------------------------------
    def vector(self, values: Sequence[Value]) -> list:
        """Outputs of an op returning a list: one PIR vector result, or the legacy slot's arguments."""
        return [tuple(values)] if self.pir else list(values)


@dataclass(frozen=True)
class ConverterSpec:
    """A converter and, for legacy ops, the output slots its results bind to (in order)."""

    fn: Callable[[OpContext], Sequence[Bound]]
    outputs: tuple[str, ...]


CONVERTERS: dict[str, ConverterSpec] = {}


def converter_of(op_type: str) -> ConverterSpec | None:
    """The converter of an op type; PIR's in-place variants (`relu_`, `scale_`) convert as their op."""
    spec = CONVERTERS.get(op_type)
    if spec is None and op_type.endswith("_") and not op_type.startswith("builtin."):
        spec = CONVERTERS.get(op_type[:-1])
    return spec


def converter(*op_types: str, outputs: Sequence[str] = ("Out",)):
    """Register a function as the converter of some Paddle op types (legacy and PIR names)."""

    def register(fn):
        for t in op_types:
            if t in CONVERTERS:
                raise ValueError(f"Paddle op {t} has two converters")
            CONVERTERS[t] = ConverterSpec(fn, tuple(outputs))
        return fn

    return register


def attr_of(ctx: OpContext, names: Sequence[str], default: Any) -> Any:
    """The first present attribute among spellings of one setting (legacy and PIR names, Paddle 2 and 3)."""
    return next((ctx.attr(n) for n in names if n in ctx.op.attrs), default)


# PIR type names of the element types, and their cinn dtypes
_PIR_DTYPES = {
    "bool": "bool", "i8": "int8", "i16": "int16", "i32": "int32", "i64": "int64", "ui8": "uint8", "f16": "float16",
    "f32": "float32", "f64": "float64",
}


def dtype_of_code(code: int, what: str) -> str:
    """The cinn dtype of a legacy data type code, or a clear error."""
    if code in DTYPE_OF_CODE:
        return DTYPE_OF_CODE[code]
    name = UNSUPPORTED_CODES.get(code, f"code {code}")
    raise PaddleImportError(f"{what}: data type {name} is not supported (supported: {', '.join(DTYPES)})")


def dtype_of_name(name: str, what: str) -> str:
    """The cinn dtype of a PIR dtype attribute (`float32`) or element type (`0.t_f32`), or a clear error."""
    short = name.rpartition(".t_")[2] if ".t_" in name else name
    dtype = _PIR_DTYPES.get(short, short)
    if dtype not in DTYPES:
        raise PaddleImportError(f"{what}: data type {short} is not supported (supported: {', '.join(DTYPES)})")
    return dtype


def dtype_arg(ctx: OpContext, attr: str, what: str) -> str:
    """A dtype attribute: a code in legacy ops, a name in PIR ops."""
    value = ctx.attr(attr)
    return dtype_of_name(value, what) if isinstance(value, str) else dtype_of_code(int(value), what)


def optional_dtype(ctx: OpContext, attr: str, what: str) -> str | None:
    """A dtype attribute that may say "as the input": absent, legacy code -1 or PIR `Undefined(...)` give None."""
    value = ctx.attr(attr, None)
    if value is None or value == -1 or (isinstance(value, str) and value.startswith("Undefined")):
        return None
    return dtype_arg(ctx, attr, what)
