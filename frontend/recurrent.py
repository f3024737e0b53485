"""Recurrent layers (simple RNN, GRU, LSTM) unrolled over a static sequence length, for the ONNX and Paddle importers.

The input projections of every step are one matmul, each step one recurrent matmul and its gates. The importers
differ only in how they stack the gate blocks of their weights (`Direction.gates`). With per-sequence lengths, a
step past a sequence's end keeps its state and outputs zeros, so a reverse direction starts at each sequence's
last step, as both ONNX and Paddle define it.
"""
from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from cinn.core.builder import NetBuilder
from cinn.core.ir import Value

Activation = Callable[[Value], Value]
# one step: (x's projection at t, h, c) -> (h, c)
Step = Callable[[Value, Value, Value | None], tuple[Value, Value | None]]


class Cell(enum.Enum):
    """The recurrence of a layer."""

    RNN = "RNN"
    GRU = "GRU"
    LSTM = "LSTM"


class Gate(enum.Enum):
    """One gate's block of a cell's stacked weights."""

    INPUT = "input"  # LSTM
    OUTPUT = "output"  # LSTM
    FORGET = "forget"  # LSTM
    CELL = "cell"  # LSTM's candidate cell
    UPDATE = "update"  # GRU
    RESET = "reset"  # GRU
    HIDDEN = "hidden"  # GRU's candidate, the simple RNN's one block


@dataclass(frozen=True)
class Direction:
    """One direction of a layer: its weights, gate blocks stacked along their first dim in `gates` order."""

    cell: Cell
    gates: tuple[Gate, ...]
    w: Value  # [gates * hidden, input]
    r: Value  # [gates * hidden, hidden]
    wb: Value | None  # [gates * hidden]
    rb: Value | None
    acts: tuple[Activation, ...]  # RNN: (h,); GRU: (gates, candidate); LSTM: (gates, candidate, output)
    reverse: bool
    linear_before_reset: bool = False  # GRU: the reset gate scales the recurrent product, not h
    peep: Value | None = None  # LSTM: [3 * hidden] (input, output, forget)

    def __post_init__(self):
        if set(self.gates) != set(CELL_GATES[self.cell]) or len(self.gates) != len(CELL_GATES[self.cell]):
            raise ValueError(f"{self.cell.name} gates must be {[g.name for g in CELL_GATES[self.cell]]}, "
                             f"got {[g.name for g in self.gates]}")


# each cell's gates, in ONNX's order of their blocks
CELL_GATES = {
    Cell.RNN: (Gate.HIDDEN,),
    Cell.GRU: (Gate.UPDATE, Gate.RESET, Gate.HIDDEN),
    Cell.LSTM: (Gate.INPUT, Gate.OUTPUT, Gate.FORGET, Gate.CELL),
}


def step_mask(b: NetBuilder, lengths: Value | None, seq: int) -> Value | None:
    """[seq, batch, 1]: whether step t is within sequence b's length (None: every step is)."""
    if lengths is None:
        return None
    batch = lengths.shape[0]
    steps = b.create_constant(np.arange(seq).reshape(seq, 1), dtype=lengths.dtype)
    return b.expand_dims(b.less_than(steps, b.reshape(lengths, [1, batch])), [2])


def run(b: NetBuilder, x: Value, d: Direction, h: Value, c: Value | None, mask: Value | None
        ) -> tuple[Value, Value, Value | None]:
    """One direction over x [seq, batch, input] from state h (and c): every step's output [seq, batch, hidden] in
    time order, and the last state h and c."""
    seq, batch, size = x.shape
    projected = b.matmul(b.reshape(x, [seq * batch, size]), d.w, trans_y=True)
    if d.wb is not None:
        projected = b.add(projected, d.wb)
    projected = b.reshape(projected, [seq, batch, -1])
    step = _STEPS[d.cell](b, d, h.shape[-1])
    zero = b.fill_constant((), 0.0, h.dtype)  # a padded step's output
    ys: dict[int, Value] = {}
    for t in range(seq - 1, -1, -1) if d.reverse else range(seq):
        h_new, c_new = step(index(b, projected, t), h, c)
        if mask is None:
            h, c, y = h_new, c_new, h_new
        else:
            valid = index(b, mask, t)
            h, y = b.select(valid, h_new, h), b.select(valid, h_new, zero)
            c = None if c is None or c_new is None else b.select(valid, c_new, c)
        ys[t] = b.expand_dims(y, [0])
    return b.concat([ys[t] for t in range(seq)], axis=0), h, c


def stack(b: NetBuilder, values: Sequence[Value], axis: int) -> Value:
    """Values of one shape stacked along a new axis."""
    return b.concat([b.expand_dims(v, [axis]) for v in values], axis=axis)


def index(b: NetBuilder, v: Value, k: int) -> Value:
    """v[k] along the first axis."""
    return b.reshape(b.slice(v, axes=[0], starts=[k], ends=[k + 1]), list(v.shape[1:]))


def part(b: NetBuilder, v: Value, k: int, size: int) -> Value:
    """The k-th block of `size` along the last axis."""
    last = len(v.shape) - 1
    return b.slice(v, axes=[last], starts=[k * size], ends=[(k + 1) * size])


def _blocks(b: NetBuilder, d: Direction, v: Value, size: int) -> dict[Gate, Value]:
    """Each gate's block of v (stacked along its last axis in the direction's gate order)."""
    return {g: part(b, v, k, size) for k, g in enumerate(d.gates)}


def _recurrent(b: NetBuilder, h: Value, r: Value, rb: Value | None) -> Value:
    """h R^T + rb: every gate's recurrent term in one matmul."""
    out = b.matmul(h, r, trans_y=True)
    return out if rb is None else b.add(out, rb)


# Each cell's step for one direction; what a step reads of the weights is sliced once, here, not at every step.
def _rnn_step(b: NetBuilder, d: Direction, hidden: int) -> Step:
    def step(xt: Value, h: Value, c: Value | None) -> tuple[Value, Value | None]:
        return d.acts[0](b.add(xt, _recurrent(b, h, d.r, d.rb))), c

    return step


def _gru_step(b: NetBuilder, d: Direction, hidden: int) -> Step:
    """h' = (1 - z) * g(x_h + recurrent_h(r * h)), or g(x_h + r * recurrent_h(h)) when linear before reset, + z * h."""
    f, g = d.acts
    k = d.gates.index(Gate.HIDDEN)
    r_h = b.slice(d.r, axes=[0], starts=[k * hidden], ends=[(k + 1) * hidden])
    rb_h = None if d.rb is None else part(b, d.rb, k, hidden)
    one = b.fill_constant((), 1.0, d.r.dtype)

    def step(xt: Value, h: Value, c: Value | None) -> tuple[Value, Value | None]:
        x, rec = _blocks(b, d, xt, hidden), _blocks(b, d, _recurrent(b, h, d.r, d.rb), hidden)
        z = f(b.add(x[Gate.UPDATE], rec[Gate.UPDATE]))
        reset = f(b.add(x[Gate.RESET], rec[Gate.RESET]))
        if d.linear_before_reset:
            candidate = g(b.add(x[Gate.HIDDEN], b.multiply(reset, rec[Gate.HIDDEN])))
        else:  # the hidden block of the product over all gates goes unused
            candidate = g(b.add(x[Gate.HIDDEN], _recurrent(b, b.multiply(reset, h), r_h, rb_h)))
        return b.add(b.multiply(b.subtract(one, z), candidate), b.multiply(z, h)), c

    return step


def _lstm_step(b: NetBuilder, d: Direction, hidden: int) -> Step:
    """The LSTM step, with optional peepholes P = [input, output, forget]."""
    f, g, act_h = d.acts
    peep = {gate: None if d.peep is None else part(b, d.peep, k, hidden)
            for k, gate in enumerate((Gate.INPUT, Gate.OUTPUT, Gate.FORGET))}

    def step(xt: Value, h: Value, c: Value | None) -> tuple[Value, Value | None]:
        assert c is not None
        gates = _blocks(b, d, b.add(xt, _recurrent(b, h, d.r, d.rb)), hidden)

        def peephole(gate: Gate, cell: Value) -> Value:
            p = peep[gate]
            return gates[gate] if p is None else b.add(gates[gate], b.multiply(p, cell))

        i = f(peephole(Gate.INPUT, c))
        forget = f(peephole(Gate.FORGET, c))
        c_new = b.add(b.multiply(forget, c), b.multiply(i, g(gates[Gate.CELL])))
        o = f(peephole(Gate.OUTPUT, c_new))
        return b.multiply(o, act_h(c_new)), c_new

    return step


_STEPS: dict[Cell, Callable[[NetBuilder, Direction, int], Step]] = {
    Cell.RNN: _rnn_step, Cell.GRU: _gru_step, Cell.LSTM: _lstm_step,
}
