"""Model files in: a Program from an ONNX file or a Paddle inference model, chosen by its name."""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from cinn.core.ir import Program
from cinn.core.symbolic import StagedProgram, SymbolicProgram

ONNX_SUFFIXES = (".onnx",)
PADDLE_SUFFIXES = (".pdmodel", ".json")
PROGRAM_SUFFIX = ".cinn"  # a program that cinn.core.ir_json.save_program wrote (cinn-quantize writes them)
MODEL_FILE_SUFFIXES = ONNX_SUFFIXES + PADDLE_SUFFIXES + (PROGRAM_SUFFIX,)


class UnsupportedModelFormat(ValueError):
    """A model file whose format cinn cannot read."""


def is_model_file(path: str) -> bool:
    """Whether a name is a model file (ONNX, Paddle .pdmodel/.json) or a Paddle model directory."""
    return os.path.isdir(path) or path.endswith(MODEL_FILE_SUFFIXES)


def load_model(path: str, input_shapes: Mapping[str, Sequence[int]] | None = None
               ) -> Program | StagedProgram | SymbolicProgram:
    """A Program from a model file, chosen by its extension (a directory is a Paddle model, a .cinn file a program
    that cinn.core.ir_json.save_program wrote); symbolic when dims that input_shapes leaves open are symbolic."""
    # each importer is imported only for its own format: onnx and protobuf take a while to import
    if path.endswith(PROGRAM_SUFFIX):
        from cinn.core.ir_json import load_program

        return load_program(path)
    if path.endswith(PADDLE_SUFFIXES) or os.path.isdir(path):
        from frontend.paddle import load_paddle

        return load_paddle(path, input_shapes)
    if not path.endswith(ONNX_SUFFIXES):
        raise UnsupportedModelFormat(f"{path}: unknown model format (expected .onnx, .json, .pdmodel, .cinn or a "
                                     "Paddle model directory)")
    from frontend.onnx import load_onnx

    return load_onnx(path, input_shapes)


def parse_input_shapes(specs: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """NAME=2,3,4 specs as {name: shape}; malformed ones raise ValueError naming the spec."""
    shapes = {}
    for spec in specs:
        name, sep, dims = spec.rpartition("=")
        try:
            if not sep or not name:
                raise ValueError
            shapes[name] = tuple(int(d) for d in dims.split(",")) if dims else ()
        except ValueError:
            raise ValueError(f"--input-shape {spec!r}: expected NAME=D0,D1,... with integer dims") from None
    return shapes
