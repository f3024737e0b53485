"""Decoder of PIR `.json` programs (Paddle 3's default inference format) into a PaddleModel."""
from __future__ import annotations

import json
from typing import Any

from frontend.paddle.graph import Operand, PaddleImportError, PaddleModel, PaddleOp, Tensor
from frontend.paddle.registry import dtype_of_name

# op-name dialect prefixes: pd_op names are kept bare (shared with legacy converters where they agree)
_DIALECTS = {"0": "builtin.", "1": "", "2": "cf."}


def read_pir(path: str) -> PaddleModel:
    """Decode a PIR program: `data` ops become inputs, `p` (parameter) ops parameters, `fetch` ops outputs."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        raw_ops = doc["program"]["regions"][0]["blocks"][0]["ops"]
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise PaddleImportError(f"{path}: not a valid Paddle PIR .json file ({e})") from None
    except RecursionError:  # json's decoder recurses once per nesting level
        raise PaddleImportError(f"{path}: not a valid Paddle PIR .json file (nested too deeply)") from None
    except (KeyError, IndexError, TypeError):
        raise PaddleImportError(f"{path}: not a valid Paddle PIR .json file (no program.regions[0].blocks[0].ops)") from None
    if not isinstance(doc.get("base_code"), dict) or doc["base_code"].get("magic") != "pir":
        raise PaddleImportError(f"{path}: not a Paddle PIR program (base_code.magic is not 'pir')")
    try:
        return _model(path, raw_ops)
    except (KeyError, IndexError, TypeError, AttributeError) as e:
        raise PaddleImportError(f"{path}: malformed Paddle PIR op ({type(e).__name__}: {e})") from None


def _model(path: str, raw_ops: list) -> PaddleModel:
    inputs, params, ops, fetches = [], [], [], []
    for raw in raw_ops:
        kind = raw["#"]
        if kind == "p":  # A: [is_distributed, is_parameter, need_clip, name]; OA: [persistable, stop_gradient, ...]
            if (raw.get("OA") or [1])[0]:  # a non-persistable one (an rnn's dropout state) is not in .pdiparams
                params.append(_tensor(raw["O"], raw["A"][3]))
        elif kind == "1.data":
            inputs.append(_tensor(raw["O"][0], _attrs(raw)["name"]))
        elif kind == "1.fetch":
            fetches.append((_attrs(raw)["col"], _key(raw["I"][0])))
        else:
            ops.append(_op(raw))
    if not fetches:
        raise PaddleImportError(f"{path}: not a valid Paddle inference program (it fetches nothing)")
    return PaddleModel(path, True, tuple(inputs), tuple(params), tuple(ops), tuple(k for _, k in sorted(fetches)))


def _op(raw: dict) -> PaddleOp:
    dialect, _, name = raw["#"].partition(".")
    op_type = _DIALECTS.get(dialect, f"{dialect}.") + name
    inputs = tuple(Operand("", (_key(v),) if v.get("%") else ()) for v in raw.get("I", []))
    results = raw.get("O", [])
    outputs = tuple(Operand("", (_key(v),)) for v in (results if isinstance(results, list) else [results]))
    label = outputs[0].names[0] if outputs else op_type
    return PaddleOp(op_type, label, inputs, outputs, _attrs(raw))


def _key(value: dict) -> str:
    """The name a PIR value id is bound to while converting."""
    return f"%{value['%']}"


def _attrs(raw: dict) -> dict[str, Any]:
    return {a["N"]: _attr_value(a["AT"]) for a in raw.get("A", [])}


def _attr_value(at: dict) -> Any:
    """A typed attribute as plain Python: arrays become lists, the rest their data. JSON has no infinities or NaN:
    Paddle writes those floats as a string in `VD` ("INF", "-INF", "NAN")."""
    if at["#"] == "0.a_array":
        return [_attr_value(x) for x in at["D"]]
    if "VD" in at:
        try:
            return float(at["VD"])
        except (TypeError, ValueError):
            raise PaddleImportError(f"attribute value {at['VD']!r} is not a number") from None
    return at.get("D")


def _tensor(result: dict, name: str) -> Tensor:
    """A data or parameter op's result: its dtype and dims from the result type."""
    ty = result["TT"]
    if ty["#"] != "0.t_dtensor":
        raise PaddleImportError(f"{name!r} has type {ty['#']}, not a dense tensor")
    elem, dims = ty["D"][0]["#"], ty["D"][1]
    return Tensor(_key(result), name, dtype_of_name(elem, f"{name!r}"), tuple(int(d) for d in dims))
