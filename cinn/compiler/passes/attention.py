"""Recognize multi-head attention as exporters write it and replace it by the fused attention op.

The form matched:

    scores    = matmul(view(q), view(k), trans_y, alpha)   # k viewed as [..., seq, dim], or [..., dim, seq]
    logits    = scores [* or / a scalar, or scale] [+ bias]
    context   = matmul(softmax(logits, axes=[-1]), view(v))
    out       = view of the context as [..., seq, heads * dim]

where each view is any chain of layout ops (reshapes, transposes, gathers of one index, slices; index_map) and
scalar scales that reads [batch, heads, seq, dim] from a value's rows with the heads side by side: BERT's and
transformers' [batch, seq, heads * dim] split through 4-D shapes, torch's nn.MultiheadAttention's sequence-first
fused projection cut by gathers and its heads merged with the batch ([batch * heads, seq, dim]), q and k scaled
before the matmul or the scores after. The views fold into the fused kernel's indexing, so none of them is copied
(a reshape of a whole value to [..., seq, row] at most, which moves nothing).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from math import prod

import numpy as np

from cinn.compiler.passes.dce import dce
from cinn.compiler.passes.index_map import VIEW_OPS, Digit, IndexMap, backward, forward, merged
from cinn.compiler.passes.rewrite import Rewriter, rewrite
from cinn.compiler.passes.simplify import RESHAPE_LIKE
from cinn.core.ir import Node, Program, Value
from cinn.core.ops.attention import MASKED, AttentionAttrs, attention_shape, broadcasts_to
from cinn.core.ops.shape import ReshapeAttrs, SliceAttrs, slice_ranges


def fuse_attention(program: Program) -> Program:
    """Replace every matched attention subgraph by one attention node."""
    return dce(rewrite(program, _fuse))


def fold_attention_slices(program: Program) -> Program:
    """Read q, k and v that are slices of one tensor's last axis (a fused QKV projection split in three) in place:
    the attention takes the sliced tensor and the slices' first columns, and the copies go."""
    return dce(rewrite(program, _fold_slices))


def _fold_slices(rw: Rewriter, node: Node) -> bool:
    attrs = node.attrs
    if node.op != "attention" or not isinstance(attrs, AttentionAttrs) or attrs.columns != (0, 0, 0):
        return False
    inputs = rw.inputs(node)
    found = [_column_slice(rw, x) for x in inputs[:3]]
    if all(f is None for f in found):
        return False
    s = attention_shape([x.type for x in inputs], attrs)
    sources = [x if f is None else f[0] for x, f in zip(inputs[:3], found, strict=True)]
    q_col, k_col, v_col = (0 if f is None else f[1] for f in found)
    folded = dataclasses.replace(attrs, columns=(q_col, k_col, v_col), head_dims=(s.dim, s.value_dim))
    rw.keep(node, inputs=(*sources, inputs[3]), attrs=folded)
    return True


def _column_slice(rw: Rewriter, value: Value) -> tuple[Value, int] | None:
    """The tensor and first column of a value that is a contiguous range of that tensor's last axis."""
    node = rw.producer(value)
    if node is None or not isinstance(node.attrs, SliceAttrs):
        return None
    (source,) = rw.inputs(node)
    ranges = slice_ranges(source.shape, node.attrs)
    whole = all(r == range(d) for r, d in zip(ranges[:-1], source.shape[:-1], strict=True))
    return (source, ranges[-1].start) if whole and ranges[-1].step == 1 else None


def mark_causal(program: Program) -> Program:
    """Mark the attention nodes whose constant bias masks exactly the keys after each query's position (causal), so
    that their kernels skip those keys; run after constant folding, which makes an exporter's mask arithmetic one
    constant."""
    return rewrite(program, _mark_causal)


def _mark_causal(rw: Rewriter, node: Node) -> bool:
    attrs = node.attrs
    if node.op != "attention" or not isinstance(attrs, AttentionAttrs) or attrs.causal:
        return False
    bias = rw.constant(rw.inputs(node)[3])
    if bias is None or not is_causal(bias, node.inputs[0].shape[-2], node.inputs[1].shape[-2]):
        return False
    rw.keep(node, attrs=dataclasses.replace(attrs, causal=True))
    return True


def is_causal(bias: np.ndarray, queries: int, keys: int) -> bool:
    """Whether the bias (broadcast to [..., queries, keys]) is <= MASKED exactly where key j > query i + keys -
    queries, every query keeping at least its first key (a row all masked is no causal one: its softmax spreads
    over every key)."""
    if bias.ndim < 2 or bias.shape[-2:] != (queries, keys) or keys < queries:
        return False
    i, j = np.ogrid[:queries, :keys]
    return bool(np.array_equal(np.broadcast_to(bias <= MASKED, bias.shape), np.broadcast_to(j > i + keys - queries,
                                                                                              bias.shape)))


@dataclass(frozen=True)
class _Heads:
    """q, k, v or the output as [batch, heads, seq, dim] in a base value's rows: element (b, h, s, d) at
    b * seq * row + s * row + column + h * dim + d of the base's storage."""

    base: Value
    batch: int
    heads: int
    seq: int
    dim: int
    row: int
    column: int


LAYOUT_OPS = (*RESHAPE_LIKE, "transpose")


def _fuse(rw: Rewriter, node: Node) -> bool:
    """Fuse at the first layout op after the context matmul whose output holds the context as the fused op writes it,
    [..., seq, heads * dim]."""
    if node.op not in LAYOUT_OPS:
        return False
    final, layout = node.outputs[0], node
    context = IndexMap.of(final.shape)  # the context as a view of `final`
    while True:
        before = backward(layout, context)
        producer = rw.producer(rw.inputs(layout)[0])
        if before is None or producer is None or not _single(rw, producer):
            return False
        context = before
        if producer.op not in LAYOUT_OPS:
            break
        layout = producer
    if producer.op != "matmul" or producer.attrs.trans_x or producer.attrs.alpha != 1.0:
        return False
    out = _layout(final, context)
    return out is not None and _fuse_context(rw, producer, out)


def _fuse_context(rw: Rewriter, pv: Node, out: _Heads) -> bool:
    """Replace the attention whose context matmul is `pv` and whose output is laid out as `out`."""
    softmax = _producer(rw, pv.inputs[0], "softmax")
    rank = len(pv.inputs[0].shape)
    if softmax is None or tuple(a % rank for a in softmax.attrs.axes) != (rank - 1,) or not _single(rw, softmax):
        return False
    found = _logits(rw, softmax.inputs[0])
    viewed = _heads(rw, pv.inputs[1], transposed=pv.attrs.trans_y)
    if found is None or viewed is None:
        return False
    q, k, scale, bias = found
    v, v_scale = viewed  # the op scales no values
    lead = pv.outputs[0].shape[:-2]
    if v_scale != 1.0 or not q.base.dtype == k.base.dtype == v.base.dtype or not q.seq == out.seq or k.seq != v.seq \
            or not q.heads == k.heads == v.heads == out.heads or not q.batch == k.batch == v.batch == out.batch \
            or q.dim != k.dim or v.dim != out.dim or out.column or out.row != out.heads * out.dim \
            or not pv.inputs[0].shape[:-2] == pv.inputs[1].shape[:-2] == lead:
        return False
    # the batch dims as the graph has them where it keeps the heads an axis of their own, else merged in one
    separate = lead[-1:] == (q.heads,) and prod(lead[:-1]) == q.batch
    batch = lead[:-1] if separate else (q.batch,)
    bias = _bias(rw, bias, separate, (*batch, q.heads, q.seq, k.seq), q.base.dtype)
    if bias is None:
        return False
    plain = q.column == k.column == v.column == 0 and q.row == k.row == q.heads * q.dim and v.row == v.heads * v.dim
    attrs = AttentionAttrs(q.heads, scale) if plain else AttentionAttrs(
        q.heads, scale, columns=(q.column, k.column, v.column), head_dims=(q.dim, v.dim))
    rows = [_reshaped(rw, x.base, (*batch, x.seq, x.row)) for x in (q, k, v)]
    (result,) = rw.emit("attention", [*rows, bias], attrs)
    rw.substitute(out.base, _reshaped(rw, result, out.base.shape))
    return True


def _bias(rw: Rewriter, bias: Value | None, separate: bool, logits: tuple[int, ...], dtype: str) -> Value | None:
    """The bias as the fused op reads it (broadcast to [batch..., heads, queries, keys]); None where it cannot be: a
    bias over merged batch and heads that differs between them."""
    if bias is None:
        return rw.new_constant(np.zeros((), dtype), "attention_bias")
    if not separate:
        if any(d != 1 for d in bias.shape[:-2]):
            return None
        bias = _reshaped(rw, bias, bias.shape[-2:])
    return bias if bias.dtype == dtype and broadcasts_to(bias.shape, logits) else None


def _reshaped(rw: Rewriter, value: Value, shape: tuple[int, ...]) -> Value:
    if value.shape == shape:
        return value
    (out,) = rw.emit("reshape", [value], ReshapeAttrs(shape))
    return out


def _logits(rw: Rewriter, value: Value) -> tuple[_Heads, _Heads, float, Value | None] | None:
    """q, k, the scale and the bias of logits = matmul(q, k^T) [scaled] [+ bias]."""
    bias = None
    add = _producer(rw, value, "add")
    if add is not None and _single(rw, add):
        for i in (0, 1):
            if (found := _scaled_scores(rw, add.inputs[i])) is not None:
                bias = add.inputs[1 - i]
                break
        else:
            return None
    else:
        found = _scaled_scores(rw, value)
    if found is None:
        return None
    return (*found, bias)


def _scaled_scores(rw: Rewriter, value: Value) -> tuple[_Heads, _Heads, float] | None:
    """q, k and the scale of matmul(q, k^T, alpha), optionally scaled once more by a scalar (q and k may be scaled
    before too)."""
    scale = 1.0
    node = rw.producer(value)
    if node is not None and _single(rw, node) and (scaled := _scaled(rw, node)) is not None:
        scale, node = scaled[0], rw.producer(scaled[1])
    if node is None or node.op != "matmul" or node.attrs.trans_x or not _single(rw, node):
        return None
    q = _heads(rw, node.inputs[0], transposed=False)
    k = _heads(rw, node.inputs[1], transposed=not node.attrs.trans_y)
    if q is None or k is None:
        return None
    return q[0], k[0], scale * node.attrs.alpha * q[1] * k[1]


def _scaled(rw: Rewriter, node: Node) -> tuple[float, Value] | None:
    """The factor and the input of x * c, c * x, x / c or scale(x, c) (no bias) with a scalar constant c."""
    if node.op == "scale":
        return (float(node.attrs.scale), rw.inputs(node)[0]) if node.attrs.bias == 0 else None
    if node.op not in ("multiply", "divide"):
        return None
    inputs = rw.inputs(node)
    for i in (1, 0) if node.op == "multiply" else (1,):
        c = rw.constant(inputs[i])
        x = inputs[1 - i]
        if c is not None and c.size == 1 and x.shape == node.outputs[0].shape:
            value = float(c.reshape(()))
            if node.op == "multiply":
                return value, x
            return (1.0 / value, x) if value else None
    return None


def _heads(rw: Rewriter, value: Value, transposed: bool) -> tuple[_Heads, float] | None:
    """q, k or v of a matmul, [..., seq, dim] ([..., dim, seq] when `transposed`), in the rows it is read from through
    layout ops and scalar scales, and the scales' product."""
    base, index, factor = _viewed(rw, value)
    if transposed:
        n = len(index.axes)
        index = index.transpose((*range(n - 2), n - 1, n - 2))
    layout = _layout(base, index)
    return None if layout is None else (layout, factor)


def _viewed(rw: Rewriter, value: Value) -> tuple[Value, IndexMap, float]:
    """The value that a chain of view ops and scalar scales reads `value` from, as far back as its map composes, the
    map, and the scales' product."""
    node = rw.producer(value)
    scaled = None if node is None else _scaled(rw, node)
    if node is None or (node.op not in VIEW_OPS and scaled is None):
        return value, IndexMap.of(value.shape), 1.0
    base, index, factor = _viewed(rw, rw.inputs(node)[0] if scaled is None else scaled[1])
    if scaled is not None:
        return base, index, factor * scaled[0]
    mapped = forward(node, index, rw.constant)
    return (base, mapped, factor) if mapped is not None else (value, IndexMap.of(value.shape), 1.0)


def _layout(base: Value, index: IndexMap) -> _Heads | None:
    """The [batch, heads, seq, dim] layout of an [..., seq, dim] map of `base`, batch and heads in the leading axes
    (separate or merged, the batch outermost); None where the heads' columns do not lie side by side in rows of the
    base."""
    *lead, seq_axis, dim_axis = index.axes
    seq, dim = index.shape[-2:]
    if not base.shape:
        return None
    row = merged(seq_axis)[0].stride if seq > 1 else base.shape[-1]
    digits = [d for axis in lead for d in axis]
    batch = [d for d in digits if d.stride >= row]
    heads = digits[len(batch):]
    if merged(dim_axis) != _digit(dim, 1) or merged(seq_axis) != _digit(seq, row) or batch != digits[: len(batch)] \
            or row <= 0 or any(d.stride >= row or d.stride <= 0 for d in heads):
        return None
    b, h = prod(d.size for d in batch), prod(d.size for d in heads)
    if merged(batch) != _digit(b, seq * row) or merged(heads) != _digit(h, dim) or prod(base.shape) != b * seq * row \
            or not 0 <= index.offset <= row - h * dim:
        return None
    return _Heads(base, b, h, seq, dim, row, index.offset)


def _digit(size: int, stride: int) -> tuple[Digit, ...]:
    """The merged digits of an axis of `size` with `stride` (none for a unit axis)."""
    return (Digit(size, stride),) if size > 1 else ()


def _producer(rw: Rewriter, value: Value, op: str) -> Node | None:
    node = rw.producer(value)
    return node if node is not None and node.op == op else None


def _single(rw: Rewriter, node: Node) -> bool:
    """Whether the node's output feeds only the next node of the pattern (so the fused op replaces all its uses)."""
    return rw.has_single_use(node.outputs[0])
