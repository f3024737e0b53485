"""3-D (volumetric) convolution and pooling as 2-D ones, so they take the tuned 2-D schedules on every target.

A 3-D conv is one 2-D conv over the (H, W) planes: each output depth's KD input planes (depth-padded, strided and
dilated) are stacked as input channels and the weights' depth taps folded into theirs. 3-D pooling pools each plane
in 2-D, then combines KD depth-shifted slices of the result (max, or a sum over the in-bounds taps for average).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import reduce

import numpy as np

from cinn.core.builder import NetBuilder
from cinn.core.ir import Value


@dataclass(frozen=True)
class Window3d:
    """A 3-D Conv/Pool window: per (D, H, W) kernel, stride, dilation, and pads before and after."""

    kernel: tuple[int, int, int]
    strides: tuple[int, int, int]
    dilations: tuple[int, int, int]
    begin: tuple[int, int, int]
    end: tuple[int, int, int]

    @property
    def planar_pads(self) -> list[int]:
        """The (H, W) pads in conv2d/pool2d order: top, left, bottom, right."""
        return [self.begin[1], self.begin[2], self.end[1], self.end[2]]

    def depth_out(self, depth: int, ceil_mode: bool = False) -> int:
        """Output depth, as ONNX sizes it (a ceil-mode window must start inside the input or its front padding)."""
        span = depth + self.begin[0] + self.end[0] - self.dilations[0] * (self.kernel[0] - 1) - 1
        out = (-(-span // self.strides[0]) if ceil_mode else span // self.strides[0]) + 1
        if ceil_mode and (out - 1) * self.strides[0] >= depth + self.begin[0]:
            out -= 1
        if out < 1:
            raise ValueError(f"the window {self.kernel} does not fit the input depth {depth} (pads {self.begin[0]}, "
                             f"{self.end[0]})")
        return out


def _depth_taps(b: NetBuilder, x: Value, win: Window3d, out: int, fill: float) -> list[Value]:
    """The KD slices of x (axis 2) that output depths 0..out-1 read at each depth tap, x padded with `fill`."""
    kd, sd, dd = win.kernel[0], win.strides[0], win.dilations[0]
    reach = (out - 1) * sd + dd * (kd - 1) + 1  # padded depth the last window reaches (ceil mode: past the pads)
    after = reach - x.shape[2] - win.begin[0]
    if win.begin[0] or after > 0:
        pads = [(0, 0)] * len(x.shape)
        pads[2] = (win.begin[0], max(after, 0))
        x = b.pad(x, pads, pad_value=fill)
    return [b.slice(x, [2], [k * dd], [k * dd + (out - 1) * sd + 1], [sd]) for k in range(kd)]


def conv3d(b: NetBuilder, x: Value, w: Value, win: Window3d, groups: int) -> Value:
    """[N, C, D, H, W] conv [M, C/g, KD, KH, KW] -> [N, M, OD, OH, OW] through one conv2d."""
    n, c, _, h, wd = x.shape
    m, cg, kd, kh, kw = w.shape
    od = win.depth_out(x.shape[2])
    taps = [b.expand_dims(t, [3]) for t in _depth_taps(b, x, win, od, 0.0)]
    stacked = b.concat(taps, axis=3) if kd > 1 else taps[0]  # [N, C, OD, KD, H, W]
    # channel c * KD + k: group-major, as conv2d's groups split the channels
    planes = b.reshape(b.transpose(stacked, [0, 2, 1, 3, 4, 5]), [n * od, c * kd, h, wd])
    folded = b.reshape(w, [m, cg * kd, kh, kw])
    y = b.conv2d(planes, folded, list(win.strides[1:]), win.planar_pads, list(win.dilations[1:]), groups)
    _, _, oh, ow = y.shape
    return b.transpose(b.reshape(y, [n, od, m, oh, ow]), [0, 2, 1, 3, 4])


def pool3d(b: NetBuilder, x: Value, kind: str, win: Window3d, ceil_mode: bool, exclusive: bool) -> Value:
    """Max or average pooling of [N, C, D, H, W]; average divides by the in-bounds taps (exclusive) or the whole
    window, as pool2d does per plane."""
    n, c, d, h, wd = x.shape
    planes = b.pool2d(b.reshape(x, [n, c * d, h, wd]), kind, list(win.kernel[1:]), list(win.strides[1:]),
                      win.planar_pads, ceil_mode, exclusive, dilations=list(win.dilations[1:]))
    _, _, oh, ow = planes.shape
    y = b.reshape(planes, [n, c, d, oh, ow])
    od = win.depth_out(d, ceil_mode)
    if kind == "max":
        fill = float("-inf") if x.dtype.startswith("float") else float(np.iinfo(x.dtype).min)
        return reduce(b.max, _depth_taps(b, y, win, od, fill))
    total = reduce(b.add, _depth_taps(b, y, win, od, 0.0))
    taps = np.array([_in_bounds(o, win, d) if exclusive else win.kernel[0] for o in range(od)], x.dtype)
    return b.multiply(total, b.create_constant((1 / taps).astype(x.dtype).reshape(1, 1, od, 1, 1)))


def _in_bounds(o: int, win: Window3d, depth: int) -> int:
    """How many of output depth o's taps read the input rather than its padding."""
    start = o * win.strides[0] - win.begin[0]
    return sum(0 <= start + k * win.dilations[0] < depth for k in range(win.kernel[0]))


def window3d(kernel: Sequence[int], strides: Sequence[int], dilations: Sequence[int], begin: Sequence[int],
             end: Sequence[int]) -> Window3d:
    """A Window3d from per-dim sequences."""
    def three(v: Sequence[int]) -> tuple[int, int, int]:
        a, b_, c = (int(e) for e in v)
        return a, b_, c

    return Window3d(three(kernel), three(strides), three(dilations), three(begin), three(end))
