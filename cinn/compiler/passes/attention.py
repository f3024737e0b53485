"""Recognize multi-head attention as exporters write it and replace it by the fused attention op.

The form matched (as PyTorch's and our zoo's graphs have it; ONNX exports the same nodes):

    split(x)  = transpose(reshape(x, [..., seq, heads, dim]), [..., seq <-> heads])
    scores    = matmul(split(q), split(k), trans_y=True, alpha)   # or k split straight to [..., heads, dim, seq]
    logits    = scores [* or / a scalar, or scale] [+ bias]
    context   = matmul(softmax(logits, axes=[-1]), split(v))
    out       = reshape(transpose(context, [..., heads <-> seq]), [..., seq, heads * dim])

The head splits and the merge fold into the fused kernel's indexing, so none of them is copied.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from cinn.compiler.passes.dce import dce
from cinn.compiler.passes.rewrite import Rewriter, rewrite
from cinn.compiler.passes.simplify import transpose_perm
from cinn.core.ir import Node, Program, Value
from cinn.core.ops.attention import MASKED, AttentionAttrs, attention_shape, broadcasts_to
from cinn.core.ops.shape import SliceAttrs, slice_ranges


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
    """A [..., seq, heads * dim] value seen through a head split."""

    source: Value
    heads: int
    dim: int


def _fuse(rw: Rewriter, node: Node) -> bool:
    """Fuse at the reshape that merges the heads back."""
    if node.op != "reshape":
        return False
    merge = _producer(rw, rw.inputs(node)[0], "transpose")
    if merge is None or transpose_perm(merge) != _swap(len(merge.inputs[0].shape) - 3, 0) or not _single(rw, merge):
        return False
    pv = _producer(rw, merge.inputs[0], "matmul")
    if pv is None or not _plain(pv) or not _single(rw, pv):
        return False
    softmax = _producer(rw, pv.inputs[0], "softmax")
    rank = len(pv.inputs[0].shape)
    if softmax is None or tuple(a % rank for a in softmax.attrs.axes) != (rank - 1,) or not _single(rw, softmax):
        return False
    found = _logits(rw, softmax.inputs[0])
    v = _split(rw, pv.inputs[1], transposed=False)
    if found is None or v is None:
        return False
    q, k, scale, bias = found
    if not q.heads == k.heads == v.heads or q.dim != k.dim or node.outputs[0].shape != v.source.shape[:-2] + (
        q.source.shape[-2], v.heads * v.dim):
        return False
    if bias is None:
        bias = rw.new_constant(np.zeros((), q.source.dtype), "attention_bias")
    if bias.dtype != q.source.dtype or not broadcasts_to(bias.shape, softmax.inputs[0].shape):
        return False
    (out,) = rw.emit("attention", [q.source, k.source, v.source, bias], AttentionAttrs(q.heads, scale))
    rw.substitute(node.outputs[0], out)
    return True


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
    """q, k and the scale of matmul(q, k^T, alpha), optionally scaled once more by a scalar."""
    scale = 1.0
    node = rw.producer(value)
    if node is not None and node.op in ("scale", "multiply", "divide") and _single(rw, node):
        factor = _scalar_factor(rw, node)
        if factor is None:
            return None
        scale, node = factor, rw.producer(node.inputs[0])
    if node is None or node.op != "matmul" or node.attrs.trans_x or not _single(rw, node):
        return None
    q = _split(rw, node.inputs[0], transposed=False)
    k = _split(rw, node.inputs[1], transposed=not node.attrs.trans_y)
    if q is None or k is None or q.source.shape[:-2] != k.source.shape[:-2]:
        return None
    return q, k, scale * node.attrs.alpha


def _scalar_factor(rw: Rewriter, node: Node) -> float | None:
    """The factor of x * c, x / c or scale(x, c) (no bias) with a scalar constant c."""
    if node.op == "scale":
        return float(node.attrs.scale) if node.attrs.bias == 0 else None
    c = rw.constant(node.inputs[1])
    if c is None or c.size != 1 or node.inputs[0].shape != node.outputs[0].shape:
        return None
    value = float(c.reshape(()))
    return value if node.op == "multiply" else 1.0 / value if value else None


def _split(rw: Rewriter, value: Value, transposed: bool) -> _Heads | None:
    """x behind transpose(reshape(x, [..., seq, heads, dim])) to [..., heads, seq, dim] ([..., heads, dim, seq] when
    `transposed`)."""
    tr = _producer(rw, value, "transpose")
    if tr is None:
        return None
    reshape = _producer(rw, tr.inputs[0], "reshape")
    n = len(tr.inputs[0].shape) - 3
    if reshape is None or n < 0 or transpose_perm(tr) != _swap(n, int(transposed)):
        return None
    source = reshape.inputs[0]
    *lead, seq, heads, dim = tr.inputs[0].shape
    if source.shape != (*lead, seq, heads * dim):
        return None
    return _Heads(source, heads, dim)


def _swap(n: int, transposed: int) -> tuple[int, ...]:
    """[..., seq, heads, dim] -> [..., heads, seq, dim], or -> [..., heads, dim, seq] when `transposed`."""
    return (*range(n), n + 1, n + 2, n) if transposed else (*range(n), n + 1, n, n + 2)


def _producer(rw: Rewriter, value: Value, op: str) -> Node | None:
    node = rw.producer(value)
    return node if node is not None and node.op == op else None


def _plain(matmul: Node) -> bool:
    a = matmul.attrs
    return not (a.trans_x or a.trans_y) and a.alpha == 1.0


def _single(rw: Rewriter, node: Node) -> bool:
    """Whether the node's output feeds only the next node of the pattern (so the fused op replaces all its uses)."""
    return rw.has_single_use(node.outputs[0])
