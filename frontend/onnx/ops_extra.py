"""Converters of ONNX ops written as compositions of cinn ops: RMSNormalization, LpNormalization, Hardmax, Swish,
Trilu, EyeLike, OneHot, RotaryEmbedding, Einsum, and the loss ops exporters emit (NegativeLogLikelihoodLoss,
SoftmaxCrossEntropyLoss)."""
from __future__ import annotations

import numpy as np

from cinn.core.ir import Value
from frontend.onnx.ops_elementwise import scalar
from frontend.onnx.registry import NodeContext, OnnxImportError, converter, onnx_dtype


def _positions(ctx: NodeContext, n: int, trailing: int, dtype: str) -> Value:
    """0 .. n-1 along an axis followed by `trailing` axes of size 1 (to compare with an index along that axis): a
    constant where it folds, its length checked first."""
    return ctx.b.reshape(ctx.b.arange(start=0, end=n, step=1, dtype=dtype), [n] + [1] * trailing)


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
    positions = _positions(ctx, flat.shape[axis], len(flat.shape) - axis - 1, "int32")
    hot = ctx.b.cast(ctx.b.equal(top, positions), x.dtype)
    return [hot if per_axis else ctx.b.reshape(hot, list(x.shape))]


@converter("Swish")
def swish(ctx: NodeContext):
    x = ctx.input(0)
    return [ctx.b.multiply(x, ctx.b.sigmoid(ctx.b.scale(x, scale=float(ctx.attr("alpha", 1.0)))))]


@converter("Trilu")
def trilu(ctx: NodeContext):
    """The upper (or lower) triangle of the last two axes from diagonal k; the rest 0."""
    x = ctx.input(0)
    k = 0 if ctx.input(1) is None else int(np.asarray(ctx.require_const(1, "k")).reshape(()))
    rows, cols = x.shape[-2:]
    offset = np.arange(cols)[None, :] - np.arange(rows)[:, None]
    keep = offset >= k if ctx.attr("upper", 1) else offset <= k
    zero = ctx.b.fill_constant((), False if x.dtype == "bool" else 0, x.dtype)
    return [ctx.b.select(ctx.b.create_constant(keep), x, zero)]


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
    rank = len(indices.shape) + 1
    axis = ctx.attr("axis", -1) % rank
    index = ctx.b.cast(indices, "int64")
    index = ctx.b.select(ctx.b.less_than(index, ctx.b.fill_constant((), 0, "int64")),
                         ctx.b.add(index, ctx.b.fill_constant((), depth, "int64")), index)
    hot = ctx.b.equal(ctx.b.expand_dims(index, [axis]), _positions(ctx, depth, rank - axis - 1, "int64"))
    off, on = (ctx.b.reshape(ctx.b.slice(values, axes=[0], starts=[i], ends=[i + 1]), []) for i in (0, 1))
    return [ctx.b.select(hot, on, off)]


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
    """Einstein summation: repeated indices of one operand become diagonals; two operands contract through one
    batched matmul; otherwise the operands are aligned on every index, multiplied and summed."""
    terms, out = _einsum_terms(str(ctx.attr("equation", "")).replace(" ", ""), [len(v.shape) for v in ctx.inputs])
    operands = [_diagonals(ctx, x, term) for x, term in zip(ctx.inputs, terms, strict=True)]
    if len(operands) == 2 and (y := _einsum_matmul(ctx, operands[0], operands[1], out)) is not None:
        return [y]
    return [_einsum_broadcast(ctx, operands, out)]


def _einsum_terms(equation: str, ranks: list[int]) -> tuple[list[str], str]:
    """The operands' index strings and the output's, with each '...' spelled as distinct stand-in letters
    (right-aligned across operands); an implicit output is the ellipsis, then the indices used once, sorted."""
    lhs, arrow, rhs = equation.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise OnnxImportError(f"equation {equation!r} has {len(terms)} operands for {len(ranks)} inputs")
    widths = [rank - (len(t) - 3) if "..." in t else 0 for t, rank in zip(terms, ranks, strict=True)]
    stand_in = "".join(chr(0x3B1 + k) for k in range(max(widths, default=0)))  # greek letters: never in an equation
    terms = [t.replace("...", stand_in[len(stand_in) - w:] if w else "") for t, w in zip(terms, widths, strict=True)]
    for t, rank in zip(terms, ranks, strict=True):
        if len(t) != rank:
            raise OnnxImportError(f"equation {equation!r}: term {t!r} does not match an input of rank {rank}")
    if arrow:
        return terms, rhs.replace("...", stand_in)
    counts = {c: sum(t.count(c) for t in terms) for t in terms for c in t}
    return terms, stand_in + "".join(sorted(c for c, n in counts.items() if n == 1 and c not in stand_in))


def _diagonals(ctx: NodeContext, x: Value, term: str) -> tuple[Value, str]:
    """Repeated indices of one operand ('ii') reduced to their diagonal."""
    while len(set(term)) < len(term):
        a = next(i for i, c in enumerate(term) if term.index(c) != i)
        first = term.index(term[a])
        shape = [1] * len(term)
        shape[first] = shape[a] = x.shape[a]
        eye = ctx.b.create_constant(np.eye(x.shape[a]).reshape(shape), dtype=x.dtype)
        x = ctx.b.reduce_sum(ctx.b.multiply(x, eye), [a])
        term = term[:a] + term[a + 1:]
    return x, term


def _sizes(pairs: list[tuple[Value, str]]) -> dict[str, list[int]]:
    return {c: [x.shape[t.index(c)] for x, t in pairs if c in t] for _, term in pairs for c in term}


def _einsum_matmul(ctx: NodeContext, a: tuple[Value, str], b: tuple[Value, str], out: str) -> Value | None:
    """Two operands as one batched matmul [batch, a's kept, contracted] x [batch, contracted, b's kept]; None where
    an index broadcasts (sizes differ)."""
    sizes = _sizes([a, b])
    if any(len(set(s)) > 1 for s in sizes.values()):
        return None
    (x, ta), (y, tb) = a, b
    x, ta = _sum_out(ctx, x, ta, tb + out)
    y, tb = _sum_out(ctx, y, tb, ta + out)
    batch = [c for c in out if c in ta and c in tb]
    contracted = [c for c in ta if c in tb and c not in out]
    keep_a, keep_b = [c for c in out if c in ta and c not in tb], [c for c in out if c in tb and c not in ta]

    def grouped(v: Value, term: str, groups: list[list[str]]) -> Value:
        order = [c for g in groups for c in g]
        v = ctx.b.transpose(v, [term.index(c) for c in order]) if order != list(term) else v
        return ctx.b.reshape(v, [int(np.prod([sizes[c][0] for c in g])) for g in groups])

    prod = ctx.b.matmul(grouped(x, ta, [batch, keep_a, contracted]), grouped(y, tb, [batch, contracted, keep_b]))
    order = batch + keep_a + keep_b
    result = ctx.b.reshape(prod, [sizes[c][0] for c in order])
    return ctx.b.transpose(result, [order.index(c) for c in out]) if order != list(out) else result


def _sum_out(ctx: NodeContext, x: Value, term: str, elsewhere: str) -> tuple[Value, str]:
    """Sum an operand over the indices no other operand and not the output has."""
    alone = [i for i, c in enumerate(term) if c not in elsewhere]
    if not alone:
        return x, term
    return ctx.b.reduce_sum(x, alone), "".join(c for i, c in enumerate(term) if i not in alone)


def _einsum_broadcast(ctx: NodeContext, operands: list[tuple[Value, str]], out: str) -> Value:
    """Every operand transposed to the order output indices, then summed ones, with size-1 axes for the indices it
    lacks; their product summed over the non-output indices."""
    letters = list(out) + [c for _, t in operands for c in t if c not in out]
    letters = list(dict.fromkeys(letters))
    product = None
    for x, term in operands:
        mine = [c for c in letters if c in term]
        aligned = ctx.b.transpose(x, [term.index(c) for c in mine]) if mine != list(term) else x
        if mine != letters:
            aligned = ctx.b.reshape(aligned, [aligned.shape[mine.index(c)] if c in term else 1 for c in letters])
        product = aligned if product is None else ctx.b.multiply(product, aligned)
    assert product is not None
    summed = list(range(len(out), len(letters)))
    return ctx.b.reduce_sum(product, summed) if summed else product


@converter("AffineGrid")
def affine_grid(ctx: NodeContext):
    """Sampling grids of theta ([N, d, d + 1]) over a constant size (N, C, *spatial): the base grid of normalized
    coordinates (x fastest, then y, then z, and 1) times theta transposed, one batched matmul."""
    theta = ctx.input(0)
    size = [int(v) for v in ctx.require_const(1, "size")]
    batch, spatial = size[0], size[2:]
    if len(spatial) not in (2, 3) or theta.shape != (batch, len(spatial), len(spatial) + 1):
        raise OnnxImportError(f"theta of shape {theta.shape} does not fit size {size} (2-D or 3-D grids)")

    def axis(n: int) -> np.ndarray:
        return np.linspace(-1, 1, n) if ctx.attr("align_corners", 0) else (np.arange(n) * 2 + 1) / n - 1

    coords = np.meshgrid(*[axis(n) for n in spatial], indexing="ij")  # (z,) y, x
    base = np.stack([*coords[::-1], np.ones(spatial)], axis=-1).reshape(1, -1, len(spatial) + 1)
    base = ctx.b.create_constant(np.ascontiguousarray(np.broadcast_to(base, (batch, *base.shape[1:])), theta.dtype))
    grid = ctx.b.matmul(base, theta, trans_y=True)
    return [ctx.b.reshape(grid, [batch, *spatial, len(spatial)])]
