"""The model zoo: built-in models written with NetBuilder (each with a full and a small test size), and model files
with seeded random inputs, as the benchmarks, the tuner and the tests use them."""
from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from cinn.core.builder import NetBuilder
from cinn.core.ir import Program, Value
from cinn.core.symbolic import SymbolicProgram, require_static
from cinn.core.utils import random_array, random_feeds
from frontend.loading import is_model_file, load_model

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

    def tokens(self, shape: tuple[int, ...], vocab: int, name: str) -> Value:
        """An int64 input of token ids, random in [0, vocab)."""
        self.feeds[name] = self.rng.integers(0, vocab, shape, dtype=np.int64)
        return self.b.create_input("int64", shape, name)

    def padding_mask(self, batch: int, seq: int, step: int) -> Value:
        """A float32 attention-mask input: 1 for tokens, 0 for the last step * k positions of row k."""
        mask = np.ones((batch, seq), np.float32)
        for row in range(batch):
            mask[row, seq - min(seq - 1, step * row) :] = 0.0
        self.feeds["attention_mask"] = mask
        return self.b.create_input("float32", (batch, seq), "attention_mask")

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
    m = _Builder("encoder")
    x = _encoder_layer(m, m.input((seq, hidden)), heads, ffn, None, "")
    return m.finish("encoder", [x])


def symbolic_encoder(small: bool = False) -> SymbolicProgram:
    """The encoder layer (see encoder) over input x[batch, seq, hidden] with symbolic batch and seq."""
    hidden, heads, ffn = (16, 2, 32) if small else (768, 12, 3072)
    m = _Builder("encoder")
    x = m.b.create_input("float32", ("batch", "seq", hidden), "x")
    return m.b.build_symbolic([_encoder_layer(m, x, heads, ffn, None, "")])


_BERT = (12, 768, 12, 3072, 30522, 512)  # layers, hidden, heads, ffn, vocab, positions
_BERT_SMALL = (2, 16, 2, 32, 50, 64)


def bert_base(small: bool = False, batch: int = 1) -> BenchModel:
    """BERT-base as PyTorch exports it: token, position and segment embeddings (Gather), a padding mask, 12 post-norm
    encoder layers (hidden 768, 12 heads, erf GELU MLP 3072); seq 128. The mask pads the last 8k tokens of row k."""
    seq = 8 if small else 128
    layers, hidden, heads, ffn, vocab, _ = _BERT_SMALL if small else _BERT
    name = "bert_base" if batch == 1 else f"bert_base_b{batch}"
    m = _Builder(name)
    ids = m.tokens((batch, seq), vocab, "input_ids")
    mask = m.padding_mask(batch, seq, step=max(1, seq // 16))
    x = m.b.add(m.b.gather(m.weight((vocab, hidden), "word_embeddings"), ids, axis=0),
                m.weight((seq, hidden), "position_embeddings"))
    return m.finish(name, [_bert_encoder(m, x, mask, layers, heads, ffn)])


def symbolic_bert_base(small: bool = False) -> SymbolicProgram:
    """BERT-base (see bert_base) over input_ids, attention_mask and position_ids, each [batch, seq] with symbolic batch
    and seq (up to 512 positions): one program for every request size."""
    layers, hidden, heads, ffn, vocab, positions = _BERT_SMALL if small else _BERT
    m = _Builder("bert_base")
    ids, mask, pos = (m.b.create_input(dtype, ("batch", "seq"), name) for dtype, name in (
        ("int64", "input_ids"), ("float32", "attention_mask"), ("int64", "position_ids")))
    x = m.b.add(m.b.gather(m.weight((vocab, hidden), "word_embeddings"), ids, axis=0),
                m.b.gather(m.weight((positions, hidden), "position_embeddings"), pos, axis=0))
    return m.b.build_symbolic([_bert_encoder(m, x, mask, layers, heads, ffn)])


def bert_feeds(batch: int, seq: int, small: bool = False) -> dict[str, np.ndarray]:
    """Seeded inputs of symbolic_bert_base at one size: random tokens, the padding mask of bert_base, positions."""
    m = _Builder("feeds")
    m.tokens((batch, seq), (_BERT_SMALL if small else _BERT)[4], "input_ids")
    m.padding_mask(batch, seq, step=max(1, seq // 16))
    return m.feeds | {"position_ids": np.broadcast_to(np.arange(seq, dtype=np.int64), (batch, seq)).copy()}


def _bert_encoder(m: _Builder, x: Value, mask: Value, layers: int, heads: int, ffn: int) -> Value:
    """BERT after its token and position embeddings: the segment embedding, a layer norm and the encoder layers,
    with the padding mask as an additive bias."""
    x = m.layer_norm(m.b.add(x, m.weight((x.shape[-1],), "token_type_embedding")), "emb_ln")
    # (1 - mask) * -10000, broadcast over heads and query rows
    bias = m.b.reshape(m.b.scale(mask, scale=10000.0, bias=-10000.0), [0, 1, 1, -1])
    for i in range(layers):
        x = _encoder_layer(m, x, heads, ffn, bias, f"l{i}_")
    return x


def bert_base_b8(small: bool = False) -> BenchModel:
    """BERT-base at batch 8 (see bert_base)."""
    return bert_base(small, batch=8)


def gpt2(small: bool = False) -> BenchModel:
    """A GPT-2-style decoder (124M) on a 128-token prefill: token and position embeddings, 12 pre-norm layers (hidden
    768, 12 heads, one fused QKV projection, causal mask, tanh GELU MLP 3072), a final layer norm and logits over
    the 50257-token vocabulary through the tied token embeddings."""
    layers, seq, hidden, heads, vocab = (2, 8, 16, 2, 50) if small else (12, 128, 768, 12, 50257)
    m = _Builder("gpt2")
    b = m.b
    wte = m.weight((vocab, hidden), "wte", fan_in=hidden)
    x = b.add(b.gather(wte, m.tokens((1, seq), vocab, "input_ids"), axis=0), m.weight((seq, hidden), "wpe"))
    causal = np.triu(np.full((seq, seq), -10000.0, np.float32), 1)
    bias = b.create_constant(causal, "causal_mask")
    for i in range(layers):
        qkv = m.dense(m.layer_norm(x, f"l{i}_ln1"), 3 * hidden, f"l{i}_qkv")
        q, k, v = (b.slice(qkv, axes=[2], starts=[j * hidden], ends=[(j + 1) * hidden]) for j in range(3))
        x = b.add(x, m.dense(_attention(m, q, k, v, heads, bias), hidden, f"l{i}_proj"))
        h = b.gelu(m.dense(m.layer_norm(x, f"l{i}_ln2"), 4 * hidden, f"l{i}_fc"), approximate=True)
        x = b.add(x, m.dense(h, hidden, f"l{i}_mlp_proj"))
    logits = b.matmul(m.layer_norm(x, "ln_f"), wte, trans_y=True)
    return m.finish("gpt2", [logits])


def _attention(m: _Builder, q: Value, k: Value, v: Value, heads: int, bias: Value | None) -> Value:
    """Multi-head scaled dot-product attention over [..., seq, hidden] projections, as exporters write it: heads
    split by Reshape/Transpose, softmax(q k^T / sqrt(d) + bias) v, heads merged back."""
    b = m.b
    hidden = q.shape[-1]
    head_dim = hidden // heads
    n = len(q.shape) - 2
    perm = [*range(n), n + 1, n, n + 2]  # [..., seq, heads, d] <-> [..., heads, seq, d]
    keep = [0] * (n + 1)  # reshape keeps the leading dims and seq: the layer takes any (symbolic) sizes of them

    def split(t: Value) -> Value:
        return b.transpose(b.reshape(t, [*keep, heads, head_dim]), perm)

    scores = b.matmul(split(q), split(k), trans_y=True, alpha=1.0 / math.sqrt(head_dim))
    if bias is not None:
        scores = b.add(scores, bias)
    ctx = b.matmul(b.softmax(scores, axes=[-1]), split(v))
    return b.reshape(b.transpose(ctx, perm), [*keep, hidden])


def _encoder_layer(m: _Builder, x: Value, heads: int, ffn: int, bias: Value | None, prefix: str) -> Value:
    """A post-norm encoder layer (BERT's): attention, residual, layer norm, erf-GELU MLP, residual, layer norm."""
    b = m.b
    hidden = x.shape[-1]
    q, k, v = (m.dense(x, hidden, f"{prefix}{name}") for name in ("q", "k", "v"))
    x = m.layer_norm(b.add(x, m.dense(_attention(m, q, k, v, heads, bias), hidden, f"{prefix}proj")), f"{prefix}ln1")
    h = b.gelu(m.dense(x, ffn, f"{prefix}fc1"), approximate=False)
    return m.layer_norm(b.add(x, m.dense(h, hidden, f"{prefix}fc2")), f"{prefix}ln2")


MODELS: dict[str, Callable[[bool], BenchModel]] = {
    f.__name__: f for f in (mlp, conv_bn_relu, layernorm_gelu, attention_softmax, encoder, bert_base, bert_base_b8, gpt2)
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
        program = require_static(load_model(name, input_shapes), "pass input_shapes={name: shape} for each")
        return BenchModel(model_label(name), program, random_feeds(program.inputs, SEED), name if name.endswith(".onnx") else None)
    try:
        factory = MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}: neither a model file nor a built-in model ({', '.join(MODELS)})") from None
    return factory(small)
