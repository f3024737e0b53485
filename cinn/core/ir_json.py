"""Programs as JSON, with no code in the format: a typed codec driven by the dataclass fields and type hints of the IR
and of each op's Attrs class (its OpDef's), so that what is read back is checked as it is made.

Values map as: dataclasses to objects of their fields, tuples to arrays, enums to their values, None to null, and
floats to numbers, or "inf", "-inf" and "nan" (standard JSON has no non-finite numbers). A union's members are tried
in order. A program's constants are not in the document: their names are, in order, and the caller keeps the
arrays (an .npz beside the JSON); save_program writes both into one .npz file (a `.cinn` file).
"""
from __future__ import annotations

import dataclasses
import enum
import json
import math
import os
import types
import typing
import zipfile
from collections.abc import Mapping
from typing import Any

import numpy as np

from cinn.core.ir import Node, Program, Value, conforms, field_types, type_name
from cinn.core.ops import OPS

_NON_FINITE = ("inf", "-inf", "nan")


class DecodeError(ValueError):
    """A JSON document that is not a valid program (the message says where, as a path of fields)."""


def encode(value: Any, hint: Any) -> Any:
    """`value`, of type `hint`, as JSON data; TypeError for a value or type the format cannot hold."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        member = next((a for a in args if conforms(value, a)), None)
        if member is None:
            raise TypeError(f"{value!r} is not {type_name(hint)}")
        return encode(value, member)
    if origin is tuple:
        hints = _element_hints(args, len(value)) if isinstance(value, (tuple, list)) else None
        if hints is None:
            raise TypeError(f"{value!r} is not {type_name(hint)}")
        return [encode(x, h) for x, h in zip(value, hints, strict=True)]
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if type(value) is not hint:
            raise TypeError(f"{value!r} is not {hint.__name__}")
        declared = field_types(typing.cast(Any, hint))
        return {f.name: encode(getattr(value, f.name), declared[f.name]) for f in dataclasses.fields(hint)}
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return hint(value).value  # a field that takes its enum's values may hold the string
    if hint is float:
        number = int(value) if isinstance(value, (int, np.integer)) else float(value)  # 1 stays 1, 1.0 stays 1.0
        return number if math.isfinite(number) else str(number)
    if hint not in (int, bool, str, type(None)):
        raise TypeError(f"the program format cannot hold {type_name(hint)}")
    if not conforms(value, hint):
        raise TypeError(f"{value!r} is not {type_name(hint)}")
    return None if value is None else hint(value)  # numpy's integers as ints


def decode(data: Any, hint: Any, where: str) -> Any:
    """The value of type `hint` that `data` encodes; DecodeError naming `where` for anything else."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        for member in args:
            try:
                return decode(data, member, where)
            except DecodeError:
                continue
        raise DecodeError(f"{where}: {_short(data)} is not {type_name(hint)}")
    if origin is tuple:
        hints = _element_hints(args, len(data)) if isinstance(data, list) else None
        if hints is None:
            raise DecodeError(f"{where}: {_short(data)} is not {type_name(hint)}")
        return tuple(decode(x, h, f"{where}[{i}]") for i, (x, h) in enumerate(zip(data, hints, strict=True)))
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _decode_dataclass(data, hint, where)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        if isinstance(data, (str, int)) and not isinstance(data, bool):
            try:
                return hint(data)
            except ValueError:
                pass
        raise DecodeError(f"{where}: {_short(data)} is not one of {[m.value for m in hint]}")
    if hint is float and isinstance(data, str) and data in _NON_FINITE:
        return float(data)
    if _scalar(data, hint):
        return data
    raise DecodeError(f"{where}: {_short(data)} is not {type_name(hint)}")


def _scalar(data: Any, hint: Any) -> bool:
    """Whether JSON data is a value of a scalar type (ints for float too; a bool is no number)."""
    if hint is float:
        return isinstance(data, (int, float)) and not isinstance(data, bool)
    if hint is int:
        return isinstance(data, int) and not isinstance(data, bool)
    if hint is type(None):
        return data is None
    return hint in (bool, str) and isinstance(data, hint)


def _element_hints(args: tuple, n: int) -> tuple | None:
    """The hints of a tuple's n elements (None when a fixed-length tuple has another length)."""
    if len(args) == 2 and args[1] is Ellipsis:
        return (args[0],) * n
    return args if len(args) == n else None


def _decode_dataclass(data: Any, cls: type, where: str) -> Any:
    """An instance of cls from an object of its fields (those with defaults may be left out)."""
    if not isinstance(data, dict):
        raise DecodeError(f"{where}: {_short(data)} is not {cls.__name__}")
    hints = field_types(typing.cast(Any, cls))
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - names)
    if unknown:
        raise DecodeError(f"{where}: {cls.__name__} has no field {unknown[0]!r}")
    fields = {k: decode(v, hints[k], f"{where}.{k}") for k, v in data.items()}
    try:
        return cls(**fields)
    except (TypeError, ValueError) as err:  # a missing field, or the class's own checks
        raise DecodeError(f"{where}: {err}") from None


def _short(data: Any) -> str:
    text = repr(data)
    return text if len(text) <= 80 else text[:77] + "..."


def node_to_json(node: Node) -> dict[str, Any]:
    """A node as JSON: its attrs by its op's Attrs class (TypeError for attrs of another class)."""
    attrs_type = OPS[node.op].attrs if node.op in OPS else None
    if type(node.attrs) is not attrs_type:
        raise TypeError(f"node {node.name!r}: op {node.op!r} takes {getattr(attrs_type, '__name__', 'no attrs')}, "
                        f"not {type(node.attrs).__name__}")
    return {"op": node.op, "name": node.name, "inputs": encode(node.inputs, tuple[Value, ...]),
            "outputs": encode(node.outputs, tuple[Value, ...]), "attrs": encode(node.attrs, attrs_type)}


def node_from_json(data: Any, where: str) -> Node:
    """A node from JSON; DecodeError for an unknown op or anything of the wrong type."""
    if not isinstance(data, dict) or set(data) != {"op", "name", "inputs", "outputs", "attrs"}:
        raise DecodeError(f"{where}: {_short(data)} is not a node")
    op = data["op"]
    if not isinstance(op, str) or op not in OPS:
        raise DecodeError(f"{where}: unknown op {_short(op)}")
    return Node(op, decode(data["inputs"], tuple[Value, ...], f"{where}.inputs"),
                decode(data["outputs"], tuple[Value, ...], f"{where}.outputs"),
                decode(data["attrs"], OPS[op].attrs, f"{where}.attrs"), decode(data["name"], str, f"{where}.name"))


def program_to_json(program: Program) -> dict[str, Any]:
    """A program as JSON, its constants by name only (in the order of program.constants)."""
    return {"name": program.name, "inputs": encode(program.inputs, tuple[Value, ...]),
            "nodes": [node_to_json(n) for n in program.nodes], "outputs": encode(program.outputs, tuple[Value, ...]),
            "constants": list(program.constants)}


def program_from_json(data: Any, constants: Mapping[str, np.ndarray], where: str = "program") -> Program:
    """A program from JSON and its constants' arrays (exactly those it names); DecodeError for anything else."""
    if not isinstance(data, dict) or set(data) != {"name", "inputs", "nodes", "outputs", "constants"}:
        raise DecodeError(f"{where}: not a program")
    names = decode(data["constants"], tuple[str, ...], f"{where}.constants")
    if sorted(names) != sorted(constants):
        raise DecodeError(f"{where}: the constants named ({len(names)}) are not the arrays given ({len(constants)})")
    nodes = data["nodes"]
    if not isinstance(nodes, list):
        raise DecodeError(f"{where}.nodes: not a list")
    return Program(decode(data["name"], str, f"{where}.name"), decode(data["inputs"], tuple[Value, ...], f"{where}.inputs"),
                   tuple(node_from_json(n, f"{where}.nodes[{i}]") for i, n in enumerate(nodes)),
                   decode(data["outputs"], tuple[Value, ...], f"{where}.outputs"), {k: constants[k] for k in names})


PROGRAM_FILE_FORMAT = "cinn-program"
PROGRAM_FILE_VERSION = 1
_DOCUMENT = "program"  # the .npz member holding the JSON document; the constants are c0, c1, ... in its order


def save_program(program: Program, path: str | os.PathLike) -> None:
    """Write a program to one file: an .npz of its JSON document (a uint8 array) and its constants."""
    document = {"format": PROGRAM_FILE_FORMAT, "version": PROGRAM_FILE_VERSION, "program": program_to_json(program)}
    text = json.dumps(document, allow_nan=False, separators=(",", ":")).encode()
    arrays = {_DOCUMENT: np.frombuffer(text, np.uint8), **{f"c{i}": a for i, a in enumerate(program.constants.values())}}
    with open(path, "wb") as f:
        np.savez(f, allow_pickle=False, **arrays)


def load_program(path: str | os.PathLike) -> Program:
    """A program that save_program wrote; DecodeError for another file, OSError for one that cannot be read."""
    where = os.fspath(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            document = json.loads(bytes(z[_DOCUMENT])) if _DOCUMENT in z.files else None
            arrays = {k: z[k] for k in z.files if k != _DOCUMENT}
    except (zipfile.BadZipFile, json.JSONDecodeError, UnicodeDecodeError, ValueError, AttributeError) as err:
        # ValueError: not an .npy or .npz at all; AttributeError: an .npy (no members)
        raise DecodeError(f"{where}: not a {PROGRAM_FILE_FORMAT} file ({type(err).__name__})") from None
    if not isinstance(document, dict) or document.get("format") != PROGRAM_FILE_FORMAT \
            or not isinstance(document.get("program"), dict):
        raise DecodeError(f"{where}: not a {PROGRAM_FILE_FORMAT} file")
    if document.get("version") != PROGRAM_FILE_VERSION:
        raise DecodeError(f"{where}: {PROGRAM_FILE_FORMAT} version {document.get('version')!r} (this cinn reads "
                          f"version {PROGRAM_FILE_VERSION})")
    names = decode(document["program"].get("constants"), tuple[str, ...], "program.constants")
    if sorted(arrays) != sorted(f"c{i}" for i in range(len(names))):
        raise DecodeError(f"{where}: its arrays are not the {len(names)} constants it names")
    return program_from_json(document["program"], {k: arrays[f"c{i}"] for i, k in enumerate(names)})
