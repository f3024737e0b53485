"""Stride-1 3x3 convolutions with constant weights as Winograd convolutions (cinn.core.ops.winograd): winograd_input, a
batched matmul with the weights transformed at compile time, winograd_output (the conv's epilogue fuses into it),
which writes only the conv's output where the last tiles overhang it. F(4x4, 3x3) does 36 products per 16 outputs
where the direct conv does 144, F(2x2, 3x3) 16 per 4 (36).

Measured (2 cores, AVX-512, each kernel alone; the direct convs run at 450-500 GFLOP/s): resnet50's 64->64 on
56x56, F(4x4): 0.06 + 0.18 + 0.05 ms against 0.50; 128->128 on 28x28, F(4x4): 0.24 against 0.50; 256->256 on 14x14,
F(2x2): 0.29 against 0.50; vgg19's 512->512 on 28x28: 4.0 against 7.7 ms. Whole models: resnet50 19.9 -> 18.6 ms,
vgg19 97 -> 63 ms. It does not pay where the transformed weights, (m+2)^2/9 times the direct ones, dominate the run
(few tiles per many channels: 7x7), nor where the transformed input, (m+2)^2/m^2 times the input, is too large to stay
in cache for few channels. Those limits were measured on one machine: `cinn-tune` measures each conv shape's
algorithms on the machine at hand and its choices (`tiles`, keyed by ConvShape.key) overrule the estimate.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import cast

import numpy as np

from cinn.compiler.passes.channels_last import FEW_REGISTERS
from cinn.compiler.passes.rewrite import Rewriter, rewrite
from cinn.core.ir import Node, Program
from cinn.core.ops.nn import Conv2dAttrs, DataFormat, MatmulAttrs, PaddingAlgorithm, WeightLayout, row_panels
from cinn.core.ops.winograd import KERNEL, WinogradInputAttrs, WinogradOutputAttrs, tile_grid, weight_transform

MIN_CHANNELS = 32  # input channels below which the batched matmul is too thin to gain
# output channels below which the input transform outweighs the saved products (densenet's 128->32 on 56x56: 0.62
# ms against the direct 0.57, measured at full FMA width before the transforms ran over vectors of consecutive tiles;
# at half width, scaled to 32, it passes and gains: 0.56-0.64 against 1.15 ms)
MIN_OUT_CHANNELS = 64
# tiles per image below which the transformed weights outweigh the saved products, by the share of the calibration
# FMA width: measured at full width before the weights were row-paneled (512->512 on 7x7: F(2x2)'s 16 tiles lost);
# at half width (2-core znver4, row panels) 4 tiles of F(4x4) lose inside runs (resnet50's 512->512 on 7x7: 1.26 ms
# against 0.95 for F(2x2)) but 9 of F(2x2) gain (inception_v1's 160->320 on 6x6: 0.14 against 0.31 ms direct)
MIN_TILES = ((1.0, 32), (0.0, 8))
TILES = (4, 2)  # output tile sizes tried
# transformed inputs larger than this (bytes), by the share of the calibration FMA width, go through memory twice more
# than the direct conv's input; with few channels per tile that costs more than the products save at full width
# (vgg19's 64->64 on 224x224, 29 MB: 10.0 ms, direct 8.6), not at half width, where the direct conv takes twice as
# long (12.5 against 17.8 ms; the model 0.96x in paired rounds)
MAX_TRANSFORMED = ((1.0, 8 << 20), (0.0, 64 << 20))
WIDE_CHANNELS = 128  # channels from which the products outweigh the transforms at any size
GAIN = 0.9  # the estimated Winograd time must be under this share of the direct conv's
# the machine the rates and thresholds here were measured on: 2 znver5 cores, two 512-bit FMAs per cycle each. A core
# with half that FMA throughput (znver4, AVX2 CPUs) runs the direct conv and the matmul at about half the rate but the
# transforms, which load and store, at about the same: there the rates scale by the share of this FMA width and the
# channel thresholds with them, which on a 2-core znver4 agreed with 42 of 53 measured choices (the ten CNNs' conv
# shapes) against 22 unscaled, 0.7 ms over the measured best in all against 2.0 (vgg19's 224x224 conv aside); the
# tile and size thresholds are measured at each width (MIN_TILES, MAX_TRANSFORMED)
CALIBRATION_FMA_BITS = 1024
# rates measured here (2 cores, AVX-512): the direct conv's FLOP/s and the batched matmul's, each by its reduction (input
# channels); transformed elements made and read per second (fewer once they spill from L2). A direct conv over fewer
# than 64 input channels runs at about three quarters of the rate (squeezenet's 16->64 on 55x55: 169 of 235 GFLOP/s on
# a 2-core znver4; Winograd there: 0.23 against 0.33 ms); the matmul's rows (output channels) matter less than its
# reduction (densenet's 128->32 on 56x56: 180 GFLOP/s, Winograd 0.56-0.64 against 1.15 ms, the model 0.88x). A thin
# matmul reading row-paneled weights runs at 200 GFLOP/s or more: squeezenet's 48->192 on 13x13, F(4x4) 0.103 against
# 0.136 ms direct. `cinn-tune`'s measurements of the ten CNNs' 51 conv shapes agree with 49 of these choices,
# 0.09 ms over the measured best in all (squeezenet's 16->64 on 55x55 measures 0.35 ms direct against 0.44 for
# F(4x4), but its model ran 0.955x with F(4x4) in paired rounds)
DIRECT_RATES = ((64, 470e9), (0, 360e9))
MATMUL_RATES = ((96, 380e9), (64, 320e9), (0, 200e9))
TRANSFORM_RATE, SPILLED_TRANSFORM_RATE, OUTPUT_RATE = 8e9, 3.5e9, 10e9
L2_BYTES = 2 << 20
# output channels per row panel of the transformed weights ([t, K / 16, C, 16]): a register tile of 16 rows streams
# one contiguous panel from memory, where it read 16 rows of C at a stride (resnet50's 256->256 on 14x14, weights
# 9.4 MB: 0.68-0.76 -> 0.59 ms inside runs), and a matmul vectorized over output channels (a tile count that is no
# whole number of vectors) reads the panels in place instead of a copy transposed per run (paired rounds: inception_v2
# 0.85x, inception_v1 0.95x, resnet50 0.97x, squeezenet 0.97x, densenet121 0.98x)
ROW_PANEL = 16
# with 16 vector registers (AVX2), a matmul over whole vectors of tiles takes 2 vectors x 6 rows (12 accumulators)
# over row panels of 6, the output channels padded to whole panels with zero weights (their rows never read): over
# panels of 16 it took 2 x 4 (resnet50's 256->256 on 14x14, 36 x [256 x 256] x 16 tiles, 0.72x; 512->512 on 7x7
# 0.79x)
FEW_REGISTERS_PANEL = 6
LANES = 16  # a tile count that is no multiple of this makes the matmul vectorize over output channels
# with 16 vector registers, tiles padded to whole vectors of LANES (one image's V continues past its last tile row;
# winograd_output reads the leading columns) where that adds at most an eighth of the work: 56x56 F(4x4)'s 196 tiles
# to 208, for the 2 x 6 tiles above; over output channels the matmul took 1 x 7 or 2 x 4
MAX_PADDING = 8
# the input transform stores a vector to each of V's (m + 2)^2 position rows in turn: rows a multiple of 4 KiB apart
# share their L1 sets and evict each other (64 channels x 208 columns: resnet50's 0.19 -> 0.25 ms, the matmul's gain
# gone), so those stay unpadded; squeezenet's 16 channels x 208: matmul 0.235 -> 0.14 ms, input 0.056 -> 0.059
ALIASING = 4096
# transformed weights of output channels that are no whole panels, above this size (bytes), are stored [t, C, K]
# (read as transposed), so that a matmul vectorized over output channels reads them in place instead of copying them
# per run transposed (vgg19's 512->512 on 14x14: 13.2 -> 1.4 ms); small ones stay [t, K, C]
SMALL_WEIGHTS = 1 << 20


ALGORITHM_FAMILY = "winograd/"  # the start of every conv algorithm record's workload in a schedule log
# the revision of the Winograd kernels an algorithm record was measured with, bumped when their speed changes (2: the
# transforms over vectors of consecutive tiles, 2-6x faster on 7x7 to 14x14 images; 3: the transformed weights in
# row panels, read in place; 4: with 16 vector registers, row panels of 6 output channels; 5: their tiles padded to
# whole vectors), so that a log's measurements of earlier kernels no longer decide
TRANSFORMS_REVISION = 5
ALGORITHM_PREFIX = f"{ALGORITHM_FAMILY}r{TRANSFORMS_REVISION}/"  # of a ConvShape's key
DIRECT = 0  # the tile of a measured choice that keeps the conv direct


@dataclass(frozen=True)
class ConvShape:
    """What the choice of algorithm for a Winograd-eligible conv depends on."""

    batch: int
    channels: int
    out_channels: int
    size: tuple[int, int]  # of the input
    paddings: tuple[int, int, int, int]  # top, left, bottom, right

    @property
    def out_size(self) -> tuple[int, int]:
        top, left, bottom, right = self.paddings
        return self.size[0] + top + bottom - KERNEL + 1, self.size[1] + left + right - KERNEL + 1

    @property
    def key(self) -> str:
        """Its name in the schedule log: winograd/rR/NxCxHxW/K/top,left,bottom,right (R: TRANSFORMS_REVISION)."""
        return (f"{ALGORITHM_PREFIX}{self.batch}x{self.channels}x{self.size[0]}x{self.size[1]}/{self.out_channels}/"
                + ",".join(map(str, self.paddings)))


def winograd(program: Program, choices: Mapping[str, int] = MappingProxyType({}),
             fma_bits: int = CALIBRATION_FMA_BITS, registers: int = FEW_REGISTERS) -> Program:
    """Rewrite every conv2d that gains into its Winograd form: by the measured choice in `choices` (ConvShape.key ->
    output tile size, DIRECT for none) where it has one, else by choose_tile's estimate for a CPU whose cores complete
    `fma_bits` of FMA results per cycle (Target.fma_bits) and have `registers` vector registers."""
    share = fma_bits / CALIBRATION_FMA_BITS
    return rewrite(program, lambda rw, node: _rewrite(rw, node, choices, share, registers))


def conv_shapes(program: Program) -> list[ConvShape]:
    """The distinct shapes of the convs `winograd` may rewrite, in program order."""
    shapes = (_shape(node, program.constants.get(node.inputs[1].name)) for node in program.nodes if node.op == "conv2d")
    return list(dict.fromkeys(s for s in shapes if s is not None))


def _shape(node: Node, weights) -> ConvShape | None:
    """The conv's shape if it is eligible for the Winograd form (constant weights among the conditions)."""
    if weights is None:
        return None
    a, x = cast(Conv2dAttrs, node.attrs), node.inputs[0]
    if not _eligible(a, weights.shape, x.dtype):
        return None
    top, left, bottom, right = a.paddings if len(a.paddings) == 4 else a.paddings * 2
    return ConvShape(x.shape[0], x.shape[1], weights.shape[0], (x.shape[2], x.shape[3]), (top, left, bottom, right))


def _rewrite(rw: Rewriter, node: Node, choices: Mapping[str, int], fma_share: float, registers: int) -> bool:
    if node.op != "conv2d":
        return False
    x, w = rw.inputs(node)
    weights = rw.constant(w)
    shape = _shape(node, weights)
    if weights is None or shape is None:
        return False
    oh, ow = shape.out_size
    tile = choices.get(shape.key, choose_tile(shape.batch, shape.channels, shape.out_channels, (oh, ow), fma_share))
    if not tile:
        return False
    grid = tile_grid((oh, ow), tile)
    columns = _whole_columns(math.prod(grid), shape.channels) if registers < FEW_REGISTERS and shape.batch == 1 else 0
    (v,) = rw.emit("winograd_input", [x], WinogradInputAttrs(tile=tile, paddings=shape.paddings, columns=columns))
    transformed = weight_transform(weights, tile)
    if registers < FEW_REGISTERS and v.shape[2] % LANES == 0:
        transformed = np.pad(transformed, ((0, 0), (0, -shape.out_channels % FEW_REGISTERS_PANEL), (0, 0)))
        u = rw.new_constant(row_panels(transformed, FEW_REGISTERS_PANEL), f"{w.name}_winograd{tile}")
        attrs = MatmulAttrs(x_panel=FEW_REGISTERS_PANEL)
    elif shape.out_channels % ROW_PANEL == 0:
        u = rw.new_constant(row_panels(transformed, ROW_PANEL), f"{w.name}_winograd{tile}")
        attrs = MatmulAttrs(x_panel=ROW_PANEL)
    else:
        trans = v.shape[2] % LANES != 0 and transformed.nbytes > SMALL_WEIGHTS
        u = rw.new_constant(transformed.transpose(0, 2, 1).copy() if trans else transformed, f"{w.name}_winograd{tile}")
        attrs = MatmulAttrs(trans_x=trans)
    (mm,) = rw.emit("matmul", [u, v], attrs)
    (y,) = rw.emit("winograd_output", [mm], WinogradOutputAttrs(tile, grid, (oh, ow), shape.out_channels))
    rw.substitute(node.outputs[0], y)
    return True


def _whole_columns(tiles: int, channels: int) -> int:
    """V's columns padded to whole vectors of LANES where that adds at most 1 / MAX_PADDING of the tiles and its
    rows of tile positions stay off a multiple of ALIASING bytes apart (0: no padding)."""
    padding = -tiles % LANES
    aliased = channels * (tiles + padding) * 4 % ALIASING == 0
    return tiles + padding if 0 < padding * MAX_PADDING <= tiles and not aliased else 0


def _eligible(a: Conv2dAttrs, shape: tuple[int, ...], dtype: str) -> bool:
    """A dense NCHW float32 conv with 3x3 OIHW weights, stride 1, no dilation, explicit paddings."""
    return (dtype == "float32" and a.groups == 1 and a.data_format is DataFormat.NCHW
            and a.weight_layout is WeightLayout.OIHW and shape[2:] == (KERNEL, KERNEL)
            and tuple(a.strides) == (1, 1) and tuple(a.dilations) == (1, 1)
            and a.padding_algorithm is PaddingAlgorithm.EXPLICIT)


def choose_tile(batch: int, channels: int, out_channels: int, size: tuple[int, int], fma_share: float = 1.0
                ) -> int | None:
    """The output tile size for a conv of this shape whose estimated time is least, None where the direct conv is
    estimated faster or the guards (channels, tiles, transformed size) rule it out."""
    if channels < MIN_CHANNELS * fma_share or out_channels < MIN_OUT_CHANNELS * fma_share:
        return None
    rate = next(r for least, r in DIRECT_RATES if channels >= least)
    direct = 2 * KERNEL * KERNEL * batch * channels * out_channels * size[0] * size[1] / (rate * fma_share)
    times = {m: _estimate(batch, channels, out_channels, size, m, fma_share) for m in TILES
             if _allowed(batch, channels, out_channels, size, m, fma_share)}
    best = min(times, key=times.__getitem__, default=None)
    return best if best is not None and times[best] < GAIN * direct else None


def _allowed(batch: int, channels: int, out_channels: int, size: tuple[int, int], m: int, fma_share: float) -> bool:
    tiles = math.prod(tile_grid(size, m))
    transformed = (m + 2) ** 2 * channels * batch * tiles * 4
    return tiles >= _at(MIN_TILES, fma_share) and (transformed <= _at(MAX_TRANSFORMED, fma_share)
                                                    or min(channels, out_channels) >= WIDE_CHANNELS)


def _at(thresholds: tuple[tuple[float, int], ...], fma_share: float) -> int:
    """The threshold for a CPU at this share of the calibration FMA width (the first whose share it reaches)."""
    return next(value for share, value in thresholds if fma_share >= share)


def _estimate(batch: int, channels: int, out_channels: int, size: tuple[int, int], m: int, fma_share: float) -> float:
    """Seconds for the input transform, the batched matmul and the output transform."""
    positions, tiles = (m + 2) ** 2, batch * math.prod(tile_grid(size, m))
    rate = next(r for least, r in MATMUL_RATES if channels >= least)
    made = positions * channels * tiles
    seconds = 2 * positions * channels * out_channels * tiles / (rate * fma_share) + positions * out_channels * tiles / OUTPUT_RATE
    seconds += made / (TRANSFORM_RATE if made * 4 <= L2_BYTES else SPILLED_TRANSFORM_RATE)
    return seconds
