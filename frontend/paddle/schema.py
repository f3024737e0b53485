"""Paddle's framework.proto (the parts an inference model uses), built at run time: no protoc, no paddle.

Field numbers are Paddle's (see /work/shared/PADDLE_FORMAT.md). Enum-typed fields are declared as
int32 (the same varint on the wire) so that a code this schema does not list still decodes.
"""
from __future__ import annotations

import enum
import functools

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

PACKAGE = "paddle.framework.proto"

_F = descriptor_pb2.FieldDescriptorProto
_OPTIONAL, _REPEATED = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED
_SCALAR_TYPES = {
    "int32": _F.TYPE_INT32, "int64": _F.TYPE_INT64, "float": _F.TYPE_FLOAT, "double": _F.TYPE_DOUBLE,
    "bool": _F.TYPE_BOOL, "string": _F.TYPE_STRING,
}

# message -> (field name, number, type (scalar name or message name), repeated)
_MESSAGES: dict[str, list[tuple[str, int, str, bool]]] = {
    "Version": [("version", 1, "int64", False)],
    "Scalar": [("type", 1, "int32", False), ("b", 2, "bool", False), ("i", 3, "int64", False), ("r", 4, "double", False)],
    "OpDesc.Attr": [
        ("name", 1, "string", False), ("type", 2, "int32", False), ("i", 3, "int32", False), ("f", 4, "float", False),
        ("s", 5, "string", False), ("ints", 6, "int32", True), ("floats", 7, "float", True),
        ("strings", 8, "string", True), ("b", 10, "bool", False), ("bools", 11, "bool", True),
        ("block_idx", 12, "int32", False), ("l", 13, "int64", False), ("blocks_idx", 14, "int32", True),
        ("longs", 15, "int64", True), ("float64s", 16, "double", True), ("var_name", 17, "string", False),
        ("vars_name", 18, "string", True), ("float64", 19, "double", False), ("scalar", 20, "Scalar", False),
        ("scalars", 21, "Scalar", True),
    ],
    "OpDesc.Var": [("parameter", 1, "string", False), ("arguments", 2, "string", True)],
    "OpDesc": [("inputs", 1, "OpDesc.Var", True), ("outputs", 2, "OpDesc.Var", True), ("type", 3, "string", False),
               ("attrs", 4, "OpDesc.Attr", True), ("is_target", 5, "bool", False)],
    "TensorDesc": [("data_type", 1, "int32", False), ("dims", 2, "int64", True)],
    "DenseTensorDesc": [("tensor", 1, "TensorDesc", False), ("legacy_lod_level", 2, "int32", False)],
    "VarType": [("type", 1, "int32", False), ("dense_tensor", 3, "DenseTensorDesc", False)],
    "VarDesc": [("name", 1, "string", False), ("type", 2, "VarType", False), ("persistable", 3, "bool", False),
                ("need_check_feed", 4, "bool", False), ("is_parameter", 5, "bool", False),
                ("stop_gradient", 6, "bool", False)],
    "BlockDesc": [("idx", 1, "int32", False), ("parent_idx", 2, "int32", False), ("vars", 3, "VarDesc", True),
                  ("ops", 4, "OpDesc", True), ("forward_block_idx", 5, "int32", False)],
    "ProgramDesc": [("blocks", 1, "BlockDesc", True), ("version", 4, "Version", False)],
}


class AttrType(enum.IntEnum):
    """OpDesc.Attr.type: which field holds the value."""

    INT = 0
    FLOAT = 1
    STRING = 2
    INTS = 3
    FLOATS = 4
    STRINGS = 5
    BOOLEAN = 6
    BOOLEANS = 7
    BLOCK = 8
    LONG = 9
    BLOCKS = 10
    LONGS = 11
    FLOAT64S = 12
    VAR = 13
    VARS = 14
    FLOAT64 = 15
    SCALAR = 16
    SCALARS = 17


ATTR_FIELD = {
    AttrType.INT: "i", AttrType.FLOAT: "f", AttrType.STRING: "s", AttrType.INTS: "ints", AttrType.FLOATS: "floats",
    AttrType.STRINGS: "strings", AttrType.BOOLEAN: "b", AttrType.BOOLEANS: "bools", AttrType.BLOCK: "block_idx",
    AttrType.LONG: "l", AttrType.BLOCKS: "blocks_idx", AttrType.LONGS: "longs", AttrType.FLOAT64S: "float64s",
    AttrType.VAR: "var_name", AttrType.VARS: "vars_name", AttrType.FLOAT64: "float64", AttrType.SCALAR: "scalar",
    AttrType.SCALARS: "scalars",
}


class VarKind(enum.IntEnum):
    """VarType.type codes of the variables an inference program declares."""

    DENSE_TENSOR = 7
    FEED_MINIBATCH = 9
    FETCH_LIST = 10


class ScalarType(enum.IntEnum):
    """Scalar.type: which field holds the value."""

    BOOLEAN = 1
    LONG = 2
    FLOAT64 = 3


# Paddle's data type codes (VarType.Type) that have a cinn dtype
DTYPE_OF_CODE = {
    0: "bool", 1: "int16", 2: "int32", 3: "int64", 4: "float16", 5: "float32", 6: "float64", 20: "uint8", 21: "int8",
}
# names of the other codes, for error messages
UNSUPPORTED_CODES = {22: "bfloat16", 23: "complex64", 24: "complex128"}


def _field(name: str, number: int, kind: str, repeated: bool) -> descriptor_pb2.FieldDescriptorProto:
    f = _F(name=name, number=number, label=_REPEATED if repeated else _OPTIONAL)
    if kind in _SCALAR_TYPES:
        f.type = _SCALAR_TYPES[kind]
    else:
        f.type, f.type_name = _F.TYPE_MESSAGE, f".{PACKAGE}.{kind}"
    return f


@functools.cache
def _classes() -> dict[str, type]:
    """The message classes of the schema, built once in a private descriptor pool."""
    proto = descriptor_pb2.FileDescriptorProto(name="cinn_paddle_framework.proto", package=PACKAGE, syntax="proto2")
    top: dict[str, descriptor_pb2.DescriptorProto] = {}
    for full_name, fields in _MESSAGES.items():
        outer, _, inner = full_name.partition(".")
        if outer not in top:
            top[outer] = proto.message_type.add(name=outer)
        msg = top[outer].nested_type.add(name=inner) if inner else top[outer]
        msg.field.extend(_field(*f) for f in fields)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{PACKAGE}.{name}"))
            for name in _MESSAGES}


def program_desc() -> type:
    """The ProgramDesc message class."""
    return _classes()["ProgramDesc"]


def tensor_desc() -> type:
    """The TensorDesc message class (the header of each tensor in a .pdiparams file)."""
    return _classes()["TensorDesc"]
