"""Converters of ONNX's recurrent layers (RNN, GRU, LSTM), unrolled over their static sequence length: the input
projections of every step are one matmul, each step one recurrent matmul and its gates."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from cinn.core.ir import Value
from frontend.onnx.registry import NodeContext, OnnxImportError, converter

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
DEFAULT_ACTIVATIONS = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}
Activation = Callable[[Value], Value]


@dataclass(frozen=True)
class _Layer:
    """One direction's weights and settings."""

    w: Value  # [gates * hidden, input]
    r: Value  # [gates * hidden, hidden]
    wb: Value | None  # [gates * hidden]
    rb: Value | None
    peep: Value | None  # LSTM: [3 * hidden] (input, output, forget)
    acts: list[Activation]
    reverse: bool


@converter("RNN", "GRU", "LSTM")
def recurrent(ctx: NodeContext):
    op = ctx.node.op_type
    layout = ctx.attr("layout", 0)
    x = ctx.input(0) if layout == 0 else ctx.b.transpose(ctx.input(0), [1, 0, 2])  # [seq, batch, input]
    seq, batch, _ = x.shape
    hidden, dirs = ctx.attr("hidden_size", 0), ctx.input(1).shape[0]
    if op == "LSTM" and ctx.attr("input_forget", 0):
        raise OnnxImportError("input_forget=1 is not supported")
    lengths = ctx.input(4)
    if lengths is not None and not (ctx.require_const(4, "sequence_lens") == seq).all():
        raise OnnxImportError(f"sequence_lens must all equal the sequence length {seq} (sequences are not masked)")
    layers = [_layer(ctx, op, d, dirs) for d in range(dirs)]
    h0, c0 = (_initial(ctx, i, dirs, batch, hidden, x.dtype, layout) for i in (5, 6))
    outs = [_run(ctx, op, x, layer, _index(ctx, h0, d), _index(ctx, c0, d)) for d, layer in enumerate(layers)]
    ys = ctx.b.concat([ctx.b.expand_dims(y, [1]) for y, _, _ in outs], axis=1)  # [seq, dirs, batch, hidden]
    y_h = ctx.b.concat([ctx.b.expand_dims(h, [0]) for _, h, _ in outs], axis=0)  # [dirs, batch, hidden]
    results = [ys, y_h]
    if op == "LSTM":
        results.append(ctx.b.concat([ctx.b.expand_dims(c, [0]) for _, _, c in outs], axis=0))
    if layout == 1:
        results = [ctx.b.transpose(ys, [2, 0, 1, 3]), *(ctx.b.transpose(r, [1, 0, 2]) for r in results[1:])]
    return results


def _layer(ctx: NodeContext, op: str, d: int, dirs: int) -> _Layer:
    gates, hidden = GATES[op], ctx.attr("hidden_size", 0)
    direction = ctx.attr("direction", "forward")
    if direction not in ("forward", "reverse", "bidirectional") or (dirs == 2) != (direction == "bidirectional"):
        raise OnnxImportError(f"direction {direction!r} does not fit {dirs} weight directions")
    w, r = (_index(ctx, ctx.input(i), d) for i in (1, 2))
    bias = None if ctx.input(3) is None else _index(ctx, ctx.input(3), d)
    wb, rb = (None, None) if bias is None else (_part(ctx, bias, 0, gates * hidden), _part(ctx, bias, 1, gates * hidden))
    names = ctx.attr("activations", None) or DEFAULT_ACTIVATIONS[op] * dirs
    count = len(DEFAULT_ACTIVATIONS[op])
    acts = [_activation(ctx, n) for n in names[d * count:(d + 1) * count]]
    peep = _index(ctx, ctx.input(7), d) if op == "LSTM" and ctx.input(7) is not None else None
    return _Layer(w, r, wb, rb, peep, acts, direction == "reverse" or d == 1)


def _activation(ctx: NodeContext, name: str) -> Activation:
    table: dict[str, Activation] = {"Sigmoid": ctx.b.sigmoid, "Tanh": ctx.b.tanh, "Relu": ctx.b.relu}
    if name not in table:
        raise OnnxImportError(f"activation {name!r} is not supported (supported: {', '.join(table)})")
    clip = ctx.attr("clip", None)
    if clip is None:
        return table[name]
    return lambda v: table[name](ctx.b.clip(v, -float(clip), float(clip)))


def _index(ctx: NodeContext, v: Value, d: int) -> Value:
    """v[d] of a per-direction tensor."""
    return ctx.b.reshape(ctx.b.slice(v, axes=[0], starts=[d], ends=[d + 1]), list(v.shape[1:]))


def _part(ctx: NodeContext, v: Value, k: int, size: int) -> Value:
    """The k-th block of `size` along the last axis."""
    last = len(v.shape) - 1
    return ctx.b.slice(v, axes=[last], starts=[k * size], ends=[(k + 1) * size])


def _initial(ctx: NodeContext, i: int, dirs: int, batch: int, hidden: int, dtype: str, layout: int) -> Value:
    """initial_h or initial_c as [dirs, batch, hidden] (zeros when absent)."""
    v = ctx.input(i)
    if v is None:
        return ctx.b.create_constant(np.zeros((dirs, batch, hidden)), dtype=dtype)
    return ctx.b.transpose(v, [1, 0, 2]) if layout == 1 else v


def _run(ctx: NodeContext, op: str, x: Value, layer: _Layer, h: Value, c: Value | None) -> tuple[Value, Value, Value | None]:
    """One direction over the sequence: every step's output [seq, batch, hidden] (in time order), the last h and c."""
    seq, batch, size = x.shape
    projected = ctx.b.matmul(ctx.b.reshape(x, [seq * batch, size]), layer.w, trans_y=True)
    if layer.wb is not None:
        projected = ctx.b.add(projected, layer.wb)
    projected = ctx.b.reshape(projected, [seq, batch, -1])
    steps = range(seq - 1, -1, -1) if layer.reverse else range(seq)
    ys: dict[int, Value] = {}
    for t in steps:
        xt = ctx.b.reshape(ctx.b.slice(projected, axes=[0], starts=[t], ends=[t + 1]), [batch, -1])
        h, c = _STEP[op](ctx, layer, xt, h, c)
        ys[t] = ctx.b.expand_dims(h, [0])
    return ctx.b.concat([ys[t] for t in range(seq)], axis=0), h, c


def _recurrent(ctx: NodeContext, layer: _Layer, h: Value, r: Value, rb: Value | None) -> Value:
    out = ctx.b.matmul(h, r, trans_y=True)
    return out if rb is None else ctx.b.add(out, rb)


def _rnn_step(ctx: NodeContext, layer: _Layer, xt: Value, h: Value, c: Value | None) -> tuple[Value, Value | None]:
    return layer.acts[0](ctx.b.add(xt, _recurrent(ctx, layer, h, layer.r, layer.rb))), c


def _gru_step(ctx: NodeContext, layer: _Layer, xt: Value, h: Value, c: Value | None) -> tuple[Value, Value | None]:
    """Gates z, r, h (ONNX's order): h' = (1 - z) * g(x_h + recurrent(r * h or r * (h R_h))) + z * h."""
    f, g = layer.acts
    hidden = h.shape[-1]
    xz, xr, xh = (_part(ctx, xt, k, hidden) for k in range(3))
    rz, rr, rh = (_part(ctx, ctx.b.transpose(layer.r, [1, 0]), k, hidden) for k in range(3))
    bz, br, bh = (None, None, None) if layer.rb is None else (_part(ctx, layer.rb, k, hidden) for k in range(3))

    def rec(v: Value, weight: Value, bias: Value | None) -> Value:
        out = ctx.b.matmul(v, weight)
        return out if bias is None else ctx.b.add(out, bias)

    z = f(ctx.b.add(xz, rec(h, rz, bz)))
    r = f(ctx.b.add(xr, rec(h, rr, br)))
    if ctx.attr("linear_before_reset", 0):
        candidate = g(ctx.b.add(xh, ctx.b.multiply(r, rec(h, rh, bh))))
    else:
        candidate = g(ctx.b.add(xh, rec(ctx.b.multiply(r, h), rh, bh)))
    one = ctx.b.fill_constant((), 1.0, h.dtype)
    return ctx.b.add(ctx.b.multiply(ctx.b.subtract(one, z), candidate), ctx.b.multiply(z, h)), c


def _lstm_step(ctx: NodeContext, layer: _Layer, xt: Value, h: Value, c: Value | None) -> tuple[Value, Value | None]:
    """Gates i, o, f, c (ONNX's order), with optional peepholes P = [i, o, f]."""
    assert c is not None
    f, g, act_h = layer.acts
    hidden = h.shape[-1]
    gates = ctx.b.add(xt, _recurrent(ctx, layer, h, layer.r, layer.rb))
    gi, go, gf, gc = (_part(ctx, gates, k, hidden) for k in range(4))
    pi, po, pf = (None, None, None) if layer.peep is None else (_part(ctx, layer.peep, k, hidden) for k in range(3))

    def peephole(gate: Value, p: Value | None, cell: Value) -> Value:
        return gate if p is None else ctx.b.add(gate, ctx.b.multiply(p, cell))

    i = f(peephole(gi, pi, c))
    forget = f(peephole(gf, pf, c))
    c_new = ctx.b.add(ctx.b.multiply(forget, c), ctx.b.multiply(i, g(gc)))
    o = f(peephole(go, po, c_new))
    return ctx.b.multiply(o, act_h(c_new)), c_new


_STEP = {"RNN": _rnn_step, "GRU": _gru_step, "LSTM": _lstm_step}
