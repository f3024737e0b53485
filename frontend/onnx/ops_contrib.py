"""Converters of the com.microsoft ops that onnxruntime's transformer optimizer writes: Attention (into the fused
attention op), SkipLayerNormalization, BiasGelu, FastGelu."""
from __future__ import annotations

import math

import numpy as np

from cinn.core.ir import TensorType, Value
from frontend.onnx.ops_nn import layer_norm_outputs
from frontend.onnx.registry import NodeContext, OnnxImportError, converter

MS = "com.microsoft."


@converter(MS + "BiasGelu")
def bias_gelu(ctx: NodeContext):
    return [ctx.b.gelu(ctx.b.add(ctx.input(0), ctx.input(1)), approximate=False)]


@converter(MS + "FastGelu")
def fast_gelu(ctx: NodeContext):
    x, bias = ctx.input(0), ctx.input(1)
    return [ctx.b.gelu(x if bias is None else ctx.b.add(x, bias), approximate=True)]


@converter(MS + "SkipLayerNormalization")
def skip_layer_norm(ctx: NodeContext):
    """LayerNorm(input + skip [+ bias]) over the last axis; outputs y, mean, inv_std_var, input + skip + bias."""
    x, skip, gamma, beta, bias = (ctx.input(i) for i in range(5))
    total = ctx.b.add(x, skip)
    if bias is not None:
        total = ctx.b.add(total, bias)
    axis = len(total.shape) - 1
    outs = layer_norm_outputs(ctx, total, gamma, beta, axis, ctx.attr("epsilon", 1e-12), ctx.node.output[1:3])
    return [*outs, *([None, None] if len(outs) == 1 else []), total]


@converter(MS + "Attention")
def attention(ctx: NodeContext):
    """Self-attention over one input: a packed Q/K/V projection (weights [hidden_in, q + k + v], bias), a mask
    (key lengths [batch], or 0/1 [batch, keys] or [batch, queries, keys] with mask_filter_value where 0),
    `unidirectional` (causal) and attention_bias, as the fused attention op."""
    for i, what in ((4, "past"), (6, "past_sequence_length")):
        if ctx.input(i) is not None:
            raise OnnxImportError(f"com.microsoft.Attention: the {what} input (a key/value cache) is not supported")
    if ctx.attr("do_rotary", 0) or (len(ctx.node.output) > 1 and ctx.node.output[1]):
        raise OnnxImportError("com.microsoft.Attention: do_rotary and the present output are not supported")
    x, weights, proj_bias = ctx.input(0), ctx.input(1), ctx.input(2)
    heads = int(ctx.attr("num_heads", 0))
    sizes = ctx.attr("qkv_hidden_sizes", None) or [weights.shape[-1] // 3] * 3
    if heads <= 0 or sum(sizes) != weights.shape[-1] or sizes[0] != sizes[1] or any(s % heads for s in sizes):
        raise OnnxImportError(f"com.microsoft.Attention: num_heads {heads} and Q/K/V sizes {list(sizes)} do not fit "
                              f"weights {weights.shape}")
    qkv = ctx.b.matmul(x, weights)
    if proj_bias is not None:
        qkv = ctx.b.add(qkv, proj_bias)
    starts = np.cumsum([0, *sizes])
    q, k, v = (ctx.b.slice(qkv, axes=[2], starts=[int(starts[i])], ends=[int(starts[i + 1])]) for i in range(3))
    scale = float(ctx.attr("scale", 0.0)) or 1.0 / math.sqrt(sizes[0] // heads)
    bias = _bias(ctx, x.shape[0], x.shape[1], float(ctx.attr("mask_filter_value", -10000.0)), x.dtype)
    return [ctx.b.attention(q, k, v, bias, heads=heads, scale=scale)]


def _bias(ctx: NodeContext, batch: int, seq: int, fill: float, dtype: str) -> Value:
    """The additive bias of the logits ([batch or 1, heads or 1, seq, seq]) from mask_index, unidirectional and
    attention_bias."""
    bias = ctx.b.fill_constant((), 0.0, dtype)
    mask = ctx.input(3)
    if mask is not None:
        bias = ctx.b.add(bias, _mask_bias(ctx, mask, batch, seq, fill, dtype))
    if ctx.attr("unidirectional", 0):
        TensorType((seq, seq), dtype)  # ShapeTooLarge before numpy makes the mask
        causal = np.where(np.tril(np.ones((seq, seq), bool)), 0.0, fill).astype(dtype)
        bias = ctx.b.add(bias, ctx.b.create_constant(causal))
    extra = ctx.input(5)
    return bias if extra is None else ctx.b.add(bias, extra)


def _mask_bias(ctx: NodeContext, mask: Value, batch: int, seq: int, fill: float, dtype: str) -> Value:
    """mask_index as a bias: key lengths [batch], or a 0/1 raw mask [batch, keys] or [batch, queries, keys]."""
    zero, hidden = ctx.b.fill_constant((), 0.0, dtype), ctx.b.fill_constant((), fill, dtype)
    if mask.shape == (batch,):
        keys = ctx.b.create_constant(np.arange(seq, dtype=mask.dtype))
        seen = ctx.b.less_than(keys, ctx.b.reshape(mask, [batch, 1]))
        return ctx.b.reshape(ctx.b.select(seen, zero, hidden), [batch, 1, 1, seq])
    if mask.shape in ((batch, seq), (batch, seq, seq)):
        seen = ctx.b.not_equal(mask, ctx.b.fill_constant((), 0, mask.dtype))
        return ctx.b.reshape(ctx.b.select(seen, zero, hidden), [batch, 1, *(1,) * (3 - len(mask.shape)), *mask.shape[1:]])
    raise OnnxImportError(f"com.microsoft.Attention: mask_index of shape {mask.shape} is not supported (supported: "
                          f"[batch], [batch, seq], [batch, seq, seq] with batch {batch}, seq {seq})")
