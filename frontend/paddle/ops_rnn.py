"""Converter of Paddle's rnn op (paddle.nn.SimpleRNN, GRU and LSTM), unrolled by `frontend.recurrent`.

The op reads time-major input [seq, batch, input] (the layers transpose around it), initial states [layers * dirs,
batch, hidden] (h, and c for LSTM) and WeightList: weight_ih and weight_hh of every layer and direction, then their
bias_ih and bias_hh. Layer l > 0 reads the directions' outputs of layer l - 1 side by side. Paddle stacks the gate
blocks as LSTM (input, forget, cell, output) and GRU (reset, update, candidate), and applies a GRU's reset gate to
the recurrent product, after its bias.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

from cinn.core.ir import Value
from frontend.paddle.graph import PaddleImportError
from frontend.paddle.registry import OpContext, Unavailable, converter
from frontend.recurrent import Activation, Cell, Direction, Gate, index, run, stack, step_mask


class Mode(enum.Enum):
    """The rnn op's `mode` attribute."""

    LSTM = "LSTM"
    GRU = "GRU"
    RNN_TANH = "RNN_TANH"
    RNN_RELU = "RNN_RELU"

    @property
    def cell(self) -> Cell:
        return {Mode.LSTM: Cell.LSTM, Mode.GRU: Cell.GRU}.get(self, Cell.RNN)


GATES = {
    Cell.RNN: (Gate.HIDDEN,),
    Cell.GRU: (Gate.RESET, Gate.UPDATE, Gate.HIDDEN),
    Cell.LSTM: (Gate.INPUT, Gate.FORGET, Gate.CELL, Gate.OUTPUT),
}


@dataclass(frozen=True)
class _Layout:
    """The op's layers, directions and sizes, and where each (layer, direction)'s weights lie in WeightList."""

    mode: Mode
    layers: int
    dirs: int
    hidden: int
    biased: bool  # WeightList ends with the biases

    @property
    def count(self) -> int:
        """The (layer, direction) pairs, each with its slot in the initial and final states."""
        return self.layers * self.dirs


@converter("rnn", outputs=("Out", "State"))
def rnn(ctx: OpContext):
    x = ctx.input("Input", 0)
    seq, batch, size = x.shape
    weights = ctx.inputs("WeightList", 2)
    layout = _layout(ctx, len(weights))
    if size != int(ctx.attr("input_size", size)):
        raise PaddleImportError(f"input_size {ctx.attr('input_size')} does not fit the input's {size} features")
    h0, c0 = _initial_states(ctx, layout, batch, x.dtype)
    lengths = ctx.optional_input("SequenceLength", 3)
    if lengths is not None and lengths.shape != (batch,):
        raise PaddleImportError(f"SequenceLength has shape {list(lengths.shape)}, not [{batch}] (one per sequence)")
    mask = step_mask(ctx.b, lengths, seq)
    final_h, final_c = [], []
    for layer in range(layout.layers):
        ys = []
        for d in range(layout.dirs):
            k = layer * layout.dirs + d
            y, h, c = run(ctx.b, x, _direction(ctx, layout, weights, k, reverse=d == 1), index(ctx.b, h0, k),
                          None if c0 is None else index(ctx.b, c0, k), mask)
            ys.append(y)
            final_h.append(h)
            final_c.extend([] if c is None else [c])
        x = ys[0] if len(ys) == 1 else ctx.b.concat(ys, axis=2)
    states = [stack(ctx.b, final_h, axis=0)] + ([stack(ctx.b, final_c, axis=0)] if c0 is not None else [])
    if ctx.pir:  # results: out, dropout_state_out, state (a vector), reserve
        return [x, Unavailable(ctx.op, "DropoutState"), tuple(states)]
    return [x, *states]


def _layout(ctx: OpContext, weights: int) -> _Layout:
    name = ctx.attr("mode")
    if name not in Mode.__members__:
        raise PaddleImportError(f"mode {name!r} is not supported (supported: {', '.join(Mode.__members__)})")
    if not ctx.attr("is_test", False) and float(ctx.attr("dropout_prob", 0.0)) > 0:
        raise PaddleImportError("training-mode rnn with dropout (is_test=False) is not supported; save the model in "
                                "eval mode")
    layers, dirs = int(ctx.attr("num_layers", 1)), 2 if ctx.attr("is_bidirec", False) else 1
    layout = _Layout(Mode[name], layers, dirs, int(ctx.attr("hidden_size")), weights == 4 * layers * dirs)
    if weights not in (2 * layout.count, 4 * layout.count):
        raise PaddleImportError(f"WeightList has {weights} tensors, but {layers} layers in {dirs} direction(s) need "
                                f"{4 * layout.count} (or {2 * layout.count} without biases)")
    return layout


def _initial_states(ctx: OpContext, layout: _Layout, batch: int, dtype: str) -> tuple[Value, Value | None]:
    """PreState's h (and c for LSTM), [layers * dirs, batch, hidden]; zeros when the op has none."""
    states = ctx.inputs("PreState", 1)
    wanted = 2 if layout.mode == Mode.LSTM else 1
    if not states:
        states = [ctx.b.fill_constant((layout.count, batch, layout.hidden), 0.0, dtype)] * wanted
    shape = (layout.count, batch, layout.hidden)
    if len(states) != wanted or any(s.shape != shape for s in states):
        raise PaddleImportError(f"PreState must be {wanted} tensors of shape {list(shape)} for {layout.mode.value}, "
                                f"got {[list(s.shape) for s in states]}")
    return states[0], states[1] if wanted == 2 else None


def _direction(ctx: OpContext, layout: _Layout, weights: list[Value], k: int, reverse: bool) -> Direction:
    """The k-th (layer, direction) pair's weights: WeightList[2k, 2k + 1], and its biases after all the weights."""
    cell = layout.mode.cell
    w, r = weights[2 * k], weights[2 * k + 1]
    wb, rb = (weights[2 * (layout.count + k)], weights[2 * (layout.count + k) + 1]) if layout.biased else (None, None)
    rows = len(GATES[cell]) * layout.hidden
    if w.shape[0] != rows or r.shape != (rows, layout.hidden):
        raise PaddleImportError(f"weights {list(w.shape)} and {list(r.shape)} of layer {k // layout.dirs} do not fit "
                                f"{layout.mode.value} with hidden size {layout.hidden} ({rows} rows)")
    b = ctx.b
    acts: dict[Mode, tuple[Activation, ...]] = {
        Mode.LSTM: (b.sigmoid, b.tanh, b.tanh), Mode.GRU: (b.sigmoid, b.tanh), Mode.RNN_TANH: (b.tanh,),
        Mode.RNN_RELU: (b.relu,),
    }
    return Direction(cell, GATES[cell], w, r, wb, rb, acts[layout.mode], reverse, linear_before_reset=True)
