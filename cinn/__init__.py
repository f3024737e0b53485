"""cinn: a CINN-style tensor compiler on Apache TVM.

The public names are exported lazily: `import cinn` is cheap, and importing a lower layer (``cinn.core.ops``) does not load
the compiler, the importers or TVM's build machinery.
"""
from __future__ import annotations

import importlib
import os
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING

try:
    __version__ = version("cinn")
except PackageNotFoundError:  # a source tree used without installing it
    __version__ = "0+unknown"

# OpenBLAS's idle threads spin for 2**28 cycles (~0.1 s) after each numpy BLAS call and take the cores from cinn's
# kernels (see docs/notes/runtime-overheads.md); 2**4 cycles stops that and costs numpy's small matmuls little.
# OpenBLAS reads this once, when numpy loads it: it has effect when cinn is imported first.
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

# public name -> the module that defines it
_EXPORTS = {
    "NetBuilder": "cinn.core.builder",
    "compile": "cinn.facade.api",
    "quantize": "cinn.facade.quantize",
    "CalibrationMethod": "cinn.facade.quant_calibration",
    "QuantizePolicy": "cinn.facade.quantize",
    "QuantizedModel": "cinn.facade.quantize",
    "Executable": "cinn.runtime.executable",
    "DynamicExecutable": "cinn.runtime.dynamic",
    "StagedExecutable": "cinn.runtime.dynamic",
    "SymbolicProgram": "cinn.core.symbolic",
    "StagedProgram": "cinn.core.symbolic",
    "ShapeBindingError": "cinn.core.symbolic",
    "aligned_empty": "cinn.runtime.executable",
    "Node": "cinn.core.ir",
    "Program": "cinn.core.ir",
    "TensorType": "cinn.core.ir",
    "Value": "cinn.core.ir",
    "load_onnx": "frontend.onnx",
    "load_paddle": "frontend.paddle",
    "load_model": "frontend.loading",
    "Precision": "cinn.core.precision",
    "PrecisionPolicy": "cinn.core.precision",
}

__all__ = ["CalibrationMethod", "DynamicExecutable", "Executable", "NetBuilder", "Node", "Precision", "PrecisionPolicy",
           "Program", "QuantizePolicy", "QuantizedModel", "ShapeBindingError", "StagedExecutable", "StagedProgram",
           "SymbolicProgram", "TensorType", "Value", "__version__", "aligned_empty", "compile", "load_model",
           "load_onnx", "load_paddle", "quantize"]

if TYPE_CHECKING:
    from cinn.core.builder import NetBuilder
    from cinn.core.ir import Node, Program, TensorType, Value
    from cinn.core.precision import Precision, PrecisionPolicy
    from cinn.core.symbolic import ShapeBindingError, StagedProgram, SymbolicProgram
    from cinn.facade.api import compile
    from cinn.facade.quant_calibration import CalibrationMethod
    from cinn.facade.quantize import QuantizedModel, QuantizePolicy, quantize
    from cinn.runtime.dynamic import DynamicExecutable, StagedExecutable
    from cinn.runtime.executable import Executable, aligned_empty
    from frontend.loading import load_model
    from frontend.onnx import load_onnx
    from frontend.paddle import load_paddle


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'cinn' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this hook
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
