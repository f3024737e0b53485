"""The Paddle importer: `load_paddle(path, input_shapes=None) -> Program`, for PIR .json and legacy .pdmodel."""
from frontend.paddle.graph import PaddleImportError
from frontend.paddle.loader import load_paddle
from frontend.paddle.registry import CONVERTERS

__all__ = ["CONVERTERS", "PaddleImportError", "load_paddle"]
