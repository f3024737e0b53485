"""The Paddle importer: `load_paddle(path, input_shapes=None) -> Program`, for PIR .json and legacy .pdmodel."""
from cinn.frontend.paddle.graph import PaddleImportError
from cinn.frontend.paddle.loader import load_paddle
from cinn.frontend.paddle.registry import CONVERTERS

__all__ = ["CONVERTERS", "PaddleImportError", "load_paddle"]
