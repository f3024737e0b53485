"""Converters of ONNX's recurrent layers (RNN, GRU, LSTM), unrolled by `frontend.recurrent`."""
from __future__ import annotations

from cinn.core.ir import Value
from frontend.onnx.registry import NodeContext, OnnxImportError, converter
from frontend.recurrent import CELL_GATES, Activation, Cell, Direction, index, part, run, stack, step_mask

DEFAULT_ACTIVATIONS = {Cell.RNN: ["Tanh"], Cell.GRU: ["Sigmoid", "Tanh"], Cell.LSTM: ["Sigmoid", "Tanh", "Tanh"]}


@converter("RNN", "GRU", "LSTM")
def recurrent(ctx: NodeContext):
    cell = Cell(ctx.node.op_type)
    layout = ctx.attr("layout", 0)
    x = ctx.input(0) if layout == 0 else ctx.b.transpose(ctx.input(0), [1, 0, 2])  # [seq, batch, input]
    seq, batch, _ = x.shape
    hidden, dirs = ctx.attr("hidden_size", 0), ctx.input(1).shape[0]
    if cell == Cell.LSTM and ctx.attr("input_forget", 0):
        raise OnnxImportError("input_forget=1 is not supported")
    lengths, known = ctx.input(4), ctx.const(4)
    if known is not None and (known == seq).all():
        lengths = None  # every sequence is whole: no masking
    mask = step_mask(ctx.b, lengths, seq)
    directions = [_direction(ctx, cell, d, dirs) for d in range(dirs)]
    h0, c0 = (_initial(ctx, i, dirs, batch, hidden, x.dtype, layout) for i in (5, 6))
    outs = [run(ctx.b, x, direction, index(ctx.b, h0, d), index(ctx.b, c0, d), mask)
            for d, direction in enumerate(directions)]
    ys = stack(ctx.b, [y for y, _, _ in outs], axis=1)  # [seq, dirs, batch, hidden]
    results = [ys, stack(ctx.b, [h for _, h, _ in outs], axis=0)]  # Y, Y_h [dirs, batch, hidden]
    if cell == Cell.LSTM:
        results.append(stack(ctx.b, [c for _, _, c in outs if c is not None], axis=0))
    if layout == 1:
        results = [ctx.b.transpose(ys, [2, 0, 1, 3]), *(ctx.b.transpose(r, [1, 0, 2]) for r in results[1:])]
    return results


def _direction(ctx: NodeContext, cell: Cell, d: int, dirs: int) -> Direction:
    gates, hidden = len(CELL_GATES[cell]), ctx.attr("hidden_size", 0)
    direction = ctx.attr("direction", "forward")
    if direction not in ("forward", "reverse", "bidirectional") or (dirs == 2) != (direction == "bidirectional"):
        raise OnnxImportError(f"direction {direction!r} does not fit {dirs} weight directions")
    w, r = (index(ctx.b, ctx.input(i), d) for i in (1, 2))
    bias = None if ctx.input(3) is None else index(ctx.b, ctx.input(3), d)
    wb, rb = (None, None) if bias is None else (part(ctx.b, bias, 0, gates * hidden), part(ctx.b, bias, 1, gates * hidden))
    names = ctx.attr("activations", None) or DEFAULT_ACTIVATIONS[cell] * dirs
    count = len(DEFAULT_ACTIVATIONS[cell])
    acts = tuple(_activation(ctx, n) for n in names[d * count:(d + 1) * count])
    peep = index(ctx.b, ctx.input(7), d) if cell == Cell.LSTM and ctx.input(7) is not None else None
    # ONNX stacks the gate blocks of W, R and B in CELL_GATES's order
    return Direction(cell, CELL_GATES[cell], w, r, wb, rb, acts, reverse=direction == "reverse" or d == 1,
                     linear_before_reset=bool(ctx.attr("linear_before_reset", 0)), peep=peep)


def _activation(ctx: NodeContext, name: str) -> Activation:
    table: dict[str, Activation] = {"Sigmoid": ctx.b.sigmoid, "Tanh": ctx.b.tanh, "Relu": ctx.b.relu}
    if name not in table:
        raise OnnxImportError(f"activation {name!r} is not supported (supported: {', '.join(table)})")
    clip = ctx.attr("clip", None)
    if clip is None:
        return table[name]
    return lambda v: table[name](ctx.b.clip(v, -float(clip), float(clip)))


def _initial(ctx: NodeContext, i: int, dirs: int, batch: int, hidden: int, dtype: str, layout: int) -> Value:
    """initial_h or initial_c as [dirs, batch, hidden] (zeros when absent)."""
    v = ctx.input(i)
    if v is None:
        return ctx.b.fill_constant((dirs, batch, hidden), 0.0, dtype)
    return ctx.b.transpose(v, [1, 0, 2]) if layout == 1 else v
