"""cinn: a CINN-style tensor compiler on Apache TVM."""
from cinn.api import compile
from cinn.ir import Node, Program, TensorType, Value
from cinn.runtime import Executable

__all__ = ["Executable", "NetBuilder", "Node", "Program", "TensorType", "Value", "compile", "load_onnx", "load_paddle"]


def __getattr__(name: str):
    # NetBuilder lives in frontend, which imports cinn: resolve it lazily so either package may be imported first
    if name == "NetBuilder":
        from cinn.frontend.net_builder import NetBuilder

        return NetBuilder
    if name == "load_onnx":  # importing onnx costs time: only when a model is loaded
        from cinn.frontend.onnx import load_onnx

        return load_onnx
    if name == "load_paddle":  # importing protobuf and the converters costs time: only when a model is loaded
        from cinn.frontend.paddle import load_paddle

        return load_paddle
    raise AttributeError(f"module 'cinn' has no attribute {name!r}")
