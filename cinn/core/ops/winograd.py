"""Winograd convolution F(m x m, 3 x 3) (Lavin and Gray, 2016): a stride-1 3x3 convolution as a transform of input
tiles, one batched matmul per tile position and a transform back, m*m outputs per (m+2)^2 products instead of 9*m*m.

With alpha = m + 2, for every output tile of m x m (its input tile alpha x alpha, d) and channel pair (g: 3 x 3):
Y = A^T [(G g G^T) * (B^T d B)] A. The weights' transform U = G g G^T is done once, at compile time (the winograd
pass); `winograd_input` makes V[t, c, p] = (B^T d B)[t] for tile p of channel c; the matmul U[t] @ V[t] sums over
channels; `winograd_output` makes Y from M[t, k, p] = sum_c U[t, k, c] V[t, c, p].

The matrices come from the Toom-Cook interpolation points (the usual 0, +-1, +-2 and infinity): A and G from the
points, B solved from the identity every 1-D output satisfies, so nothing is tabulated by hand.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from tvm import te, tirx

from cinn.core.ir import Attrs, TensorType
from cinn.core.ops.registry import DtypeClass as D
from cinn.core.ops.registry import OpDef, RuleName, register
from cinn.core.ops.registry import PatternKind as K
from cinn.core.ops.te_util import const, dims

KERNEL = 3
ROW_ANNOTATION = "tiles_per_row"  # of winograd_input's padded copy: its tile columns, for the schedule
POINTS = {2: (0, 1, -1), 4: (0, 1, -1, 2, -2)}  # finite interpolation points per output tile size


@functools.cache
def transforms(m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(A^T [m, alpha], G [alpha, 3], B^T [alpha, alpha]) of F(m, 3), float64."""
    points, r = np.array(POINTS[m], dtype=np.float64), KERNEL
    alpha, n = m + r - 1, len(POINTS[m])
    at, g = np.zeros((m, alpha)), np.zeros((alpha, r))
    for i, p in enumerate(points):
        at[:, i] = p ** np.arange(m)
        g[i] = p ** np.arange(r) / np.prod([p - q for q in np.delete(points, i)])
    at[m - 1, n] = g[n, r - 1] = 1  # the point at infinity
    # y_j = sum_k g_k d_(j+k) for every j, k, l: sum_i A^T[j, i] G[i, k] B^T[i, l] = [l == j + k]
    system = np.einsum("ji,ik,lL->jklLi", at, g, np.eye(alpha)).reshape(m * r * alpha, alpha * alpha)
    target = np.array([float(l_ == j + k) for j in range(m) for k in range(r) for l_ in range(alpha)])
    bt = np.linalg.lstsq(system, target, rcond=None)[0].reshape(alpha, alpha).T
    return at, g, np.round(bt, 9) + 0.0


def weight_transform(w: np.ndarray, m: int) -> np.ndarray:
    """U[t, k, c] = (G w[k, c] G^T) flattened over t, from OIHW 3x3 weights."""
    g = transforms(m)[1]
    # two tensordots (BLAS), not one three-operand einsum, which dominated a cached compile (docs/notes/compile-time.md)
    gw = np.tensordot(g, w.astype(np.float64), ([1], [2]))  # [a, k, c, j]
    u = np.tensordot(gw, g, ([3], [1])).transpose(0, 3, 1, 2)  # [a, b, k, c]
    return np.ascontiguousarray(u, dtype=w.dtype).reshape(-1, *w.shape[:2])


@dataclass(frozen=True)
class WinogradInputAttrs(Attrs):
    """Output tile size m, the conv's zero paddings (top, left, bottom, right) and V's columns (0: one per tile; more,
    for one image only: the tiles continue row by row past its last tile row, over zeros, so that a matmul over V
    takes whole register tiles)."""

    tile: int = 4
    paddings: tuple[int, int, int, int] = (1, 1, 1, 1)
    columns: int = 0


@dataclass(frozen=True)
class WinogradOutputAttrs(Attrs):
    """Output tile size m, the tiles per column and row of one image, the output's rows and columns (up to m
    times those: the tiles of the last row and column may overhang) and its channels, the leading ones of M's rows (0:
    all of them; M's rows may be padded to whole register tiles)."""

    tile: int = 4
    tiles: tuple[int, int] = (1, 1)
    size: tuple[int, int] = (4, 4)
    channels: int = 0


def tile_grid(size: Sequence[int], tile: int) -> tuple[int, int]:
    """Tiles of `tile` x `tile` per column and row that cover an output of `size` (rows, columns)."""
    return math.ceil(size[0] / tile), math.ceil(size[1] / tile)


def tile_size(positions: int) -> int:
    """The output tile size m of a transform over `positions` = (m + 2)^2 tile positions."""
    return round(positions ** 0.5) - (KERNEL - 1)


def input_tiles(shape: Sequence[int], a: WinogradInputAttrs) -> tuple[int, int]:
    """Tiles per column and row of one image: its conv output rows and columns over m, rounded up."""
    top, left, bottom, right = a.paddings
    return tile_grid((int(shape[2]) + top + bottom - KERNEL + 1, int(shape[3]) + left + right - KERNEL + 1), a.tile)


def _check_tile(op: str, tile: int) -> None:
    if tile not in POINTS:
        raise ValueError(f"{op}: tile {tile} not supported (one of {sorted(POINTS)})")


def _input_infer(types: Sequence[TensorType], a: WinogradInputAttrs) -> list[TensorType]:
    (x,) = types
    _check_tile("winograd_input", a.tile)
    th, tw = input_tiles(x.shape, a) if len(x.shape) == 4 else (0, 0)
    if th < 1 or tw < 1 or min(a.paddings) < 0:
        raise ValueError(f"winograd_input: x {x.shape} [N, C, H, W] with paddings {a.paddings} has no 3x3 window")
    tiles = x.shape[0] * th * tw
    if a.columns and (a.columns < tiles or x.shape[0] != 1):
        raise ValueError(f"winograd_input: columns {a.columns} for x {x.shape}: padded columns need one image and at "
                         f"least its {tiles} tiles")
    return [TensorType(((a.tile + 2) ** 2, x.shape[1], a.columns or tiles), x.dtype)]


def _output_infer(types: Sequence[TensorType], a: WinogradOutputAttrs) -> list[TensorType]:
    (mm,) = types
    _check_tile("winograd_output", a.tile)
    per_image = a.tiles[0] * a.tiles[1]
    if len(mm.shape) != 3 or mm.shape[0] != (a.tile + 2) ** 2 or min(a.tiles) < 1 or mm.shape[2] < per_image:
        raise ValueError(f"winograd_output: M {mm.shape} is no [(tile + 2)^2, K, N * tiles] for tile {a.tile} and "
                         f"tiles {a.tiles}")
    if any(not (t - 1) * a.tile < s <= t * a.tile for s, t in zip(a.size, a.tiles, strict=True)):
        raise ValueError(f"winograd_output: size {a.size} is not covered by tiles {a.tiles} of {a.tile}")
    if not 0 <= a.channels <= mm.shape[1]:
        raise ValueError(f"winograd_output: channels {a.channels} are not among M's {mm.shape[1]} rows")
    return [TensorType((mm.shape[2] // per_image, a.channels or mm.shape[1], *a.size), mm.dtype)]


def _coefficient(column: np.ndarray, index, dtype: str):
    """column[index] as a chain of selects on a (loop) index: once the loop is unrolled the chain folds to a constant,
    and the simplifier drops the products by 0 and 1."""
    out = const(float(column[-1]), dtype)
    for v in range(len(column) - 2, -1, -1):
        out = tirx.Select(index == v, const(float(column[v]), dtype), out)
    return out


def _transform(left: np.ndarray, right: np.ndarray, rows, cols, tap, dtype: str):
    """(left @ D @ right^T)[rows, cols] for the tile D = tap(i, j), as sum_i left[rows, i] * (sum_j right[cols, j] *
    tap(i, j)): separable, so the expression stays small (compile time) and the inner sums are shared by the
    unrolled positions of one row."""
    total = None
    for i in range(left.shape[1]):
        inner = None
        for j in range(right.shape[1]):
            term = _coefficient(right[:, j], cols, dtype) * tap(i, j)
            inner = term if inner is None else inner + term
        term = _coefficient(left[:, i], rows, dtype) * inner
        total = term if total is None else total + term
    return total


def _input_compute(tensors, a: WinogradInputAttrs, out_types: Sequence[TensorType]):
    """A zero-padded copy of each input plane, Q[row % m, column, s] for s = tile row * tiles per row + tile column,
    so that a tap of consecutive tiles of an image is a contiguous vector even across tile rows (a 14x14 input's 16
    tiles one 16-lane vector, not four vectors of 4; see docs/notes/winograd-kernels.md); then V[t, c, p], p running
    over (image, tile row, tile column)."""
    (x,) = tensors
    m, alpha, bt = a.tile, a.tile + 2, transforms(a.tile)[2]
    n, c, h, w = dims(x)
    th, tw = input_tiles((n, c, h, w), a)
    top, left = a.paddings[:2]
    dtype = out_types[0].dtype

    def pad(b, ch, phase, j, s):
        i, col = s // tw * m + phase - top, s % tw * m + j - left
        inside = tirx.all(i >= 0, i < h, col >= 0, col < w)
        return tirx.if_then_else(inside, x[b, ch, i, col], const(0, dtype))

    # one tile row more than the tiles (a tile's last two rows are the next tile row's first two), and the columns
    columns = out_types[0].shape[2]
    padded = te.compute((n, c, m, alpha, max(th + 1, -(-columns // tw) + 1) * tw), pad, name="winograd_pad",
                        attrs={ROW_ANNOTATION: tw})

    def value(t, ch, p):
        b, s = (p // (th * tw), p % (th * tw)) if n > 1 else (0, p)
        return _transform(bt, bt, t // alpha, t % alpha, lambda i, j: padded[b, ch, i % m, j, s + i // m * tw], dtype)

    return [te.compute(out_types[0].shape, value, name="winograd_input")]


def _output_compute(tensors, a: WinogradOutputAttrs, out_types: Sequence[TensorType]):
    """The m x m outputs of every tile, O[position, k, p] (vectors of consecutive tiles, as winograd_input's), then
    Y[n, k, h, w] from the tile at (n, h // m, w // m), the position (h % m, w % m)."""
    (mm,) = tensors
    m, alpha, at = a.tile, a.tile + 2, transforms(a.tile)[0]
    th, tw = a.tiles
    dtype = out_types[0].dtype

    def position(t, k, p):
        return _transform(at, at, t // m, t % m, lambda e, f: mm[e * alpha + f, k, p], dtype)

    # M's columns past the images' tiles (padding to whole register tiles) are not read
    tiles = te.compute((m * m, out_types[0].shape[1], out_types[0].shape[0] * th * tw), position, name="winograd_tiles")

    def value(b, k, h, w):
        return tiles[h % m * m + w % m, k, (b * th + h // m) * tw + w // m]

    return [te.compute(out_types[0].shape, value, name="winograd_output")]


def _input_reference(arrays: Sequence[np.ndarray], a: WinogradInputAttrs) -> list[np.ndarray]:
    (x,) = arrays
    m, alpha, bt = a.tile, a.tile + 2, transforms(a.tile)[2]
    th, tw = input_tiles(x.shape, a)
    th = max(th, -(-a.columns // tw))  # padded columns: the tile rows past the image
    top, left = a.paddings[:2]
    padded = np.zeros((*x.shape[:2], th * m + 2, tw * m + 2), np.float64)
    rows, cols = min(x.shape[2], th * m + 2 - top), min(x.shape[3], tw * m + 2 - left)
    padded[:, :, top:top + rows, left:left + cols] = x[:, :, :rows, :cols]
    tiles = np.lib.stride_tricks.sliding_window_view(padded, (alpha, alpha), axis=(2, 3))[:, :, ::m, ::m]
    v = np.einsum("ei,nchwij,fj->efcnhw", bt, tiles, bt).reshape(alpha * alpha, x.shape[1], -1)
    return [v[:, :, : a.columns or v.shape[2]].astype(x.dtype)]


def _output_reference(arrays: Sequence[np.ndarray], a: WinogradOutputAttrs) -> list[np.ndarray]:
    (mm,) = arrays
    m, alpha, at = a.tile, a.tile + 2, transforms(a.tile)[0]
    th, tw = a.tiles
    images = mm.shape[2] // (th * tw)
    tiles = mm[:, :, : images * th * tw].astype(np.float64).reshape(alpha, alpha, mm.shape[1], images, th, tw)
    y = np.einsum("ae,efknhw,bf->nkhawb", at, tiles, at)
    y = y.reshape(y.shape[0], mm.shape[1], th * m, tw * m)[:, : a.channels or mm.shape[1], : a.size[0], : a.size[1]]
    return [y.astype(mm.dtype)]


register(
    OpDef(
        name="winograd_input",
        kind=K.NON_FUSIBLE,
        needs_rules=(RuleName.CPU_WINOGRAD,),
        infer=_input_infer,
        compute=_input_compute,
        reference=_input_reference,
        attrs=WinogradInputAttrs,
        dtypes=D.FLOAT,
        doc="Winograd F(m x m, 3x3) input transform of a zero-padded NCHW input: V[(tile + 2)^2, C, N * tiles] "
            "(the winograd pass emits it for stride-1 3x3 convolutions).",
    )
)
register(
    OpDef(
        name="winograd_output",
        kind=K.OUT_FUSIBLE,
        needs_rules=(RuleName.CPU_WINOGRAD,),
        infer=_output_infer,
        compute=_output_compute,
        reference=_output_reference,
        attrs=WinogradOutputAttrs,
        dtypes=D.FLOAT,
        doc="Winograd F(m x m, 3x3) output transform: Y[N, K, rows, cols] (the tiles of the last row and column "
            "may overhang it) from M[(m + 2)^2, K, N * tiles], the batched product of transformed weights and "
            "winograd_input's V.",
    )
)
