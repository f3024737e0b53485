"""Front doors producing a cinn Program: NetBuilder, the ONNX importer (`cinn.frontend.onnx`), the Paddle importer
(`cinn.frontend.paddle`), model-file loading and the built-in model zoo."""
from cinn.builder import NetBuilder

__all__ = ["NetBuilder"]
