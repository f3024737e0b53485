"""Fused multi-head attention: softmax(q k^T * scale + bias) v per head, in one kernel.

The fuse_attention pass recognizes the op from the graph exporters write (head splits by Reshape/Transpose, two
matmuls, a softmax); NetBuilder users may also call it directly. q, k and v keep their [..., seq, heads * dim] layout:
the kernel indexes heads in place, so no transpose copies are made.

A query row whose logits are all -inf (every key masked) gives zeros, as ONNX's Attention defines it; NaN logits
give NaN rows, as numpy.

The compute is staged so the CPU schedule (schedules/cpu_attention.py) can keep one block of query rows' scores in
cache: scores are stored keys-major ([..., heads, keys, queries]) so the softmax over keys and both matmuls run as
vector operations across queries (q is transposed per block, a small copy), never as horizontal reductions.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from tvm import te, tirx, topi

from cinn.core.cpu_model import lowering_model
from cinn.core.ir import Attrs, SymbolicType, TensorType
from cinn.core.ops.common import broadcast_shapes, keep_nan, same_dims, same_dtype
from cinn.core.ops.registry import DtypeClass, OpDef, PatternKind, RuleName, register
from cinn.core.ops.te_util import broadcast_index, const, dims, leading_rows, thin_rows, whole_tiles

# a bias at or below this masks its key: exp(-10000 + s - max) is 0 in float32 unless that key's logit exceeds the
# row's largest unmasked one by ~9900
MASKED = -1e4
CAUSAL = "cinn.causal"  # the output stage's annotation: the bias is causal (schedules skip the masked keys)


@dataclass(frozen=True)
class AttentionAttrs(Attrs):
    """`heads` heads share q/k/v's last axis (head h owns columns h*d .. h*d+d-1); logits are scaled by `scale`.
    `causal`: the bias masks (<= MASKED) exactly the keys after each query's position (key j of query i where
    j > i + keys - queries), so a kernel may skip them (cinn.compiler.passes.attention.mark_causal sets it)."""

    heads: int = 1
    scale: float = 1.0
    causal: bool = False
    # where q's, k's and v's heads start in their last axes, and the q/k and v head sizes (0: last axis / heads): q,
    # k and v may then be one fused projection's output, read in place (cinn.compiler.passes.attention.fold_attention_slices)
    columns: tuple[int, int, int] = (0, 0, 0)
    head_dims: tuple[int, int] = (0, 0)


@dataclass(frozen=True)
class AttentionShape:
    """The sizes of one attention application."""

    batch: tuple[int, ...]
    queries: int
    keys: int
    heads: int
    dim: int  # per head, of q and k
    value_dim: int  # per head, of v and the output

    @property
    def logits(self) -> tuple[int, ...]:
        """The shape the bias broadcasts to: [..., heads, queries, keys]."""
        return (*self.batch, self.heads, self.queries, self.keys)


def attention_shape(types: Sequence[TensorType | SymbolicType], a: AttentionAttrs) -> AttentionShape:
    """Validate q, k, v and bias shapes (errors name every shape)."""
    q, k, v, bias = (t.shape for t in types)
    where = f"attention: q {q}, k {k}, v {v}, bias {bias}, heads {a.heads}"
    if a.heads < 1:
        raise ValueError(f"{where}: heads must be positive")
    if min(len(q), len(k), len(v)) < 2 or not len(q) == len(k) == len(v):
        raise ValueError(f"{where}: q, k and v must be [..., seq, heads * dim] of one rank (at least 2)")
    if not q[:-2] == k[:-2] == v[:-2] or k[-2] != v[-2]:
        raise ValueError(f"{where}: q, k and v disagree on batch or key count")
    if a.head_dims == (0, 0) and a.columns == (0, 0, 0):
        if q[-1] != k[-1]:
            raise ValueError(f"{where}: q and k disagree on the head size")
        if q[-1] % a.heads or v[-1] % a.heads:
            raise ValueError(f"{where}: the last axes of q and v must divide into {a.heads} heads")
        s = AttentionShape(q[:-2], q[-2], k[-2], a.heads, q[-1] // a.heads, v[-1] // a.heads)
    else:
        s = AttentionShape(q[:-2], q[-2], k[-2], a.heads, *a.head_dims)
        widths = (s.dim, s.dim, s.value_dim)
        if min(s.dim, s.value_dim) < 1 or min(a.columns) < 0 or any(
                c + a.heads * w > x[-1] for c, w, x in zip(a.columns, widths, (q, k, v), strict=True)):
            raise ValueError(f"{where}, columns {a.columns}, head sizes {a.head_dims}: the heads must lie inside the "
                             "last axes")
    if not broadcasts_to(bias, s.logits):
        raise ValueError(f"{where}: bias must broadcast to [..., heads, queries, keys] = {s.logits}")
    return s


def broadcasts_to(shape: tuple[int, ...], to: tuple[int, ...]) -> bool:
    """Whether numpy broadcasts `shape` to exactly `to`."""
    try:
        return len(shape) <= len(to) and same_dims(broadcast_shapes("attention", shape, to), to)
    except ValueError:
        return False


def _infer(types: Sequence[TensorType], a: AttentionAttrs) -> list[TensorType]:
    dtype = same_dtype("attention", types)
    s = attention_shape(types, a)
    return [TensorType((*s.batch, s.queries, s.heads * s.value_dim), dtype)]


QUERY_PAD = 32  # query rows of a symbolic attention's blocks (schedules.cpu_attention.ROW_BLOCKS divide it)


def _query_tile(s: AttentionShape, a: AttentionAttrs) -> int:
    """The query rows the kernel computes in whole tiles of (0: as they are): a symbolic count in blocks of QUERY_PAD,
    a static one that is no whole number of vectors (CpuModel.lanes) in whole vectors (the schedule's vectors run
    along the queries: 197 would take one lane each). A causal attention keeps its rows, by which skip_masked_keys
    cuts."""
    if not isinstance(s.queries, int):
        return QUERY_PAD
    lanes = lowering_model().lanes
    return lanes if not a.causal and s.queries > lanes and s.queries % lanes else 0


def _key_tile(s: AttentionShape, a: AttentionAttrs) -> int:
    """The keys the scores compute in whole tiles of (0: as they are): static keys with no fitting register-tile
    height (thin_rows), whose padded scores the softmax then skips."""
    tile = lowering_model().padded_rows
    return tile if isinstance(s.keys, int) and not a.causal and thin_rows(s.keys, tile) else 0


def _compute(tensors, a: AttentionAttrs, out_types: Sequence[TensorType]):
    q, k, v, bias = tensors
    s = attention_shape([SymbolicType(dims(t), str(t.dtype)) for t in tensors], a)
    n, dtype, d, dv = len(s.batch), q.dtype, s.dim, s.value_dim
    # query rows and the scores' keys in whole tiles where they have none that fits (see whole_tiles)
    padded, key_tile = _query_tile(s, a), _key_tile(s, a)
    queries, query = whole_tiles(s.queries, padded) if padded else (s.queries, lambda i: i)
    keys, key = whole_tiles(s.keys, key_tile) if key_tile else (s.keys, lambda i: i)
    rd, rt = te.reduce_axis((0, d), name="d"), te.reduce_axis((0, s.keys), name="t")
    # the max reads the padded keys' logits too, copies of the last key's: so the scores are computed (and tiled)
    # over whole tiles of keys, while the sum and the context read the keys there are
    rt_max = te.reduce_axis((0, keys), name="t") if key_tile else rt

    # per head: q^T [d, queries]; scores, logits and exponentials [keys, queries]; max, sum [queries]
    qc, kc, vc = a.columns
    qt = te.compute((*s.batch, s.heads, d, queries),
                    lambda *i: q(*i[:n], query(i[n + 2]), qc + i[n] * d + i[n + 1]), name="attention_qt")
    scores = te.compute(
        (*s.batch, s.heads, keys, queries),
        lambda *i: te.sum(k(*i[:n], key(i[n + 1]), kc + i[n] * d + rd) * qt(*i[:n], i[n], rd, i[n + 2]), axis=rd),
        name="attention_scores",
    )
    shape = (*s.batch, s.heads, s.keys, queries)  # the exponentials': the keys there are

    def logit(*i):  # i: [..., heads, keys, queries]; the bias is indexed as [..., heads, queries, keys]
        value = scores(*i) if a.scale == 1.0 else scores(*i) * const(a.scale, dtype)
        return value + bias(*broadcast_index(bias, [*i[:-2], query(i[-1]), key(i[-2])]))

    logits = te.compute(scores.shape, logit, name="attention_logits")
    top = te.compute((*s.batch, s.heads, queries), lambda *i: te.max(logits(*i[:-1], rt_max, i[-1]), axis=rt_max),
                     name="attention_max")
    shifted = te.compute(shape, lambda *i: logits(*i) - top(*i[:-2], i[-1]), name="attention_shifted")
    if dtype == "float32":  # NaN logits stay NaN (topi's polynomial clamps them), so the row's output is NaN
        exp = keep_nan(shifted, topi.fast_exp(shifted), name="attention_exp")
    else:
        exp = te.compute(shape, lambda *i: tirx.exp(shifted(*i)), name="attention_exp")
    total = te.compute(top.shape, lambda *i: te.sum(exp(*i[:-1], rt, i[-1]), axis=rt), name="attention_sum")
    context = te.compute(
        (*s.batch, s.heads, queries, dv),
        lambda *i: te.sum(exp(*i[:n], i[n], rt, i[n + 1]) * v(*i[:n], rt, vc + i[n] * dv + i[n + 2]), axis=rt),
        name="attention_context",
    )

    def merge(*i):  # i: [..., queries, heads * value_dim]
        row = (*i[:n], i[n + 1] // dv, i[n])
        # every logit -inf (all keys masked): te.max's initial lowest value survives, and the row is zeros, as ONNX
        # has it (its sum may be 0). Arithmetic, not a Select (TVM's CUDA codegen miscompiles a vector Select on a
        # broadcast comparison): `seen` is 0 for that value, else a product that overflows to inf, clamped to 1
        seen = tirx.min((top(*row) - tirx.min_value(dtype)) * tirx.max_value(dtype), const(1, dtype))
        return context(*row, i[n + 1] % dv) * seen / (total(*row) + (const(1, dtype) - seen))

    if not padded:
        return [te.compute(out_types[0].shape, merge, name="attention", attrs={CAUSAL: 1} if a.causal else None)]
    merged = te.compute((*s.batch, queries, s.heads * dv), merge, name="attention")
    return [leading_rows(merged, out_types[0].shape, "attention_rows")]


def _reference(arrays: Sequence[np.ndarray], a: AttentionAttrs) -> list[np.ndarray]:
    q, k, v, bias = arrays
    s = attention_shape([TensorType(x.shape, str(x.dtype)) for x in arrays], a)

    def heads(x: np.ndarray, column: int, width: int) -> np.ndarray:  # [..., seq, h * d] -> [..., h, seq, d], float64
        x = x[..., column:column + s.heads * width]
        return np.moveaxis(x.astype(np.float64).reshape(*x.shape[:-1], s.heads, width), -2, -3)

    qc, kc, vc = a.columns
    logits = heads(q, qc, s.dim) @ np.swapaxes(heads(k, kc, s.dim), -1, -2) * a.scale + bias.astype(np.float64)
    top = logits.max(axis=-1, keepdims=True)
    masked = np.isneginf(top)  # every key masked: zeros
    e = np.exp(logits - np.where(masked, 0.0, top))
    with np.errstate(invalid="ignore"):
        ctx = np.where(masked, 0.0, e / e.sum(axis=-1, keepdims=True)) @ heads(v, vc, s.value_dim)
    return [np.moveaxis(ctx, -3, -2).reshape(*s.batch, s.queries, -1).astype(q.dtype)]


def _flops(types: Sequence[TensorType], a: AttentionAttrs, outs: Sequence[TensorType]) -> int:
    s = attention_shape(types, a)
    per_head = 2 * s.queries * s.keys * (s.dim + s.value_dim)
    return math.prod(s.batch) * s.heads * per_head


register(
    OpDef(
        name="attention",
        kind=PatternKind.NON_FUSIBLE,
        needs_rules=(RuleName.CPU_ATTENTION,),  # on CUDA the generic schedule runs it
        infer=_infer,
        compute=_compute,
        reference=_reference,
        flops=_flops,
        attrs=AttentionAttrs,
        num_inputs=4,
        dtypes=DtypeClass.FLOAT,
        doc="Multi-head attention softmax(q k^T * scale + bias) v over [..., seq, heads * dim] q, k, v (or heads at "
        "`columns` of wider last axes, of sizes `head_dims`: one fused projection read in place); bias broadcasts to "
        "[..., heads, queries, keys] (a scalar 0 when there is none); a query whose keys are all masked (-inf) gives "
        "zeros.",
    )
)
