"""Store constant weights in the layout the kernels read: each kernel then reads them in place, and the transposition
is paid once at compile time instead of on every run. The panel widths and register tiles are the CpuModel's; the
measurements behind the choices here are in docs/notes/pack-weights.md."""
from __future__ import annotations

import dataclasses
from math import prod
from typing import cast

import numpy as np

from cinn.compiler.passes.rewrite import Rewriter, rewrite
from cinn.core.cpu_model import CpuModel
from cinn.core.ir import Node, Program, Value
from cinn.core.ops import PatternKind, get_op, layout_variant
from cinn.core.ops.nn import (
    Conv2dAttrs,
    DataFormat,
    MatmulAttrs,
    PackedConv2dAttrs,
    PackedMatmulAttrs,
    WeightLayout,
    as_nchw,
    channel_axis,
    conv_windows,
    is_flat_pointwise,
    panel,
)
from cinn.core.ops.shape import ReshapeAttrs, SliceAttrs, slice_ranges

# N with no divisor of whole 8-lane registers (GPT-2's 50257-token vocabulary) from this many columns on: padded to
# whole panels; the kernel writes back the N columns (PackedMatmulAttrs.columns)
PAD_MIN_COLS = 256
# output channels of a dense conv padded to whole register-tile rows (CpuModel.tile_columns) when its output rows
# are no whole vectors either and the padding adds at most this fraction of work
CHANNEL_PAD_MAX = 0.25
# a strided conv is vectorized over channels whatever its rows: padded where that adds at most this fraction
STRIDED_PAD_MAX = 1 / 3
# with few vector registers an NCHW 1x1 conv over flat pixels takes register tiles of two pixel vectors by
# CpuModel.row_tile output channels: channels with no divisor of row_tile - 1 or row_tile are computed in whole
# tiles (PackedConv2dAttrs.channel_tile) where that adds at most this fraction
ROW_PAD_MAX = 1 / 16


def pack_weights(program: Program, cpu: CpuModel, pad_rows: bool = True) -> Program:
    """A conv2d with constant weights becomes a conv2d_packed, its weights OIHW -> IHWO32 panels for dense convs, IHWO
    for grouped ones (output channels contiguous: the conv kernels' vector axis; many channels padded to whole panels
    and sliced back); a matmul's constant 2-D y goes to column panels [N / p, K, p] of a matmul_packed (y_panel: the
    tiled kernels' vector axis, contiguous per register tile; zero-padded to whole panels where N is wide with no
    8-lane divisor, its `columns`), or [K, N] where no panel width divides a small N, or [N, K] for one output row
    (a plain matmul). The elementwise epilogue of a padded conv then runs before the slice back
    (sink_slices). Matmul panels are the first of the CPU's matmul_panels that divides N. With few registers, flat 1x1
    convs compute whole register tiles of output channels (CpuModel.row_tile). With `pad_rows` (a CPU's kernels),
    a panel matmul whose rows have no fitting tile height computes them in whole tiles of CpuModel.padded_rows
    (PackedMatmulAttrs.row_pad)."""
    return rewrite(rewrite(program, lambda rw, node: _pack(rw, node, cpu, pad_rows)), sink_slices)


def _pack(rw: Rewriter, node: Node, cpu: CpuModel, pad_rows: bool) -> bool:
    if node.op not in ("conv2d", "matmul"):
        return False
    x, w = rw.inputs(node)
    data = rw.constant(w)
    if data is None:
        return False
    if node.op == "conv2d":
        _ihwo(rw, node, data, cpu)
        return True
    mm = cast(MatmulAttrs, node.attrs)
    columns = data.T if mm.trans_y else data
    if data.ndim == 2 and not _is_gemv(node) and (width := _panel_width(columns.shape[1], cpu.matmul_panels)):
        _panels(rw, node, columns, width, cpu.padded_rows if pad_rows else 0)
        return True
    if data.ndim >= 2 and mm.trans_y != _is_gemv(node):
        packed = rw.new_constant(np.swapaxes(data, -1, -2), f"{w.name}_t")
        rw.keep(node, inputs=(x, packed), attrs=dataclasses.replace(mm, trans_y=not mm.trans_y))
        return True
    return False


def _panels(rw: Rewriter, node: Node, columns: np.ndarray, width: int, row_pad: int) -> None:
    """matmul(x, [K, N] columns) as a matmul_packed over column panels of `width`, zero-padded to whole panels where
    `width` does not divide N (its `columns`: the kernel writes back the N columns, no slice copies them), its rows
    computed in whole tiles of `row_pad` where they have no fitting tile height (the kernel decides by the rows it
    is lowered for: a symbolic program's probes all take the same attributes)."""
    x, w = rw.inputs(node)
    n = columns.shape[1]
    padded = np.pad(columns, ((0, 0), (0, -n % width))) if n % width else columns
    packed = rw.new_constant(panel(padded, width), f"{w.name}_panels")
    semantic = dataclasses.replace(cast(MatmulAttrs, node.attrs), trans_y=False)
    attrs = layout_variant(PackedMatmulAttrs, semantic, y_panel=width, columns=n % width and n, row_pad=row_pad)
    rw.keep(node, op="matmul_packed", inputs=(x, packed), attrs=attrs)


def _ihwo(rw: Rewriter, node: Node, oihw: np.ndarray, cpu: CpuModel) -> None:
    """The conv as conv2d_packed with IHWO weights, in IHWO32 panels (CpuModel.conv_panel wide) where the output
    channels are whole panels of a dense conv (a channel tile's weights are then one contiguous block, read in place:
    no per-run copy into a packed panel); many output channels that are no whole number of panels (squeezenet's 1000
    classes) are zero-padded to whole panels and the output sliced back (1000 channels took narrower registers). A
    grouped NCHW conv (not depthwise) takes GIHWO weights instead."""
    x, w = rw.inputs(node)
    conv = cast(Conv2dAttrs, node.attrs)
    o = oihw.shape[0]
    dense = conv.groups == 1
    width = as_nchw(node.outputs[0].shape, conv.data_format)[-1]
    if conv.data_format is DataFormat.NCHW and 1 < conv.groups < x.shape[1]:  # grouped, not depthwise
        _gihwo(rw, node, oihw, _channel_padding(o // conv.groups, width, conv.strides[1] > 1, cpu))
        return
    padding = _channel_padding(o, width, conv.strides[1] > 1, cpu) if dense else 0
    tiles = cpu.few_registers and _takes_row_tiles(x.shape, oihw.shape, conv, o + padding, cpu)
    layout = WeightLayout.IHWO32 if dense and (o + padding) % cpu.conv_panel == 0 else WeightLayout.IHWO
    padded = np.pad(oihw, ((0, padding), (0, 0), (0, 0), (0, 0)))
    packed = rw.new_constant(layout.from_oihw(padded, panel=cpu.conv_panel), f"{w.name}_ihwo")
    attrs = layout_variant(PackedConv2dAttrs, conv, weight_layout=layout, channel_tile=cpu.row_tile if tiles else 0)
    _replace(rw, node, (x, packed), attrs, channel_axis(node.outputs[0].shape, conv.data_format), (o, o + padding))


def _takes_row_tiles(xs: tuple[int, ...], oihw: tuple[int, ...], conv: Conv2dAttrs, channels: int,
                     cpu: CpuModel) -> bool:
    """Whether an NCHW 1x1 conv over flat pixels computes whole register tiles of the CPU's row_tile output channels:
    where they have no divisor of row_tile - 1 or row_tile and that adds at most ROW_PAD_MAX."""
    tile = cpu.row_tile
    flat = is_flat_pointwise(oihw, conv_windows(xs, oihw, conv), conv, cpu.tile_columns)
    return (conv.data_format is DataFormat.NCHW and flat and not any(channels % r == 0 for r in range(tile - 1, tile + 1))
            and -channels % tile <= channels * ROW_PAD_MAX)


def _gihwo(rw: Rewriter, node: Node, oihw: np.ndarray, padding: int) -> None:
    """A grouped conv as conv2d_packed over GIHWO weights, each group's output channels zero-padded by `padding` (to
    whole vectors: shufflenet's 68 per group -> 80) and the padded channels dropped from the output again."""
    x, w = rw.inputs(node)
    conv = cast(Conv2dAttrs, node.attrs)
    groups = conv.groups
    per_group = oihw.reshape(groups, -1, *oihw.shape[1:])
    padded = np.pad(per_group, ((0, 0), (0, padding), (0, 0), (0, 0), (0, 0))).reshape(-1, *oihw.shape[1:])
    packed = rw.new_constant(WeightLayout.GIHWO.from_oihw(padded, groups), f"{w.name}_gihwo")
    attrs = layout_variant(PackedConv2dAttrs, conv, weight_layout=WeightLayout.GIHWO)
    if not padding:
        rw.keep(node, op="conv2d_packed", inputs=(x, packed), attrs=attrs)
        return
    n, o, h, wd = node.outputs[0].shape
    og = o // groups
    (y,) = rw.emit("conv2d_packed", [x, packed], attrs)
    (y,) = rw.emit("reshape", [y], ReshapeAttrs((n, groups, og + padding, h, wd)))
    (y,) = rw.emit("slice", [y], SliceAttrs(axes=(2,), starts=(0,), ends=(og,)))
    (y,) = rw.emit("reshape", [y], ReshapeAttrs((n, o, h, wd)))
    rw.substitute(node.outputs[0], y)


def _channel_padding(o: int, width: int, strided: bool, cpu: CpuModel) -> int:
    """Zero output channels a dense conv's weights get: to whole panels for many channels, to whole register-tile
    rows where the channels are none but the vector axis (rows that are not whole ones, a strided conv) and that
    costs little."""
    if o >= PAD_MIN_COLS:
        return -o % cpu.conv_panel
    columns = cpu.tile_columns
    pad = -o % columns
    return pad if pad <= o * (STRIDED_PAD_MAX if strided else CHANNEL_PAD_MAX if width % columns else 0) else 0


def _replace(rw: Rewriter, node: Node, inputs: tuple, attrs: PackedConv2dAttrs, axis: int, extents: tuple[int, int]) -> None:
    """The conv as conv2d_packed over its packed weights; where they were zero-padded (`extents`: the output's extent
    along `axis`, then the padded one), it is emitted anew and its output sliced back."""
    n, wide = extents
    if wide == n:
        rw.keep(node, op="conv2d_packed", inputs=inputs, attrs=attrs)
        return
    (out,) = rw.emit("conv2d_packed", list(inputs), attrs)
    (out,) = rw.emit("slice", [out], SliceAttrs(axes=(axis,), starts=(0,), ends=(n,)))
    rw.substitute(node.outputs[0], out)


def _panel_width(n: int, widths: tuple[int, ...]) -> int:
    """Columns per packed panel: the first of `widths` that divides N; for a wide N with no divisor of whole 8-lane
    registers, the first one (padded); else 0."""
    divides = next((p for p in widths if n % p == 0), 0)
    return divides or (widths[0] if n % 8 and n >= PAD_MIN_COLS else 0)


def _is_gemv(node: Node) -> bool:
    """A matmul with one output row (a batch-1 fully connected layer): its kernel streams each output column's
    weights as one contiguous dot product (trans_y), at memory bandwidth."""
    return prod(node.outputs[0].shape[:-1]) == 1


def sink_slices(rw: Rewriter, node: Node) -> bool:
    """elementwise(slice(x), constants) -> slice(elementwise(x, constants padded)) for a unit-step slice read only
    there: a padded conv's batch norm and activation then fuse into its kernel instead of taking one of their own,
    and the slice stays last, a view where it is a contiguous range."""
    if get_op(node.op).kind not in (PatternKind.ELEMENTWISE, PatternKind.BROADCAST) or len(node.outputs) != 1:
        return False
    sliced = [i for i, v in enumerate(node.inputs) if _unit_slice(rw, v)]
    if len(sliced) != 1 or node.outputs[0].shape != node.inputs[sliced[0]].shape:
        return False
    cut = cast(Node, rw.producer(rw.value(node.inputs[sliced[0]])))
    (x,) = rw.inputs(cut)
    ranges = slice_ranges(x.shape, cast(SliceAttrs, cut.attrs))
    inputs = [x if i == sliced[0] else _widened(rw, v, x.shape, ranges) for i, v in enumerate(rw.inputs(node))]
    if any(v is None for v in inputs):
        return False
    (wide,) = rw.emit(node.op, cast(list[Value], inputs), node.attrs)
    (out,) = rw.emit("slice", [wide], cut.attrs)
    rw.substitute(node.outputs[0], out)
    return True


def _unit_slice(rw: Rewriter, v: Value) -> bool:
    """Whether v (read once) is now a slice's output with unit steps that drops no more than padding (up to a
    STRIDED_PAD_MAX share of the work): ops sunk below a slice that drops much would do much more work."""
    cut = rw.producer(rw.value(v))
    if not rw.has_single_use(v) or cut is None or cut.op != "slice":
        return False
    kept = prod(v.shape) / prod(cut.inputs[0].shape)
    return all(step == 1 for step in cast(SliceAttrs, cut.attrs).strides or ()) and kept * (1 + STRIDED_PAD_MAX) >= 1


def _widened(rw: Rewriter, v: Value, shape: tuple[int, ...], ranges: list[range]) -> Value | None:
    """A constant operand broadcast against the slice, padded (edge values: no NaN in the discarded lanes) to broadcast
    against the slice's input; None for an operand that is not a constant."""
    data = rw.constant(v)
    if data is None:
        return None
    lead = len(shape) - data.ndim
    pads = [(0, 0) if d == 1 else (ranges[lead + a].start, shape[lead + a] - ranges[lead + a].stop)
            for a, d in enumerate(data.shape)]
    if all(p == (0, 0) for p in pads):
        return v
    return rw.new_constant(np.pad(data, pads, mode="edge"), f"{v.name}_wide")
