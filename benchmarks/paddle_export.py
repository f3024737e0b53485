"""Saving paddle Layers as inference models in both formats, and running them with Paddle Inference.

Shared by the Paddle model set (`benchmarks.paddle_models`), Paddle Inference's cinn-bench worker
(`benchmarks.paddle_worker`) and the importer's fixtures (`tools/make_paddle_fixtures.py`). It imports the standard
library and numpy alone: paddle is passed in, or imported by the functions that run it, so that this module also loads
where paddle is not installed (cinn-bench's parent process, the tests).

The format a Layer is saved in is chosen by FLAGS_enable_pir_api, which paddle reads when it is imported: each format
is saved by a process of its own (`spawn_in_format`).
"""
from __future__ import annotations

import enum
import importlib
import os
import pathlib
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

PREFIX = "inference"  # the saved files' stem: inference.json or inference.pdmodel, and inference.pdiparams
PARAMS_SUFFIX = ".pdiparams"
PADDLE_EXTRA = "pip install cinn[paddle]"  # what installs paddlepaddle and paddle2onnx


class PaddleFormat(enum.StrEnum):
    """A Paddle inference model format."""

    PIR = "pir"  # a .json program (paddle >= 3)
    LEGACY = "legacy"  # a protobuf .pdmodel program

    @property
    def flag(self) -> str:
        """The FLAGS_enable_pir_api value that makes paddle.jit.save write this format."""
        return "1" if self is PaddleFormat.PIR else "0"

    @property
    def suffix(self) -> str:
        return ".json" if self is PaddleFormat.PIR else ".pdmodel"

    def model_file(self, folder: pathlib.Path) -> pathlib.Path:
        """Where paddle.jit.save puts a model saved under folder/PREFIX."""
        return folder / f"{PREFIX}{self.suffix}"


class InputKind(enum.Enum):
    """How an input's sample values are drawn."""

    FLOAT = enum.auto()  # uniform in [-1, 1)
    TOKENS = enum.auto()  # ids in [1, vocab), the last quarter of each row padding (id 0)
    FIXED = enum.auto()  # the given int64 values (sequence lengths)


@dataclass(frozen=True)
class InputDef:
    """One model input: its name, the InputSpec shape (-1: dynamic), the shape of its sample, and its values."""

    name: str
    spec: tuple[int, ...]
    sample: tuple[int, ...]
    kind: InputKind = InputKind.FLOAT
    vocab: int = 0  # TOKENS: ids below this
    values: tuple[int, ...] = ()  # FIXED: the sample, in order

    @property
    def dtype(self) -> str:
        return "float32" if self.kind is InputKind.FLOAT else "int64"

    def draw(self, rng: np.random.Generator) -> np.ndarray:
        """A sample value."""
        if self.kind is InputKind.FLOAT:
            return rng.uniform(-1, 1, self.sample).astype(np.float32)
        if self.kind is InputKind.FIXED:
            return np.array(self.values, np.int64).reshape(self.sample)
        ids = rng.integers(1, max(self.vocab, 2), self.sample, dtype=np.int64)
        ids[..., ids.shape[-1] - ids.shape[-1] // 4:] = 0
        return ids


def spawn_in_format(fmt: PaddleFormat, command: Sequence[str]) -> None:
    """Run `command` (a Python child that imports paddle) with paddle set to save `fmt`; CalledProcessError if it
    fails."""
    subprocess.run(list(command), env=dict(os.environ, FLAGS_enable_pir_api=fmt.flag), check=True)


def as_list(out: Any) -> list:
    """A Layer's outputs as a list."""
    return list(out) if isinstance(out, (list, tuple)) else [out]


def save_layer(paddle: Any, layer: Any, inputs: Sequence[InputDef], folder: pathlib.Path) -> None:
    """Save an eval-mode Layer as an inference model under folder/PREFIX, in the format this process writes."""
    specs = [paddle.static.InputSpec(list(i.spec), i.dtype, i.name) for i in inputs]
    _give_rnn_dropout_states(paddle, layer)
    paddle.jit.save(layer, str(folder / PREFIX), input_spec=specs)


def _give_rnn_dropout_states(paddle: Any, layer: Any) -> None:
    """paddle 3.3's legacy tracing asks every buffer for its device, and an RNN's dropout state has none until the RNN
    first runs (a ValueError, "Unknown place type"): give it an empty one."""
    for sub in layer.sublayers(include_self=True):
        state = getattr(sub, "_dropout_state", None)
        if state is not None and hasattr(state, "_is_initialized") and not state._is_initialized():
            placed = paddle.zeros([0], "uint8")
            placed.name = state.name  # the name paddle knows as non-persistable: not written to .pdiparams
            sub._dropout_state = placed


def _legacy_op(paddle, op_type: str, inputs: dict, attrs: dict, dtype=None):
    """Append a legacy op with one output `Out` (of the first input's dtype unless given) to the traced program."""
    helper = paddle.base.layer_helper.LayerHelper(op_type)
    out = helper.create_variable_for_type_inference(dtype or next(iter(inputs.values())).dtype)
    helper.append_op(type=op_type, inputs=inputs, outputs={"Out": out}, attrs=attrs)
    return out


def _legacy_unary(paddle, op_type: str):
    """An API of one tensor appending the legacy op of the same name."""
    return lambda x, name=None: _legacy_op(paddle, op_type, {"X": x}, {})


def _legacy_binary(paddle, op_type: str):
    """An API of two tensors X, Y appending a legacy op (elementwise ones broadcast as numpy: axis -1)."""
    attrs = {"axis": -1} if op_type.startswith("elementwise_") else {}
    return lambda x, y, name=None: _legacy_op(paddle, op_type, {"X": x, "Y": y}, attrs)


def _legacy_reduce(paddle, op_type: str):
    """A reduction API (x, axis, keepdim) appending the legacy reduce op."""
    def reduce(x, axis=None, keepdim=False, name=None, dtype=None):
        axes = [] if axis is None else [axis] if isinstance(axis, int) else list(axis)
        return _legacy_op(paddle, op_type, {"X": x}, {"dim": axes, "keep_dim": keepdim, "reduce_all": not axes})
    return reduce


def _legacy_arg(paddle, op_type: str):
    """argmax / argmin appending the legacy arg_max / arg_min (int64 indices)."""
    def arg(x, axis=None, keepdim=False, dtype="int64", name=None):
        attrs = {"axis": -1 if axis is None else axis, "keepdims": keepdim, "flatten": axis is None, "dtype": 3}
        return _legacy_op(paddle, op_type, {"X": x}, attrs, paddle.int64)
    return arg


def patch_legacy_apis(paddle: Any) -> None:
    """paddle 3.3 traces these APIs only to PIR; in legacy static mode append the ops Paddle 2 wrote."""
    F = paddle.nn.functional
    tensor = importlib.import_module("paddle.tensor")
    unary = {(paddle, api): _legacy_unary(paddle, api)
             for api in ("tanh", "abs", "exp", "floor", "sign", "expm1", "rsqrt", "log1p", "sqrt", "logical_not")}
    binary = {(paddle, api): _legacy_binary(paddle, op_type)
              for api, op_type in (("maximum", "elementwise_max"), ("multiply", "elementwise_mul"),
                                   ("logical_and", "logical_and"), ("logical_xor", "logical_xor"))}
    legacy = {
        **unary, **binary,
        (F, "gelu"): lambda x, approximate=False, name=None: _legacy_op(
            paddle, "gelu", {"X": x}, {"approximate": approximate}),
        **{(module, "matmul"): lambda x, y, transpose_x=False, transpose_y=False, name=None: _legacy_op(
            paddle, "matmul_v2", {"X": x, "Y": y}, {"trans_x": transpose_x, "trans_y": transpose_y})
           for module in (paddle, tensor)},
        (F, "sigmoid"): lambda x, name=None: _legacy_op(paddle, "sigmoid", {"X": x}, {}),
        (F, "softplus"): lambda x, beta=1, threshold=20, name=None: _legacy_op(
            paddle, "softplus", {"X": x}, {"beta": float(beta), "threshold": float(threshold)}),
        (paddle, "round"): lambda x, decimals=0, name=None: _legacy_op(paddle, "round", {"X": x}, {"decimals": decimals}),
        (paddle, "roll"): lambda x, shifts, axis=None, name=None: _legacy_op(
            paddle, "roll", {"X": x}, {"shifts": list(shifts), "axis": list(axis or [])}),
        **{(paddle, name): (lambda lower: lambda x, diagonal=0, name=None: _legacy_op(
            paddle, "tril_triu", {"X": x}, {"diagonal": diagonal, "lower": lower}))(name == "tril")
           for name in ("tril", "triu")},
        (paddle, "expand_as"): lambda x, y, name=None: _legacy_op(
            paddle, "expand_as_v2", {"X": x, "Y": y}, {"target_shape": list(y.shape)}),
        (paddle, "bmm"): _legacy_binary(paddle, "bmm"),
        (paddle, "diagonal"): lambda x, offset=0, axis1=0, axis2=1, name=None: _legacy_op(
            paddle, "diagonal", {"Input": x}, {"offset": offset, "axis1": axis1, "axis2": axis2}),
        (paddle, "dot"): _legacy_binary(paddle, "dot"),
        (paddle, "isclose"): lambda x, y, rtol=1e-5, atol=1e-8, equal_nan=False, name=None: _legacy_op(
            paddle, "isclose", {"Input": x, "Other": y}, {"rtol": str(rtol), "atol": str(atol), "equal_nan": equal_nan},
            paddle.bool),
        (paddle, "argmax"): _legacy_arg(paddle, "arg_max"),
        (paddle, "argmin"): _legacy_arg(paddle, "arg_min"),
        **{(module, "sum"): _legacy_reduce(paddle, "reduce_sum") for module in (paddle, tensor)},
        (paddle, "all"): _legacy_reduce(paddle, "reduce_all"),
        (paddle, "any"): _legacy_reduce(paddle, "reduce_any"),
        (paddle, "logsumexp"): lambda x, axis=None, keepdim=False, name=None: _legacy_op(
            paddle, "logsumexp", {"X": x}, {"axis": [] if axis is None else [axis] if isinstance(axis, int) else list(axis),
                                             "keepdim": keepdim, "reduce_all": axis is None}),
    }
    for (module, name), static in legacy.items():
        setattr(module, name, _dispatch(paddle, getattr(module, name), static))


def _dispatch(paddle, eager, static):
    def call(*args, **kwargs):  # decided at each call: the mode changes after patching
        return (eager if paddle.in_dynamic_mode() else static)(*args, **kwargs)

    return call


def params_path(model_file: str | os.PathLike) -> str:
    """The .pdiparams file beside a model file."""
    return os.path.splitext(os.fspath(model_file))[0] + PARAMS_SUFFIX


class PaddleInference:
    """A saved model run by Paddle Inference on the CPU: `threads` math-library threads and MKLDNN (oneDNN) on, as
    Paddle's CPU default has it; the inputs copied in and the outputs copied out on every run."""

    def __init__(self, model_file: str | os.PathLike, threads: int):
        from paddle import inference  # only the processes that run Paddle import it

        config = inference.Config(os.fspath(model_file), params_path(model_file))
        config.disable_gpu()
        config.enable_mkldnn()
        config.set_cpu_math_library_num_threads(threads)
        config.disable_glog_info()
        self.mkldnn = bool(config.mkldnn_enabled())
        self._predictor = inference.create_predictor(config)
        self.input_names: list[str] = list(self._predictor.get_input_names())
        self.output_names: list[str] = list(self._predictor.get_output_names())

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """One run on named inputs; the outputs in fetch order."""
        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise ValueError(f"no value for the model's input(s) {', '.join(missing)}")
        for name in self.input_names:
            self._predictor.get_input_handle(name).copy_from_cpu(np.ascontiguousarray(feeds[name]))
        self._predictor.run()
        return [self._predictor.get_output_handle(name).copy_to_cpu() for name in self.output_names]

