"""cinn: a CINN-style tensor compiler on Apache TVM.

The public names are exported lazily: `import cinn` is cheap, and importing a lower layer (``cinn.ops``) does not load
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
# kernels (an encoder run right after a numpy matmul: 3.5x slower); 2**4 cycles stops that and costs numpy's small
# matmuls a few percent. OpenBLAS reads this once, when numpy loads it: it has effect when cinn is imported first.
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

# public name -> the module that defines it
_EXPORTS = {
    "NetBuilder": "cinn.builder",
    "compile": "cinn.api",
    "Executable": "cinn.runtime",
    "DynamicExecutable": "cinn.dynamic",
    "SymbolicProgram": "cinn.symbolic",
    "ShapeBindingError": "cinn.symbolic",
    "aligned_empty": "cinn.runtime",
    "Node": "cinn.ir",
    "Program": "cinn.ir",
    "TensorType": "cinn.ir",
    "Value": "cinn.ir",
    "load_onnx": "cinn.frontend.onnx",
    "load_paddle": "cinn.frontend.paddle",
    "load_model": "cinn.frontend.loading",
}

__all__ = ["DynamicExecutable", "Executable", "NetBuilder", "Node", "Program", "ShapeBindingError", "SymbolicProgram",
           "TensorType", "Value", "__version__", "aligned_empty", "compile", "load_model", "load_onnx", "load_paddle"]

if TYPE_CHECKING:
    from cinn.api import compile
    from cinn.builder import NetBuilder
    from cinn.dynamic import DynamicExecutable
    from cinn.frontend.loading import load_model
    from cinn.frontend.onnx import load_onnx
    from cinn.frontend.paddle import load_paddle
    from cinn.ir import Node, Program, TensorType, Value
    from cinn.runtime import Executable, aligned_empty
    from cinn.symbolic import ShapeBindingError, SymbolicProgram


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'cinn' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this hook
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
