"""Cases for elementwise ops: every op over float32, int32/bool where allowed, broadcasting, 0-d and size-1 dims."""
from __future__ import annotations

import numpy as np

from tests.cases import Case, positive, random_array

F, I, B = "float32", "int32", "bool"
M = (4, 5)  # the default small matrix


def _inputs(*makers):
    """A case maker from one maker per input array."""
    return lambda rng: [m(rng) for m in makers]


def _rand(shape, dtype=F):
    return lambda rng: random_array(rng, shape, dtype)


def _wide(shape, k):
    """Float values in [-2k, 2k): reach the saturating regions of clipped activations."""
    return lambda rng: random_array(rng, shape, F) * np.float32(k)


def _pos(shape, dtype=F):
    return lambda rng: positive(shape, dtype)(rng)[0]


def _nonzero(shape, dtype=F):
    """Values bounded away from zero, of both signs (divisors)."""

    def make(rng):
        sign = np.where(rng.random(shape) < 0.5, -1, 1)
        if np.dtype(dtype).kind in "iu":  # unsigned: the wrapped negatives are large divisors
            return (sign * rng.integers(1, 4, size=shape)).astype(dtype)
        return (sign * (rng.random(shape) * 2 + 0.5)).astype(dtype)

    return make


def _halves(shape):
    """Exact .5 values (round-half-to-even matters) mixed with random ones."""
    return lambda rng: np.where(rng.random(shape) < 0.5, rng.integers(-8, 9, size=shape) * 0.5, rng.random(shape) * 8 - 4).astype(F)


def _specials(shape):
    """Random values with NaN, +inf and -inf sprinkled in."""

    def make(rng):
        x = random_array(rng, shape, F)
        x.flat[::3] = np.nan
        x.flat[1::4] = np.inf
        x.flat[2::5] = -np.inf
        return x

    return make


def _mod_infinities(rng):
    """Infinite divisors (x or the divisor, by the signs) and infinite dividends (NaN), as numpy's mod."""
    inf = np.inf
    x = np.array([3.0, -3.0, 1.0, -1.0, 0.0, inf, -inf, 2.5], F)
    y = np.array([inf, inf, -inf, -inf, inf, inf, 2.0, -1.5], F)
    return [x, y]


def _with_zeros(shape, dtype):
    """Random values with exact zeros (sign of 0)."""

    def make(rng):
        x = random_array(rng, shape, dtype)
        x.flat[::3] = 0
        return x

    return make


def _unary(op, shapes_dtypes, **kw):
    return [Case(op, ((s, d),), **kw) for s, d in shapes_dtypes]


# unary float math; transcendental TE intrinsics differ from numpy in the last bits
_TOL = {"rtol": 1e-4, "atol": 1e-5}
CASES = [
    *_unary("relu", [(M, F), ((3,), I), ((), F)]),
    Case("relu6", make=_inputs(_wide(M, 5)), id="relu6-wide"),
    *_unary("sigmoid", [(M, F), ((1, 3, 1), F)], **_TOL),
    *_unary("tanh", [(M, F)], **_TOL),
    *_unary("exp", [(M, F), ((), F)], **_TOL),
    *_unary("sin", [(M, F)], **_TOL),
    *_unary("cos", [((2, 1, 3), F)], **_TOL),
    *_unary("tan", [(M, F)], **_TOL),
    Case("asin", make=_inputs(lambda rng: rng.uniform(-0.99, 0.99, M).astype(F)), id="asin-domain", **_TOL),
    Case("acos", make=_inputs(lambda rng: rng.uniform(-0.99, 0.99, M).astype(F)), id="acos-domain", **_TOL),
    *_unary("atan", [(M, F)], **_TOL),
    *_unary("sinh", [(M, F)], **_TOL),
    *_unary("cosh", [(M, F)], **_TOL),
    *_unary("asinh", [(M, F)], **_TOL),
    Case("acosh", make=_inputs(lambda rng: rng.uniform(1.0, 5.0, M).astype(F)), id="acosh-domain", **_TOL),
    Case("atanh", make=_inputs(lambda rng: rng.uniform(-0.99, 0.99, M).astype(F)), id="atanh-domain", **_TOL),
    *_unary("erf", [(M, F)], **_TOL),
    *_unary("silu", [(M, F)], **_TOL),
    Case("softplus", make=_inputs(_wide(M, 20)), id="softplus-wide", **_TOL),
    Case("hard_swish", make=_inputs(_wide(M, 3)), id="hard_swish-wide"),
    *_unary("floor", [(M, F)]),
    *_unary("ceil", [((1,), F)]),
    *_unary("abs", [(M, F), (M, I)]),
    *_unary("negative", [(M, F), ((), I)]),
    Case("log", make=positive(M), id="log-positive", **_TOL),
    Case("sqrt", make=positive((1, 6)), id="sqrt-positive"),
    Case("rsqrt", make=positive(M), id="rsqrt-positive", **_TOL),
    Case("reciprocal", make=_inputs(_nonzero(M)), id="reciprocal-nonzero"),
    Case("round", make=_inputs(_halves((6, 5))), id="round-halves"),
    Case("sign", make=_inputs(_with_zeros(M, F)), id="sign-float"),
    Case("sign", make=_inputs(_with_zeros((7,), I)), id="sign-int"),
    Case("is_nan", make=_inputs(_specials((4, 6))), id="is_nan-specials"),
    Case("is_inf", make=_inputs(_specials((4, 6))), id="is_inf-specials"),
    *_unary("logical_not", [(M, B), ((), B)]),
    *_unary("bitwise_not", [(M, I), ((3,), "int8")]),
    *_unary("identity", [(M, F), ((3,), I), ((2, 1), B), ((), F)]),
    # unary ops with attributes
    Case("gelu", ((M, F),), id="gelu-exact", **_TOL),
    Case("gelu", ((M, F),), {"approximate": True}, id="gelu-tanh", **_TOL),
    Case("hard_sigmoid", make=_inputs(_wide(M, 3)), id="hard_sigmoid-default"),
    Case("hard_sigmoid", ((M, F),), {"slope": 0.1666667, "offset": 0.5}, id="hard_sigmoid-onnx"),
    Case("leaky_relu", ((M, F),)),
    Case("leaky_relu", (((3, 1), F),), {"alpha": 0.2}, id="leaky_relu-alpha"),
    Case("elu", ((M, F),), **_TOL),
    Case("elu", (((), F),), {"alpha": 0.5}, id="elu-alpha-scalar", **_TOL),
    Case("clip", ((M, F),), {"min": -0.5, "max": 1.0}),
    Case("clip", ((M, I),), {"min": -2, "max": 3}),
    Case("clip", attrs={"min": -0.5, "max": 1.0}, make=_inputs(_specials((4, 6))), id="clip-specials"),
    Case("clip", attrs={"min": -0.5, "max": 1.0, "keep_nan": False}, make=_inputs(_specials((4, 6))),
         id="clip-saturating-specials"),
    Case("scale", ((M, F),), {"scale": 2.0, "bias": 0.5}),
    Case("scale", ((M, I),), {"scale": 3, "bias": 1, "bias_after_scale": False}),
    Case("cast", ((M, F),), {"dtype": I}, id="cast-float-int32"),
    Case("cast", ((M, I),), {"dtype": F}, id="cast-int32-float"),
    Case("cast", ((M, F),), {"dtype": B}, make=_inputs(_with_zeros(M, F)), id="cast-float-bool"),
    Case("cast", ((M, I),), {"dtype": B}, make=_inputs(_with_zeros(M, I)), id="cast-int32-bool"),
    Case("cast", (((), B),), {"dtype": F}, id="cast-bool-float-scalar"),
    Case("cast", (((2, 3), F),), {"dtype": "float16"}, id="cast-float-float16"),
]

# broadcasting binary ops
_BROADCAST = (((2, 3, 4), F), ((3, 1), F))
CASES += [
    Case("add", ((M, F), (M, F))),
    Case("add", (((2, 3), F), ((3,), F))),
    Case("add", (((), F), ((2, 1, 3), F))),
    Case("add", ((M, I), ((), I))),
    Case("subtract", _BROADCAST),
    Case("subtract", (((1, 5), I), ((4, 1), I))),
    Case("multiply", ((M, F), ((1,), F))),
    Case("multiply", ((M, I), (M, I))),
    Case("max", _BROADCAST),
    Case("max", (((3,), I), ((2, 3), I))),
    Case("min", (((), F), ((), F))),
    Case("min", ((M, I), ((5,), I))),
    Case("divide", make=_inputs(_rand((2, 3, 4)), _nonzero((3, 1))), id="divide-broadcast"),
    Case("divide", make=_inputs(_rand(()), _nonzero(M)), id="divide-scalar"),
    Case("floor_divide", make=_inputs(_rand(M, I), _nonzero((5,), I)), id="floor_divide-int"),
    Case("floor_divide", make=_inputs(_rand(M), _nonzero(M)), id="floor_divide-float"),
    Case("mod", make=_inputs(_rand((3, 5), I), _nonzero((3, 1), I)), id="mod-int"),
    Case("mod", make=_inputs(_rand(M), _nonzero((5,))), id="mod-float", atol=1e-5),
    Case("mod", make=_mod_infinities, id="mod-float-infinities"),
    Case("pow", make=_inputs(_pos(M), _rand((5,))), id="pow-broadcast", **_TOL),
    Case("pow", make=_inputs(_pos(()), _rand((2, 2))), id="pow-scalar-base", **_TOL),
    Case("equal", ((M, I), ((5,), I))),
    Case("equal", (((2, 3), B), ((2, 1), B))),
    Case("not_equal", ((M, I), (M, I))),
    Case("not_equal", (((3,), F), ((), F))),
    Case("greater_than", _BROADCAST),
    Case("greater_than", ((M, I), (M, I))),
    Case("greater_equal", ((M, I), ((1, 5), I))),
    Case("less_than", ((M, F), (M, F))),
    Case("less_than", (((), I), ((3,), I))),
    Case("less_equal", ((M, I), ((4, 1), I))),
    Case("logical_and", ((M, B), ((5,), B))),
    Case("logical_or", (((2, 1, 3), B), ((4, 1), B))),
    Case("logical_xor", ((M, B), (M, B))),
    Case("logical_xor", (((), B), ((3,), B))),
    Case("bitwise_and", ((M, I), ((5,), I))),
    Case("bitwise_or", ((M, "int64"), (M, "int64"))),
    Case("bitwise_xor", ((M, "int8"), (M, "int8"))),
    Case("select", (((4, 1), B), (M, F), (M, F))),
    Case("select", ((M, B), ((), I), ((5,), I))),
    Case("select", (((), B), ((2, 3), F), ((1, 3), F))),
]

# the narrow and unsigned integer dtypes: the random ints in [-5, 5] wrap to their dtype's largest values, so sums,
# products and negations overflow and must wrap as numpy; divisions by zero give 0
_NARROW = ("int16", "uint8", "uint16", "uint32", "uint64")


def _unsigned_range(rng):
    """Floats in [0, 200): in range of every unsigned dtype (a negative float's unsigned value is undefined)."""
    return [(rng.random(M) * 200).astype(F)]


for _d in _NARROW:
    CASES += [
        *(Case(op, ((M, _d), ((5,), _d)), id=f"{op}-wraps:{_d}") for op in ("add", "subtract", "multiply")),
        Case("floor_divide", make=_inputs(_rand(M, _d), _with_zeros((5,), _d)), id=f"floor_divide-by-zero:{_d}"),
        Case("mod", make=_inputs(_rand(M, _d), _with_zeros((5,), _d)), id=f"mod-by-zero:{_d}"),
        *(Case(op, ((M, _d),), id=f"{op}:{_d}") for op in ("abs", "negative", "bitwise_not", "relu")),
        Case("sign", make=_inputs(_with_zeros(M, _d)), id=f"sign:{_d}"),
        Case("max", ((M, _d), ((1, 5), _d)), id=f"max:{_d}"),
        Case("less_than", ((M, _d), ((5,), _d)), id=f"less_than:{_d}"),
        Case("bitwise_xor", ((M, _d), ((), _d)), id=f"bitwise_xor:{_d}"),
        Case("cast", ((M, _d),), {"dtype": "float64"}, id=f"cast-{_d}-float64"),
        Case("cast", ((M, "int64"),), {"dtype": _d}, id=f"cast-int64-{_d}-wraps"),
        Case("cast", ((M, _d),), {"dtype": "int8"}, id=f"cast-{_d}-int8-wraps"),
    ]
CASES += [Case("cast", attrs={"dtype": _d}, make=_unsigned_range, id=f"cast-float-{_d}") for _d in _NARROW[1:]]


def _shifts(dtype):
    """Values of every magnitude, and shifts from -2 to the width + 2 (negative and too-wide ones shift all out)."""
    bits = np.dtype(dtype).itemsize * 8

    def make(rng):
        x = rng.integers(np.iinfo(dtype).min, np.iinfo(dtype).max, size=M, dtype=dtype, endpoint=True)
        return [x, rng.integers(-2, bits + 3, size=(5,)).astype(dtype)]

    return make


CASES += [Case(op, make=_shifts(d), id=f"{op}:{d}") for op in ("left_shift", "right_shift")
          for d in ("int8", "uint8", "int16", "uint32", "int64", "uint64")]
CASES += [
    Case("bitcast", make=_inputs(_specials(M)), attrs={"dtype": I}, id="bitcast-float32-int32"),
    Case("bitcast", ((M, "uint16"),), {"dtype": "float16"}, id="bitcast-uint16-float16"),
    Case("bitcast", ((M, "int64"),), {"dtype": "uint64"}, id="bitcast-int64-uint64"),
    Case("bitcast", ((M, B),), {"dtype": "int8"}, id="bitcast-bool-int8"),
]
