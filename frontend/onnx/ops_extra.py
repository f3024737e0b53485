"""Converters of ONNX ops written as compositions of cinn ops: RMSNormalization, LpNormalization, Hardmax, Swish,
Trilu, EyeLike, OneHot, RotaryEmbedding, Einsum, and the loss ops exporters emit (NegativeLogLikelihoodLoss,
SoftmaxCrossEntropyLoss)."""
from __future__ import annotations

import numpy as np

from cinn.core.ir import Value
from frontend import compose
from frontend.onnx.ops_elementwise import scalar
from frontend.onnx.registry import NodeContext, OnnxImportError, converter, onnx_dtype


@converter("RMSNormalization")
def rms_norm(ctx: NodeContext):
    """x / sqrt(mean(x^2 over the axes from `axis`) + epsilon) * scale."""
    x, scale = ctx.input(0), ctx.input(1)
    axes = list(range(ctx.attr("axis", -1) % len(x.shape), len(x.shape)))
    mean_square = ctx.b.reduce_mean(ctx.b.multiply(x, x), axes, keep_dim=True)
    inv = ctx.b.rsqrt(ctx.b.add(mean_square, scalar(ctx, ctx.attr("epsilon", 1e-5), x)))
    return [ctx.b.multiply(ctx.b.multiply(x, inv), scale)]


@converter("LpNormalization")
def lp_norm(ctx: NodeContext):
    x = ctx.input(0)
    axis, p = ctx.attr("axis", -1) % len(x.shape), ctx.attr("p", 2)
    if p == 1:
        norm = ctx.b.reduce_sum(ctx.b.abs(x), [axis], keep_dim=True)
    elif p == 2:
        norm = ctx.b.sqrt(ctx.b.reduce_sum(ctx.b.multiply(x, x), [axis], keep_dim=True))
    else:
        raise OnnxImportError(f"p={p}: LpNormalization takes p 1 or 2")
    # a zero norm gives 0, not 0 / 0, as ONNX's reference
    zero = scalar(ctx, 0.0, x)
    return [ctx.b.select(ctx.b.equal(norm, zero), zero, ctx.b.divide(x, norm))]


@converter("Hardmax")
def hardmax(ctx: NodeContext):
    """1 at the first maximum along `axis`, else 0 (before opset 13: over the flattened axes from `axis`)."""
    x = ctx.input(0)
    per_axis = ctx.opset >= 13
    axis = ctx.attr("axis", -1 if per_axis else 1) % len(x.shape)
    flat = x if per_axis else ctx.b.reshape(x, [int(np.prod(x.shape[:axis])), -1])
    axis = axis if per_axis else 1
    top = ctx.b.argmax(flat, axis=axis, keep_dim=True)
    positions = compose.positions(ctx.b, flat.shape[axis], len(flat.shape) - axis - 1, "int32")
    hot = ctx.b.cast(ctx.b.equal(top, positions), x.dtype)
    return [hot if per_axis else ctx.b.reshape(hot, list(x.shape))]


@converter("Swish")
def swish(ctx: NodeContext):
    x = ctx.input(0)
    return [ctx.b.multiply(x, ctx.b.sigmoid(ctx.b.scale(x, scale=float(ctx.attr("alpha", 1.0)))))]


@converter("Trilu")
def trilu(ctx: NodeContext):
    """The upper (or lower) triangle of the last two axes from diagonal k; the rest 0."""
    k = 0 if ctx.input(1) is None else int(np.asarray(ctx.require_const(1, "k")).reshape(()))
    return [compose.trilu(ctx.b, ctx.input(0), k, bool(ctx.attr("upper", 1)))]


@converter("EyeLike")
def eye_like(ctx: NodeContext):
    x = ctx.input(0)
    dtype = onnx_dtype(ctx.attr("dtype", 0), "EyeLike dtype") if ctx.has_attr("dtype") else x.dtype
    rows, cols = x.shape
    return [ctx.b.create_constant(np.eye(rows, cols, k=ctx.attr("k", 0)), dtype=dtype)]


@converter("OneHot")
def one_hot(ctx: NodeContext):
    """values[1] where the position along the new axis equals the index (negative ones count from depth)."""
    indices, values = ctx.input(0), ctx.input(2)
    depth = int(np.asarray(ctx.require_const(1, "depth")).reshape(-1)[0])
    axis = ctx.attr("axis", -1) % (len(indices.shape) + 1)
    off, on = (ctx.b.reshape(ctx.b.slice(values, axes=[0], starts=[i], ends=[i + 1]), []) for i in (0, 1))
    return [compose.one_hot(ctx.b, indices, depth, axis, on, off)]


@converter("NegativeLogLikelihoodLoss")
def nll_loss(ctx: NodeContext):
    return [_nll(ctx, ctx.input(0), ctx.input(1), ctx.input(2))]


@converter("SoftmaxCrossEntropyLoss")
def softmax_cross_entropy(ctx: NodeContext):
    """NegativeLogLikelihoodLoss of log_softmax over the classes (axis 1); the log-probabilities are output 1."""
    log_prob = ctx.b.log_softmax(ctx.input(0), axes=[1])
    return [_nll(ctx, log_prob, ctx.input(1), ctx.input(2)), log_prob]


def _nll(ctx: NodeContext, x: Value, target: Value, weight: Value | None) -> Value:
    """-x[n, target[n, ...], ...] weighted by weight[target]; targets equal to ignore_index weigh 0; reduced by
    `reduction` (mean: divided by the total weight)."""
    reduction = ctx.attr("reduction", "mean")
    if reduction not in ("none", "sum", "mean"):
        raise OnnxImportError(f"reduction {reduction!r}: expected none, sum or mean")
    target = ctx.b.cast(target, "int64")
    ignore = ctx.attr("ignore_index", None)
    valid = None if ignore is None else ctx.b.not_equal(target, ctx.b.fill_constant((), ignore, "int64"))
    if valid is not None:  # an ignored target may lie outside the classes: read class 0 instead
        target = ctx.b.select(valid, target, ctx.b.fill_constant((), 0, "int64"))
    picked = ctx.b.squeeze(ctx.b.gather_elements(x, ctx.b.expand_dims(target, [1]), axis=1), [1])
    w = None if weight is None else ctx.b.gather(weight, target, axis=0)
    if valid is not None:
        w = ctx.b.select(valid, w if w is not None else scalar(ctx, 1.0, x), scalar(ctx, 0.0, x))
    loss = ctx.b.negative(picked if w is None else ctx.b.multiply(picked, w))
    if reduction == "none":
        return loss
    total = ctx.b.reduce_sum(loss, [])
    if reduction == "sum":
        return total
    if w is None:
        return ctx.b.divide(total, scalar(ctx, float(np.prod(loss.shape)), x))
    return ctx.b.divide(total, ctx.b.reduce_sum(ctx.b.broadcast_to(w, list(loss.shape)), []))


@converter("RotaryEmbedding")
def rotary_embedding(ctx: NodeContext):
    """Rotate the first rotary_embedding_dim features of each head by the cached angles of its position: halves
    (or, interleaved, even and odd features) as the real and imaginary parts. Works in the input's layout: [batch,
    heads, seq, dim], or [batch, seq, heads * dim] viewed as [batch, seq, heads, dim]."""
    x, cos, sin, positions = (ctx.input(i) for i in range(4))
    batch, seq = x.shape[0], x.shape[2 if len(x.shape) == 4 else 1]
    if len(x.shape) == 3:
        heads = ctx.attr("num_heads", 0)
        if heads <= 0 or x.shape[2] % heads:
            raise OnnxImportError(f"3-D input {x.shape} needs num_heads dividing its last axis")
        x = ctx.b.reshape(x, [batch, seq, heads, x.shape[2] // heads])
    dim = x.shape[3]
    rotated = ctx.attr("rotary_embedding_dim", 0) or dim
    half = rotated // 2
    if positions is not None:
        cos, sin = (ctx.b.gather(c, positions, axis=0) for c in (cos, sin))
    view = [batch, 1, seq, half] if len(ctx.input(0).shape) == 4 else [batch, seq, 1, half]
    cos, sin = (ctx.b.reshape(c, view) for c in (cos, sin))
    interleaved = bool(ctx.attr("interleaved", 0))

    def part(start: int, end: int, step: int = 1) -> Value:
        return ctx.b.slice(x, axes=[3], starts=[start], ends=[end], strides=[step])

    x1, x2 = (part(0, rotated, 2), part(1, rotated, 2)) if interleaved else (part(0, half), part(half, rotated))
    real = ctx.b.subtract(ctx.b.multiply(cos, x1), ctx.b.multiply(sin, x2))
    imag = ctx.b.add(ctx.b.multiply(sin, x1), ctx.b.multiply(cos, x2))
    if interleaved:
        pairs = ctx.b.concat([ctx.b.expand_dims(real, [4]), ctx.b.expand_dims(imag, [4])], axis=4)
        out = ctx.b.reshape(pairs, [*x.shape[:3], rotated])
    else:
        out = ctx.b.concat([real, imag], axis=3)
    if rotated < dim:
        out = ctx.b.concat([out, part(rotated, dim)], axis=3)
    return [ctx.b.reshape(out, list(ctx.input(0).shape))]


@converter("Einsum")
def einsum(ctx: NodeContext):
    return [compose.einsum(ctx.b, str(ctx.attr("equation", "")), ctx.inputs)]


@converter("AffineGrid")
def affine_grid(ctx: NodeContext):
    size = [int(v) for v in ctx.require_const(1, "size")]
    return [compose.affine_grid(ctx.b, ctx.input(0), size, bool(ctx.attr("align_corners", 0)))]
