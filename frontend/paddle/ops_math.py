"""Converters of Paddle elementwise ops: activations, arithmetic (legacy `axis` broadcast), scale, cast, dropout."""
from __future__ import annotations

from cinn.core.ir import Value
from frontend.paddle.graph import PaddleImportError
from frontend.paddle.registry import OpContext, converter, dtype_arg

# Paddle op (legacy and PIR names) -> cinn op, for ops taking one input X and no attributes used here
_UNARY = {
    "relu": "relu", "sigmoid": "sigmoid", "tanh": "tanh", "exp": "exp", "log": "log", "sqrt": "sqrt",
    "rsqrt": "rsqrt", "abs": "abs", "floor": "floor", "ceil": "ceil", "erf": "erf", "sin": "sin", "cos": "cos",
    "silu": "silu", "reciprocal": "reciprocal", "sign": "sign", "logical_not": "logical_not",
    "assign": "identity", "isnan": "is_nan", "isinf": "is_inf",
}
# legacy elementwise_* ops (with `axis`) and their PIR names (numpy broadcasting) -> cinn op
_BINARY = {
    "elementwise_add": "add", "add": "add", "elementwise_sub": "subtract", "subtract": "subtract",
    "elementwise_mul": "multiply", "multiply": "multiply", "elementwise_div": "divide", "divide": "divide",
    "elementwise_max": "max", "maximum": "max", "elementwise_min": "min", "minimum": "min",
    "elementwise_pow": "pow", "elementwise_floordiv": "floor_divide", "floor_divide": "floor_divide",
    "elementwise_mod": "mod", "remainder": "mod",
    "equal": "equal", "not_equal": "not_equal", "less_than": "less_than", "less_equal": "less_equal",
    "greater_than": "greater_than", "greater_equal": "greater_equal",
    "logical_and": "logical_and", "logical_or": "logical_or", "logical_xor": "logical_xor",
}


def _apply(ctx: OpContext, op: str, *inputs: Value, **attrs) -> Value:
    """One cinn op through the op's builder (a method of the op table)."""
    return getattr(ctx.b, op)(*inputs, **attrs)


@converter(*_UNARY)
def unary(ctx: OpContext):
    return [_apply(ctx, _UNARY[ctx.op.type], ctx.input("X", 0))]


@converter(*_BINARY)
def binary(ctx: OpContext):
    x, y = _legacy_broadcast(ctx, ctx.input("X", 0), ctx.input("Y", 1))
    return [_apply(ctx, _BINARY[ctx.op.type], x, y)]


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


@converter("gelu")
def gelu(ctx: OpContext):
    return [ctx.b.gelu(ctx.input("X", 0), approximate=bool(ctx.attr("approximate", False)))]


@converter("hard_swish", "hardswish")
def hard_swish(ctx: OpContext):
    # the table's hard_swish is x * relu6(x + 3) / 6, Paddle's defaults (legacy ops may carry others)
    given = (ctx.attr("threshold", 6.0), ctx.attr("scale", 6.0), ctx.attr("offset", 3.0))
    if given != (6.0, 6.0, 3.0):
        raise PaddleImportError(f"hard_swish with threshold/scale/offset {given} is not supported (only 6, 6, 3)")
    return [ctx.b.hard_swish(ctx.input("X", 0))]


@converter("hard_sigmoid", "hardsigmoid")
def hard_sigmoid(ctx: OpContext):
    return [ctx.b.hard_sigmoid(ctx.input("X", 0), slope=ctx.attr("slope", 0.2), offset=ctx.attr("offset", 0.5))]


@converter("leaky_relu")
def leaky_relu(ctx: OpContext):
    return [ctx.b.leaky_relu(ctx.input("X", 0), alpha=ctx.attr("alpha", 0.02))]


@converter("softmax")
def softmax(ctx: OpContext):
    return [ctx.b.softmax(ctx.input("X", 0), axes=[ctx.attr("axis", -1)])]


@converter("log_softmax")
def log_softmax(ctx: OpContext):
    return [ctx.b.log_softmax(ctx.input("X", 0), axes=[ctx.attr("axis", -1)])]


@converter("scale")
def scale(ctx: OpContext):
    factor = ctx.scalar("scale", 1, "the scale", tensor_slot="ScaleTensor")
    return [ctx.b.scale(ctx.input("X", 0), scale=float(factor), bias=float(ctx.attr("bias", 0.0)),
                        bias_after_scale=bool(ctx.attr("bias_after_scale", True)))]


@converter("cast")
def cast(ctx: OpContext):
    attr = "dtype" if ctx.pir else "out_dtype"
    return [ctx.b.cast(ctx.input("X", 0), dtype=dtype_arg(ctx, attr, "cast target"))]


@converter("dropout")
def dropout(ctx: OpContext):
    # PIR: operands (x, seed_tensor, p) and attribute `mode`; legacy: attributes dropout_prob, dropout_implementation
    prob = ctx.scalar("dropout_prob", 2, "the dropout probability", default=0.5)
    mode = ctx.attr("mode" if ctx.pir else "dropout_implementation", "downgrade_in_infer")
    return [ctx.b.dropout(ctx.input("X", 0), dropout_prob=float(prob), dropout_implementation=mode,
                          is_test=bool(ctx.attr("is_test", False)))]
