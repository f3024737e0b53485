"""Stride-1 3x3 convolutions with constant weights as Winograd convolutions (cinn.core.ops.winograd): winograd_input, a
batched matmul with the weights transformed at compile time, winograd_output (the conv's epilogue fuses into it),
which writes only the conv's output where the last tiles overhang it. F(4x4, 3x3) does 36 products per 16 outputs
where the direct conv does 144, F(2x2, 3x3) 16 per 4 (36).

The choice weighs the estimated seconds of each form on the target's CpuModel: the products at a share of its FMA
peak, the transforms in core cycles per element (they load and store at about the same rate whatever the FMA width),
a transformed input too large for the cores' L2 at the memory bandwidth. It does not pay where the transformed
weights, (m+2)^2/9 times the direct ones, dominate the run (few tiles per many channels: 7x7), nor where the
transformed input, (m+2)^2/m^2 times the input, is too large to stay in cache for few channels. The shares and
thresholds, and the measurements they rest on, are in docs/notes/winograd.md; `cinn-tune` measures each conv shape's
algorithms on the machine at hand and its choices (`tiles`, keyed by ConvShape.key) overrule the estimate.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import cast

import numpy as np

from cinn.compiler.passes.rewrite import Rewriter, rewrite
from cinn.core.cpu_model import CpuModel
from cinn.core.ir import Node, Program
from cinn.core.ops.nn import Conv2dAttrs, DataFormat, MatmulAttrs, PackedMatmulAttrs, PaddingAlgorithm, row_panels
from cinn.core.ops.winograd import KERNEL, WinogradInputAttrs, WinogradOutputAttrs, tile_grid, weight_transform
from cinn.core.target import Target

# the channel, tile and size thresholds scale with the CPU's FMA share (CpuModel.fma_share: its FMA throughput over
# the widest's), as the products' time does and the transforms' does not (docs/notes/winograd.md)
MIN_CHANNELS = 32  # input channels below which the batched matmul is too thin to gain
MIN_OUT_CHANNELS = 64  # output channels below which the input transform outweighs the saved products
# tiles per image below which the transformed weights outweigh the saved products, by FMA share
MIN_TILES = ((1.0, 32), (0.0, 8))
TILES = (4, 2)  # output tile sizes tried
# transformed inputs larger than this (bytes), by FMA share, go through memory twice more than the direct conv's
# input; with few channels per tile that costs more than the products save where the FMAs are wide
MAX_TRANSFORMED = ((1.0, 8 << 20), (0.0, 64 << 20))
WIDE_CHANNELS = 128  # channels from which the products outweigh the transforms at any size
MAX_SHARE = 0.9  # the estimated Winograd time must be under this share of the direct conv's
# the direct conv's and the batched matmul's FLOP/s as shares of the FMA peak, each by its reduction (input channels)
DIRECT_EFFICIENCY = ((64, 0.98), (0, 0.75))
MATMUL_EFFICIENCY = ((96, 0.79), (64, 0.67), (0, 0.42))
# core cycles per element the input transform makes and the output transform reads, all cores in parallel
TRANSFORM_CYCLES, OUTPUT_CYCLES = 0.94, 0.75
FLOAT_SIZE = 4
# with few registers, tiles padded to whole register-tile rows (one image's V continues past its last tile row;
# winograd_output reads the leading columns) where that adds at most an eighth of the work
MAX_PADDING = 8
# transformed weights of output channels that are no whole panels, above this size (bytes), are stored [t, C, K]
# (read as transposed), so that a matmul vectorized over output channels reads them in place instead of copying them
# per run; small ones stay [t, K, C]
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


def winograd(program: Program, target: Target, choices: Mapping[str, int] = MappingProxyType({})) -> Program:
    """Rewrite every conv2d that gains into its Winograd form: by the measured choice in `choices` (ConvShape.key ->
    output tile size, DIRECT for none) where it has one, else by choose_tile's estimate for the target."""
    return rewrite(program, lambda rw, node: _rewrite(rw, node, choices, target))


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


def _rewrite(rw: Rewriter, node: Node, choices: Mapping[str, int], target: Target) -> bool:
    if node.op != "conv2d":
        return False
    x, w = rw.inputs(node)
    weights = rw.constant(w)
    shape = _shape(node, weights)
    if weights is None or shape is None:
        return False
    oh, ow = shape.out_size
    tile = choices.get(shape.key, choose_tile(shape.batch, shape.channels, shape.out_channels, (oh, ow), target))
    if not tile:
        return False
    cpu = target.model
    grid = tile_grid((oh, ow), tile)
    columns = _whole_columns(math.prod(grid), shape.channels, cpu) if cpu.few_registers and shape.batch == 1 else 0
    (v,) = rw.emit("winograd_input", [x], WinogradInputAttrs(tile=tile, paddings=shape.paddings, columns=columns))
    transformed = weight_transform(weights, tile)
    # the batched matmul is a matmul_packed over row panels where it can: its register tile is 2 vectors of tiles x
    # row_tile output channels over row panels of that many (padded with zero weights, their rows never read) with few
    # registers, row_panel rows over panels of row_panel elsewhere, each streaming one contiguous panel; a tile count
    # that is no whole register-tile row vectorizes a plain matmul over output channels
    if cpu.few_registers and v.shape[2] % cpu.tile_columns == 0:
        transformed = np.pad(transformed, ((0, 0), (0, -shape.out_channels % cpu.row_tile), (0, 0)))
        u = rw.new_constant(row_panels(transformed, cpu.row_tile), f"{w.name}_winograd{tile}")
        (mm,) = rw.emit("matmul_packed", [u, v], PackedMatmulAttrs(x_panel=cpu.row_tile))
    elif shape.out_channels % cpu.row_panel == 0:
        u = rw.new_constant(row_panels(transformed, cpu.row_panel), f"{w.name}_winograd{tile}")
        (mm,) = rw.emit("matmul_packed", [u, v], PackedMatmulAttrs(x_panel=cpu.row_panel))
    else:
        trans = v.shape[2] % cpu.tile_columns != 0 and transformed.nbytes > SMALL_WEIGHTS
        u = rw.new_constant(transformed.transpose(0, 2, 1).copy() if trans else transformed, f"{w.name}_winograd{tile}")
        (mm,) = rw.emit("matmul", [u, v], MatmulAttrs(trans_x=trans))
    (y,) = rw.emit("winograd_output", [mm], WinogradOutputAttrs(tile, grid, (oh, ow), shape.out_channels))
    rw.substitute(node.outputs[0], y)
    return True


def _whole_columns(tiles: int, channels: int, cpu: CpuModel) -> int:
    """V's columns padded to whole register-tile rows (CpuModel.tile_columns) where that adds at most 1 / MAX_PADDING
    of the tiles and its rows of tile positions stay off a multiple of the L1's alias distance apart: the input
    transform stores a vector to each of V's rows in turn, and rows that share their L1 sets evict each other (0: no
    padding)."""
    padding = -tiles % cpu.tile_columns
    aliased = channels * (tiles + padding) * FLOAT_SIZE % cpu.l1_alias_bytes == 0
    return tiles + padding if 0 < padding * MAX_PADDING <= tiles and not aliased else 0


def _eligible(a: Conv2dAttrs, shape: tuple[int, ...], dtype: str) -> bool:
    """A dense NCHW float32 conv2d (OIHW weights) of 3x3, stride 1, no dilation, explicit paddings."""
    return (dtype == "float32" and a.groups == 1 and a.data_format is DataFormat.NCHW
            and shape[2:] == (KERNEL, KERNEL)
            and tuple(a.strides) == (1, 1) and tuple(a.dilations) == (1, 1)
            and a.padding_algorithm is PaddingAlgorithm.EXPLICIT)


def choose_tile(batch: int, channels: int, out_channels: int, size: tuple[int, int], target: Target) -> int | None:
    """The output tile size for a conv of this shape whose estimated time on the target is least, None where the
    direct conv is estimated faster or the guards (channels, tiles, transformed size) rule it out."""
    share = target.model.fma_share
    if channels < MIN_CHANNELS * share or out_channels < MIN_OUT_CHANNELS * share:
        return None
    efficiency = next(e for least, e in DIRECT_EFFICIENCY if channels >= least)
    direct = 2 * KERNEL * KERNEL * batch * channels * out_channels * size[0] * size[1] / (efficiency * target.peak_flops)
    times = {m: _estimate(batch, channels, out_channels, size, m, target) for m in TILES
             if _allowed(batch, channels, out_channels, size, m, share)}
    best = min(times, key=times.__getitem__, default=None)
    return best if best is not None and times[best] < MAX_SHARE * direct else None


def _allowed(batch: int, channels: int, out_channels: int, size: tuple[int, int], m: int, fma_share: float) -> bool:
    tiles = math.prod(tile_grid(size, m))
    transformed = (m + 2) ** 2 * channels * batch * tiles * FLOAT_SIZE
    return tiles >= _at(MIN_TILES, fma_share) and (transformed <= _at(MAX_TRANSFORMED, fma_share)
                                                    or min(channels, out_channels) >= WIDE_CHANNELS)


def _at(thresholds: tuple[tuple[float, int], ...], fma_share: float) -> int:
    """The threshold for a CPU at this FMA share (the first whose share it reaches)."""
    return next(value for share, value in thresholds if fma_share >= share)


def _estimate(batch: int, channels: int, out_channels: int, size: tuple[int, int], m: int, target: Target) -> float:
    """Seconds for the input transform, the batched matmul and the output transform on the target's cores: a
    transformed input larger than their L2 goes through memory."""
    positions, tiles = (m + 2) ** 2, batch * math.prod(tile_grid(size, m))
    efficiency = next(e for least, e in MATMUL_EFFICIENCY if channels >= least)
    cycles = target.model.cycles(target.num_cores)
    made = positions * channels * tiles
    seconds = 2 * positions * channels * out_channels * tiles / (efficiency * target.peak_flops)
    seconds += positions * out_channels * tiles * OUTPUT_CYCLES / cycles
    transform = made * TRANSFORM_CYCLES / cycles
    if made * FLOAT_SIZE > target.l2_bytes * target.num_cores:
        transform = max(transform, made * FLOAT_SIZE / target.bandwidth)
    return seconds + transform
