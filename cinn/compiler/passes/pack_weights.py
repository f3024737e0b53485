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
from cinn.core.ops.bf16 import PAIR, pack_bf16, pack_bf16_conv
from cinn.core.ops.nn import (
    TO_NCHW,
    TO_NHWC,
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
from cinn.core.ops.quant import DEPTH, IntConvAttrs
from cinn.core.ops.reduction import ReduceAttrs, reduced_axes
from cinn.core.ops.shape import PadAttrs, ReshapeAttrs, SliceAttrs, TransposeAttrs, slice_ranges
from cinn.core.precision import FP32, OpKind, PrecisionPolicy

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


def pack_weights(program: Program, cpu: CpuModel, pad_rows: bool = True, precision: PrecisionPolicy = FP32) -> Program:
    """A conv2d with constant weights becomes a conv2d_packed, its weights OIHW -> IHWO32 panels for dense convs, IHWO
    for grouped ones (output channels contiguous: the conv kernels' vector axis; many channels padded to whole panels
    and sliced back); a matmul's constant 2-D y goes to column panels [N / p, K, p] of a matmul_packed (y_panel: the
    tiled kernels' vector axis, contiguous per register tile; zero-padded to whole panels where N is wide with no
    8-lane divisor, its `columns`), or [K, N] where no panel width divides a small N, or [N, K] for one output row
    (a plain matmul). The elementwise epilogue of a padded conv then runs before the slice back, and so do the
    depthwise convs, pools and squeeze-excite gates after it, up to the next dense conv, which reads the padded
    channels as zero weights (sink_slices). Matmul panels are the first of the CPU's matmul_panels that divides N.
    With few registers, flat 1x1 convs compute whole register tiles of output channels (CpuModel.row_tile). With
    `pad_rows` (a CPU's kernels), a panel matmul whose rows have no fitting tile height computes them in whole tiles
    of CpuModel.padded_rows (PackedMatmulAttrs.row_pad). Where `precision` computes matmuls in bf16, a matmul of
    float32 rows and constant float32 weights becomes a matmul_bf16 over its weights in bf16 (_bf16_matmul)."""
    return rewrite(program, lambda rw, node: _pack(rw, node, cpu, pad_rows, precision) or sink_slices(rw, node))


def _pack(rw: Rewriter, node: Node, cpu: CpuModel, pad_rows: bool, precision: PrecisionPolicy) -> bool:
    if node.op == "conv2d_u8i8":
        return _wide_integer_conv(rw, node)
    if node.op not in ("conv2d", "matmul"):
        return False
    x, w = rw.inputs(node)
    data = rw.constant(w)
    if data is None:
        return False
    if node.op == "matmul" and precision.computes_bf16(OpKind.MATMUL) and _bf16_matmul(rw, node, data, cpu.lanes):
        return True
    if node.op == "conv2d" and precision.computes_bf16(_conv_kind(rw, x)) and _bf16_conv(rw, node, data, cpu.lanes):
        return True
    if node.op == "conv2d":
        _conv(rw, node, data, cpu)
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


def _bf16_matmul(rw: Rewriter, node: Node, data: np.ndarray, lanes: int) -> bool:
    """matmul(x, constant [K, N]) -> matmul_bf16 over the weights in bf16 pairs of k ([N / L, K / 2, L, 2], L the
    CPU's float32 lanes), N zero-padded to whole vectors and sliced back; not for an odd K, transposed or scaled
    rows, or a vector x."""
    mm = cast(MatmulAttrs, node.attrs)
    x = rw.inputs(node)[0]
    columns = data.T if mm.trans_y else data
    if mm.trans_x or mm.alpha != 1.0 or data.ndim != 2 or len(x.shape) < 2 or x.dtype != "float32" \
            or data.dtype != np.float32 or columns.shape[0] % PAIR:
        return False
    n = columns.shape[1]
    packed = rw.new_constant(pack_bf16(np.pad(columns, ((0, 0), (0, -n % lanes))), lanes), f"{node.inputs[1].name}_bf16")
    (y,) = rw.emit("matmul_bf16", [x, packed])
    if n % lanes:
        (y,) = rw.emit("slice", [y], SliceAttrs((len(y.shape) - 1,), (0,), (n,)))
    rw.substitute(node.outputs[0], y)
    return True


def _conv_kind(rw: Rewriter, x: Value) -> OpKind:
    """A conv of a program input is a stem conv."""
    return OpKind.STEM_CONV if rw.producer(x) is None and rw.constant(x) is None else OpKind.CONV


def _bf16_conv(rw: Rewriter, node: Node, oihw: np.ndarray, lanes: int) -> bool:
    """A dense conv of float32 -> conv2d_bf16 over its weights in bf16 pairs of input channels ([OC / L, KH, KW, C / 2,
    L, 2]), its input channels last (an NCHW one transposed there and its output back: sink_transposes cancels the
    transposes between such convs) and padded (spatially, and to an even channel count), its output channels
    zero-padded to whole vectors and sliced back."""
    a = cast(Conv2dAttrs, node.attrs)
    x = rw.inputs(node)[0]
    if a.groups != 1 or x.dtype != "float32" or oihw.dtype != np.float32:
        return False
    rows, cols = conv_windows(x.shape, oihw.shape, a)
    nchw = a.data_format is DataFormat.NCHW
    (nhwc,) = rw.emit("transpose", [x], TransposeAttrs(TO_NHWC)) if nchw else (x,)
    oc, c = oihw.shape[:2]
    pads = ((0, 0), (rows.pad_begin, rows.pad_end), (cols.pad_begin, cols.pad_end), (0, c % PAIR))
    if any(p for pair in pads for p in pair):
        (nhwc,) = rw.emit("pad", [nhwc], PadAttrs(pads, 0.0))
    packed = pack_bf16_conv(np.pad(oihw, ((0, -oc % lanes), (0, c % PAIR), (0, 0), (0, 0))), lanes)
    attrs = IntConvAttrs((rows.stride, cols.stride), (rows.dilation, cols.dilation))
    (y,) = rw.emit("conv2d_bf16", [nhwc, rw.new_constant(packed, f"{node.inputs[1].name}_bf16")], attrs)
    if oc % lanes:
        (y,) = rw.emit("slice", [y], SliceAttrs((3,), (0,), (oc,)))
    if nchw:
        (y,) = rw.emit("transpose", [y], TransposeAttrs(TO_NCHW))
    rw.substitute(node.outputs[0], y)
    return True


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


def _conv(rw: Rewriter, node: Node, oihw: np.ndarray, cpu: CpuModel) -> None:
    """Pack a conv's weights (_ihwo); a dense or depthwise conv of channels sliced from padded ones (a padded conv's
    output, _cut) reads all of them instead: a dense conv's weights of the padding are zeros, a depthwise conv
    computes the padding too (zero weights) and its output is sliced back."""
    x = rw.inputs(node)[0]
    conv = cast(Conv2dAttrs, node.attrs)
    cut = _cut(rw, x)
    if cut is None or cut.axis != channel_axis(x.shape, conv.data_format) or not _slice_dies(rw, node.inputs[0]):
        _ihwo(rw, node, oihw, cpu, x)
        return
    pad = (cut.kept.start, cut.wide.shape[cut.axis] - cut.kept.stop)
    if conv.groups == 1:
        _ihwo(rw, node, np.pad(oihw, ((0, 0), pad, (0, 0), (0, 0))), cpu, cut.wide)
    elif conv.groups == x.shape[cut.axis] == oihw.shape[0]:
        _wide_depthwise(rw, node, np.pad(oihw, (pad, (0, 0), (0, 0), (0, 0))), cut)
    else:
        _ihwo(rw, node, oihw, cpu, x)


def _wide_integer_conv(rw: Rewriter, node: Node) -> bool:
    """An integer conv of channels sliced from padded ones (a padded integer conv's output, _cut) reads all of them,
    its VNNI-packed weights of the padding zeros, in whole steps of DEPTH channels."""
    x, w = rw.inputs(node)
    cut, packed = _cut(rw, x), rw.constant(w)
    if cut is None or packed is None or cut.axis != len(x.shape) - 1 or not _slice_dies(rw, node.inputs[0]):
        return False
    pad = (cut.kept.start, cut.wide.shape[cut.axis] - cut.kept.stop)
    if any(p % DEPTH for p in pad):
        return False
    steps = ((0, 0),) * 3 + (tuple(p // DEPTH for p in pad),) + ((0, 0),) * 2
    rw.keep(node, inputs=(cut.wide, rw.new_constant(np.pad(packed, steps), f"{w.name}_wide")))
    return True


def _wide_depthwise(rw: Rewriter, node: Node, oihw: np.ndarray, cut: _Cut) -> None:
    """A depthwise conv over the padded channels `cut` drops (their weights zero), its output sliced back alike."""
    conv = dataclasses.replace(cast(Conv2dAttrs, node.attrs), groups=oihw.shape[0])
    packed = rw.new_constant(WeightLayout.IHWO.from_oihw(oihw), f"{node.inputs[1].name}_ihwo")
    attrs = layout_variant(PackedConv2dAttrs, conv, weight_layout=WeightLayout.IHWO)
    (y,) = rw.emit("conv2d_packed", [cut.wide, packed], attrs)
    rw.substitute(node.outputs[0], cut.apply(rw, y, channel_axis(y.shape, conv.data_format)))


def _ihwo(rw: Rewriter, node: Node, oihw: np.ndarray, cpu: CpuModel, x: Value) -> None:
    """The conv as conv2d_packed with IHWO weights, in IHWO32 panels (CpuModel.conv_panel wide) where the output
    channels are whole panels of a dense conv (a channel tile's weights are then one contiguous block, read in place:
    no per-run copy into a packed panel); many output channels that are no whole number of panels (squeezenet's 1000
    classes) are zero-padded to whole panels and the output sliced back (1000 channels took narrower registers). A
    grouped NCHW conv (not depthwise) takes GIHWO weights instead. `x` is the input it reads."""
    w = rw.inputs(node)[1]
    conv = cast(Conv2dAttrs, node.attrs)
    o = oihw.shape[0]
    dense = conv.groups == 1
    width = as_nchw(node.outputs[0].shape, conv.data_format)[-1]
    if conv.data_format is DataFormat.NCHW and 1 < conv.groups < x.shape[1]:  # grouped, not depthwise
        _gihwo(rw, node, oihw, _channel_padding(o // conv.groups, width, conv.strides[1] > 1, cpu))
        return
    padding = _channel_padding(o, width, conv.strides[1] > 1, cpu) if dense else 0
    tiles = cpu.few_registers and _takes_row_tiles(x.shape, oihw.shape, conv, o + padding, cpu)
    # a conv of one pixel reads each input channel's weights once, whole rows of output channels: no panels
    one_pixel = as_nchw(node.outputs[0].shape, conv.data_format)[2:] == (1, 1)
    panels = dense and (o + padding) % cpu.conv_panel == 0 and not one_pixel
    layout = WeightLayout.IHWO32 if panels else WeightLayout.IHWO
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


@dataclasses.dataclass(frozen=True)
class _Cut:
    """A slice keeping one unit-step range of one axis of `wide` that drops little (a padded conv's padding)."""

    wide: Value
    axis: int
    kept: range

    def apply(self, rw: Rewriter, v: Value, axis: int) -> Value:
        """The slice of `v` (as wide as `wide` on `axis`) keeping the same range of `axis`."""
        (out,) = rw.emit("slice", [v], SliceAttrs(axes=(axis,), starts=(self.kept.start,), ends=(self.kept.stop,)))
        return out


def _cut(rw: Rewriter, v: Value) -> _Cut | None:
    """v (rewritten) as a slice that keeps a unit-step range of one axis and drops no more than padding (up to a
    STRIDED_PAD_MAX share of the work): ops sunk below a slice that drops much would do much more work."""
    cut = rw.producer(v)
    if cut is None or cut.op != "slice":
        return None
    x = cut.inputs[0]
    ranges = slice_ranges(x.shape, cast(SliceAttrs, cut.attrs))
    axes = [d for d, r in enumerate(ranges) if len(r) != x.shape[d]]
    if len(axes) != 1 or any(r.step != 1 for r in ranges) or len(ranges[axes[0]]) * (1 + STRIDED_PAD_MAX) < x.shape[axes[0]]:
        return None
    return _Cut(x, axes[0], ranges[axes[0]])


def _slice_dies(rw: Rewriter, v: Value) -> bool:
    """Whether every reader of v (a source value now sliced) is an op the slice may sink below or a conv that may
    absorb it: the slice then has no reader left, rather than remaining beside the wider ops."""
    users = rw.users(v)
    return users is not None and all(get_op(u.op).kind is PatternKind.ELEMENTWISE or isinstance(u.attrs, ReduceAttrs)
                                     or u.op in ("conv2d", "conv2d_u8i8") for u in users)


def sink_slices(rw: Rewriter, node: Node) -> bool:
    """op(slice(x), ...) -> slice(op(x, ...)) for a slice that drops padding (_cut) and whose readers all take the
    padded tensor (_slice_dies): elementwise ops whose other operands are slices of the same range, broadcast along
    the axis, or constants (padded with edge values: no NaN in the discarded lanes), and reductions over other axes.
    A padded conv's batch norm and activation then fuse into its kernel instead of taking one of their own, a
    squeeze-excite block's pool, gate and scale run on the padded channels, and the slice stays last, absorbed by
    the next conv (_conv) or a view where it is a contiguous range."""
    if isinstance(node.attrs, ReduceAttrs):
        return _sink_reduction(rw, node)
    if get_op(node.op).kind is not PatternKind.ELEMENTWISE or len(node.outputs) != 1:
        return False
    rank = len(node.outputs[0].shape)
    inputs = rw.inputs(node)
    cuts = {i: c for i, v in enumerate(inputs) if len(v.shape) == rank and (c := _cut(rw, v)) is not None}
    if not cuts:
        return False
    cut = next(iter(cuts.values()))
    extent = cut.wide.shape[cut.axis]
    if any((c.axis, c.kept, c.wide.shape[c.axis]) != (cut.axis, cut.kept, extent) for c in cuts.values()) \
            or not all(_slice_dies(rw, node.inputs[i]) for i in cuts):
        return False
    wide = [cuts[i].wide if i in cuts else _widened(rw, v, cut.axis - rank + len(v.shape), cut.kept, extent)
            for i, v in enumerate(inputs)]
    if any(v is None for v in wide):
        return False
    (y,) = rw.emit(node.op, cast(list[Value], wide), node.attrs)
    rw.substitute(node.outputs[0], cut.apply(rw, y, cut.axis))
    return True


def _sink_reduction(rw: Rewriter, node: Node) -> bool:
    """reduce(slice(x)) -> slice(reduce(x)) over axes other than the sliced one."""
    (x,) = rw.inputs(node)
    cut = _cut(rw, x)
    if cut is None or not _slice_dies(rw, node.inputs[0]):
        return False
    axes = reduced_axes(node.op, cast(ReduceAttrs, node.attrs).dim, x.shape)
    if cut.axis in axes:
        return False
    (y,) = rw.emit(node.op, [cut.wide], node.attrs)
    kept = cut.axis if cast(ReduceAttrs, node.attrs).keep_dim else cut.axis - sum(a < cut.axis for a in axes)
    rw.substitute(node.outputs[0], cut.apply(rw, y, kept))
    return True


def _widened(rw: Rewriter, v: Value, axis: int, kept: range, extent: int) -> Value | None:
    """An operand of an op sunk below a slice of `axis` (its own axis number; negative: it has none): as it is where it
    broadcasts along that axis, a constant padded (edge values) to `extent`, else None."""
    if axis < 0 or v.shape[axis] == 1:
        return v
    data = rw.constant(v)
    if data is None:
        return None
    pads = [(0, 0)] * data.ndim
    pads[axis] = (kept.start, extent - kept.stop)
    return rw.new_constant(np.pad(data, pads, mode="edge"), f"{v.name}_wide")
