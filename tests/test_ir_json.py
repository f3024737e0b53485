"""cinn.core.ir_json: every op's attrs and whole optimized programs go to JSON and back unchanged; anything else is
refused with a DecodeError naming where (finding 1 of issue 49: the compile cache's format holds no code)."""
from __future__ import annotations

import dataclasses
import enum
import importlib
import json
import math
import pkgutil

import pytest

import tests.cases
from cinn.compiler.passes.pipeline import optimize
from cinn.core import ir_json
from cinn.core.ir import Node, Program, TensorType, Value, field_types
from cinn.core.ops import OPS
from cinn.core.target import parse_target
from tests.test_integer_kernels import _quantized_matmul, _weights
from tests.test_passes import _bottlenecks


def _cases():
    for info in pkgutil.iter_modules(tests.cases.__path__):
        yield from importlib.import_module(f"tests.cases.{info.name}").CASES


def _through_json(value, hint):
    """value encoded, written as standard JSON, read and decoded."""
    return ir_json.decode(json.loads(json.dumps(ir_json.encode(value, hint), allow_nan=False)), hint, "x")


def _attrs_of_every_class() -> dict[type, list]:
    """Attrs instances of every op's Attrs class: the op test tables' rows."""
    found: dict[type, list] = {}
    for case in _cases():
        cls = OPS[case.op].attrs
        found.setdefault(cls, []).append(cls(**case.attrs))
    return found


def test_every_ops_attrs_round_trip():
    found = _attrs_of_every_class()
    assert {op.attrs for op in OPS.values()} <= set(found), "an op's Attrs class without a case"
    for attrs in (a for instances in found.values() for a in instances):
        back = _through_json(attrs, type(attrs))
        assert type(back) is type(attrs) and repr(back) == repr(attrs)


def _edge_values(hint) -> list:
    """Values at the edges of a field's type: non-finite and signed-zero floats, None, each member of a union."""
    if hint is float:
        return [math.inf, -math.inf, math.nan, -0.0, 5e-324, 1]
    if hint in (int, bool, str) or (isinstance(hint, type) and issubclass(hint, enum.Enum)):
        return []
    members = getattr(hint, "__args__", ())
    if type(None) in members:
        return [None]
    return [(3,)] if int in members else []


def test_edge_values_round_trip():
    """inf, -inf, nan (standard JSON has none), -0.0, an int in a float field, None and each union's members."""
    tried = 0
    for instances in _attrs_of_every_class().values():
        attrs = instances[0]
        for f in dataclasses.fields(attrs):
            for value in _edge_values(field_types(type(attrs))[f.name]):
                try:
                    edged = dataclasses.replace(attrs, **{f.name: value})
                except (TypeError, ValueError):  # the class's own checks refuse it
                    continue
                back = _through_json(edged, type(attrs))
                assert repr(back) == repr(edged) and type(getattr(back, f.name)) is type(value)
                tried += 1
    assert tried > 50


def _programs() -> list[Program]:
    """Optimized programs as the compile cache keeps them: resnet bottlenecks (NHWC and Winograd convs, packed
    weights) and a quantized matmul on a VNNI target (matmul_u8i8, int8 constants)."""
    quantized = optimize(_quantized_matmul(_weights(32, 48, True), 7), target=parse_target("llvm -mcpu=znver4"))
    assert "matmul_u8i8" in [n.op for n in quantized.nodes]
    return [optimize(_bottlenecks(14, 64, 16), target=parse_target("llvm -mcpu=znver3")), quantized]


@pytest.mark.parametrize("program", _programs(), ids=["bottlenecks", "int8"])
def test_optimized_programs_round_trip(program):
    text = json.dumps(ir_json.program_to_json(program), allow_nan=False)
    back = ir_json.program_from_json(json.loads(text), dict(program.constants))
    assert (back.name, back.inputs, back.nodes, back.outputs) == (program.name, program.inputs, program.nodes,
                                                                    program.outputs)
    assert list(back.constants) == list(program.constants)


def _document() -> dict:
    x = Value("x", TensorType((2, 3), "float32"))
    y = Value("y", TensorType((2, 3), "float32"))
    program = Program("p", (x,), (Node("scale", (x,), (y,), OPS["scale"].attrs(scale=2.0), "n"),), (y,))
    return ir_json.program_to_json(program)


def _set(path: str, value):
    """The small program's document with the field at `path` (dots and list indices) replaced."""
    doc = _document()
    *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
    target = doc
    for p in parents:
        target = target[p]
    target[last] = value
    return doc


@pytest.mark.parametrize(("path", "value", "message"), [
    ("nodes.0.op", "os.system", "nodes\\[0\\]: unknown op 'os.system'"),
    ("nodes.0.attrs.scale", "2.0", "nodes\\[0\\].attrs.scale: '2.0' is not float"),
    ("nodes.0.attrs.bias_after_scale", 1, "bias_after_scale: 1 is not bool"),
    ("nodes.0.attrs.evil", 1, "ScaleAttrs has no field 'evil'"),
    ("inputs.0.type.shape", [2, True], "shape\\[1\\]: True is not int"),
    ("inputs.0.type.shape", [2, 3.0], "shape\\[1\\]: 3.0 is not int"),
    ("inputs.0.type.dtype", "object", "unsupported dtype"),
    ("inputs.0.type", {"shape": [2, 3]}, "dtype"),
    ("nodes.0", ["scale"], "is not a node"),
    ("nodes", {"0": 1}, "nodes: not a list"),
    ("constants", ["w"], "constants named"),
])
def test_a_document_of_the_wrong_shape_is_refused(path, value, message):
    with pytest.raises(ir_json.DecodeError, match=message):
        ir_json.program_from_json(_set(path, value), {})


def test_enums_and_fixed_tuples_are_checked():
    pad, pool = OPS["pad"].attrs, OPS["pool2d"].attrs
    doc = ir_json.encode(pad(paddings=((1, 1), (0, 2))), pad)
    with pytest.raises(ir_json.DecodeError, match="mode: 'spiral' is not one of"):
        ir_json.decode({**doc, "mode": "spiral"}, pad, "attrs")
    with pytest.raises(ir_json.DecodeError, match=r"paddings\[0\]: \[1, 1, 1\] is not tuple\[int, int\]"):
        ir_json.decode({**doc, "paddings": [[1, 1, 1]]}, pad, "attrs")
    assert ir_json.decode(doc, pad, "attrs") == pad(paddings=((1, 1), (0, 2)))
    with pytest.raises(ir_json.DecodeError, match="pooling_type: True is not one of"):
        ir_json.decode({**ir_json.encode(pool("max", (2, 2)), pool), "pooling_type": True}, pool, "attrs")
