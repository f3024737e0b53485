"""Converters of ONNX elementwise ops: activations, arithmetic, comparisons, logic, shifts, Cast, BitCast, Where."""
from __future__ import annotations

from functools import reduce

from cinn.core.ir import Value
from frontend import compose
from frontend.onnx.registry import NodeContext, OnnxImportError, converter, onnx_dtype

# ONNX op -> cinn op, for ops without attributes taking their inputs as they are
_UNARY = {
    "Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Exp": "exp", "Log": "log", "Sqrt": "sqrt",
    "Abs": "abs", "Neg": "negative", "Erf": "erf", "Floor": "floor", "Ceil": "ceil", "Round": "round",
    "Sign": "sign", "Reciprocal": "reciprocal", "Softplus": "softplus", "Sin": "sin", "Cos": "cos", "Tan": "tan",
    "Asin": "asin", "Acos": "acos", "Atan": "atan", "Sinh": "sinh", "Cosh": "cosh", "Asinh": "asinh",
    "Acosh": "acosh", "Atanh": "atanh",
    "Not": "logical_not", "BitwiseNot": "bitwise_not", "IsNaN": "is_nan", "HardSwish": "hard_swish",
    "Identity": "identity",
}
_BINARY = {
    "Add": "add", "Sub": "subtract", "Mul": "multiply", "Equal": "equal", "Less": "less_than",
    "LessOrEqual": "less_equal", "Greater": "greater_than", "GreaterOrEqual": "greater_equal",
    "And": "logical_and", "Or": "logical_or", "Xor": "logical_xor", "BitwiseAnd": "bitwise_and",
    "BitwiseOr": "bitwise_or", "BitwiseXor": "bitwise_xor",
}
# variadic ONNX ops folded pairwise with a binary cinn op
_VARIADIC = {"Sum": "add", "Max": "max", "Min": "min"}


def _apply(ctx: NodeContext, op: str, *inputs: Value, **attrs) -> Value:
    """One cinn op through the node's builder (a method of the op table)."""
    return getattr(ctx.b, op)(*inputs, **attrs)


@converter(*_UNARY)
def unary(ctx: NodeContext):
    return [_apply(ctx, _UNARY[ctx.node.op_type], ctx.input(0))]


@converter(*_BINARY)
def binary(ctx: NodeContext):
    return [_apply(ctx, _BINARY[ctx.node.op_type], ctx.input(0), ctx.input(1))]


@converter(*_VARIADIC)
def variadic(ctx: NodeContext):
    op = _VARIADIC[ctx.node.op_type]
    return [reduce(lambda x, y: _apply(ctx, op, x, y), ctx.inputs)]


@converter("Mean")
def mean(ctx: NodeContext):
    total = reduce(ctx.b.add, ctx.inputs)
    return [ctx.b.divide(total, ctx.b.fill_constant((), len(ctx.inputs), total.dtype))]


def scalar(ctx: NodeContext, value: float, like: Value) -> Value:
    """A 0-d constant of `like`'s dtype."""
    return compose.scalar(ctx.b, value, like)


@converter("Div")
def div(ctx: NodeContext):
    return [compose.divide(ctx.b, *ctx.inputs)]


@converter("Mod")
def mod(ctx: NodeContext):
    x, y = ctx.inputs
    if not ctx.attr("fmod", 0):
        return [ctx.b.mod(x, y)]
    # C fmod: the result takes the dividend's sign
    return [ctx.b.multiply(ctx.b.sign(x), ctx.b.mod(ctx.b.abs(x), ctx.b.abs(y)))]


@converter("Pow")
def pow_(ctx: NodeContext):
    x, y = ctx.inputs
    if y.dtype != x.dtype and x.dtype.startswith("float"):  # ONNX allows an exponent of another type
        y = ctx.b.cast(y, dtype=x.dtype)
    exponent = ctx.const(1)
    if exponent is not None and exponent.size == 1 and float(exponent.reshape(())) == 2.0:
        return [ctx.b.multiply(x, x)]  # the common x**2 (variance) without a pow call
    if x.dtype.startswith("float"):
        return [ctx.b.pow(x, y)]
    # integer powers through float64 (exact for results below 2**53)
    wide = ctx.b.pow(ctx.b.cast(x, dtype="float64"), ctx.b.cast(y, dtype="float64"))
    return [ctx.b.cast(ctx.b.round(wide), dtype=x.dtype)]


@converter("LeakyRelu")
def leaky_relu(ctx: NodeContext):
    return [ctx.b.leaky_relu(ctx.input(0), alpha=ctx.attr("alpha", 0.01))]


@converter("Elu")
def elu(ctx: NodeContext):
    return [ctx.b.elu(ctx.input(0), alpha=ctx.attr("alpha", 1.0))]


@converter("Selu")
def selu(ctx: NodeContext):
    alpha = ctx.attr("alpha", 1.67326319217681884765625)
    gamma = ctx.attr("gamma", 1.05070102214813232421875)
    return [compose.selu(ctx.b, ctx.input(0), alpha, gamma)]


@converter("Celu")
def celu(ctx: NodeContext):
    return [compose.celu(ctx.b, ctx.input(0), ctx.attr("alpha", 1.0))]


@converter("ThresholdedRelu")
def thresholded_relu(ctx: NodeContext):
    return [compose.thresholded_relu(ctx.b, ctx.input(0), ctx.attr("alpha", 1.0))]


@converter("HardSigmoid")
def hard_sigmoid(ctx: NodeContext):
    return [ctx.b.hard_sigmoid(ctx.input(0), slope=ctx.attr("alpha", 0.2), offset=ctx.attr("beta", 0.5))]


@converter("Gelu")
def gelu(ctx: NodeContext):
    approximate = ctx.attr("approximate", "none")
    if approximate not in ("none", "tanh"):
        raise OnnxImportError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
    return [ctx.b.gelu(ctx.input(0), approximate=approximate == "tanh")]


@converter("Mish")
def mish(ctx: NodeContext):
    return [compose.mish(ctx.b, ctx.input(0))]


@converter("Softsign")
def softsign(ctx: NodeContext):
    return [compose.softsign(ctx.b, ctx.input(0))]


@converter("PRelu")
def prelu(ctx: NodeContext):
    return [compose.prelu(ctx.b, *ctx.inputs)]


@converter("IsInf")
def is_inf(ctx: NodeContext):
    x = ctx.input(0)
    positive, negative = ctx.attr("detect_positive", 1), ctx.attr("detect_negative", 1)
    inf = ctx.b.is_inf(x)
    if positive and negative:
        return [inf]
    if not (positive or negative):
        return [ctx.b.fill_constant(x.shape, False, "bool")]
    sign = ctx.b.greater_than(x, scalar(ctx, 0, x)) if positive else ctx.b.less_than(x, scalar(ctx, 0, x))
    return [ctx.b.logical_and(inf, sign)]


@converter("Clip")
def clip(ctx: NodeContext):
    x = ctx.input(0)
    if ctx.opset < 11:
        lo, hi = ctx.attr("min", None), ctx.attr("max", None)
        bounds = [None if v is None else scalar(ctx, v, x) for v in (lo, hi)]
    else:
        bounds = [ctx.input(1), ctx.input(2)]
    lo, hi = bounds
    if lo is not None:
        x = ctx.b.max(x, lo)
    if hi is not None:
        x = ctx.b.min(x, hi)
    return [x if x is not ctx.input(0) else ctx.b.identity(x)]


@converter("Where")
def where(ctx: NodeContext):
    return [ctx.b.select(*ctx.inputs)]


@converter("Cast")
def cast(ctx: NodeContext):
    return [ctx.b.cast(ctx.input(0), dtype=onnx_dtype(ctx.attr("to", None), "Cast 'to'"))]


@converter("BitCast")
def bit_cast(ctx: NodeContext):
    return [ctx.b.bitcast(ctx.input(0), dtype=onnx_dtype(ctx.attr("to", None), "BitCast 'to'"))]


@converter("BitShift")
def bit_shift(ctx: NodeContext):
    direction = ctx.attr("direction", "")
    if direction not in ("LEFT", "RIGHT"):
        raise OnnxImportError(f"BitShift: direction must be LEFT or RIGHT, got {direction!r}")
    return [_apply(ctx, "left_shift" if direction == "LEFT" else "right_shift", ctx.input(0), ctx.input(1))]


@converter("CastLike")
def cast_like(ctx: NodeContext):
    return [ctx.b.cast(ctx.input(0), dtype=ctx.input(1).dtype)]


@converter("Dropout")
def dropout(ctx: NodeContext):
    if ctx.input(2) is not None and (ctx.const(2) is None or bool(ctx.const(2))):
        raise OnnxImportError("training_mode must be a constant False (inference only)")
    x = ctx.input(0)
    # inference: y = x and the mask is all ones
    return [ctx.b.identity(x), ctx.b.fill_constant(x.shape, True, "bool")]


@converter("Shrink")
def shrink(ctx: NodeContext):
    return [compose.shrink(ctx.b, ctx.input(0), float(ctx.attr("lambd", 0.5)), float(ctx.attr("bias", 0.0)))]
