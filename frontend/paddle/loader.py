"""cinn.load_paddle: each Paddle op becomes NetBuilder calls (as CINN's op mappers), giving a Program."""
from __future__ import annotations

import glob
import os
from collections.abc import Mapping, Sequence

import numpy as np

from cinn.core.ir import Program, Value, shape_of
from cinn.core.symbolic import Dim, StagedProgram, SymbolicInput, SymbolicProgram, symbol_name
from frontend.folding import FoldingBuilder
from frontend.paddle import ops_math, ops_nn, ops_reduce, ops_rnn, ops_shape  # noqa: F401  (register converters)
from frontend.paddle.graph import PaddleImportError, PaddleModel, PaddleOp, Tensor
from frontend.paddle.params import params_path, read_params
from frontend.paddle.pdmodel import read_pdmodel
from frontend.paddle.pir import read_pir
from frontend.paddle.registry import Bound, OpContext, Unavailable, converter_of

MODEL_SUFFIXES = (".json", ".pdmodel")
# how Paddle's PIR writer begins every program (json.dumps without spaces)
PIR_HEAD = b'{"base_code":{"magic":"pir"'


def load_paddle(path: str | os.PathLike, input_shapes: Mapping[str, Sequence[int]] | None = None
                ) -> Program | StagedProgram | SymbolicProgram:
    """Convert a Paddle inference model to a Program; its parameters (`.pdiparams` beside it) become constants.

    `path` is a `.json` (PIR) or `.pdmodel` (legacy) file, or a directory holding one with its `.pdiparams`. Dynamic
    (-1) dims give a SymbolicProgram (input `x` dim 0 is symbol `x_0`), unless input_shapes fixes them (it may also
    override static dims).
    """
    model_path = resolve_model_path(os.fspath(path))
    model = read_pir(model_path) if model_path.endswith(".json") else read_pdmodel(model_path)
    _check_supported(model)
    arrays = read_params(params_path(model_path), model.params) if model.params else {}
    name = os.path.splitext(os.path.basename(model_path))[0]
    inputs = _symbolic_inputs(model, dict(input_shapes or {}))
    return SymbolicProgram(name, inputs, lambda shapes, _: _import(name, model, arrays, shapes)).static_or_probed()


def _import(name: str, model: PaddleModel, arrays: Mapping[str, np.ndarray], shapes: Mapping[str, Sequence[int]]
            ) -> Program:
    """The Program of a decoded model with static input shapes."""
    b = FoldingBuilder(name)
    env: dict[str, Bound] = {t.key: b.create_input(t.dtype, shapes[t.name], t.name) for t in model.inputs}
    env |= {p.key: b.create_constant(arrays[p.key], p.name, p.dtype) for p in model.params}
    for op in model.ops:
        _convert(b, model, op, env)
    outputs = [_fetched(model, env, key) for key in model.outputs]
    return b.build(b.distinct(outputs))


def resolve_model_path(path: str) -> str:
    """The model file named by a path: the file itself, or the one model file in a directory."""
    if os.path.isdir(path):
        found = sorted(f for f in glob.glob(os.path.join(glob.escape(path), "*"))
                       if f.endswith(".pdmodel") or (f.endswith(".json") and _is_pir(f)))
        if len(found) != 1:
            what = "no" if not found else f"{len(found)} ({', '.join(map(os.path.basename, found))})"
            raise PaddleImportError(f"{path}: {what} Paddle model files (PIR .json, or .pdmodel); "
                                    "pass the model file")
        return found[0]
    if not path.endswith(MODEL_SUFFIXES):
        raise PaddleImportError(f"{path}: not a Paddle model (expected a directory, .json or .pdmodel)")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such Paddle model file")
    return path


def _is_pir(path: str) -> bool:
    """A .json that is a PIR program: its .pdiparams is beside it, or (a model without parameters) it starts as one."""
    if os.path.isfile(params_path(path)):
        return True
    with open(path, "rb") as f:
        return f.read(len(PIR_HEAD)) == PIR_HEAD


def _check_supported(model: PaddleModel) -> None:
    """One error listing every unsupported op type with the ops that use it, before converting anything."""
    unsupported: dict[str, list[str]] = {}
    for op in model.ops:
        if converter_of(op.type) is None:
            unsupported.setdefault(op.type, []).append(op.name)
    if unsupported:
        detail = "; ".join(f"{t} (outputs {', '.join(repr(n) for n in names)})" for t, names in sorted(unsupported.items()))
        raise NotImplementedError(f"{model.path}: unsupported Paddle op{'s' if len(unsupported) > 1 else ''}: {detail}")


def _symbolic_inputs(model: PaddleModel, shapes: dict[str, Sequence[int]]) -> tuple[SymbolicInput, ...]:
    """Each input with its dims: given by input_shapes, else the model's (symbols for its -1 dims)."""
    unknown = sorted(set(shapes) - {t.name for t in model.inputs})
    if unknown:
        raise PaddleImportError(f"input_shapes names {unknown}, which are not model inputs; "
                                f"inputs: {[t.name for t in model.inputs]}")
    return tuple(SymbolicInput(t.name, t.dtype, _input_dims(t, shapes.get(t.name))) for t in model.inputs)


def _input_dims(t: Tensor, given: Sequence[int] | None) -> tuple[Dim, ...]:
    """An input's dims: from input_shapes when given, else the model's, with a symbol for each dynamic dim."""
    if given is not None:
        given = shape_of(given, f"input_shapes[{t.name!r}]")
        if len(given) != len(t.shape) or any(d not in (g, -1) for d, g in zip(t.shape, given, strict=True)):
            raise PaddleImportError(f"input_shapes[{t.name!r}] = {given} does not fit the model's shape {list(t.shape)}")
        return given
    return tuple(symbol_name(f"{t.name}_{k}") if d < 0 else d for k, d in enumerate(t.shape))


def _convert(b: FoldingBuilder, model: PaddleModel, op: PaddleOp, env: dict[str, Bound]) -> None:
    """Convert one op, binding its outputs; errors name the op."""
    where = f"Paddle op {op.type} {op.name!r}"
    spec = converter_of(op.type)
    assert spec is not None  # _check_supported saw to it
    try:
        results = list(spec.fn(OpContext(b, op, model.pir, env)))
    except (ValueError, TypeError, NotImplementedError) as e:
        raise type(e)(f"{where}: {e}") from None
    except IndexError as e:  # folding an index op on constants: an index outside its table at these shapes
        raise PaddleImportError(f"{where}: {e}; at other input shapes (input_shapes) it may fit") from None
    for k, (slot, name) in enumerate(_output_names(model, op, spec.outputs)):
        value = results[k] if k < len(results) else Unavailable(op, slot)
        if not isinstance(value, Unavailable) or name not in env:  # legacy MeanOut rewrites the mean parameter
            env[name] = value


def _output_names(model: PaddleModel, op: PaddleOp, slots: tuple[str, ...]) -> list[tuple[str, str]]:
    """(slot, name) of each output in binding order: PIR results by position; legacy: the converter's slots first."""
    if model.pir:
        return [(f"result {k}", name) for k, o in enumerate(op.outputs) for name in o.names]
    ordered = sorted(op.outputs, key=lambda o: slots.index(o.slot) if o.slot in slots else len(slots))
    return [(o.slot, name) for o in ordered for name in o.names]


def _fetched(model: PaddleModel, env: dict[str, Bound], key: str) -> Value:
    value = env.get(key)
    if not isinstance(value, Value):
        raise PaddleImportError(f"{model.path}: fetched value {key!r} is not a tensor produced by the program")
    return value
