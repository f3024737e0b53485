"""Decoder of legacy `.pdmodel` files (a protobuf ProgramDesc) into a PaddleModel."""
from __future__ import annotations

from typing import Any

from google.protobuf.message import DecodeError

from frontend.paddle.graph import Operand, PaddleImportError, PaddleModel, PaddleOp, Tensor
from frontend.paddle.registry import dtype_of_code
from frontend.paddle.schema import ATTR_FIELD, AttrType, ScalarType, VarKind, program_desc

# attributes every op carries for Paddle's own bookkeeping
_BOOKKEEPING = frozenset({"op_callstack", "op_device", "op_namescope", "op_role", "op_role_var", "with_quant_attr"})
_SCALAR_FIELD = {ScalarType.BOOLEAN: "b", ScalarType.LONG: "i", ScalarType.FLOAT64: "r"}
_REPEATED = frozenset({AttrType.INTS, AttrType.FLOATS, AttrType.STRINGS, AttrType.BOOLEANS, AttrType.BLOCKS,
                       AttrType.LONGS, AttrType.FLOAT64S, AttrType.VARS})


def read_pdmodel(path: str) -> PaddleModel:
    """Decode a legacy inference program: feeds become inputs, persistable variables parameters."""
    desc = _parse(path)
    block = desc.blocks[0]
    variables = {v.name: v for v in block.vars}
    feeds, fetches, ops = [], [], []
    for op in block.ops:
        if op.type == "feed":
            feeds.append((_attr_value(_find_attr(op, "col"), path), _args(op.outputs, "Out", path, op.type)))
        elif op.type == "fetch":
            fetches.append((_attr_value(_find_attr(op, "col"), path), _args(op.inputs, "X", path, op.type)))
        else:
            ops.append(_op(op, path))
    inputs = tuple(_tensor(variables, name, path) for _, name in sorted(feeds))
    fed = {t.name for t in inputs}
    params = tuple(_tensor(variables, v.name, path) for v in block.vars
                   if v.persistable and v.type.type == VarKind.DENSE_TENSOR and v.name not in fed)
    if not fetches:
        raise PaddleImportError(f"{path}: not a valid Paddle inference program (it fetches nothing)")
    return PaddleModel(path, False, inputs, params, tuple(ops), tuple(name for _, name in sorted(fetches)))


def _parse(path: str):
    with open(path, "rb") as f:
        data = f.read()
    desc = program_desc()()
    try:
        desc.ParseFromString(data)
    except DecodeError as e:
        raise PaddleImportError(f"{path}: not a valid Paddle .pdmodel file ({e})") from None
    if not desc.blocks or not desc.blocks[0].ops:
        raise PaddleImportError(f"{path}: not a valid Paddle .pdmodel file (no program blocks or ops)")
    return desc


def _op(op, path: str) -> PaddleOp:
    inputs = tuple(Operand(v.parameter, tuple(v.arguments)) for v in op.inputs)
    outputs = tuple(Operand(v.parameter, tuple(v.arguments)) for v in op.outputs)
    attrs = {a.name: _attr_value(a, path) for a in op.attrs if a.name not in _BOOKKEEPING}
    name = next((n for o in outputs for n in o.names), op.type)
    return PaddleOp(op.type, name, inputs, outputs, attrs)


def _find_attr(op, name: str):
    for a in op.attrs:
        if a.name == name:
            return a
    raise PaddleImportError(f"{op.type} op has no {name!r} attribute")


def _attr_value(attr, path: str) -> Any:
    """An attribute's value as plain Python (lists for repeated fields, numbers for scalars)."""
    try:
        kind = AttrType(attr.type)
    except ValueError:
        raise PaddleImportError(f"{path}: attribute {attr.name!r} has unknown type {attr.type}") from None
    value = getattr(attr, ATTR_FIELD[kind])
    if kind == AttrType.SCALAR:
        return _scalar(value)
    if kind == AttrType.SCALARS:
        return [_scalar(s) for s in value]
    return list(value) if kind in _REPEATED else value


def _scalar(s) -> Any:
    return getattr(s, _SCALAR_FIELD.get(s.type, "r"))


def _args(slots, slot: str, path: str, op_type: str) -> str:
    for v in slots:
        if v.parameter == slot and len(v.arguments) == 1:
            return v.arguments[0]
    raise PaddleImportError(f"{path}: {op_type} op without a single {slot} variable")


def _tensor(variables, name: str, path: str) -> Tensor:
    """A declared dense tensor variable (an input or parameter)."""
    var = variables.get(name)
    if var is None:
        raise PaddleImportError(f"{path}: variable {name!r} is used but not declared")
    desc = var.type.dense_tensor.tensor
    return Tensor(name, name, dtype_of_code(desc.data_type, f"variable {name!r}"), tuple(int(d) for d in desc.dims))
