"""Neural-network ops: matmul, conv2d and pool2d (computed), batchnorm, layer_norm, softmax and
log_softmax (composite, expanded by the decompose pass), dropout (inference form); and the layout variants
matmul_packed and conv2d_packed, whose operands are stored as their kernels read them (the semantic ops' attributes
hold no kernel layout: passes choose a variant for the target's CpuModel and emit it).

Padding convention (conv2d and pool2d, as CINN's pool2d and ONNX's `pads`): `paddings` is either
2 values (pad_h, pad_w), applied on both sides, or 4 values (top, left, bottom, right).
`padding_algorithm` "SAME" (extra padding at the bottom/right) or "VALID" overrides `paddings`.
"""
from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from tvm import te, tirx

from cinn.core.cpu_model import lowering_model
from cinn.core.ir import Attrs, TensorType
from cinn.core.ops.common import broadcast_shapes, coerce_enum, normalize_axes, normalize_axis, register_elementwise, same_dtype
from cinn.core.ops.registry import DtypeClass as D
from cinn.core.ops.registry import OpDef, layout_variant, register, register_semantic
from cinn.core.ops.registry import PatternKind as K
from cinn.core.ops.te_util import cast, const, dims, dtype_of, leading_rows, lowest, thin_rows, whole_tiles


class PoolType(enum.StrEnum):
    """pool2d's reduction."""

    MAX = "max"
    AVG = "avg"


class DataFormat(enum.StrEnum):
    """Position of the channel axis."""

    NCHW = "NCHW"
    NHWC = "NHWC"


TO_NHWC = (0, 2, 3, 1)  # the transpose of a 4-D NCHW tensor to NHWC
TO_NCHW = (0, 3, 1, 2)  # and back

class WeightLayout(enum.StrEnum):
    """A conv's weight layout: OIHW as conv2d takes them (the frontends' order); conv2d_packed's IHWO (output
    channels contiguous), IHWO32 (IHWO in panels of P output channels, [O / P, I, H, W, P]: each channel tile's
    weights one contiguous block; P is the CpuModel's conv_panel) or GIHWO (a grouped conv's: [G, I, H, W, O / G], a
    panel per group) as the pack_weights pass stores constant weights, so a kernel reads its output-channel vectors
    in place (I = C / groups)."""

    OIHW = "OIHW"
    IHWO = "IHWO"
    IHWO32 = "IHWO32"
    GIHWO = "GIHWO"

    @property
    def ndim(self) -> int:
        return 5 if self.panels else 4

    @property
    def panels(self) -> bool:
        """Whether the weights are [panels, I, H, W, panel width]."""
        return self in (WeightLayout.IHWO32, WeightLayout.GIHWO)

    def oihw(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """A weight shape of this layout in OIHW order (a shape of another rank as it is, for the error message)."""
        if len(shape) != self.ndim or self is WeightLayout.OIHW:
            return shape
        return (shape[3], *shape[:3]) if self is WeightLayout.IHWO else (shape[0] * shape[4], *shape[1:4])

    def to_oihw(self, w: np.ndarray) -> np.ndarray:
        """Weights of this layout as OIHW."""
        if self.panels:
            return np.moveaxis(w, 4, 1).reshape(-1, *w.shape[1:4])
        return np.moveaxis(w, 3, 0) if self is WeightLayout.IHWO else w

    def from_oihw(self, w: np.ndarray, groups: int = 1, panel: int = 0) -> np.ndarray:
        """OIHW weights in this layout (IHWO32: in panels of `panel` output channels)."""
        if self.panels:
            width = w.shape[0] // groups if self is WeightLayout.GIHWO else panel
            return np.moveaxis(w.reshape(-1, width, *w.shape[1:]), 1, 4)
        return np.moveaxis(w, 0, 3) if self is WeightLayout.IHWO else w

    def reader(self, w):
        """The weights as a function of OIHW indices (o, c, y, z), for a TE compute."""
        if self.panels:
            width = int(w.shape[4])
            return lambda o, c, y, z: w[o // width, c, y, z, o % width]
        return (lambda o, c, y, z: w[c, y, z, o]) if self is WeightLayout.IHWO else w


class PaddingAlgorithm(enum.StrEnum):
    """How conv2d/pool2d paddings are chosen: as given, to keep ceil(in/stride) outputs, or none."""

    EXPLICIT = "EXPLICIT"
    SAME = "SAME"
    VALID = "VALID"


class DropoutImpl(enum.StrEnum):
    """Paddle's dropout modes: which phase scales by (1 - p)."""

    DOWNGRADE_IN_INFER = "downgrade_in_infer"
    UPSCALE_IN_TRAIN = "upscale_in_train"



def _accumulate(x: np.ndarray) -> np.ndarray:
    """Reference arithmetic in float64 for floats (exact enough to judge float32 kernels)."""
    return x.astype(np.float64) if x.dtype.kind == "f" else x


# ---------------------------------------------------------------------------------------------
# matmul


@dataclass(frozen=True)
class MatmulAttrs(Attrs):
    """out = alpha * op(x) @ op(y), op transposing the last two axes when trans_* is set."""

    trans_x: bool = False
    trans_y: bool = False
    alpha: float = 1.0


@dataclass(frozen=True, kw_only=True)
class PackedMatmulAttrs(MatmulAttrs):
    """matmul_packed: a matmul with an operand stored in the panels its kernel streams, as the pack_weights and
    winograd passes store constant operands for the CpuModel's register tiles (a kernel layout, not a user option).

    `y_panel` > 0 says a 2-D y is stored as column panels, [N / y_panel, K, y_panel]: each register tile of the
    kernel then streams one contiguous panel (pack_weights stores constant weights so).
    `columns` > 0 says N is only the panels' first that many columns: the rest are zero padding to whole panels,
    computed with the others and not written back (GPT-2's 50257-token logits over panels of 24).
    `x_panel` > 0 likewise says x is stored as row panels, [batch..., M / x_panel, K, x_panel] (the winograd pass
    stores its transformed weights so).
    `row_pad` > 0 says a static M with no divisor of at least half of `row_pad` (197 tokens, a prime) is computed in
    whole tiles of `row_pad` rows, the last tile reading x's last row again, and only the M rows written back: its
    register tiles would otherwise be one or two rows high (te_util.thin_rows)."""

    y_panel: int = 0
    x_panel: int = 0
    columns: int = 0
    row_pad: int = 0


@dataclass(frozen=True)
class _MatmulShape:
    """A matmul's operands as [batch..., rows, cols]; 1-D operands are vectors (numpy rules)."""

    batch: tuple[int, ...]
    m: int
    k: int
    n: int
    x_vec: bool
    y_vec: bool

    @property
    def out(self) -> tuple[int, ...]:
        return self.batch + ((self.m,) if not self.x_vec else ()) + ((self.n,) if not self.y_vec else ())


def _matmul_shape(xs: tuple[int, ...], ys: tuple[int, ...], a: PackedMatmulAttrs) -> _MatmulShape:
    """Validate operand shapes and resolve batch, M, K, N."""
    if not xs or not ys:
        raise ValueError(f"matmul: shapes {xs} and {ys}: operands must have at least one dimension")
    if a.x_panel:
        if len(xs) < 3 or xs[-1] != a.x_panel or a.trans_x:
            raise ValueError(f"matmul_packed: x of shape {xs} is not stored as [..., M / {a.x_panel}, K, {a.x_panel}] panels")
        xs = xs[:-3] + (xs[-3] * xs[-1], xs[-2])
    xm, xk = (1, xs[0]) if len(xs) == 1 else (xs[-1], xs[-2]) if a.trans_x else xs[-2:]
    if a.y_panel:
        if len(ys) != 3 or ys[-1] != a.y_panel or a.trans_y:
            raise ValueError(f"matmul_packed: y of shape {ys} is not stored as [N / {a.y_panel}, K, {a.y_panel}] panels")
        if a.columns and not (ys[0] - 1) * ys[2] < a.columns <= ys[0] * ys[2]:
            raise ValueError(f"matmul_packed: columns {a.columns} is not within the last of the panels of y {ys}")
        ys = (ys[1], a.columns or ys[0] * ys[2])
    elif a.columns:
        raise ValueError("matmul_packed: columns is only for y stored as panels (y_panel)")
    yk, yn = (ys[0], 1) if len(ys) == 1 else (ys[-1], ys[-2]) if a.trans_y else ys[-2:]
    if xk != yk:
        raise ValueError(f"matmul: shapes {xs} and {ys} are incompatible (K {xk} vs {yk})")
    try:
        batch = broadcast_shapes("matmul", xs[:-2], ys[:-2])
    except ValueError:
        raise ValueError(f"matmul: batch dims of shapes {xs} and {ys} do not broadcast") from None
    return _MatmulShape(batch, xm, xk, yn, len(xs) == 1, len(ys) == 1)


def _matmul_infer(types: Sequence[TensorType], a: PackedMatmulAttrs) -> list[TensorType]:
    dtype = same_dtype("matmul", types)
    return [TensorType(_matmul_shape(types[0].shape, types[1].shape, a).out, dtype)]


def _operand_index(shape: tuple[int, ...], batch_idx: Sequence, row, col, trans: bool) -> list:
    """Index of one matmul operand: broadcast batch indices, then (row, col) or (col, row)."""
    if len(shape) == 1:
        return [col if row is None else row]  # a vector is indexed by k alone
    own = shape[:-2]
    lead = batch_idx[len(batch_idx) - len(own) :] if own else []
    return [0 if d == 1 else i for d, i in zip(own, lead, strict=False)] + ([col, row] if trans else [row, col])


def _matmul_compute(tensors, a: PackedMatmulAttrs, out_types: Sequence[TensorType]):
    x, y = tensors
    xs, ys = dims(x), dims(y)
    s = _matmul_shape(xs, ys, a)
    dtype = out_types[0].dtype
    k = te.reduce_axis((0, s.k), name="k")
    # a symbolic kernel's rows in whole tiles of SymbolicType.tile_rows (see whole_tiles), a static M without a
    # fitting tile height in tiles of row_pad
    tile = getattr(out_types[0], "tile_rows", 1)
    padded = not isinstance(s.m, int) and not s.x_vec and not a.x_panel and tile > 1
    if isinstance(s.m, int) and not (s.x_vec or s.y_vec or a.x_panel) and thin_rows(s.m, a.row_pad):
        padded, tile = True, a.row_pad
    rows, row = whole_tiles(s.m, tile) if padded else (s.m, lambda i: i)
    cols, col = _computed_columns(s, a, dims(y))
    wide = isinstance(s.n, int) and cols != s.n

    def body(*idx):
        b, rest = idx[: len(s.batch)], list(idx[len(s.batch) :])
        m = None if s.x_vec else row(rest.pop(0))
        n = None if s.y_vec else col(rest.pop(0))
        # x is [.., m, k], y is [.., k, n]; the transposed operand is indexed directly (no transpose stage)
        yi = [n // a.y_panel, k, n % a.y_panel] if a.y_panel else _operand_index(ys, b, k, n, a.trans_y)
        xi = (_operand_index(xs[:-1], b, m // a.x_panel, k, False) + [m % a.x_panel] if a.x_panel
              else _operand_index(xs, b, m, k, a.trans_x))
        prod = x(*xi) * y(*yi)
        return te.sum(prod if a.alpha == 1.0 else prod * const(a.alpha, dtype), axis=k)

    if not (padded or wide):
        return [te.compute(s.out, body, name="matmul")]
    shape = (*s.batch, rows, *(() if s.y_vec else (cols,)))
    tiles = te.compute(shape, body, name="matmul")
    return [leading_rows(tiles, s.out, "matmul_rows")]


def _computed_columns(s: _MatmulShape, a: PackedMatmulAttrs, ys: tuple) -> tuple:
    """The extent of N the kernel computes and the column it reads at each: over column panels with `columns`, the
    whole panels (the view back drops the padding); over row panels, where the register tile's rows are N's columns,
    whole tiles of the CpuModel's pixel_tile where N has no fitting divisor (the last column read again); else N as it is."""
    if a.columns:
        return ys[0] * a.y_panel, lambda j: j
    tile = lowering_model().pixel_tile
    if a.x_panel and not s.y_vec and isinstance(s.n, int) and _whole_tile_extent(s.n, tile + 1) > s.n:
        return whole_tiles(s.n, tile)
    return s.n, lambda j: j


def panel(y: np.ndarray, width: int) -> np.ndarray:
    """[K, N] -> [N / width, K, width] column panels (PackedMatmulAttrs.y_panel)."""
    k, n = y.shape
    return np.ascontiguousarray(y.reshape(k, n // width, width).transpose(1, 0, 2))


def unpanel(y: np.ndarray) -> np.ndarray:
    """Column panels [N / width, K, width] -> [K, N]."""
    return y.transpose(1, 0, 2).reshape(y.shape[1], -1)


def row_panels(x: np.ndarray, width: int) -> np.ndarray:
    """[..., M, K] -> [..., M / width, K, width] row panels (PackedMatmulAttrs.x_panel)."""
    *batch, m, k = x.shape
    return np.ascontiguousarray(np.swapaxes(x.reshape(*batch, m // width, width, k), -1, -2))


def unrow_panels(x: np.ndarray) -> np.ndarray:
    """Row panels [..., M / width, K, width] -> [..., M, K]."""
    *batch, panels, k, width = x.shape
    return np.swapaxes(x, -1, -2).reshape(*batch, panels * width, k)


def _matmul_flops(types: Sequence[TensorType], a: PackedMatmulAttrs, outs: Sequence[TensorType]) -> int:
    xs = types[0].shape
    k = xs[-2] if (a.trans_x or a.x_panel) and len(xs) > 1 else xs[-1]
    return 2 * outs[0].size * k


def _matmul_reference(arrays: Sequence[np.ndarray], a: PackedMatmulAttrs) -> list[np.ndarray]:
    x, y = arrays
    xt = unrow_panels(x) if a.x_panel else np.swapaxes(x, -1, -2) if a.trans_x and x.ndim >= 2 else x
    yt = np.swapaxes(y, -1, -2) if a.trans_y and y.ndim >= 2 else y
    if a.y_panel:
        yt = unpanel(y)[:, : a.columns or None]
    out = np.matmul(_accumulate(xt), _accumulate(yt))
    if a.alpha != 1.0:
        out = out * a.alpha
    return [np.asarray(out).astype(x.dtype)]


MATMUL_PACKED = register(
    OpDef(
        name="matmul_packed",
        kind=K.OUT_FUSIBLE,
        infer=_matmul_infer,
        compute=_matmul_compute,
        reference=_matmul_reference,
        flops=_matmul_flops,
        attrs=PackedMatmulAttrs,
        num_inputs=2,
        dtypes=D.NUMBER,
        doc="matmul with x stored as row panels or y as column panels (PackedMatmulAttrs), as the pack_weights and "
            "winograd passes store constant operands for the target's kernels.",
    )
)
register_semantic(MATMUL_PACKED, "matmul", MatmulAttrs, lambda a: layout_variant(PackedMatmulAttrs, a),
                  "Batched matrix product with numpy broadcasting of batch dims and numpy rules for 1-D operands.")


# ---------------------------------------------------------------------------------------------
# sliding windows shared by conv2d and pool2d


@dataclass(frozen=True)
class _Window:
    """One spatial dim of a sliding window: input size, kernel, stride, dilation, pads, output size."""

    size: int
    kernel: int
    stride: int
    dilation: int
    pad_begin: int
    pad_end: int
    out: int

    def start(self, o):
        """First input index of output `o`'s window (ints or TIR expressions)."""
        return o * self.stride - self.pad_begin

    def end(self, o):
        """One past the last input index of output `o`'s window (padding included)."""
        return self.start(o) + (self.kernel - 1) * self.dilation + 1

    def guards(self, idx, _o) -> list:
        """Conditions for input index `idx` to be inside the input, only those that can fail."""
        overruns = self.end(self.out - 1) > self.size
        return ([idx >= 0] if self.pad_begin else []) + ([idx < self.size] if overruns else [])

    def count(self, o, lo, hi):
        """How many taps of output o's window are inside the input (lo/hi: max/min of ints or TIR exprs)."""
        start, d = self.start(o), self.dilation
        first = lo((d - 1 - start) // d, 0)  # ceil(-start / d): the first tap at index >= 0
        last = hi((self.size - 1 - start) // d, self.kernel - 1)
        return last - first + 1

    def inside(self, o: int) -> list[int]:
        """The input indices output o's window reads (padding left out)."""
        return [i for i in range(self.start(o), self.end(o), self.dilation) if 0 <= i < self.size]

    def taps(self, k: int) -> slice:
        """Positions of the padded input that kernel tap `k` reads, one per output."""
        first = k * self.dilation
        return slice(first, first + self.stride * (self.out - 1) + 1, self.stride)


def _pair(op: str, name: str, values: Sequence[int]) -> tuple[int, int]:
    """A 2-value attribute (H, W), checked positive."""
    if len(values) != 2 or any(int(v) < 1 for v in values):
        raise ValueError(f"{op}: {name} must be 2 positive values (H, W), got {tuple(values)}")
    return int(values[0]), int(values[1])


def _pads(op: str, paddings: Sequence[int]) -> tuple[tuple[int, int], tuple[int, int]]:
    """(begin, end) padding per spatial dim from 2 symmetric or 4 (top, left, bottom, right) values."""
    p = tuple(int(v) for v in paddings)
    if len(p) not in (2, 4) or any(v < 0 for v in p):
        raise ValueError(f"{op}: paddings must be 2 (h, w) or 4 (top, left, bottom, right) values >= 0, got {p}")
    if len(p) == 2:
        p = p + p
    return (p[0], p[2]), (p[1], p[3])


def _windows(
    op: str,
    in_hw: Sequence[int],
    kernel: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
    paddings: Sequence[int],
    algorithm: PaddingAlgorithm,
    ceil_mode: bool,
    shapes: str,
) -> tuple[_Window, _Window]:
    """Resolve the (H, W) window geometry; `shapes` names the operands in errors."""
    strides, dilations = _pair(op, "strides", strides), _pair(op, "dilations", dilations)
    pads = _pads(op, paddings)
    windows = []
    for size, k, s, d, given in zip(in_hw, kernel, strides, dilations, pads, strict=False):
        span = (k - 1) * d + 1
        pb, pe = given
        if algorithm is PaddingAlgorithm.VALID:
            pb = pe = 0
        elif algorithm is PaddingAlgorithm.SAME:
            total = max((-(-size // s) - 1) * s + span - size, 0)
            pb, pe = total // 2, total - total // 2
        room = size + pb + pe - span
        if room < 0:
            raise ValueError(f"{op}: window {kernel} (dilations {dilations}) larger than padded input for {shapes}")
        out = (room + (s - 1 if ceil_mode else 0)) // s + 1
        if ceil_mode and (out - 1) * s >= size + pb:  # ceil mode's last window starts in the end padding: dropped (ONNX, PyTorch)
            out -= 1
        windows.append(_Window(size, k, s, d, pb, pe, out))
    return windows[0], windows[1]


def _window_pad(x, hw: tuple[_Window, _Window], value):
    """A padded window's input padded by a stage of its own (the CPU schedule copies it per channel, deinterleaved
    where strided, then reads whole rows of vectors with no bounds test: inception's 3x3/1 pools, the 3x3/2 ones
    after stems), else None."""
    if all(win.pad_begin == win.pad_end == 0 for win in hw):
        return None
    h, w = (replace(win, pad_end=max(win.pad_end, win.end(win.out - 1) - win.size)) for win in hw)
    return _zero_pad(x, (h, w), value)


def _zero_pad(x, hw: tuple[_Window, _Window], value, channels_last: bool = False):
    """x padded on its spatial axes (the last two, or the two before the channels when `channels_last`) by a
    separate injective stage (inlined by the schedule or computed per tile), its rows a whole number of strides
    wide, so a schedule can split them in phases (the extra columns are never read)."""
    if all(w.pad_begin == w.pad_end == 0 for w in hw):
        return x
    h, w = hw
    w = replace(w, pad_end=w.pad_end + -(w.size + w.pad_begin + w.pad_end) % w.stride)
    n, c = dims(x)[0], dims(x)[3 if channels_last else 1]
    hw_ = (h.size + h.pad_begin + h.pad_end, w.size + w.pad_begin + w.pad_end)
    shape = (n, *hw_, c) if channels_last else (n, c, *hw_)

    def body(*idx):
        n, i, j, c = idx if channels_last else (idx[0], idx[2], idx[3], idx[1])
        inside = [
            cond
            for ix, win in ((i, h), (j, w))
            for cond, needed in ((ix >= win.pad_begin, win.pad_begin), (ix < win.size + win.pad_begin, win.pad_end))
            if needed
        ]
        i, j = i - h.pad_begin, j - w.pad_begin
        return tirx.if_then_else(tirx.all(*inside), x[n, i, j, c] if channels_last else x[n, c, i, j], value)

    return te.compute(shape, body, name="pad")


def _check_nchw(op: str, data_format: DataFormat, shape: tuple[int, ...], nhwc: bool = False) -> None:
    """x is 4-D and in a data format the op computes (NCHW; also NHWC where `nhwc`)."""
    if data_format is not DataFormat.NCHW and not nhwc:
        raise NotImplementedError(f"{op}: data_format {data_format.value} is not supported (use NCHW); x {shape}")
    if len(shape) != 4:
        raise ValueError(f"{op}: x must be 4-D {data_format.value}, got shape {shape}")


def as_nchw(shape: tuple[int, ...], data_format: DataFormat) -> tuple[int, ...]:
    """A 4-D shape of this data format in NCHW order."""
    return tuple(shape[i] for i in TO_NCHW) if data_format is DataFormat.NHWC else shape


def from_nchw(shape: tuple[int, ...], data_format: DataFormat) -> tuple[int, ...]:
    """A 4-D NCHW shape in this data format's order."""
    return tuple(shape[i] for i in TO_NHWC) if data_format is DataFormat.NHWC else shape


# ---------------------------------------------------------------------------------------------
# conv2d


@dataclass(frozen=True)
class Conv2dAttrs(Attrs):
    """2-D convolution of NCHW (or NHWC) input with OIHW weights (I = C / groups); see the module doc for paddings."""

    strides: tuple[int, ...] = (1, 1)
    paddings: tuple[int, ...] = (0, 0)
    dilations: tuple[int, ...] = (1, 1)
    groups: int = 1
    data_format: DataFormat = DataFormat.NCHW
    padding_algorithm: PaddingAlgorithm = PaddingAlgorithm.EXPLICIT

    def __post_init__(self):
        super().__post_init__()
        coerce_enum(self, "data_format", DataFormat, "conv2d")
        coerce_enum(self, "padding_algorithm", PaddingAlgorithm, "conv2d")


@dataclass(frozen=True, kw_only=True)
class PackedConv2dAttrs(Conv2dAttrs):
    """conv2d_packed: a conv2d with its weights in `weight_layout` (IHWO, IHWO32 or GIHWO; OIHW is conv2d's), as the
    pack_weights pass stores constant weights for the CpuModel's register tiles (a kernel layout, not a user option).
    `channel_tile` > 1 has an NCHW 1x1 conv over flat pixels compute its output channels in whole register tiles of
    that many (the last channel again past the end, dropped by the view back); the output is the same."""

    weight_layout: WeightLayout
    channel_tile: int = 0

    def __post_init__(self):
        super().__post_init__()
        coerce_enum(self, "weight_layout", WeightLayout, "conv2d_packed")


def conv_windows(xs: tuple[int, ...], ws: tuple[int, ...], a: Conv2dAttrs) -> tuple[_Window, _Window]:
    """Validate conv2d operands and resolve the window geometry (ws in OIHW order)."""
    _check_nchw("conv2d", a.data_format, xs, nhwc=True)
    xs = as_nchw(xs, a.data_format)
    shapes = f"x {xs} and w {ws}"
    if len(ws) != 4:
        raise ValueError(f"conv2d: w must be 4-D OIHW, got {shapes}")
    g = a.groups
    if g < 1 or xs[1] % g or ws[0] % g:
        raise ValueError(f"conv2d: groups {g} must divide input channels and output channels ({shapes})")
    if ws[1] * g != xs[1]:
        raise ValueError(f"conv2d: w.shape[1] {ws[1]} * groups {g} != input channels {xs[1]} ({shapes})")
    return _windows("conv2d", xs[2:], ws[2:], a.strides, a.dilations, a.paddings, a.padding_algorithm, False, shapes)


def _conv_infer(types: Sequence[TensorType], a: PackedConv2dAttrs) -> list[TensorType]:
    x, w = types
    dtype = same_dtype("conv2d", types)
    layout = a.weight_layout
    if len(w.shape) != layout.ndim or (layout is WeightLayout.GIHWO and w.shape[0] != a.groups):
        raise ValueError(f"conv2d: w of shape {w.shape} is not {layout.ndim}-D {layout}"
                         + (f" with {a.groups} groups" if layout is WeightLayout.GIHWO else ""))
    ws = layout.oihw(w.shape)
    h, wd = conv_windows(x.shape, ws, a)
    return [TensorType(from_nchw((x.shape[0], ws[0], h.out, wd.out), a.data_format), dtype)]


def _conv_compute(tensors, a: PackedConv2dAttrs, out_types: Sequence[TensorType]):
    x, w = tensors
    ws = a.weight_layout.oihw(dims(w))
    h, wd = conv_windows(dims(x), ws, a)
    weight = a.weight_layout.reader(w)
    last = a.data_format is DataFormat.NHWC
    if not last and is_flat_pointwise(ws, (h, wd), a, lowering_model().tile_columns):
        return [_pointwise_compute(x, weight, a.channel_tile, out_types[0])]
    if last and a.groups == 1:
        return [_flat_nhwc_compute(x, weight, ws, (h, wd), out_types[0])]
    if a.weight_layout is WeightLayout.GIHWO and not last:
        return [_grouped_compute(x, w, (h, wd), out_types[0])]
    cg, out_per_group = ws[1], ws[0] // a.groups
    if not last:
        wd = _whole_columns(wd, ws[3], cg)
    xp = _zero_pad(x, (h, wd), const(0, out_types[0].dtype), channels_last=last)
    rc = te.reduce_axis((0, cg), name="rc")
    ry = te.reduce_axis((0, ws[2]), name="ry")
    rx = te.reduce_axis((0, ws[3]), name="rx")

    def body(*idx):
        n, o, i, j = (idx[0], idx[3], idx[1], idx[2]) if last else idx
        c = rc if a.groups == 1 else o // out_per_group * cg + rc
        i, j = i * h.stride + ry * h.dilation, j * wd.stride + rx * wd.dilation
        pixel = xp[n, i, j, c] if last else xp[n, c, i, j]
        return te.sum(pixel * weight(o, rc, ry, rx), axis=[rc, ry, rx])

    out = out_types[0]
    if last or wd.out == out.shape[3]:
        return [te.compute(out.shape, body, name="conv2d")]
    y = te.compute((*out.shape[:3], wd.out), body, name="conv2d")
    return [te.compute(out.shape, lambda n, o, i, j: y[n, o, i, j], name="conv2d_nchw")]


def _grouped_compute(x, w, hw: tuple[_Window, _Window], out: TensorType):
    """A grouped conv with the group an axis of its own, out[n, g, o, i, j] over GIHWO weights, viewed back as NCHW:
    each group's weights are then read through plain iterators, so the conv kernel vectorizes over a group's output
    channels as over a dense conv's, and all groups run as one kernel (shufflenet's 4-group 1x1 convs were a kernel
    per group). A pointwise one over pixels that are whole vectors is computed over flat pixels, as a dense one."""
    groups, cg, ky, kx, og = dims(w)
    h, wd = hw
    rc, ry, rx = te.reduce_axis((0, cg), name="rc"), te.reduce_axis((0, ky), name="ry"), te.reduce_axis((0, kx), name="rx")
    if _is_flat(hw, (ky, kx), lowering_model().tile_columns):
        flat, width = _flatten(x), wd.out
        y = te.compute((out.shape[0], groups, og, h.out * width),
                       lambda n, g, o, p: te.sum(flat[n, g * cg + rc, p] * w[g, rc, 0, 0, o], axis=rc), name="conv2d")
        return te.compute(out.shape, lambda n, o, i, j: y[n, o // og, o % og, i * width + j], name="conv2d_nchw")
    wd = _whole_columns(wd, kx, cg)
    xp = _zero_pad(x, (h, wd), const(0, out.dtype))

    def body(n, g, o, i, j):
        pixel = xp[n, g * cg + rc, i * h.stride + ry * h.dilation, j * wd.stride + rx * wd.dilation]
        return te.sum(pixel * w[g, rc, ry, rx, o], axis=[rc, ry, rx])

    y = te.compute((out.shape[0], groups, og, h.out, wd.out), body, name="conv2d")
    return te.compute(out.shape, lambda n, o, i, j: y[n, o // og, o % og, i, j], name="conv2d_nchw")


MAX_COLUMN_PADDING = 4


def _whole_columns(wd: _Window, kernel: int, channels: int) -> _Window:
    """The output columns an NCHW conv computes: a row with no divisor from P - 1 to 2 P (P: the CpuModel's
    pixel_tile) is computed in whole tiles of P columns (past its end, over zero padding, dropped by a view), at most
    1/MAX_COLUMN_PADDING more. Such convs vectorize over output channels and take register tiles of columns that
    divide the row: 26 columns (2 x 13) took 2 vectors x 2 columns, 4 accumulators against the 10 of 2 x 5
    (docs/notes/cpu-model.md), zfnet's 109 (a prime) 2 x 1. The view inlines into the conv's write-back, so the extra
    columns never reach memory. A 1x1 window takes whole rows as its tile (up to
    13 columns) and a depthwise conv (one channel per group) reuses no input across channels: both keep theirs."""
    if kernel == 1 or channels == 1:
        return wd
    out = _whole_tile_extent(wd.out)
    return replace(wd, out=out, pad_end=wd.pad_end + (out - wd.out) * wd.stride)


def _whole_tile_extent(extent: int, largest: int = 0) -> int:
    """A register tile's row axis rounded up to whole tiles of P (the CpuModel's pixel_tile) where it has no divisor
    from P - 1 to `largest` (default 2 P) and that adds at most 1/MAX_COLUMN_PADDING, else as it is."""
    tile = lowering_model().pixel_tile
    extra = -extent % tile
    if extra * MAX_COLUMN_PADDING > extent or any(extent % r == 0 for r in range(tile - 1, (largest or 2 * tile) + 1)):
        return extent
    return extent + extra


def is_flat_pointwise(ws: tuple[int, ...], hw: tuple[_Window, _Window], a: Conv2dAttrs, columns: int) -> bool:
    """A dense 1x1 conv at stride 1 without padding over H x W pixels that are whole register-tile rows of `columns`
    (the CpuModel's tile_columns): a matmul of the weights with the input's channels x pixels, computed over one flat
    pixel axis (the rows of a 56x56 or 28x28 map are not whole vectors; its 3136 or 784 pixels are:
    docs/notes/cpu-model.md)."""
    return a.groups == 1 and _is_flat(hw, ws[2:], columns)


def _is_flat(hw: tuple[_Window, _Window], kernel: tuple[int, ...], columns: int) -> bool:
    """A 1x1 window at stride 1 without padding over pixels that are whole rows of `columns`."""
    return (tuple(kernel) == (1, 1) and all(w.stride == 1 and w.pad_begin == w.pad_end == 0 for w in hw)
            and hw[0].out * hw[1].out % columns == 0)


def _pointwise_compute(x, weight, tile: int, out: TensorType):
    """out[n, o, p] = sum_c weight[o, c] * x[n, c, p] over flat pixels p, the channels o in whole tiles of `tile`
    where that is more than one, viewed back as NCHW."""
    n_, c_, height, width = dims(x)
    rc = te.reduce_axis((0, c_), name="rc")
    flat = _flatten(x)
    channels, channel = whole_tiles(out.shape[1], tile) if tile > 1 else (out.shape[1], lambda o: o)
    y = te.compute((n_, channels, height * width),
                   lambda n, o, p: te.sum(flat[n, rc, p] * weight(channel(o), rc, 0, 0), axis=rc), name="conv2d")
    return te.compute(out.shape, lambda n, o, i, j: y[n, o, i * width + j], name="conv2d_nchw")


def _flat_nhwc_compute(x, weight, ws: tuple[int, ...], hw: tuple[_Window, _Window], out: TensorType):
    """A dense channels-last conv as a matmul over flat output pixels: out[n, p, o] = sum over the window and the
    channels of x[n, row(p) + ky, col(p) + kx, c] * weight[o, c, ky, kx], the channels innermost, in whole tiles of
    the CpuModel's pixel_tile pixels (the last pixel again past the end), viewed back as NHWC. Its register tile need
    not divide the output rows (7x7: 49 pixels as 50 rows in 5 x 2-vector tiles, where rows of 7 took 7 x 1-vector
    ones), and a strided conv's input is read at each pixel's offset, no gather (docs/notes/cpu-model.md)."""
    h, wd = hw
    xp = _zero_pad(x, hw, const(0, out.dtype), channels_last=True)
    pixels = h.out * wd.out
    tile = lowering_model().pixel_tile
    # one pixel (a squeeze-excite gate's) is a vector, no register tile of rows
    rows, pixel = whole_tiles(pixels, tile) if pixels % tile and pixels > 1 else (pixels, lambda p: p)
    rc = te.reduce_axis((0, ws[1]), name="rc")
    # a 1x1 window has no window axes: the schedule reads the reduction's first axis as the channels
    window = [te.reduce_axis((0, e), name=nm) if e > 1 else None for e, nm in zip(ws[2:], ("ry", "rx"), strict=True)]
    ry, rx = (0 if ax is None else ax for ax in window)

    def body(n, p, o):
        q = pixel(p)
        i, j = q // wd.out * h.stride + ry * h.dilation, q % wd.out * wd.stride + rx * wd.dilation
        return te.sum(xp[n, i, j, rc] * weight(o, rc, ry, rx), axis=[ax for ax in window if ax is not None] + [rc])

    y = te.compute((out.shape[0], rows, out.shape[3]), body, name="conv2d")
    return te.compute(out.shape, lambda n, i, j, o: y[n, i * wd.out + j, o], name="conv2d_nhwc")


def _flatten(x):
    """NCHW as [N, C, H * W]: a stage of its own, so the conv kernel reads flat pixels through plain iterators."""
    n_, c_, height, width = dims(x)
    return te.compute((n_, c_, height * width), lambda n, c, p: x[n, c, p // width, p % width], name="flatten")


def _conv_flops(types: Sequence[TensorType], a: PackedConv2dAttrs, outs: Sequence[TensorType]) -> int:
    return 2 * outs[0].size * math.prod(a.weight_layout.oihw(types[1].shape)[1:])


def _conv_reference(arrays: Sequence[np.ndarray], a: PackedConv2dAttrs) -> list[np.ndarray]:
    x, w = arrays
    if a.data_format is DataFormat.NHWC:
        (y,) = _conv_reference([x.transpose(TO_NCHW), w], replace(a, data_format=DataFormat.NCHW))
        return [np.ascontiguousarray(y.transpose(TO_NHWC))]
    w = a.weight_layout.to_oihw(w)
    h, wd = conv_windows(x.shape, w.shape, a)
    g, (n, c) = a.groups, x.shape[:2]
    xp = np.pad(_accumulate(x), ((0, 0), (0, 0), (h.pad_begin, h.pad_end), (wd.pad_begin, wd.pad_end)))
    xp = xp.reshape(n, g, c // g, *xp.shape[2:])
    wg = _accumulate(w).reshape(g, w.shape[0] // g, *w.shape[1:])
    out: Any = 0
    for ky in range(w.shape[2]):
        for kx in range(w.shape[3]):
            patch = xp[..., h.taps(ky), wd.taps(kx)]
            out = out + np.einsum("ngchw,goc->ngohw", patch, wg[..., ky, kx])
    return [out.reshape(n, w.shape[0], h.out, wd.out).astype(x.dtype)]


CONV2D_PACKED = register(
    OpDef(
        name="conv2d_packed",
        kind=K.OUT_FUSIBLE,
        infer=_conv_infer,
        compute=_conv_compute,
        reference=_conv_reference,
        flops=_conv_flops,
        attrs=PackedConv2dAttrs,
        num_inputs=2,
        dtypes=D.FLOAT,
        doc="conv2d with IHWO, IHWO32 or GIHWO weights and register tiles of output channels (PackedConv2dAttrs), as "
            "the pack_weights pass stores constant weights for the target's kernels.",
    )
)
register_semantic(CONV2D_PACKED, "conv2d", Conv2dAttrs,
                  lambda a: layout_variant(PackedConv2dAttrs, a, weight_layout=WeightLayout.OIHW),
                  "2-D convolution (NCHW or NHWC input, OIHW weights), grouped and depthwise (groups == C).")


# ---------------------------------------------------------------------------------------------
# pool2d


@dataclass(frozen=True)
class Pool2dAttrs(Attrs):
    """Max/avg pooling; global_pooling pools all of H, W; adaptive makes ksize the output size."""

    pooling_type: PoolType
    ksize: tuple[int, ...]
    strides: tuple[int, ...] = (1, 1)
    paddings: tuple[int, ...] = (0, 0)
    ceil_mode: bool = False
    exclusive: bool = True  # avg: divide by the in-bounds window size, not kh * kw
    global_pooling: bool = False
    data_format: DataFormat = DataFormat.NCHW
    adaptive: bool = False
    padding_algorithm: PaddingAlgorithm = PaddingAlgorithm.EXPLICIT
    dilations: tuple[int, ...] = (1, 1)  # sliding windows only

    def __post_init__(self):
        super().__post_init__()
        coerce_enum(self, "pooling_type", PoolType, "pool2d")
        coerce_enum(self, "data_format", DataFormat, "pool2d")
        coerce_enum(self, "padding_algorithm", PaddingAlgorithm, "pool2d")


@dataclass(frozen=True)
class _AdaptiveWindow:
    """One spatial dim of adaptive pooling: output o reads [floor(o*size/out), ceil((o+1)*size/out))."""

    size: int
    out: int

    def start(self, o):
        return o * self.size // self.out

    def end(self, o):
        return ((o + 1) * self.size + self.out - 1) // self.out

    @property
    def kernel(self) -> int:
        """The widest window (the reduce extent)."""
        return max(self.end(o) - self.start(o) for o in range(self.out))

    @property
    def dilation(self) -> int:
        return 1

    def guards(self, idx, o) -> list:
        """Narrower windows stop early; a uniform window needs no condition."""
        ragged = any(self.end(p) - self.start(p) < self.kernel for p in range(self.out))
        return [idx < self.end(o)] if ragged else []

    def count(self, o, _lo, _hi):
        """The size of output o's window (always inside the input)."""
        return self.end(o) - self.start(o)

    def inside(self, o: int) -> list[int]:
        return list(range(self.start(o), self.end(o)))


def _pool_windows(xs: tuple[int, ...], a: Pool2dAttrs):
    """Validate pool2d and resolve its (H, W) windows (sliding or adaptive)."""
    _check_nchw("pool2d", a.data_format, xs)
    hw = xs[2:]
    if a.global_pooling:
        return _windows("pool2d", hw, hw, (1, 1), (1, 1), (0, 0), PaddingAlgorithm.VALID, False, f"x {xs}")
    ksize = _pair("pool2d", "ksize", a.ksize)
    if a.adaptive:
        return _AdaptiveWindow(hw[0], ksize[0]), _AdaptiveWindow(hw[1], ksize[1])
    return _windows("pool2d", hw, ksize, a.strides, a.dilations, a.paddings, a.padding_algorithm, a.ceil_mode, f"x {xs}")


def _pool_infer(types: Sequence[TensorType], a: Pool2dAttrs) -> list[TensorType]:
    (x,) = types
    if a.pooling_type is not PoolType.MAX and not x.dtype.startswith("float"):
        raise TypeError(f"pool2d: average pooling needs a float input, got {x.dtype}{x.shape}; cast it first")
    h, w = _pool_windows(x.shape, a)
    return [TensorType(x.shape[:2] + (h.out, w.out), x.dtype)]


def _divisor(hw, a: Pool2dAttrs, i, j):
    """avg pooling's divisor (a TIR expr): in-bounds taps (exclusive, adaptive), else kh * kw (as Paddle)."""
    if not (a.exclusive or a.adaptive):
        return hw[0].kernel * hw[1].kernel
    return hw[0].count(i, tirx.max, tirx.min) * hw[1].count(j, tirx.max, tirx.min)


def _pool_compute(tensors, a: Pool2dAttrs, out_types: Sequence[TensorType]):
    (x,) = tensors
    hw = _pool_windows(dims(x), a)
    out = out_types[0]
    is_max = a.pooling_type is PoolType.MAX
    identity = lowest(out.dtype) if is_max else tirx.const(0, out.dtype)
    rh, rw = (te.reduce_axis((0, win.kernel), name=n) for win, n in zip(hw, ("rh", "rw"), strict=True))

    padded = _window_pad(x, hw, identity) if not a.adaptive else None

    def body(n, c, i, j):
        h, w = hw[0].start(i) + rh * hw[0].dilation, hw[1].start(j) + rw * hw[1].dilation
        if padded is not None:
            return (te.max if is_max else te.sum)(padded[n, c, h + hw[0].pad_begin, w + hw[1].pad_begin], axis=[rh, rw])
        # padding and the ragged tail of adaptive windows contribute the reduction's identity
        inside = hw[0].guards(h, i) + hw[1].guards(w, j)
        value = tirx.if_then_else(tirx.all(*inside), x[n, c, h, w], identity) if inside else x[n, c, h, w]
        return (te.max if is_max else te.sum)(value, axis=[rh, rw])

    pooled = te.compute(out.shape, body, name="pool2d" if is_max else "pool2d_sum")
    if is_max:
        return [pooled]

    def mean(n, c, i, j):
        return pooled[n, c, i, j] / cast(_divisor(hw, a, i, j), out.dtype)

    return [te.compute(out.shape, mean, name="pool2d")]


def _pool_reference(arrays: Sequence[np.ndarray], a: Pool2dAttrs) -> list[np.ndarray]:
    (x,) = arrays
    hw = _pool_windows(x.shape, a)
    # max pooling picks an input value: in the input dtype, exact for int64 beyond float64's 53 bits
    out = np.empty(x.shape[:2] + (hw[0].out, hw[1].out), x.dtype if a.pooling_type is PoolType.MAX else np.float64)
    for i in range(hw[0].out):
        for j in range(hw[1].out):
            win = _accumulate(x[:, :, hw[0].inside(i)][:, :, :, hw[1].inside(j)])
            if a.pooling_type is PoolType.MAX:
                out[:, :, i, j] = win.max(axis=(2, 3))
            else:
                inclusive = not (a.exclusive or a.adaptive)
                out[:, :, i, j] = win.sum(axis=(2, 3)) / (hw[0].kernel * hw[1].kernel if inclusive else win[0, 0].size)
    return [out.astype(x.dtype)]


register(
    OpDef(
        name="pool2d",
        kind=K.NON_FUSIBLE,
        infer=_pool_infer,
        compute=_pool_compute,
        reference=_pool_reference,
        attrs=Pool2dAttrs,
        dtypes=D.NUMBER,
        doc="2-D max/avg pooling (NCHW): sliding (ceil_mode, exclusive), global or adaptive windows; max pooling of "
            "integers too.",
    )
)


# ---------------------------------------------------------------------------------------------
# composite ops


@dataclass(frozen=True)
class BatchNormAttrs(Attrs):
    """Inference batch norm: y = (x - mean) / sqrt(variance + epsilon) * scale + bias per channel."""

    epsilon: float = 1e-5
    momentum: float = 0.9  # training only; kept for CINN/Paddle signature compatibility
    data_layout: DataFormat = DataFormat.NCHW

    def __post_init__(self):
        super().__post_init__()
        coerce_enum(self, "data_layout", DataFormat, "batchnorm")


def channel_axis(shape: tuple[int, ...], layout: DataFormat) -> int:
    """The channel axis of a tensor of this layout."""
    return 1 if layout is DataFormat.NCHW else len(shape) - 1


def _batchnorm_infer(types: Sequence[TensorType], a: BatchNormAttrs) -> list[TensorType]:
    x = types[0]
    same_dtype("batchnorm", types)
    if len(x.shape) < 2:
        raise ValueError(f"batchnorm: x must have a channel axis, got shape {x.shape}")
    c = x.shape[channel_axis(x.shape, a.data_layout)]
    params = [t.shape for t in types[1:]]
    if any(p != (c,) for p in params):
        raise ValueError(f"batchnorm: scale, bias, mean, variance must have shape ({c},) for x {x.shape}, got {params}")
    return [x]


def _channel_shape(shape: tuple[int, ...], layout: DataFormat) -> tuple[int, ...]:
    """Shape that broadcasts a per-channel vector against x."""
    axis = channel_axis(shape, layout)
    return (shape[axis],) + (1,) * (len(shape) - 1 - axis)


def _batchnorm_decompose(b, inputs, a: BatchNormAttrs):
    x, scale, bias, mean, var = inputs
    # per-channel factor and shift first: with constant params, constant folding removes them
    factor = b.multiply(scale, b.rsqrt(b.add(var, a.epsilon)))
    shift = b.subtract(bias, b.multiply(mean, factor))
    shape = _channel_shape(x.shape, a.data_layout)
    if shape != factor.shape:
        factor, shift = b.reshape(factor, list(shape)), b.reshape(shift, list(shape))
    return [b.add(b.multiply(x, factor), shift)]


def _batchnorm_reference(arrays: Sequence[np.ndarray], a: BatchNormAttrs) -> list[np.ndarray]:
    x, scale, bias, mean, var = (_accumulate(v) for v in arrays)
    shape = _channel_shape(x.shape, a.data_layout)
    scale, bias, mean, var = (v.reshape(shape) for v in (scale, bias, mean, var))
    return [((x - mean) / np.sqrt(var + a.epsilon) * scale + bias).astype(arrays[0].dtype)]


register(
    OpDef(
        name="batchnorm",
        kind=K.ELEMENTWISE,
        infer=_batchnorm_infer,
        decompose=_batchnorm_decompose,
        reference=_batchnorm_reference,
        attrs=BatchNormAttrs,
        num_inputs=5,
        dtypes=D.FLOAT,
        doc="Inference batch norm of x with per-channel scale, bias, mean, variance (returns y only).",
    )
)


@dataclass(frozen=True)
class LayerNormAttrs(Attrs):
    """Normalize over axes [begin_norm_axis, rank), then scale and shift."""

    begin_norm_axis: int = -1
    epsilon: float = 1e-5


def _norm_shape(x: tuple[int, ...], a: LayerNormAttrs) -> tuple[int, ...]:
    return x[normalize_axis("layer_norm", a.begin_norm_axis, len(x)) :]


def _layer_norm_infer(types: Sequence[TensorType], a: LayerNormAttrs) -> list[TensorType]:
    x = types[0]
    same_dtype("layer_norm", types)
    norm = _norm_shape(x.shape, a)
    size = math.prod(norm)
    # Paddle passes scale/bias flattened, ONNX with the normalized shape: both are accepted
    bad = [t.shape for t in types[1:] if t.shape not in (norm, (size,))]
    if bad:
        raise ValueError(f"layer_norm: scale and bias must have shape {norm} or ({size},) for x {x.shape}, got {bad}")
    return [x]


def _layer_norm_decompose(b, inputs, a: LayerNormAttrs):
    x, scale, bias = inputs
    norm = _norm_shape(x.shape, a)
    axes = list(range(len(x.shape) - len(norm), len(x.shape)))
    centered = b.subtract(x, b.reduce_mean(x, dim=axes, keep_dim=True))
    var = b.reduce_mean(b.multiply(centered, centered), dim=axes, keep_dim=True)
    y = b.multiply(centered, b.rsqrt(b.add(var, a.epsilon)))
    scale, bias = (p if p.shape == norm else b.reshape(p, list(norm)) for p in (scale, bias))
    return [b.add(b.multiply(y, scale), bias)]


def _layer_norm_reference(arrays: Sequence[np.ndarray], a: LayerNormAttrs) -> list[np.ndarray]:
    x, scale, bias = (_accumulate(v) for v in arrays)
    norm = _norm_shape(x.shape, a)
    axes = tuple(range(x.ndim - len(norm), x.ndim))
    centered = x - x.mean(axis=axes, keepdims=True)
    y = centered / np.sqrt((centered**2).mean(axis=axes, keepdims=True) + a.epsilon)
    return [(y * scale.reshape(norm) + bias.reshape(norm)).astype(arrays[0].dtype)]


register(
    OpDef(
        name="layer_norm",
        kind=K.REDUCTION,
        infer=_layer_norm_infer,
        decompose=_layer_norm_decompose,
        reference=_layer_norm_reference,
        attrs=LayerNormAttrs,
        num_inputs=3,
        dtypes=D.FLOAT,
        doc="Layer normalization over the trailing axes from begin_norm_axis (returns y only).",
    )
)


@dataclass(frozen=True)
class SoftmaxAttrs(Attrs):
    """Axes normalized over."""

    axes: tuple[int, ...] = (-1,)


def _softmax_infer(op: str):
    def infer(types: Sequence[TensorType], a: SoftmaxAttrs) -> list[TensorType]:
        normalize_axes(op, a.axes, len(types[0].shape))
        return [types[0]]

    return infer


def _shifted_exp(b, x, axes: list[int]):
    """x - max(x) over axes (for stability) and the sum of its exponentials (kept dims)."""
    shifted = b.subtract(x, b.reduce_max(x, dim=axes, keep_dim=True))
    e = b.exp(shifted)
    return shifted, e, b.reduce_sum(e, dim=axes, keep_dim=True)


def _softmax_decompose(b, inputs, a: SoftmaxAttrs):
    (x,) = inputs
    _, e, total = _shifted_exp(b, x, list(normalize_axes("softmax", a.axes, len(x.shape))))
    return [b.divide(e, total)]


def _log_softmax_decompose(b, inputs, a: SoftmaxAttrs):
    (x,) = inputs
    shifted, _, total = _shifted_exp(b, x, list(normalize_axes("log_softmax", a.axes, len(x.shape))))
    return [b.subtract(shifted, b.log(total))]


def _np_log_softmax(x: np.ndarray, a: SoftmaxAttrs) -> np.ndarray:
    axes = normalize_axes("softmax", a.axes, x.ndim)
    shifted = _accumulate(x) - x.max(axis=axes, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=axes, keepdims=True))


def _register_softmax(name: str, decompose, np_fn) -> None:
    """softmax and log_softmax share attrs, inference and the stable shifted-exp decomposition."""

    def reference(arrays: Sequence[np.ndarray], a: SoftmaxAttrs) -> list[np.ndarray]:
        return [np_fn(arrays[0], a).astype(arrays[0].dtype)]

    register(
        OpDef(
            name=name,
            kind=K.REDUCTION,
            infer=_softmax_infer(name),
            decompose=decompose,
            reference=reference,
            attrs=SoftmaxAttrs,
            dtypes=D.FLOAT,
            doc=f"{name} over `axes` (default the last).",
        )
    )


_register_softmax("softmax", _softmax_decompose, lambda x, a: np.exp(_np_log_softmax(x, a)))
_register_softmax("log_softmax", _log_softmax_decompose, _np_log_softmax)


# ---------------------------------------------------------------------------------------------
# dropout


@dataclass(frozen=True)
class DropoutAttrs(Attrs):
    """Inference dropout: downgrade_in_infer scales by (1 - p) as Paddle does; upscale_in_train is identity."""

    dropout_prob: float = 0.5
    dropout_implementation: DropoutImpl = DropoutImpl.DOWNGRADE_IN_INFER
    is_test: bool = True

    def __post_init__(self):
        super().__post_init__()
        coerce_enum(self, "dropout_implementation", DropoutImpl, "dropout")
        if not self.is_test:
            raise ValueError("dropout: only inference (is_test=True) is supported; training dropout is random")
        if not 0.0 <= self.dropout_prob <= 1.0:
            raise ValueError(f"dropout: dropout_prob must be in [0, 1], got {self.dropout_prob}")

    @property
    def keep_scale(self) -> float:
        """What inference multiplies x by."""
        return 1.0 - self.dropout_prob if self.dropout_implementation is DropoutImpl.DOWNGRADE_IN_INFER else 1.0


def _dropout_te(x, a: DropoutAttrs):
    return x if a.keep_scale == 1.0 else x * const(a.keep_scale, dtype_of(x))


register_elementwise(
    "dropout",
    _dropout_te,
    lambda x, a: x * np.asarray(a.keep_scale, x.dtype),
    attrs=DropoutAttrs,
    doc="Inference dropout (no randomness): x * (1 - p) for downgrade_in_infer, x for upscale_in_train.",
)
