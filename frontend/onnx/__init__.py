"""The ONNX importer: `load_onnx(path_or_ModelProto, input_shapes=None) -> Program`."""
from frontend.onnx.loader import load_onnx
from frontend.onnx.registry import CONVERTERS, OnnxImportError

__all__ = ["CONVERTERS", "OnnxImportError", "load_onnx"]
