"""cinn: a CINN-style tensor compiler on Apache TVM."""
from cinn.api import compile  # noqa: A004
from cinn.ir import Node, Program, TensorType, Value
from cinn.runtime import Executable
from frontend.net_builder import NetBuilder

__all__ = ["Executable", "NetBuilder", "Node", "Program", "TensorType", "Value", "compile"]
