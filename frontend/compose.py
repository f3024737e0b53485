"""Ops both importers write as compositions of cinn ops: activations, normalizations, pooling helpers, prefix sums,
gathers and scatters by indices computed at run time, einsum, ranges, sampling grids and transposed convolution.
Each takes the builder and values, so the ONNX and Paddle converters share one decomposition; errors are
ValueErrors, which each importer prefixes with the op that raised them."""
from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from functools import reduce

import numpy as np

from cinn.compiler.passes.fold_constants import MAX_FOLDED_BYTES
from cinn.core.builder import NetBuilder
from cinn.core.ir import TensorType, Value
from frontend.volumetric import conv3d, window3d


def scalar(b: NetBuilder, value: float, like: Value) -> Value:
    """A 0-d constant of `like`'s dtype."""
    return b.fill_constant((), value, like.dtype)


def divide(b: NetBuilder, x: Value, y: Value) -> Value:
    """x / y; integers truncate toward zero, as C (and ONNX and Paddle) divide them."""
    if x.dtype.startswith("float"):
        return b.divide(x, y)
    if x.dtype.startswith("uint"):  # truncating and flooring agree on non-negative quotients
        return b.floor_divide(x, y)
    # floor, plus one where the quotient is negative and inexact
    q = b.floor_divide(x, y)
    inexact = b.not_equal(b.mod(x, y), scalar(b, 0, x))
    negative = b.less_than(b.multiply(b.sign(x), b.sign(y)), scalar(b, 0, x))
    return b.add(q, b.cast(b.logical_and(inexact, negative), x.dtype))


# -- activations ----------------------------------------------------------------------------------
def mish(b: NetBuilder, x: Value) -> Value:
    """x * tanh(softplus(x))."""
    return b.multiply(x, b.tanh(b.softplus(x)))


def softsign(b: NetBuilder, x: Value) -> Value:
    """x / (1 + |x|)."""
    return b.divide(x, b.add(b.abs(x), scalar(b, 1, x)))


def selu(b: NetBuilder, x: Value, alpha: float, gamma: float) -> Value:
    """gamma * elu(x, alpha)."""
    return b.scale(b.elu(x, alpha=alpha), scale=gamma)


def celu(b: NetBuilder, x: Value, alpha: float) -> Value:
    """max(0, x) + min(0, alpha * (exp(x / alpha) - 1)) = alpha * elu(x / alpha)."""
    return b.scale(b.elu(b.scale(x, scale=1.0 / alpha), alpha=1.0), scale=alpha)


def thresholded_relu(b: NetBuilder, x: Value, threshold: float, value: float = 0.0) -> Value:
    """x above the threshold, else `value`."""
    return b.select(b.greater_than(x, scalar(b, threshold, x)), x, scalar(b, value, x))


def shrink(b: NetBuilder, x: Value, lambd: float, bias: float) -> Value:
    """x + bias below -lambd, x - bias above lambd, 0 between (bias 0: hard shrink; bias lambd: soft shrink)."""
    above = b.select(b.greater_than(x, scalar(b, lambd, x)), b.subtract(x, scalar(b, bias, x)), scalar(b, 0, x))
    return b.select(b.less_than(x, scalar(b, -lambd, x)), b.add(x, scalar(b, bias, x)), above)


def prelu(b: NetBuilder, x: Value, slope: Value) -> Value:
    """x where positive, else x * slope (slope broadcast against x)."""
    return b.select(b.greater_than(x, scalar(b, 0, x)), x, b.multiply(x, slope))


# -- normalizations -------------------------------------------------------------------------------
def channel_vector(b: NetBuilder, v: Value, rank: int) -> Value:
    """A per-channel [C] vector shaped to broadcast against an [N, C, ...] tensor."""
    return b.reshape(v, [v.shape[0]] + [1] * (rank - 2))


def standardized(b: NetBuilder, x: Value, axes: list[int], eps: float) -> tuple[Value, Value, Value]:
    """(x - mean) * rsqrt(var + eps) over `axes`, with the mean and the inverse standard deviation (kept dims)."""
    mean = b.reduce_mean(x, axes, keep_dim=True)
    centered = b.subtract(x, mean)
    var = b.reduce_mean(b.multiply(centered, centered), axes, keep_dim=True)
    inv_std = b.rsqrt(b.add(var, b.fill_constant((), eps, x.dtype)))
    return b.multiply(centered, inv_std), mean, inv_std


def group_standardized(b: NetBuilder, x: Value, groups: int, eps: float) -> Value:
    """[N, C, ...] standardized over each group of C / groups channels with its spatial dims."""
    n, c = x.shape[:2]
    if groups < 1 or c % groups:
        raise ValueError(f"{groups} groups do not divide the {c} channels of x {x.shape}")
    grouped = b.reshape(x, [n, groups, math.prod(x.shape[1:]) // groups])
    return b.reshape(standardized(b, grouped, [2], eps)[0], list(x.shape))


def lrn(b: NetBuilder, x: Value, size: int, alpha: float, beta: float, bias: float) -> Value:
    """Local response normalization across channels: x / (bias + alpha * (sum of x^2 over `size` channels around
    each))^beta; the channel axis zero-padded, the window a sum of shifted slices."""
    c, rank = x.shape[1], len(x.shape)
    lo = (size - 1) // 2
    padded = b.pad(b.multiply(x, x), [(0, 0), (lo, size - 1 - lo)] + [(0, 0)] * (rank - 2))
    total = reduce(b.add, [b.slice(padded, [1], [k], [k + c]) for k in range(size)])
    return b.divide(x, b.pow(b.scale(total, scale=alpha, bias=bias), b.fill_constant((), beta, x.dtype)))


def affine(b: NetBuilder, y: Value, scale: Value | None, bias: Value | None) -> Value:
    """y * scale + bias, each a per-channel vector (None: left out)."""
    rank = len(y.shape)
    if scale is not None:
        y = b.multiply(y, channel_vector(b, scale, rank))
    return b.add(y, channel_vector(b, bias, rank)) if bias is not None else y


# -- pooling --------------------------------------------------------------------------------------
def include_pad_divisor(b: NetBuilder, y: Value, sizes: Sequence[int], kernel: Sequence[int], strides: Sequence[int],
                        dilations: Sequence[int], begin: Sequence[int], end: Sequence[int]) -> Value:
    """An average that counts the padding (pool2d's exclusive=False, [N, C, *out]) divided instead, as ONNX and
    Paddle do, by the taps inside the padded input: a ceil-mode window that runs past the end pads counts fewer
    than the whole kernel, which pool2d divides by."""
    dims = zip(sizes, y.shape[2:], kernel, strides, dilations, begin, end, strict=True)
    taps = [[sum(o * s + k * d < n + pb + pe for k in range(ks)) for o in range(out)]
            for n, out, ks, s, d, pb, pe in dims]
    counts = reduce(np.multiply.outer, [np.array(t) for t in taps])
    whole = math.prod(kernel)
    if (counts == whole).all():
        return y
    return b.multiply(y, b.create_constant((whole / counts).astype(y.dtype).reshape(1, 1, *counts.shape)))


def max_pool_mask(b: NetBuilder, x: Value, kernel: Sequence[int], strides: Sequence[int], begin: Sequence[int],
                  out: Sequence[int]) -> Value:
    """Where each 2-D max-pooling window's maximum is in its channel's plane (row * W + col, the first of equal
    ones in row-major order): the windows' taps stacked from the -inf padded input, their argmax mapped back."""
    h, w = x.shape[2:]
    (kh, kw), (sh, sw), (top, left) = kernel, strides, begin
    bottom, right = ((o - 1) * s + k - size - p for o, s, k, size, p in zip(out, strides, kernel, (h, w), begin, strict=True))
    padded = b.pad(x, [(0, 0), (0, 0), (top, max(bottom, 0)), (left, max(right, 0))], pad_value=-math.inf)
    taps = [b.slice(padded, [2, 3], [i, j], [i + (out[0] - 1) * sh + 1, j + (out[1] - 1) * sw + 1], [sh, sw])
            for i in range(kh) for j in range(kw)]
    best = b.cast(b.argmax(b.concat([b.expand_dims(t, [2]) for t in taps], axis=2), axis=2), "int64")
    rows = np.arange(out[0]).reshape(-1, 1) * sh - top
    cols = np.arange(out[1]).reshape(1, -1) * sw - left
    corner = b.create_constant((rows * w + cols).astype(np.int64))
    tap_row, tap_col = b.floor_divide(best, b.fill_constant((), kw, "int64")), b.mod(best, b.fill_constant((), kw, "int64"))
    return b.add(corner, b.add(b.multiply(tap_row, b.fill_constant((), w, "int64")), tap_col))


# -- prefix ops -----------------------------------------------------------------------------------
def prefix_mask(n: int, exclusive: bool, reverse: bool) -> np.ndarray:
    """keep[i, j]: whether element i of an axis of n enters output j of a prefix op."""
    i, j = np.indices((n, n))
    keep = i < j if exclusive else i <= j
    return keep.T if reverse else keep


def cumsum(b: NetBuilder, x: Value, axis: int, keep: np.ndarray) -> Value:
    """A prefix sum along `axis`: a product with a triangular matrix of ones (exclusive: strictly; reverse: flipped)."""
    rank = len(x.shape)
    tri = b.create_constant(keep.astype(x.dtype), dtype=x.dtype)
    perm = [k for k in range(rank) if k != axis] + [axis]
    moved = x if axis == rank - 1 else b.transpose(x, perm)
    out = b.matmul(moved, tri)
    return out if axis == rank - 1 else b.transpose(out, [int(p) for p in np.argsort(perm)])


def cumprod(b: NetBuilder, x: Value, axis: int, keep: np.ndarray) -> Value:
    """out[.., j, ..] = the product of x[.., i, ..] over the i that keep[i, j] selects: x with a new axis after
    `axis`, 1 where the mask is off, reduced over `axis` (n^2 elements: prefix products of short axes)."""
    wide = b.expand_dims(x, [axis + 1])
    mask = b.create_constant(keep.reshape(keep.shape + (1,) * (len(x.shape) - axis - 1)))
    picked = b.select(mask, wide, b.fill_constant((), 1, x.dtype))
    return b.reduce_prod(picked, [axis])


# -- index ops ------------------------------------------------------------------------------------
def positions(b: NetBuilder, n: int, trailing: int, dtype: str) -> Value:
    """0 .. n-1 along an axis followed by `trailing` axes of size 1 (to compare with an index along that axis): a
    constant where it folds, its length checked first."""
    return b.reshape(b.arange(start=0, end=n, step=1, dtype=dtype), [n] + [1] * trailing)


def wrapped(b: NetBuilder, index: Value, size: int) -> Value:
    """Indices counted from the end where negative (index + size), as int64."""
    index = b.cast(index, "int64")
    return b.select(b.less_than(index, b.fill_constant((), 0, "int64")),
                    b.add(index, b.fill_constant((), size, "int64")), index)


def one_hot(b: NetBuilder, index: Value, depth: int, axis: int, on: Value, off: Value) -> Value:
    """`on` where the position along a new axis `axis` equals the index (negative ones count from depth), else
    `off`."""
    rank = len(index.shape) + 1
    hot = b.equal(b.expand_dims(wrapped(b, index, depth), [axis]), positions(b, depth, rank - axis - 1, "int64"))
    return b.select(hot, on, off)


def flat_positions(b: NetBuilder, index: Value, lead: Sequence[int]) -> Value:
    """Each index tuple's (the last axis of `index`, computed at run time) position in the flattened `lead` dims,
    as int64; negative indices count from the end of their dim."""
    k, last = index.shape[-1], len(index.shape) - 1
    if k > len(lead):
        raise ValueError(f"index tuples of {k} do not fit {len(lead)} dims")
    strides = [math.prod(lead[d + 1:k]) for d in range(k)]
    terms = [b.multiply(wrapped(b, b.squeeze(b.slice(index, [last], [d], [d + 1]), [last]), lead[d]),
                        b.fill_constant((), strides[d], "int64")) for d in range(k)]
    return reduce(b.add, terms) if terms else b.fill_constant(index.shape[:-1], 0, "int64")


def gather_nd(b: NetBuilder, x: Value, index: Value, batch_dims: int = 0) -> Value:
    """x[batch..., index...] per index tuple in the last axis of `index` (computed at run time): a gather of x's
    leading batch_dims + k axes flattened, by each tuple's flat position (negative indices count from the end)."""
    k, last = index.shape[-1], len(index.shape) - 1
    lead = x.shape[: batch_dims + k]
    if batch_dims + k > len(x.shape) or index.shape[:batch_dims] != x.shape[:batch_dims]:
        raise ValueError(f"indices of shape {index.shape} (batch_dims {batch_dims}) do not fit data of shape {x.shape}")
    flat = flat_positions(b, index, lead[batch_dims:])
    if batch_dims:  # the batch tuples' own offsets
        batch = np.indices(index.shape[:batch_dims]).reshape(batch_dims, -1)
        offsets = np.ravel_multi_index(tuple(batch), lead[:batch_dims]) * math.prod(lead[batch_dims:])
        flat = b.add(flat, b.create_constant(offsets.reshape(index.shape[:batch_dims] + (1,) * (last - batch_dims))))
    rows = b.reshape(x, [math.prod(lead), *x.shape[batch_dims + k:]])
    return b.gather(rows, flat, axis=0)


class Scatter(enum.Enum):
    """How a scattered update combines with what is there."""

    ASSIGN = "assign"  # it replaces it; of several updates to one place, the last wins
    ADD = "add"  # it is added to it
    SUM = "sum"  # the sum of the updates to a place replaces it
    MULTIPLY = "multiply"  # it multiplies it


def scatter_rows(b: NetBuilder, x: Value, ids: Value, updates: Value, mode: Scatter) -> Value:
    """x [R, ...] with rows ids [N] (computed at run time) combined with updates [N, ...]: through the [R, N] match
    of rows and ids, so no update's size is multiplied by R (a matmul sums them, a max finds the last)."""
    rows, n = x.shape[0], ids.shape[0]
    hot = b.equal(b.reshape(wrapped(b, ids, rows), [1, n]), positions(b, rows, 1, "int64"))
    trailing = [1] * (len(x.shape) - 1)
    if mode == Scatter.ASSIGN:
        order = b.reshape(b.arange(start=0, end=n, step=1, dtype="int64"), [1, n])
        last = b.reduce_max(b.select(hot, order, b.fill_constant((), -1, "int64")), [1])
        picked = b.gather(updates, b.max(last, b.fill_constant((), 0, "int64")), axis=0)
        return b.select(b.reshape(b.greater_equal(last, b.fill_constant((), 0, "int64")), [rows, *trailing]), picked, x)
    if mode == Scatter.MULTIPLY:
        raise ValueError("multiplying scatter of rows is not supported")
    if x.dtype.startswith("float"):
        flat = b.reshape(updates, [n, math.prod(x.shape[1:])])
        sums = b.reshape(b.matmul(b.cast(hot, x.dtype), flat), list(x.shape))
    else:
        sums = b.reduce_sum(b.select(b.reshape(hot, [rows, n, *trailing]), b.expand_dims(updates, [0]),
                                     scalar(b, 0, x)), [1])
    if mode == Scatter.ADD:
        return b.add(x, sums)
    return b.select(b.reshape(b.reduce_any(hot, [1]), [rows, *trailing]), sums, x)


def scatter_elements(b: NetBuilder, x: Value, index: Value, values: Value, axis: int, mode: Scatter,
                     include_self: bool = True) -> Value:
    """x with values written at index along `axis` (index and values of one shape, the same as x's off `axis`;
    computed at run time): through the match of each source position with each target along the axis."""
    n, rank = x.shape[axis], len(x.shape)
    if any(i != d for k, (i, d) in enumerate(zip(index.shape, x.shape, strict=True)) if k != axis):
        raise ValueError(f"index of shape {index.shape} must match x {x.shape} off axis {axis}")
    # hot[.., i, j, ..]: source i (along axis) writes target j (the new axis after it)
    hot = b.equal(b.expand_dims(wrapped(b, index, n), [axis + 1]), positions(b, n, rank - axis - 1, "int64"))
    wide = b.expand_dims(values, [axis + 1])
    if mode == Scatter.ASSIGN:
        order = positions(b, index.shape[axis], rank - axis, "int64")
        last = b.reduce_max(b.select(hot, order, b.fill_constant((), -1, "int64")), [axis])
        picked = b.gather_elements(values, b.max(last, b.fill_constant((), 0, "int64")), axis=axis)
        return b.select(b.greater_equal(last, b.fill_constant((), 0, "int64")), picked, x)
    if mode == Scatter.MULTIPLY:
        combined = b.reduce_prod(b.select(hot, wide, scalar(b, 1, x)), [axis])
        joined = b.multiply(x, combined) if include_self else None
    else:
        combined = b.reduce_sum(b.select(hot, wide, scalar(b, 0, x)), [axis])
        joined = b.add(x, combined) if include_self else None
    return joined if joined is not None else b.select(b.reduce_any(hot, [axis]), combined, x)


def place_region(b: NetBuilder, x: Value, value: Value, picked: Mapping[int, range]) -> Value:
    """x with the region that `picked` selects along some axes (each a range of positions, possibly strided or
    reversed) replaced by `value`, shaped as that region: value spread to x's shape by constant gathers, then
    selected by the region's mask."""
    mask = np.ones([1] * len(x.shape), bool)
    for axis, chosen in picked.items():
        size = x.shape[axis]
        source, hit = np.zeros(size, np.int64), np.zeros(size, bool)
        source[list(chosen)], hit[list(chosen)] = np.arange(len(chosen)), True
        if list(chosen) != list(range(size)):
            value = b.gather(value, b.create_constant(source), axis=axis)
        mask = mask & hit.reshape([size if k == axis else 1 for k in range(len(x.shape))])
    return b.select(b.create_constant(mask), value, x)


def trilu(b: NetBuilder, x: Value, k: int, upper: bool) -> Value:
    """The upper (or lower) triangle of the last two axes from diagonal k; the rest 0."""
    rows, cols = x.shape[-2:]
    offset = np.arange(cols)[None, :] - np.arange(rows)[:, None]
    keep = offset >= k if upper else offset <= k
    zero = b.fill_constant((), False if x.dtype == "bool" else 0, x.dtype)
    return b.select(b.create_constant(keep), x, zero)


# -- ranges ---------------------------------------------------------------------------------------
def range_length(start: float, limit: float, delta: float) -> int:
    """A range's length, max(ceil((limit - start) / delta), 0), exact for integers."""
    if not all(map(math.isfinite, (start, limit, delta))) or delta == 0:
        raise ValueError(f"range({start}, {limit}, {delta}): start, limit and delta must be finite, delta nonzero")
    if isinstance(start, int) and isinstance(limit, int) and isinstance(delta, int):
        return max(-((start - limit) // delta), 0)
    return max(math.ceil((limit - start) / delta), 0)


def arange(b: NetBuilder, start: np.ndarray, limit: np.ndarray, delta: np.ndarray, dtype: str) -> Value:
    """start, start + delta, ... up to limit: a constant where it folds (its length checked first), else computed at
    run time (in float64, which holds every integer up to 2**53 exactly)."""
    s, e, d = (np.asarray(v).reshape(()).item() for v in (start, limit, delta))
    out = TensorType((range_length(s, e, d),), dtype)
    if out.nbytes > MAX_FOLDED_BYTES and max(abs(s), abs(e)) <= 2**53:
        return b.arange(start=s, end=e, step=d, dtype=dtype)
    return b.create_constant(np.arange(s, e, d).astype(dtype), dtype=dtype)


# -- einsum ---------------------------------------------------------------------------------------
def einsum(b: NetBuilder, equation: str, inputs: Sequence[Value]) -> Value:
    """Einstein summation: repeated indices of one operand become diagonals; two operands contract through one
    batched matmul; otherwise the operands are aligned on every index, multiplied and summed."""
    terms, out = _einsum_terms(equation.replace(" ", ""), [len(v.shape) for v in inputs])
    operands = [_diagonals(b, x, term) for x, term in zip(inputs, terms, strict=True)]
    if len(operands) == 2 and (y := _einsum_matmul(b, operands[0], operands[1], out)) is not None:
        return y
    return _einsum_broadcast(b, operands, out)


def _einsum_terms(equation: str, ranks: list[int]) -> tuple[list[str], str]:
    """The operands' index strings and the output's, with each '...' spelled as distinct stand-in letters
    (right-aligned across operands); an implicit output is the ellipsis, then the indices used once, sorted."""
    lhs, arrow, rhs = equation.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise ValueError(f"equation {equation!r} has {len(terms)} operands for {len(ranks)} inputs")
    widths = [rank - (len(t) - 3) if "..." in t else 0 for t, rank in zip(terms, ranks, strict=True)]
    stand_in = "".join(chr(0x3B1 + k) for k in range(max(widths, default=0)))  # greek letters: never in an equation
    terms = [t.replace("...", stand_in[len(stand_in) - w:] if w else "") for t, w in zip(terms, widths, strict=True)]
    for t, rank in zip(terms, ranks, strict=True):
        if len(t) != rank:
            raise ValueError(f"equation {equation!r}: term {t!r} does not match an input of rank {rank}")
    if arrow:
        return terms, rhs.replace("...", stand_in)
    counts = {c: sum(t.count(c) for t in terms) for t in terms for c in t}
    return terms, stand_in + "".join(sorted(c for c, n in counts.items() if n == 1 and c not in stand_in))


def _diagonals(b: NetBuilder, x: Value, term: str) -> tuple[Value, str]:
    """Repeated indices of one operand ('ii') reduced to their diagonal."""
    while len(set(term)) < len(term):
        a = next(i for i, c in enumerate(term) if term.index(c) != i)
        first = term.index(term[a])
        shape = [1] * len(term)
        shape[first] = shape[a] = x.shape[a]
        eye = b.create_constant(np.eye(x.shape[a]).reshape(shape), dtype=x.dtype)
        x = b.reduce_sum(b.multiply(x, eye), [a])
        term = term[:a] + term[a + 1:]
    return x, term


def _sizes(pairs: list[tuple[Value, str]]) -> dict[str, list[int]]:
    return {c: [x.shape[t.index(c)] for x, t in pairs if c in t] for _, term in pairs for c in term}


def _einsum_matmul(b: NetBuilder, first: tuple[Value, str], second: tuple[Value, str], out: str) -> Value | None:
    """Two operands as one batched matmul [batch, first's kept, contracted] x [batch, contracted, second's kept];
    None where an index broadcasts (sizes differ)."""
    sizes = _sizes([first, second])
    if any(len(set(s)) > 1 for s in sizes.values()):
        return None
    (x, ta), (y, tb) = first, second
    x, ta = _sum_out(b, x, ta, tb + out)
    y, tb = _sum_out(b, y, tb, ta + out)
    batch = [c for c in out if c in ta and c in tb]
    contracted = [c for c in ta if c in tb and c not in out]
    keep_a, keep_b = [c for c in out if c in ta and c not in tb], [c for c in out if c in tb and c not in ta]

    def grouped(v: Value, term: str, groups: list[list[str]]) -> Value:
        order = [c for g in groups for c in g]
        v = b.transpose(v, [term.index(c) for c in order]) if order != list(term) else v
        return b.reshape(v, [math.prod(sizes[c][0] for c in g) for g in groups])

    prod = b.matmul(grouped(x, ta, [batch, keep_a, contracted]), grouped(y, tb, [batch, contracted, keep_b]))
    order = batch + keep_a + keep_b
    result = b.reshape(prod, [sizes[c][0] for c in order])
    return b.transpose(result, [order.index(c) for c in out]) if order != list(out) else result


def _sum_out(b: NetBuilder, x: Value, term: str, elsewhere: str) -> tuple[Value, str]:
    """Sum an operand over the indices no other operand and not the output has."""
    alone = [i for i, c in enumerate(term) if c not in elsewhere]
    if not alone:
        return x, term
    return b.reduce_sum(x, alone), "".join(c for i, c in enumerate(term) if i not in alone)


def _einsum_broadcast(b: NetBuilder, operands: list[tuple[Value, str]], out: str) -> Value:
    """Every operand transposed to the order output indices, then summed ones, with size-1 axes for the indices it
    lacks; their product summed over the non-output indices."""
    letters = list(dict.fromkeys(list(out) + [c for _, t in operands for c in t if c not in out]))
    product = None
    for x, term in operands:
        mine = [c for c in letters if c in term]
        aligned = b.transpose(x, [term.index(c) for c in mine]) if mine != list(term) else x
        if mine != letters:
            aligned = b.reshape(aligned, [aligned.shape[mine.index(c)] if c in term else 1 for c in letters])
        product = aligned if product is None else b.multiply(product, aligned)
    assert product is not None
    summed = list(range(len(out), len(letters)))
    return b.reduce_sum(product, summed) if summed else product


# -- sampling grids -------------------------------------------------------------------------------
def affine_grid(b: NetBuilder, theta: Value, size: Sequence[int], align_corners: bool) -> Value:
    """Sampling grids of theta ([N, d, d + 1]) over a size (N, C, *spatial): the base grid of normalized
    coordinates (x fastest, then y, then z, and 1) times theta transposed, one batched matmul."""
    batch, spatial = size[0], list(size[2:])
    if len(spatial) not in (2, 3) or theta.shape != (batch, len(spatial), len(spatial) + 1):
        raise ValueError(f"theta of shape {theta.shape} does not fit size {tuple(size)} (2-D or 3-D grids)")

    def axis(n: int) -> np.ndarray:
        return np.linspace(-1, 1, n) if align_corners else (np.arange(n) * 2 + 1) / n - 1

    coords = np.meshgrid(*[axis(n) for n in spatial], indexing="ij")  # (z,) y, x
    points = np.stack([*coords[::-1], np.ones(spatial)], axis=-1).reshape(1, -1, len(spatial) + 1)
    base = b.create_constant(np.ascontiguousarray(np.broadcast_to(points, (batch, *points.shape[1:])), theta.dtype))
    grid = b.matmul(base, theta, trans_y=True)
    return b.reshape(grid, [batch, *spatial, len(spatial)])


class GridPadding(enum.Enum):
    """Where grid_sample reads outside the input."""

    ZEROS = "zeros"
    BORDER = "border"
    REFLECTION = "reflection"


def grid_sample(b: NetBuilder, x: Value, grid: Value, bilinear: bool, padding: GridPadding,
                align_corners: bool) -> Value:
    """x [N, C, H, W] sampled at grid [N, Ho, Wo, 2] (x then y, normalized to [-1, 1]): bilinearly from the four
    pixels around each point, or from the nearest one; each tap a gather from the flattened image."""
    n, c, h, w = x.shape
    _, ho, wo, _ = grid.shape
    ix, iy = (_grid_coordinate(b, b.squeeze(b.slice(grid, [3], [k], [k + 1]), [3]), size, padding, align_corners)
              for k, size in ((0, w), (1, h)))
    flat = b.reshape(x, [n, c, h * w])

    def tap(xi: Value, yi: Value, weight: Value | None) -> Value:
        """The pixels at integer-valued coordinates, times the weight, 0 outside the image."""
        inside = reduce(b.logical_and, [b.greater_equal(xi, scalar(b, 0, xi)), b.less_equal(xi, scalar(b, w - 1, xi)),
                                        b.greater_equal(yi, scalar(b, 0, yi)), b.less_equal(yi, scalar(b, h - 1, yi))])
        pos = b.add(b.multiply(b.clip(yi, min=0.0, max=float(h - 1)), scalar(b, w, yi)), b.clip(xi, min=0.0, max=float(w - 1)))
        index = b.broadcast_to(b.reshape(b.cast(pos, "int64"), [n, 1, ho * wo]), [n, c, ho * wo])
        factor = b.cast(inside, x.dtype) if weight is None else b.multiply(weight, b.cast(inside, x.dtype))
        return b.multiply(b.gather_elements(flat, index, axis=2), b.reshape(factor, [n, 1, ho * wo]))

    if not bilinear:
        return b.reshape(tap(b.round(ix), b.round(iy), None), [n, c, ho, wo])
    x0, y0 = b.floor(ix), b.floor(iy)
    one = scalar(b, 1, ix)
    x1, y1 = b.add(x0, one), b.add(y0, one)
    wx1, wy1 = b.subtract(ix, x0), b.subtract(iy, y0)
    wx0, wy0 = b.subtract(one, wx1), b.subtract(one, wy1)
    taps = [tap(xi, yi, b.multiply(wx, wy)) for xi, wx in ((x0, wx0), (x1, wx1)) for yi, wy in ((y0, wy0), (y1, wy1))]
    return b.reshape(reduce(b.add, taps), [n, c, ho, wo])


def _grid_coordinate(b: NetBuilder, g: Value, size: int, padding: GridPadding, align_corners: bool) -> Value:
    """A normalized grid coordinate in pixels, clipped (border) or reflected (reflection) into the image."""
    pixels = b.scale(g, scale=(size - 1) / 2, bias=(size - 1) / 2) if align_corners else \
        b.scale(g, scale=size / 2, bias=(size - 1) / 2)
    if padding == GridPadding.ZEROS:
        return pixels
    if padding == GridPadding.REFLECTION:
        low, high = (0.0, float(size - 1)) if align_corners else (-0.5, size - 0.5)
        span = high - low
        if span <= 0:
            return b.fill_constant(g.shape, 0, g.dtype)
        dist = b.abs(b.subtract(pixels, scalar(b, low, g)))
        extra = b.mod(dist, scalar(b, span, g))
        flips = b.floor(b.divide(dist, scalar(b, span, g)))
        even = b.equal(b.mod(flips, scalar(b, 2, g)), scalar(b, 0, g))
        pixels = b.select(even, b.add(extra, scalar(b, low, g)), b.subtract(scalar(b, span + low, g), extra))
    return b.clip(pixels, min=0.0, max=float(size - 1))


# -- transposed convolution -----------------------------------------------------------------------
def conv_transpose(b: NetBuilder, x: Value, w: Value, groups: int, strides: Sequence[int], dilations: Sequence[int],
                   begin: Sequence[int], end: Sequence[int], extra: Sequence[int]) -> Value:
    """A 2-D or 3-D transposed convolution ([N, C, ...] by weights [C, M / groups, ...]; pads before and after and
    the output padding per spatial dim): a convolution of the stride-dilated input with the flipped kernel."""
    (n, c, *sizes), (_, m, *kernel) = x.shape, w.shape
    dims = len(sizes)
    # insert stride - 1 zeros between input pixels: [.., H, 1, W, 1] padded to [.., H, s, W, s], trailing zeros cut
    up = b.reshape(x, [n, c, *(v for size in sizes for v in (size, 1))])
    up = b.pad(up, [(0, 0), (0, 0), *(p for st in strides for p in ((0, 0), (0, st - 1)))])
    up = b.reshape(up, [n, c, *(size * st for size, st in zip(sizes, strides, strict=True))])
    span = [(k - 1) * d for k, d in zip(kernel, dilations, strict=True)]
    full = [sp - p for sp, p in zip(span, begin, strict=True)]
    tail = [sp - e + o - (st - 1) for sp, e, o, st in zip(span, end, extra, strides, strict=True)]
    # weights [C, M/g, *k] -> [M, C/g, *k], spatially flipped
    wt = b.reshape(w, [groups, c // groups, m, *kernel])
    wt = b.reshape(b.transpose(wt, [0, 2, 1, *range(3, 3 + dims)]), [groups * m, c // groups, *kernel])
    wt = b.reverse(wt, list(range(2, 2 + dims)))
    up = b.pad(up, [(0, 0), (0, 0), *((max(f, 0), max(t, 0)) for f, t in zip(full, tail, strict=True))])
    if dims == 3:
        y = conv3d(b, up, wt, window3d(kernel, (1, 1, 1), dilations, (0, 0, 0), (0, 0, 0)), groups)
    else:
        y = b.conv2d(up, wt, [1, 1], [0, 0], list(dilations), groups)
    cut = [max(-v, 0) for v in full + tail]
    if any(cut):
        y = b.slice(y, list(range(2, 2 + dims)), cut[:dims], [o - e for o, e in zip(y.shape[2:], cut[dims:], strict=True)])
    return y
