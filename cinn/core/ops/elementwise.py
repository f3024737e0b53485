"""Elementwise (unary and broadcasting binary) ops."""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tvm_ffi
from tvm import tirx, topi
from tvm.ir.expr import Call

from cinn.core.ir import Attrs, TensorType
from cinn.core.ops.common import broadcast_shapes, register_elementwise, same_dtype
from cinn.core.ops.registry import DtypeClass as D
from cinn.core.ops.registry import OpDef, PatternKind, register
from cinn.core.ops.te_util import dtype_of, elementwise_compute


def _dtype(expr) -> str:
    """The dtype of a TIR expression."""
    return dtype_of(expr)


def _c(value, like):
    """A constant with the dtype of an expression."""
    return tirx.const(value, _dtype(like))


def _np_c(value, like: np.ndarray) -> np.ndarray:
    """A numpy scalar with the dtype of an array (so references compute in the input dtype)."""
    return np.asarray(value, like.dtype)


# numpy has no erf; math.erf in float64 is the reference
_np_erf = np.vectorize(math.erf, otypes=[np.float64])
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


# -- attributes ---------------------------------------------------------------------------
@dataclass(frozen=True)
class ScaleAttrs(Attrs):
    """scale(x) = x * scale + bias (bias_after_scale) or (x + bias) * scale."""

    scale: float = 1.0
    bias: float = 0.0
    bias_after_scale: bool = True


@dataclass(frozen=True)
class GeluAttrs(Attrs):
    """gelu: exact erf form, or the tanh approximation when `approximate`."""

    approximate: bool = False


@dataclass(frozen=True)
class HardSigmoidAttrs(Attrs):
    """hard_sigmoid(x) = clip(x * slope + offset, 0, 1)."""

    slope: float = 0.2
    offset: float = 0.5


@dataclass(frozen=True)
class AlphaAttrs(Attrs):
    """The negative-side slope of leaky_relu."""

    alpha: float = 0.01


@dataclass(frozen=True)
class EluAttrs(Attrs):
    """elu(x) = x if x > 0 else alpha * (exp(x) - 1)."""

    alpha: float = 1.0


@dataclass(frozen=True)
class ClipAttrs(Attrs):
    """clip(x) = min(max(x, min), max); bounds are converted to the input dtype. keep_nan=False (saturation, as
    quantization does) gives `min` for NaN and reads x once: fused into a chain, the NaN-keeping form repeats its
    input expression at each nested clip."""

    min: float
    max: float
    keep_nan: bool = True


@dataclass(frozen=True)
class CastAttrs(Attrs):
    """The target dtype of cast."""

    dtype: str


# -- scalar TE bodies and numpy references of the ops with formulas --------------------------
def _scale_te(x, a: ScaleAttrs):
    s, b = _c(a.scale, x), _c(a.bias, x)
    return x * s + b if a.bias_after_scale else (x + b) * s


def _scale_np(x, a: ScaleAttrs):
    s, b = _np_c(a.scale, x), _np_c(a.bias, x)
    return x * s + b if a.bias_after_scale else (x + b) * s


def _max_te(x, y):
    """max that keeps NaN, as numpy.maximum: TVM's max is select(x > y, x, y), which drops a NaN x."""
    return _either(x < y, x, y) if _is_float(x) else tirx.max(x, y)


def _min_te(x, y):
    """min that keeps NaN, as numpy.minimum."""
    return _either(y < x, x, y) if _is_float(x) else tirx.min(x, y)


def _either(y_wins, x, y):
    """y where `y_wins` or y is NaN, else x: a NaN x stays (the comparison is false). The NaN test is on y, which is
    a constant bound in relu and clip, where it folds away: one compare and select is left, one vmaxps/vminps (a
    test on x is slower: docs/notes/graph-rewrites.md). x is used twice: once fusion inlines a
    producer's expression for it, nested clips repeat it 4**depth times (binding it with a let would avoid that, but
    TVM's vectorizer refuses a let var that inlining binds in two places)."""
    return tirx.Select(tirx.Or(y_wins, tirx.isnan(y)), y, x)


def _clip_te(x, lo, hi):
    return _min_te(_max_te(x, _c(lo, x)), _c(hi, x))


def _clip_np(x, lo, hi):
    return np.minimum(np.maximum(x, _np_c(lo, x)), _np_c(hi, x))


def _clip_op_te(x, a: ClipAttrs):
    if a.keep_nan or not _is_float(x):
        return _clip_te(x, a.min, a.max)
    return tirx.min(tirx.max(x, _c(a.min, x)), _c(a.max, x))  # a NaN x fails max's comparison: min


def _clip_op_np(x, a: ClipAttrs):
    y = _clip_np(x, a.min, a.max)
    return y if a.keep_nan or x.dtype.kind != "f" else np.where(np.isnan(x), _np_c(a.min, x), y)


def _gelu_te(x, a: GeluAttrs):
    if a.approximate:
        inner = _c(_SQRT_2_OVER_PI, x) * (x + _c(0.044715, x) * x * x * x)
        return _c(0.5, x) * x * (_c(1.0, x) + tirx.tanh(inner))
    return _c(0.5, x) * x * (_c(1.0, x) + tirx.erf(x * _c(1 / math.sqrt(2.0), x)))


def _gelu_np(x, a: GeluAttrs):
    x64 = x.astype(np.float64)
    if a.approximate:
        return 0.5 * x64 * (1.0 + np.tanh(_SQRT_2_OVER_PI * (x64 + 0.044715 * x64**3)))
    return 0.5 * x64 * (1.0 + _np_erf(x64 / math.sqrt(2.0)))


def _np_sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x.astype(np.float64)))


def _is_unsigned(x) -> bool:
    return _dtype(x).startswith("uint")


def _sign_te(x):
    if _is_unsigned(x):  # no -1 to make
        return tirx.Select(x > _c(0, x), _c(1, x), _c(0, x))
    signed = tirx.Select(x > _c(0, x), _c(1, x), tirx.Select(x < _c(0, x), _c(-1, x), _c(0, x)))
    return tirx.Select(tirx.isnan(x), x, signed) if _is_float(x) else signed  # NaN stays NaN, as numpy


def _abs_int64(x):
    """abs of an int64 with no wider type to wrap through: a negative x negated as uint64 (~x + 1, which wraps;
    TVM folds a uint64 0 - x to 0), so abs(INT64_MIN) is INT64_MIN, and the simplifier cannot take it to be
    non-negative."""
    negated = tirx.reinterpret("int64", tirx.bitwise_not(tirx.reinterpret("uint64", x)) + tirx.const(1, "uint64"))
    return tirx.Select(x < tirx.const(0, "int64"), negated, x)


def _negative_uint64(x):
    """-x of a uint64 as ~x + 1, which wraps as numpy (TVM folds a uint64 0 - x to 0); 0 is decided apart, since
    ~0 + 1 overflows the `nuw` add TVM emits."""
    return tirx.Select(x == _c(0, x), x, tirx.bitwise_not(x) + _c(1, x))


def _wrapping(fn):
    """A narrow integer arithmetic body computed in int64 and truncated: it wraps on overflow as numpy does (TVM
    emits signed arithmetic as `nsw` and 32-bit unsigned as `nuw`, whose overflow LLVM may assume away: sign(7 +
    INT_MAX) came out 0). int64 and uint64 stay as they are: there is no wider type."""

    def body(*xs):
        dtype = _dtype(xs[0])
        if not dtype.startswith(("int", "uint")) or dtype in ("int64", "uint64"):
            return fn(*xs)
        return fn(*(x.astype("int64") for x in xs)).astype(dtype)

    return body


# wrapping: abs(INT_MIN) is INT_MIN, as numpy, and TVM's simplifier, taking tirx.abs to be non-negative, no longer
# folds relu(abs(x)) to abs(x)
_abs_signed = _wrapping(lambda x: _abs_int64(x) if _dtype(x) == "int64" else tirx.abs(x))


def _subtract_te(x, y):
    # TVM's simplifier folds x - x to 0, as if x could not be inf or NaN (inf - inf is NaN): decide those first
    if _is_float(x) and _same_load(x, y):
        return tirx.Select(tirx.isfinite(x), _c(0, x), _c(float("nan"), x))
    return x - y


def _same_load(x, y) -> bool:
    """Whether two operands read the same tensor at the same indices (te.tensor_load calls: the tensor, then the
    indices)."""
    if not (isinstance(x, Call) and isinstance(y, Call)) or not x.op.same_as(y.op) or len(x.args) != len(y.args):
        return False
    return x.args[0].same_as(y.args[0]) and all(tvm_ffi.structural_equal(a, b) for a, b in zip(x.args[1:], y.args[1:], strict=True))


def _softplus_te(x):
    # max(x, 0) + log1p(exp(-|x|)) does not overflow for large x
    return tirx.max(x, _c(0, x)) + tirx.log1p(tirx.exp(-tirx.abs(x)))


def _is_float(x) -> bool:
    return _dtype(x).startswith("float")


def _safe_divisor(y):
    """An integer divisor with 0 and -1 replaced by 1: x86 traps (SIGFPE, killing the process) on x // 0 and on
    INT_MIN // -1; the callers give those cases numpy's results instead. An unsigned divisor has no -1."""
    traps = y == _c(0, y) if _is_unsigned(y) else tirx.Or(y == _c(0, y), y == _c(-1, y))
    return tirx.Select(traps, _c(1, y), y)


def _floor_divide_te(x, y):
    if _is_float(x):  # tirx.floordiv is integer-only
        # as numpy (whose floor division goes through fmod): a finite x over an infinite divisor of the other sign
        # is -1, not -0; an infinite x over a nonzero divisor gives NaN, not inf
        by_inf = tirx.And(tirx.And(tirx.isinf(y), tirx.Not(tirx.isinf(x))), x * y < _c(0, x))
        quotient = tirx.Select(by_inf, _c(-1, x), tirx.floor(x / y))
        return tirx.Select(tirx.And(tirx.isinf(x), y != _c(0, y)), _c(float("nan"), x), quotient)
    if _is_unsigned(x):  # as numpy: x // 0 is 0
        return tirx.Select(y == _c(0, y), _c(0, x), tirx.floordiv(x, _safe_divisor(y)))
    # as numpy: x // 0 is 0, x // -1 is -x (INT_MIN // -1 wraps to INT_MIN)
    return tirx.Select(y == _c(0, y), _c(0, x), tirx.Select(y == _c(-1, y), _c(0, x) - x, tirx.floordiv(x, _safe_divisor(y))))


def _mod_te(x, y):
    # numpy's mod: the result takes the divisor's sign (LLVM codegen has no tirx.fmod for floats)
    if not _is_float(x):
        return tirx.floormod(x, _safe_divisor(y))  # as numpy: x % 0 is 0, and x % -1 is 0 for every x
    # an infinite divisor leaves a finite x as it is, or gives the divisor when the signs differ (as numpy);
    # the formula would give inf * 0 = NaN
    by_inf = tirx.Select(x * y < _c(0, x), y, x)
    return tirx.Select(tirx.And(tirx.isinf(y), tirx.Not(tirx.isinf(x))), by_inf, x - tirx.floor(x / y) * y)


def _shift(left: bool):
    """x shifted by y bits, as numpy and ONNX: y is read as unsigned, so a negative or too-large shift leaves 0 (or,
    shifting a negative x right, -1); LLVM's shl/ashr/lshr by the width or more are poison. A signed x is shifted
    left as unsigned: its overflow wraps."""

    def body(x, y):
        dtype = _dtype(x)
        bits = int(dtype.removeprefix("u").removeprefix("int"))
        unsigned = "u" + dtype.removeprefix("u")
        if _is_unsigned(y):  # y < bits as no bit above the shift's: TVM's simplifier fails on a 32- or 64-bit uint < c
            inside = tirx.shift_right(y, _c(bits.bit_length() - 1, y)) == _c(0, y)
        else:
            inside = tirx.And(y >= _c(0, y), y < _c(bits, y))
        safe = tirx.Select(inside, y, _c(0, y))
        if left:
            shifted = tirx.reinterpret(dtype, tirx.shift_left(tirx.reinterpret(unsigned, x), tirx.reinterpret(unsigned, safe)))
            return tirx.Select(inside, shifted, _c(0, x))
        beyond = _c(0, x) if _is_unsigned(x) else tirx.Select(x < _c(0, x), _c(-1, x), _c(0, x))
        return tirx.Select(inside, tirx.shift_right(x, safe), beyond)  # ashr for signed x, lshr for unsigned

    return body


def _compare(name: str):
    """A comparison tvm.tirx.<name>; bools are compared as int8 since LLVM codegen emits fcmp for i1. Floats decide a
    NaN operand first (only != holds then): TVM's simplifier folds x == x to true as if NaN did not exist (the fuzz
    test's equal(x, x) gave True for NaN)."""

    def body(x, y):
        if _dtype(x) == "bool":
            x, y = x.astype("int8"), y.astype("int8")
        compared = getattr(tirx, name)(x, y)
        if not _is_float(x):
            return compared
        return tirx.Select(tirx.Or(tirx.isnan(x), tirx.isnan(y)), tirx.const(name == "NE", "bool"), compared)

    return body


def _where_positive_te(negative_branch):
    """x where x > 0, else negative_branch(x, attrs): leaky_relu and elu."""

    def body(x, a):
        return tirx.Select(x > _c(0, x), x, negative_branch(x, a))

    return body


# -- float32 fast paths: vectorizable polynomial approximations from topi -------------------------
def _fast_sigmoid(x):
    return topi.divide(1.0, topi.add(1.0, topi.fast_exp(topi.negative(x))))


def _fast_gelu(x, a: GeluAttrs):
    if a.approximate:
        inner = topi.multiply(topi.add(x, topi.multiply(topi.multiply(topi.multiply(x, x), x), 0.044715)), _SQRT_2_OVER_PI)
        return topi.multiply(topi.multiply(x, 0.5), topi.add(1.0, topi.fast_tanh(inner)))
    return topi.multiply(topi.multiply(x, 0.5), topi.add(1.0, topi.fast_erf(topi.multiply(x, 1 / math.sqrt(2.0)))))


_FAST_F32 = {
    "exp": topi.fast_exp,
    "erf": topi.fast_erf,
    "tanh": topi.fast_tanh,
    "sigmoid": _fast_sigmoid,
    "silu": lambda x: topi.multiply(x, _fast_sigmoid(x)),
    "gelu": _fast_gelu,
}


# -- unary ops ------------------------------------------------------------------------------
# name -> (scalar TE body, numpy reference, accepted dtypes); float-only unless stated
_UNARY: dict[str, tuple[Callable[..., Any], Callable[..., Any], D]] = {
    "relu": (lambda x: _max_te(x, _c(0, x)), lambda x: np.maximum(x, 0), D.NUMBER),
    "relu6": (lambda x: _clip_te(x, 0, 6), lambda x: _clip_np(x, 0, 6), D.FLOAT),
    "sigmoid": (tirx.sigmoid, _np_sigmoid, D.FLOAT),
    "tanh": (tirx.tanh, np.tanh, D.FLOAT),
    "exp": (tirx.exp, np.exp, D.FLOAT),
    "log": (tirx.log, np.log, D.FLOAT),
    "sqrt": (tirx.sqrt, np.sqrt, D.FLOAT),
    "rsqrt": (tirx.rsqrt, lambda x: 1.0 / np.sqrt(x.astype(np.float64)), D.FLOAT),
    "abs": (lambda x: x if _is_unsigned(x) else _abs_signed(x), np.abs, D.NUMBER),
    "negative": (_wrapping(lambda x: _negative_uint64(x) if _dtype(x) == "uint64" else -x), np.negative, D.NUMBER),
    "erf": (tirx.erf, _np_erf, D.FLOAT),
    "silu": (lambda x: x * tirx.sigmoid(x), lambda x: x * _np_sigmoid(x), D.FLOAT),
    "hard_swish": (lambda x: x * _clip_te(x + _c(3, x), 0, 6) / _c(6, x), lambda x: x * _clip_np(x + 3, 0, 6) / 6, D.FLOAT),
    "softplus": (_softplus_te, lambda x: np.logaddexp(0, x.astype(np.float64)), D.FLOAT),
    "sin": (tirx.sin, np.sin, D.FLOAT),
    "cos": (tirx.cos, np.cos, D.FLOAT),
    "tan": (tirx.tan, np.tan, D.FLOAT),
    "asin": (tirx.asin, np.arcsin, D.FLOAT),
    "acos": (tirx.acos, np.arccos, D.FLOAT),
    "atan": (tirx.atan, np.arctan, D.FLOAT),
    "sinh": (tirx.sinh, np.sinh, D.FLOAT),
    "cosh": (tirx.cosh, np.cosh, D.FLOAT),
    "asinh": (tirx.asinh, np.arcsinh, D.FLOAT),
    "acosh": (tirx.acosh, np.arccosh, D.FLOAT),
    "atanh": (tirx.atanh, np.arctanh, D.FLOAT),
    "floor": (tirx.floor, np.floor, D.FLOAT),
    "ceil": (tirx.ceil, np.ceil, D.FLOAT),
    # round half to even, as np.round and ONNX Round
    "round": (tirx.nearbyint, np.round, D.FLOAT),
    "sign": (_sign_te, np.sign, D.NUMBER),
    "reciprocal": (lambda x: _c(1, x) / x, np.reciprocal, D.FLOAT),
    "logical_not": (tirx.Not, np.logical_not, D.BOOL),
    "bitwise_not": (tirx.bitwise_not, np.invert, D.INT),
    # a copy compute: a kernel output must never alias its input buffer
    "identity": (lambda x: x, np.copy, D.ANY),
}
for _name, (_te, _ref, _dtypes) in _UNARY.items():
    register_elementwise(_name, _te, _ref, dtypes=_dtypes, fast_f32=_FAST_F32.get(_name))

register_elementwise("is_nan", tirx.isnan, np.isnan, out_dtype="bool")
register_elementwise("is_inf", tirx.isinf, np.isinf, out_dtype="bool")

# unary ops with attributes: name -> (attrs class, TE body(x, a), numpy reference(x, a), dtypes)
_UNARY_ATTRS = {
    "gelu": (GeluAttrs, _gelu_te, _gelu_np, D.FLOAT),
    "hard_sigmoid": (
        HardSigmoidAttrs,
        lambda x, a: _clip_te(x * _c(a.slope, x) + _c(a.offset, x), 0, 1),
        lambda x, a: _clip_np(x * _np_c(a.slope, x) + _np_c(a.offset, x), 0, 1),
        D.FLOAT,
    ),
    "leaky_relu": (
        AlphaAttrs,
        _where_positive_te(lambda x, a: x * _c(a.alpha, x)),
        lambda x, a: np.where(x > 0, x, x * _np_c(a.alpha, x)),
        D.FLOAT,
    ),
    "elu": (
        EluAttrs,
        _where_positive_te(lambda x, a: _c(a.alpha, x) * (tirx.exp(x) - _c(1, x))),
        lambda x, a: np.where(x > 0, x, _np_c(a.alpha, x) * np.expm1(x)),
        D.FLOAT,
    ),
    "clip": (ClipAttrs, _clip_op_te, _clip_op_np, D.NUMBER),
    "scale": (ScaleAttrs, _scale_te, _scale_np, D.NUMBER),
}
for _name, (_attrs, _te, _ref, _dtypes) in _UNARY_ATTRS.items():
    register_elementwise(_name, _te, _ref, attrs=_attrs, dtypes=_dtypes, fast_f32=_FAST_F32.get(_name))


# -- broadcasting binary ops ----------------------------------------------------------------
# name -> (scalar TE body, numpy reference, accepted dtypes, output dtype or None for the input's)
_BINARY = {
    "add": (_wrapping(lambda x, y: x + y), np.add, D.NUMBER, None),
    "subtract": (_wrapping(_subtract_te), np.subtract, D.NUMBER, None),
    "multiply": (_wrapping(lambda x, y: x * y), np.multiply, D.NUMBER, None),
    # integer division is ambiguous (C truncates, numpy floors): ints use floor_divide
    "divide": (lambda x, y: x / y, np.divide, D.FLOAT, None),
    "floor_divide": (_floor_divide_te, np.floor_divide, D.NUMBER, None),
    # numpy's mod: the result takes the sign of the divisor, for ints and floats
    "mod": (_mod_te, np.mod, D.NUMBER, None),
    "pow": (tirx.power, np.power, D.FLOAT, None),
    "max": (_max_te, np.maximum, D.NUMBER, None),
    "min": (_min_te, np.minimum, D.NUMBER, None),
    "equal": (_compare("EQ"), np.equal, D.ANY, "bool"),
    "not_equal": (_compare("NE"), np.not_equal, D.ANY, "bool"),
    "greater_than": (_compare("GT"), np.greater, D.NUMBER, "bool"),
    "greater_equal": (_compare("GE"), np.greater_equal, D.NUMBER, "bool"),
    "less_than": (_compare("LT"), np.less, D.NUMBER, "bool"),
    "less_equal": (_compare("LE"), np.less_equal, D.NUMBER, "bool"),
    "logical_and": (tirx.And, np.logical_and, D.BOOL, None),
    "logical_or": (tirx.Or, np.logical_or, D.BOOL, None),
    "logical_xor": (_compare("NE"), np.logical_xor, D.BOOL, None),
    "bitwise_and": (tirx.bitwise_and, np.bitwise_and, D.INT, None),
    "bitwise_or": (tirx.bitwise_or, np.bitwise_or, D.INT, None),
    "bitwise_xor": (tirx.bitwise_xor, np.bitwise_xor, D.INT, None),
    "left_shift": (_shift(left=True), np.left_shift, D.INT, None),
    "right_shift": (_shift(left=False), np.right_shift, D.INT, None),
}
for _name, (_te, _ref, _dtypes, _out) in _BINARY.items():
    register_elementwise(_name, _te, _ref, arity=2, dtypes=_dtypes, out_dtype=_out)


# -- ops whose output dtype is not their first input's ----------------------------------------
def _elementwise_compute(name: str, fn):
    """An OpDef compute applying a scalar TE function elementwise with broadcasting."""

    def compute(tensors, a: Attrs, out_types: Sequence[TensorType]):
        return [elementwise_compute(name, tensors, out_types[0], lambda *xs: fn(*xs, a))]

    return compute


def _cast_infer(types: Sequence[TensorType], a: CastAttrs) -> tuple[TensorType]:
    try:
        return (TensorType(types[0].shape, a.dtype),)
    except (TypeError, ValueError) as e:
        raise TypeError(f"cast: bad target dtype {a.dtype!r} for input {types[0].dtype}{types[0].shape}: {e}") from None


def _cast_te(x, a: CastAttrs):
    # a plain truncation to 1 bit would keep only the lowest bit: bool means "non-zero"
    if a.dtype == "bool" and _dtype(x) != "bool":
        return tirx.NE(x, _c(0, x))
    return x


def _register_conversion(name: str, infer, te, reference, doc: str) -> None:
    """An elementwise op of CastAttrs: cast or bitcast."""
    register(OpDef(name=name, kind=PatternKind.ELEMENTWISE, infer=infer, compute=_elementwise_compute(name, te),
                   reference=reference, attrs=CastAttrs, doc=doc))


_register_conversion("cast", _cast_infer, _cast_te, lambda xs, a: [xs[0].astype(a.dtype)],
                     "Convert to another dtype (floats to ints truncate; anything to bool means non-zero).")


def _bitcast_infer(types: Sequence[TensorType], a: CastAttrs) -> tuple[TensorType]:
    (x,) = types
    (out,) = _cast_infer(types, a)
    if np.dtype(x.dtype).itemsize != np.dtype(out.dtype).itemsize:
        raise TypeError(f"bitcast: {x.dtype}{x.shape} and {out.dtype} differ in width; bitcast keeps the bits")
    if out.dtype == "bool" and x.dtype != "bool":  # a byte other than 0 or 1 is no bool
        raise TypeError(f"bitcast: {x.dtype}{x.shape} to bool: compare with 0 or cast instead")
    return (out,)


def _bitcast_te(x, a: CastAttrs):
    # a TIR bool is 1 bit wide (its byte holds 0 or 1): its bits as an 8-bit integer are its value
    return x.astype(a.dtype) if _dtype(x) == "bool" else tirx.reinterpret(a.dtype, x)


_register_conversion("bitcast", _bitcast_infer, _bitcast_te, lambda xs, a: [np.asarray(xs[0], order="C").view(a.dtype)],
                     "The bits of each element read as another dtype of the same width (float32 -> int32: the IEEE "
                     "bits).")


def _select_infer(types: Sequence[TensorType], _a: Attrs) -> tuple[TensorType]:
    cond, x, y = types
    if cond.dtype != "bool":
        raise TypeError(f"select: condition must be bool, got {cond.dtype}{cond.shape}; compare or cast it first")
    dtype = same_dtype("select", (x, y))
    return (TensorType(broadcast_shapes("select", cond.shape, x.shape, y.shape), dtype),)


register(
    OpDef(
        name="select",
        kind=PatternKind.ELEMENTWISE,
        infer=_select_infer,
        compute=_elementwise_compute("select", lambda c, x, y, _a: tirx.Select(c, x, y)),
        reference=lambda xs, _a: [np.where(*xs)],
        num_inputs=3,
        doc="select(cond, x, y): x where cond else y, with numpy broadcasting.",
    )
)
