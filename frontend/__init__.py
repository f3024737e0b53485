"""Front doors producing a cinn Program: NetBuilder (and, later, the ONNX and Paddle importers)."""
from cinn.frontend.net_builder import NetBuilder

__all__ = ["NetBuilder"]
