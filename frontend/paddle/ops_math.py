"""Converters of Paddle elementwise ops: activations, arithmetic (legacy `axis` broadcast), comparisons and logic,
clip, where, scale, cast, dropout."""
from __future__ import annotations

import math
from functools import reduce

from cinn.core.ir import Value
from frontend import compose
from frontend.paddle.graph import PaddleImportError
from frontend.paddle.registry import OpContext, attr_of, converter, dtype_arg

# Paddle op (legacy and PIR names) -> cinn op, for ops taking one input X and no attributes used here
_UNARY = {
    "relu": "relu", "sigmoid": "sigmoid", "tanh": "tanh", "exp": "exp", "log": "log", "sqrt": "sqrt",
    "rsqrt": "rsqrt", "abs": "abs", "floor": "floor", "ceil": "ceil", "erf": "erf", "sin": "sin", "cos": "cos",
    "tan": "tan", "asin": "asin", "acos": "acos", "atan": "atan", "sinh": "sinh", "cosh": "cosh", "asinh": "asinh",
    "acosh": "acosh", "atanh": "atanh", "silu": "silu", "reciprocal": "reciprocal", "sign": "sign",
    "logical_not": "logical_not", "bitwise_not": "bitwise_not", "assign": "identity", "isnan": "is_nan",
    "isinf": "is_inf", "isnan_v2": "is_nan", "isinf_v2": "is_inf", "softsign": None, "square": None,
    "log1p": None, "expm1": None, "log2": None, "log10": None, "trunc": None, "logsigmoid": None,
    "tanh_shrink": None, "isfinite": None, "isfinite_v2": None, "relu6": None,
}
# unary ops written as compositions (x -> value)
_COMPOSED = {
    "softsign": compose.softsign,
    "square": lambda b, x: b.multiply(x, x),
    "log1p": lambda b, x: b.log(b.add(x, compose.scalar(b, 1, x))),
    "expm1": lambda b, x: b.subtract(b.exp(x), compose.scalar(b, 1, x)),
    "log2": lambda b, x: b.scale(b.log(x), scale=1 / math.log(2)),
    "log10": lambda b, x: b.scale(b.log(x), scale=1 / math.log(10)),
    "trunc": lambda b, x: b.multiply(b.sign(x), b.floor(b.abs(x))),
    "logsigmoid": lambda b, x: b.negative(b.softplus(b.negative(x))),
    "tanh_shrink": lambda b, x: b.subtract(x, b.tanh(x)),
    "isfinite": lambda b, x: b.logical_not(b.logical_or(b.is_nan(x), b.is_inf(x))),
    "isfinite_v2": lambda b, x: b.logical_not(b.logical_or(b.is_nan(x), b.is_inf(x))),
    "relu6": lambda b, x: b.relu6(x),
}
# legacy elementwise_* ops (with `axis`) and their PIR names (numpy broadcasting) -> cinn op
_BINARY = {
    "elementwise_add": "add", "add": "add", "elementwise_sub": "subtract", "subtract": "subtract",
    "elementwise_mul": "multiply", "multiply": "multiply",
    "elementwise_max": "max", "maximum": "max", "elementwise_min": "min", "minimum": "min",
    "elementwise_pow": "pow", "elementwise_floordiv": "floor_divide", "floor_divide": "floor_divide",
    "elementwise_mod": "mod", "remainder": "mod",
    "equal": "equal", "not_equal": "not_equal", "less_than": "less_than", "less_equal": "less_equal",
    "greater_than": "greater_than", "greater_equal": "greater_equal",
    "logical_and": "logical_and", "logical_or": "logical_or", "logical_xor": "logical_xor",
    "bitwise_and": "bitwise_and", "bitwise_or": "bitwise_or", "bitwise_xor": "bitwise_xor",
}


def _apply(ctx: OpContext, op: str, *inputs: Value, **attrs) -> Value:
    """One cinn op through the op's builder (a method of the op table)."""
    return getattr(ctx.b, op)(*inputs, **attrs)


@converter(*_UNARY)
def unary(ctx: OpContext):
    x = ctx.input("X", 0)
    op = _UNARY[ctx.op.type]
    if ctx.op.type == "relu6" and float(ctx.attr("threshold", 6.0)) != 6.0:  # Paddle 2 kept the bound
        return [ctx.b.clip(x, min=0.0, max=float(ctx.attr("threshold")))]
    if x.dtype == "bool" and op in _BOOL_BITWISE:
        op = _BOOL_BITWISE[op]
    return [_COMPOSED[ctx.op.type](ctx.b, x) if op is None else _apply(ctx, op, x)]


# bitwise ops of booleans are the logical ones
_BOOL_BITWISE = {"bitwise_and": "logical_and", "bitwise_or": "logical_or", "bitwise_xor": "logical_xor",
                 "bitwise_not": "logical_not"}


@converter(*_BINARY)
def binary(ctx: OpContext):
    x, y = _legacy_broadcast(ctx, ctx.input("X", 0), ctx.input("Y", 1))
    op = _BINARY[ctx.op.type]
    return [_apply(ctx, _BOOL_BITWISE.get(op, op) if x.dtype == "bool" else op, x, y)]


@converter("elementwise_div", "divide")
def divide(ctx: OpContext):
    x, y = _legacy_broadcast(ctx, ctx.input("X", 0), ctx.input("Y", 1))
    return [compose.divide(ctx.b, x, y)]


@converter("elementwise_fmax", "elementwise_fmin", "fmax", "fmin")
def fmax(ctx: OpContext):
    """max / min ignoring a NaN operand (NaN only where both are)."""
    x, y = _legacy_broadcast(ctx, ctx.input("X", 0), ctx.input("Y", 1))
    best = (ctx.b.max if ctx.op.type.endswith("max") else ctx.b.min)(x, y)
    if not x.dtype.startswith("float"):
        return [best]
    return [ctx.b.select(ctx.b.is_nan(x), y, ctx.b.select(ctx.b.is_nan(y), x, best))]


@converter("elementwise_heaviside", "heaviside")
def heaviside(ctx: OpContext):
    """0 below zero, y at zero, 1 above."""
    x, y = _legacy_broadcast(ctx, ctx.input("X", 0), ctx.input("Y", 1))
    zero = compose.scalar(ctx.b, 0, x)
    step = ctx.b.cast(ctx.b.greater_than(x, zero), x.dtype)
    return [ctx.b.select(ctx.b.equal(x, zero), ctx.b.add(zero, y), step)]


@converter("atan2")
def atan2(ctx: OpContext):
    """The angle of (x2, x1): atan(x1 / x2), moved by pi into the left half-plane; +-pi/2 on the vertical axis."""
    y, x = ctx.input("X1", 0), ctx.input("X2", 1)
    b = ctx.b
    zero = compose.scalar(b, 0, x)
    base = b.atan(b.divide(y, b.select(b.equal(x, zero), compose.scalar(b, 1, x), x)))
    turn = b.select(b.less_than(y, zero), compose.scalar(b, -math.pi, x), compose.scalar(b, math.pi, x))
    left = b.add(base, turn)
    vertical = b.multiply(b.sign(y), compose.scalar(b, math.pi / 2, x))
    return [b.select(b.equal(x, zero), vertical, b.select(b.less_than(x, zero), left, base))]


def _legacy_broadcast(ctx: OpContext, x: Value, y: Value) -> tuple[Value, Value]:
    """Legacy `axis` = k aligns the lower-rank operand's first dim with dim k of the other (-1: numpy rule)."""
    axis = ctx.attr("axis", -1)
    if axis == -1 or len(x.shape) == len(y.shape):
        return x, y
    big, small = (x, y) if len(x.shape) > len(y.shape) else (y, x)
    trailing = len(big.shape) - axis - len(small.shape)
    if not 0 <= axis or trailing < 0:
        raise PaddleImportError(f"axis {axis} does not align shapes {x.shape} and {y.shape}")
    if trailing == 0:  # aligned at the end: the numpy rule already
        return x, y
    small = ctx.b.reshape(small, list(small.shape) + [1] * trailing)
    return (big, small) if big is x else (small, big)


@converter("add_n")
def add_n(ctx: OpContext):
    """The sum of a list of tensors (also legacy `sum`; PIR `sum` is a reduction: ops_reduce)."""
    return [reduce(ctx.b.add, ctx.inputs("X", 0))]


# -- activations ------------------------------------------------------------------------------------
@converter("gelu")
def gelu(ctx: OpContext):
    """approximate: the tanh form."""
    return [ctx.b.gelu(ctx.input("X", 0), approximate=bool(ctx.attr("approximate", False)))]


@converter("hard_swish", "hardswish")
def hard_swish(ctx: OpContext):
    """x * clip(x + offset, 0, threshold) / scale; Paddle's defaults (3, 6, 6) are the table's hard_swish."""
    x = ctx.input("X", 0)
    threshold, scale, offset = (float(ctx.attr(n, d)) for n, d in (("threshold", 6.0), ("scale", 6.0), ("offset", 3.0)))
    if (threshold, scale, offset) == (6.0, 6.0, 3.0):  # the table's hard_swish: x * relu6(x + 3) / 6
        return [ctx.b.hard_swish(x)]
    shifted = ctx.b.clip(ctx.b.add(x, compose.scalar(ctx.b, offset, x)), min=0.0, max=threshold)
    return [ctx.b.scale(ctx.b.multiply(x, shifted), scale=1.0 / scale)]


@converter("hard_sigmoid", "hardsigmoid")
def hard_sigmoid(ctx: OpContext):
    """clip(slope * x + offset, 0, 1)."""
    return [ctx.b.hard_sigmoid(ctx.input("X", 0), slope=ctx.attr("slope", 0.2), offset=ctx.attr("offset", 0.5))]


@converter("leaky_relu")
def leaky_relu(ctx: OpContext):
    """Legacy alpha, PIR negative_slope."""
    return [ctx.b.leaky_relu(ctx.input("X", 0), alpha=float(attr_of(ctx, ("alpha", "negative_slope"), 0.02)))]


@converter("swish")
def swish(ctx: OpContext):
    """x * sigmoid(beta x) (beta: legacy Paddle 2; PIR's is 1, silu)."""
    x = ctx.input("X", 0)
    beta = float(ctx.attr("beta", 1.0))
    return [ctx.b.silu(x) if beta == 1.0 else ctx.b.multiply(x, ctx.b.sigmoid(ctx.b.scale(x, scale=beta)))]


@converter("mish")
def mish(ctx: OpContext):
    # the threshold (20) only switches softplus to its asymptote x, which it equals there in float32
    return [compose.mish(ctx.b, ctx.input("X", 0))]


@converter("elu")
def elu(ctx: OpContext):
    return [ctx.b.elu(ctx.input("X", 0), alpha=float(ctx.attr("alpha", 1.0)))]


@converter("selu")
def selu(ctx: OpContext):
    """scale * elu(x, alpha)."""
    alpha, scale = float(ctx.attr("alpha", 1.6732632423543772)), float(ctx.attr("scale", 1.0507009873554805))
    return [compose.selu(ctx.b, ctx.input("X", 0), alpha, scale)]


@converter("celu")
def celu(ctx: OpContext):
    """alpha * elu(x / alpha)."""
    return [compose.celu(ctx.b, ctx.input("X", 0), float(ctx.attr("alpha", 1.0)))]


@converter("softplus")
def softplus(ctx: OpContext):
    """log(1 + exp(beta x)) / beta, and x itself where beta x exceeds the threshold."""
    x = ctx.input("X", 0)
    beta, threshold = float(ctx.attr("beta", 1.0)), float(ctx.attr("threshold", 20.0))
    scaled = ctx.b.scale(x, scale=beta)
    smooth = ctx.b.scale(ctx.b.softplus(scaled), scale=1.0 / beta)
    return [ctx.b.select(ctx.b.greater_than(scaled, compose.scalar(ctx.b, threshold, x)), x, smooth)]


@converter("hardtanh", "brelu")
def hardtanh(ctx: OpContext):
    """clip(x, t_min, t_max)."""
    return [ctx.b.clip(ctx.input("X", 0), min=float(ctx.attr("t_min", -1.0)), max=float(ctx.attr("t_max", 1.0)))]


@converter("hardshrink", "hard_shrink")
def hard_shrink(ctx: OpContext):
    """x where |x| > threshold, else 0."""
    return [compose.shrink(ctx.b, ctx.input("X", 0), float(ctx.attr("threshold", 0.5)), 0.0)]


@converter("softshrink")
def soft_shrink(ctx: OpContext):
    """x - lambda above lambda, x + lambda below -lambda, else 0 (legacy attribute lambda, PIR threshold)."""
    lambd = float(attr_of(ctx, ("threshold", "lambda"), 0.5))
    return [compose.shrink(ctx.b, ctx.input("X", 0), lambd, lambd)]


@converter("thresholded_relu")
def thresholded_relu(ctx: OpContext):
    """x above the threshold, else value."""
    x = ctx.input("X", 0)
    return [compose.thresholded_relu(ctx.b, x, float(ctx.attr("threshold", 1.0)), float(ctx.attr("value", 0.0)))]


@converter("rrelu")
def rrelu(ctx: OpContext):
    """At inference the negative slope is the mean of [lower, upper]."""
    if not ctx.attr("is_test", True):
        raise PaddleImportError("training-mode rrelu (random slopes) is not supported; save the model in eval mode")
    slope = (float(ctx.attr("lower", 0.125)) + float(ctx.attr("upper", 1 / 3))) / 2
    return [ctx.b.leaky_relu(ctx.input("X", 0), alpha=slope)]


@converter("logit")
def logit(ctx: OpContext):
    """log(x / (1 - x)), x clipped to [eps, 1 - eps] where eps > 0."""
    x = ctx.input("X", 0)
    eps = float(ctx.attr("eps", 0.0))
    if eps > 0:
        x = ctx.b.clip(x, min=eps, max=1.0 - eps)
    return [ctx.b.log(ctx.b.divide(x, ctx.b.subtract(compose.scalar(ctx.b, 1, x), x)))]


@converter("round")
def round_(ctx: OpContext):
    """Halves round away from zero (std::round), at `decimals` decimal places."""
    x = ctx.input("X", 0)
    factor = 10.0 ** int(ctx.attr("decimals", 0))
    shifted = ctx.b.scale(x, scale=factor) if factor != 1.0 else x
    rounded = ctx.b.multiply(ctx.b.sign(shifted), ctx.b.floor(ctx.b.add(ctx.b.abs(shifted), compose.scalar(ctx.b, 0.5, x))))
    return [ctx.b.scale(rounded, scale=1.0 / factor) if factor != 1.0 else rounded]


@converter("prelu")
def prelu(ctx: OpContext):
    """mode all: one slope; channel: one per channel (axis 1, or the last for NHWC); element: one per element of a
    sample."""
    x, alpha = ctx.input("X", 0), ctx.input("Alpha", 1)
    mode, rank = ctx.attr("mode", "all"), len(x.shape)
    if mode == "all":
        slope = ctx.b.reshape(alpha, [])
    elif mode == "channel":
        channels_last = ctx.attr("data_format", "NCHW").endswith("C") and rank > 2
        slope = ctx.b.reshape(alpha, [-1] if channels_last else [-1] + [1] * (rank - 2))
    elif mode == "element":
        slope = ctx.b.reshape(alpha, list(x.shape[1:]))
    else:
        raise PaddleImportError(f"prelu mode {mode!r} is not supported (all, channel, element)")
    return [compose.prelu(ctx.b, x, slope)]


@converter("maxout")
def maxout(ctx: OpContext):
    """The max of each run of `groups` consecutive channels."""
    x = ctx.input("X", 0)
    axis, groups = int(ctx.attr("axis", 1)) % len(x.shape), int(ctx.attr("groups"))
    shape = list(x.shape[:axis]) + [x.shape[axis] // groups, groups] + list(x.shape[axis + 1:])
    return [ctx.b.reduce_max(ctx.b.reshape(x, shape), [axis + 1])]


@converter("softmax")
def softmax(ctx: OpContext):
    return [ctx.b.softmax(ctx.input("X", 0), axes=[ctx.attr("axis", -1)])]


@converter("log_softmax")
def log_softmax(ctx: OpContext):
    return [ctx.b.log_softmax(ctx.input("X", 0), axes=[ctx.attr("axis", -1)])]


# -- arithmetic with scalars --------------------------------------------------------------------------
@converter("scale")
def scale(ctx: OpContext):
    factor = ctx.scalar("scale", 1, "the scale", tensor_slot="ScaleTensor")
    return [ctx.b.scale(ctx.input("X", 0), scale=float(factor), bias=float(ctx.attr("bias", 0.0)),
                        bias_after_scale=bool(ctx.attr("bias_after_scale", True)))]


@converter("pow")
def pow_(ctx: OpContext):
    """x ** y for a scalar exponent (PIR attribute y; legacy factor or FactorTensor)."""
    x = ctx.input("X", 0)
    y = float(ctx.attr("y") if ctx.pir else ctx.scalar("factor", 1, "the exponent", tensor_slot="FactorTensor"))
    if y == 2.0:
        return [ctx.b.multiply(x, x)]
    if y == 1.0:
        return [ctx.b.identity(x)]
    if not x.dtype.startswith("float"):  # integer powers through float64 (exact below 2**53)
        wide = ctx.b.pow(ctx.b.cast(x, dtype="float64"), ctx.b.fill_constant((), y, "float64"))
        return [ctx.b.cast(ctx.b.round(wide), dtype=x.dtype)]
    return [ctx.b.pow(x, compose.scalar(ctx.b, y, x))]


@converter("clip")
def clip(ctx: OpContext):
    """Bounds: PIR operands 1 and 2; legacy Min/Max tensors or min/max attributes."""
    x = ctx.input("X", 0)
    bounds = [_bound(ctx, slot, pos) for slot, pos in (("Min", 1), ("Max", 2))]
    if all(isinstance(v, float) for v in bounds):
        return [ctx.b.clip(x, min=bounds[0], max=bounds[1])]
    lo, hi = (v if isinstance(v, Value) else compose.scalar(ctx.b, v, x) for v in bounds)
    return [ctx.b.min(ctx.b.max(x, ctx.b.cast(lo, x.dtype)), ctx.b.cast(hi, x.dtype))]


def _bound(ctx: OpContext, slot: str, pos: int) -> Value | float:
    """One clip bound: its value where constant (or an attribute), else the tensor."""
    tensor = ctx.optional_input(slot, pos)
    if tensor is None:
        return float(ctx.attr(slot.lower(), -math.inf if slot == "Min" else math.inf))
    data = ctx.b.constant_of(tensor)
    return float(data.reshape(-1)[0]) if data is not None else ctx.b.reshape(tensor, [])


@converter("where")
def where(ctx: OpContext):
    return [ctx.b.select(ctx.input("Condition", 0), ctx.input("X", 1), ctx.input("Y", 2))]


@converter("masked_fill")
def masked_fill(ctx: OpContext):
    x = ctx.input("x", 0)
    value = ctx.b.cast(ctx.input("value", 2), x.dtype)
    return [ctx.b.select(ctx.input("mask", 1), value, x)]


@converter("lerp")
def lerp(ctx: OpContext):
    x, y, w = ctx.input("X", 0), ctx.input("Y", 1), ctx.input("Weight", 2)
    return [ctx.b.add(x, ctx.b.multiply(w, ctx.b.subtract(y, x)))]


@converter("isclose", "allclose")
def isclose(ctx: OpContext):
    """|x - y| <= atol + rtol |y| (NaNs equal where equal_nan); allclose: everywhere."""
    x, y = ctx.input("Input", 0), ctx.input("Other", 1)
    rtol = float(ctx.scalar("rtol", 2, "rtol", tensor_slot="Rtol"))
    atol = float(ctx.scalar("atol", 3, "atol", tensor_slot="Atol"))
    bound = ctx.b.add(ctx.b.scale(ctx.b.abs(y), scale=rtol), compose.scalar(ctx.b, atol, y))
    close = ctx.b.logical_or(ctx.b.equal(x, y), ctx.b.less_equal(ctx.b.abs(ctx.b.subtract(x, y)), bound))
    if ctx.attr("equal_nan", False):
        close = ctx.b.logical_or(close, ctx.b.logical_and(ctx.b.is_nan(x), ctx.b.is_nan(y)))
    return [ctx.b.reduce_all(close, list(range(len(close.shape)))) if ctx.op.type == "allclose" else close]


@converter("equal_all")
def equal_all(ctx: OpContext):
    x, y = ctx.input("X", 0), ctx.input("Y", 1)
    if x.shape != y.shape:
        return [ctx.b.fill_constant((), False, "bool")]
    return [ctx.b.reduce_all(ctx.b.equal(x, y), list(range(len(x.shape))))]


@converter("cast")
def cast(ctx: OpContext):
    """Legacy out_dtype (a type code), PIR dtype (a name)."""
    attr = "dtype" if ctx.pir else "out_dtype"
    return [ctx.b.cast(ctx.input("X", 0), dtype=dtype_arg(ctx, attr, "cast target"))]


@converter("dropout")
def dropout(ctx: OpContext):
    # PIR: operands (x, seed_tensor, p) and attribute `mode`; legacy: attributes dropout_prob, dropout_implementation
    prob = ctx.scalar("dropout_prob", 2, "the dropout probability", default=0.5)
    mode = ctx.attr("mode" if ctx.pir else "dropout_implementation", "downgrade_in_infer")
    return [ctx.b.dropout(ctx.input("X", 0), dropout_prob=float(prob), dropout_implementation=mode,
                          is_test=bool(ctx.attr("is_test", False)))]


@converter("label_smooth")
def label_smooth(ctx: OpContext):
    """(1 - epsilon) x + epsilon / classes (or epsilon times the prior distribution)."""
    x = ctx.input("X", 0)
    eps = float(ctx.attr("epsilon", 0.0))
    prior = ctx.optional_input("PriorDist", 1)
    spread = ctx.b.scale(prior, scale=eps) if prior is not None else compose.scalar(ctx.b, eps / x.shape[-1], x)
    return [ctx.b.add(ctx.b.scale(x, scale=1.0 - eps), spread)]
