"""Front doors producing a cinn Program: NetBuilder, the ONNX importer (`frontend.onnx`), the Paddle importer
(`frontend.paddle`), model-file loading and the built-in model zoo."""
from cinn.core.builder import NetBuilder

__all__ = ["NetBuilder"]
