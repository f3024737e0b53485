"""The model zoo: built-in models written with NetBuilder (each with a full and a small test size), and model files
with seeded random inputs, as the benchmarks, the tuner and the tests use them."""
from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from cinn.builder import NetBuilder
from cinn.frontend.loading import is_model_file, load_model
from cinn.ir import Program, Value
from cinn.utils import random_array, random_feeds

SEED = 0


@dataclass(frozen=True)
class BenchModel:
    """A program to benchmark and the inputs to feed it."""

    name: str
    program: Program
    feeds: Mapping[str, np.ndarray]
    onnx_path: str | None = None  # the ONNX file the program was imported from: what onnxruntime runs

    def __post_init__(self):
        object.__setattr__(self, "feeds", MappingProxyType(dict(self.feeds)))


class _Builder:
    """A NetBuilder plus a seeded generator for random weights and inputs."""

    def __init__(self, name: str):
        self.b = NetBuilder(name)
        self.rng = np.random.default_rng(SEED)
        self.feeds: dict[str, np.ndarray] = {}

    def input(self, shape: tuple[int, ...], name: str = "x") -> Value:
        """A float32 input with random data."""
        self.feeds[name] = random_array(self.rng, shape, "float32")
        return self.b.create_input("float32", shape, name)

    def weight(self, shape: tuple[int, ...], name: str, fan_in: int | None = None) -> Value:
        """A random constant, scaled by 1/sqrt(fan_in) so activations stay O(1)."""
        scale = 1.0 / math.sqrt(fan_in) if fan_in else 1.0
        return self.b.create_constant(self.rng.standard_normal(shape, dtype=np.float32) * np.float32(scale), name)

    def uniform(self, shape: tuple[int, ...], name: str, low: float, high: float) -> Value:
        """A constant drawn uniformly (for positive scales and variances)."""
        return self.b.create_constant(self.rng.uniform(low, high, shape).astype(np.float32), name)

    def dense(self, x: Value, units: int, name: str) -> Value:
        """x @ W + b."""
        k = x.shape[-1]
        y = self.b.matmul(x, self.weight((k, units), f"{name}_w", fan_in=k))
        return self.b.add(y, self.weight((units,), f"{name}_b"))

    def layer_norm(self, x: Value, name: str) -> Value:
        """Layer norm over the last axis with random affine parameters."""
        h = x.shape[-1]
        scale, bias = self.uniform((h,), f"{name}_scale", 0.5, 1.5), self.weight((h,), f"{name}_bias")
        return self.b.layer_norm(x, scale, bias, begin_norm_axis=len(x.shape) - 1, epsilon=1e-5)

    def finish(self, name: str, outputs: list[Value]) -> BenchModel:
        return BenchModel(name, self.b.build(outputs), self.feeds)


def mlp(small: bool = False) -> BenchModel:
    """Three dense layers with relu between them: batch 32, 784-1024-1024-10."""
    batch, *widths = (4, 16, 32, 32, 8) if small else (32, 784, 1024, 1024, 10)
    m = _Builder("mlp")
    x = m.input((batch, widths[0]))
    for i, units in enumerate(widths[1:]):
        x = m.dense(x, units, f"fc{i}")
        if i < len(widths) - 2:
            x = m.b.relu(x)
    return m.finish("mlp", [x])


def conv_bn_relu(small: bool = False) -> BenchModel:
    """3x3 convolution (pad 1), inference batch norm and relu on a 1x64x56x56 input."""
    c, hw = (4, 8) if small else (64, 56)
    m = _Builder("conv_bn_relu")
    x = m.input((1, c, hw, hw))
    w = m.weight((c, c, 3, 3), "conv_w", fan_in=c * 9)
    y = m.b.conv2d(x, w, strides=[1, 1], paddings=[1, 1], dilations=[1, 1], groups=1)
    stats = [m.uniform((c,), "bn_scale", 0.5, 1.5), m.weight((c,), "bn_bias"), m.weight((c,), "bn_mean"),
             m.uniform((c,), "bn_var", 0.5, 1.5)]
    y = m.b.batchnorm(y, *stats, epsilon=1e-5)
    return m.finish("conv_bn_relu", [m.b.relu(y)])


def layernorm_gelu(small: bool = False) -> BenchModel:
    """Layer norm over 768 features of 128 rows, then exact (erf) gelu."""
    m = _Builder("layernorm_gelu")
    x = m.input((4, 32) if small else (128, 768))
    return m.finish("layernorm_gelu", [m.b.gelu(m.layer_norm(x, "ln"), approximate=False)])


def attention_softmax(small: bool = False) -> BenchModel:
    """Attention scores of 12 heads x 128 x 128, scaled by 1/sqrt(64), softmax over the last axis."""
    heads, seq, head_dim = (2, 8, 16) if small else (12, 128, 64)
    m = _Builder("attention_softmax")
    x = m.input((heads, seq, seq))
    y = m.b.scale(x, scale=1.0 / math.sqrt(head_dim))
    return m.finish("attention_softmax", [m.b.softmax(y, axes=[-1])])


def encoder(small: bool = False) -> BenchModel:
    """One post-norm transformer encoder layer: seq 128, hidden 768, 12 heads, MLP 3072, batch 1."""
    seq, hidden, heads, ffn = (8, 16, 2, 32) if small else (128, 768, 12, 3072)
    head_dim = hidden // heads
    m = _Builder("encoder")
    b = m.b
    x = m.input((seq, hidden))

    def split_heads(v: Value) -> Value:  # (seq, hidden) -> (heads, seq, head_dim)
        return b.transpose(b.reshape(v, [seq, heads, head_dim]), [1, 0, 2])

    q, k, v = (split_heads(m.dense(x, hidden, name)) for name in ("q", "k", "v"))
    scores = b.matmul(q, k, trans_y=True, alpha=1.0 / math.sqrt(head_dim))
    ctx = b.matmul(b.softmax(scores, axes=[-1]), v)
    ctx = b.reshape(b.transpose(ctx, [1, 0, 2]), [seq, hidden])
    x = m.layer_norm(b.add(x, m.dense(ctx, hidden, "proj")), "ln1")
    h = b.gelu(m.dense(x, ffn, "fc1"), approximate=False)
    x = m.layer_norm(b.add(x, m.dense(h, hidden, "fc2")), "ln2")
    return m.finish("encoder", [x])


MODELS: dict[str, Callable[[bool], BenchModel]] = {
    f.__name__: f for f in (mlp, conv_bn_relu, layernorm_gelu, attention_softmax, encoder)
}


def is_model_name(name: str) -> bool:
    """Whether a model name is a model file rather than a built-in model."""
    return name not in MODELS and is_model_file(name)


def model_label(name: str) -> str:
    """How reports name a model: a file by its stem, a built-in model by its name."""
    return os.path.splitext(os.path.basename(os.path.normpath(name)))[0] if is_model_name(name) else name


def get_model(name: str, small: bool = False, input_shapes: Mapping[str, Sequence[int]] | None = None) -> BenchModel:
    """A built-in model by name (`small`: its test size), or a model file with seeded random inputs (`input_shapes`
    fixes its symbolic input dims)."""
    if is_model_name(name):
        program = load_model(name, input_shapes)
        return BenchModel(model_label(name), program, random_feeds(program.inputs, SEED), name if name.endswith(".onnx") else None)
    try:
        factory = MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}: neither a model file nor a built-in model ({', '.join(MODELS)})") from None
    return factory(small)
