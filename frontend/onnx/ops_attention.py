"""Converter of ONNX's Attention (opset 23+): the fused attention op where it computes the node exactly, else the
same computation in primitive ops (softcap, qk_matmul_output, another softmax precision)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from cinn.core.ir import TensorType, Value
from frontend.onnx.registry import NodeContext, OnnxImportError, converter, onnx_dtype

NEG_INF = float("-inf")


@dataclass(frozen=True)
class _Heads:
    """Q, K and V as [batch, heads, seq, dim] (K and V after the past cache and GQA's head repeat)."""

    q: Value
    k: Value
    v: Value
    present_k: Value
    present_v: Value


@converter("Attention")
def attention(ctx: NodeContext):
    q, k, v = ctx.input(0), ctx.input(1), ctx.input(2)
    if not len(q.shape) == len(k.shape) == len(v.shape) or len(q.shape) not in (3, 4):
        raise OnnxImportError(f"Q {q.shape}, K {k.shape} and V {v.shape} must all be 3-D or all 4-D")
    heads = _heads(ctx, q, k, v)
    num_heads, dim = heads.q.shape[1], heads.q.shape[3]
    scale = ctx.attr("scale", None)
    scale = 1.0 / math.sqrt(dim) if scale is None else float(scale)
    bias = _bias(ctx, heads, past=0 if ctx.input(4) is None else ctx.input(4).shape[2])
    softcap = float(ctx.attr("softcap", 0.0))
    wants_qk = len(ctx.node.output) > 3 and bool(ctx.node.output[3])
    precision = ctx.attr("softmax_precision", None)
    precision = q.dtype if precision is None else onnx_dtype(precision, "softmax_precision")
    if not wants_qk and softcap <= 0 and precision == q.dtype and q.dtype == "float32":
        y = _fused(ctx, heads, bias, scale)
        return [_merge(ctx, y, len(q.shape), num_heads), heads.present_k, heads.present_v]
    y, qk = _primitive(ctx, heads, bias, scale, softcap, precision)
    return [_merge_4d(ctx, y, len(q.shape)), heads.present_k, heads.present_v, qk]


def _primitive(ctx: NodeContext, heads: _Heads, bias: Value | None, scale: float, softcap: float,
               precision: str) -> tuple[Value, Value]:
    """The node in primitive ops: its output [batch, heads, seq, dim] and the qk_matmul_output its mode asks for
    (0, 1: the scaled (and softcapped) logits; 2: with the bias; 3: the probabilities)."""
    mode, dtype = ctx.attr("qk_matmul_output_mode", 0), heads.q.dtype
    logits = ctx.b.matmul(heads.q, heads.k, trans_y=True, alpha=scale)
    if softcap > 0:
        logits = ctx.b.scale(ctx.b.tanh(ctx.b.scale(logits, scale=1.0 / softcap)), scale=softcap)
    qk = logits
    if bias is not None:
        logits = ctx.b.add(logits, bias)
        qk = logits if mode == 2 else qk
    probs = ctx.b.softmax(ctx.b.cast(logits, precision) if precision != dtype else logits, axes=[-1])
    if bias is not None and _may_mask_whole_rows(ctx, bias):
        # a query whose every key is masked attends to nothing: zeros, decided on the bias (not on NaN logits)
        row_max = ctx.b.reduce_max(bias, dim=[-1], keep_dim=True)
        hidden = ctx.b.equal(row_max, ctx.b.fill_constant((), NEG_INF, bias.dtype))
        probs = ctx.b.select(hidden, ctx.b.fill_constant((), 0.0, probs.dtype), probs)
    probs = ctx.b.cast(probs, dtype) if precision != dtype else probs
    return ctx.b.matmul(probs, heads.v), probs if mode == 3 else qk


def _heads(ctx: NodeContext, q: Value, k: Value, v: Value) -> _Heads:
    """Q, K, V in [batch, heads, seq, dim]: 3-D inputs split by q_num_heads / kv_num_heads; the past cache
    prepended; K and V heads repeated for grouped-query attention."""
    if len(q.shape) == 3:
        qh, kvh = ctx.attr("q_num_heads", 0), ctx.attr("kv_num_heads", 0)
        if qh <= 0 or kvh <= 0:
            raise OnnxImportError("3-D Q, K, V need the q_num_heads and kv_num_heads attributes")
        q, k, v = _split(ctx, q, qh), _split(ctx, k, kvh), _split(ctx, v, kvh)
    past_k, past_v = ctx.input(4), ctx.input(5)
    if (past_k is None) != (past_v is None):
        raise OnnxImportError("past_key and past_value must be given together")
    if past_k is not None:
        k, v = ctx.b.concat([past_k, k], axis=2), ctx.b.concat([past_v, v], axis=2)
    present_k, present_v = k, v
    num_heads, kv_heads = q.shape[1], k.shape[1]
    if num_heads != kv_heads:
        if num_heads % kv_heads or v.shape[1] != kv_heads:
            raise OnnxImportError(f"{num_heads} query heads cannot share {kv_heads} key/value heads")
        k, v = (_repeat_heads(ctx, t, num_heads // kv_heads) for t in (k, v))
    return _Heads(q, k, v, present_k, present_v)


def _split(ctx: NodeContext, x: Value, heads: int) -> Value:
    """[batch, seq, heads * dim] -> [batch, heads, seq, dim]."""
    batch, seq, hidden = x.shape
    if hidden % heads:
        raise OnnxImportError(f"hidden size {hidden} of {x.shape} does not divide into {heads} heads")
    return ctx.b.transpose(ctx.b.reshape(x, [batch, seq, heads, hidden // heads]), [0, 2, 1, 3])


def _merge_4d(ctx: NodeContext, y: Value, rank: int) -> Value:
    """[batch, heads, seq, dim] back to the inputs' rank ([batch, seq, heads * dim] for 3-D)."""
    if rank == 4:
        return y
    batch, heads, seq, dim = y.shape
    return ctx.b.reshape(ctx.b.transpose(y, [0, 2, 1, 3]), [batch, seq, heads * dim])


def _merge(ctx: NodeContext, y: Value, rank: int, heads: int) -> Value:
    """The fused op's [batch, seq, heads * dim] output in the inputs' rank."""
    if rank == 3:
        return y
    batch, seq, hidden = y.shape
    return ctx.b.transpose(ctx.b.reshape(y, [batch, seq, heads, hidden // heads]), [0, 2, 1, 3])


def _repeat_heads(ctx: NodeContext, x: Value, times: int) -> Value:
    """Each head repeated `times` times in place ([h0, h0, h1, h1, ...]), as GQA shares them."""
    batch, heads, seq, dim = x.shape
    wide = ctx.b.broadcast_to(ctx.b.reshape(x, [batch, heads, 1, seq, dim]), [batch, heads, times, seq, dim])
    return ctx.b.reshape(wide, [batch, heads * times, seq, dim])


def _fused(ctx: NodeContext, heads: _Heads, bias: Value | None, scale: float) -> Value:
    """The fused attention op over [batch, seq, heads * dim] views of the heads (copies only for 4-D inputs, which
    the graph passes otherwise cancel)."""
    q, k, v = (_merge_4d(ctx, t, 3) for t in (heads.q, heads.k, heads.v))
    if bias is None:
        bias = ctx.b.fill_constant((), 0.0, q.dtype)
    return ctx.b.attention(q, k, v, bias, heads=heads.q.shape[1], scale=scale)


def _bias(ctx: NodeContext, heads: _Heads, past: int) -> Value | None:
    """The additive bias of the logits: the attention mask (booleans as 0 / -inf, padded to the keys with -inf),
    the causal and sliding-window masks (aligned to the end of the past cache, or per batch to nonpad_kv_seqlen) and
    the padding of nonpad_kv_seqlen; None when there is none. Masks of constant positions fold to constants."""
    dtype = heads.q.dtype
    seq, keys = heads.q.shape[2], heads.k.shape[2]
    parts = [] if ctx.input(3) is None else [_mask_bias(ctx, ctx.input(3), keys, dtype)]
    zero, hidden = ctx.b.fill_constant((), 0.0, dtype), ctx.b.fill_constant((), NEG_INF, dtype)
    nonpad = ctx.input(6)
    lengths = None if nonpad is None else ctx.b.reshape(ctx.b.cast(nonpad, "int64"), [nonpad.shape[0], 1, 1, 1])
    if lengths is not None:  # an external cache: keys from nonpad_kv_seqlen[b] on are padding
        key_pos = ctx.b.create_constant(np.arange(keys, dtype=np.int64))
        parts.append(ctx.b.select(ctx.b.less_than(key_pos, lengths), zero, hidden))
    left, right = ctx.attr("left_window_size", -1), ctx.attr("right_window_size", -1)
    checks = [(bool(ctx.attr("is_causal", 0)), "greater_equal", 0), (left >= 0, "less_equal", left),
              (right >= 0, "greater_equal", -right)]
    diff = _position_offsets(ctx, seq, keys, past, lengths) if any(on for on, _, _ in checks) else None
    for on, op, bound in checks:
        if on:
            allowed = getattr(ctx.b, op)(diff, ctx.b.fill_constant((), bound, "int64"))
            parts.append(ctx.b.select(allowed, zero, hidden))
    if not parts:
        return None
    total = parts[0]
    for p in parts[1:]:
        total = ctx.b.add(total, p)
    return total


def _position_offsets(ctx: NodeContext, seq: int, keys: int, past: int, lengths: Value | None) -> Value:
    """Query position - key position, [seq, keys]: query i sits at past + i, or, with an external cache, at
    nonpad_kv_seqlen[b] - seq + i (`lengths`); its size is checked before numpy makes it."""
    TensorType((seq, keys), "int64")  # ShapeTooLarge past what a tensor may hold
    offsets = np.arange(seq)[:, None] - np.arange(keys)[None, :]
    return ctx.b.create_constant(offsets + past) if lengths is None else ctx.b.add(ctx.b.create_constant(offsets - seq), lengths)


def _mask_bias(ctx: NodeContext, mask: Value, keys: int, dtype: str) -> Value:
    """attn_mask as an additive bias over all keys."""
    if mask.dtype == "bool":
        mask = ctx.b.select(mask, ctx.b.fill_constant((), 0.0, dtype), ctx.b.fill_constant((), NEG_INF, dtype))
    elif mask.dtype != dtype:
        mask = ctx.b.cast(mask, dtype)
    short = keys - mask.shape[-1]
    if short < 0:
        raise OnnxImportError(f"attn_mask {mask.shape} covers more than the {keys} keys")
    if short:
        pads = [[0, 0]] * (len(mask.shape) - 1) + [[0, short]]
        mask = ctx.b.pad(mask, pads, pad_value=NEG_INF)
    return mask


def _may_mask_whole_rows(ctx: NodeContext, bias: Value) -> bool:
    """Whether some query row of the bias may be all -inf (always, for a bias known only at run time)."""
    data = ctx.b.constant_of(bias)
    return data is None or bool(np.isneginf(data.max(axis=-1)).any())
