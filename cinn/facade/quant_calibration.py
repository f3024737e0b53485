"""Quantization parameters from calibration data: uint8 activations (asymmetric, per tensor) from a value range that
min/max, a percentile or the least KL divergence picks, and int8 weights (symmetric, per output channel)."""
from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

BINS = 16384  # histogram bins of an activation's range (percentile and entropy): entropy's narrowest window is 1/64
LEVELS = 256  # uint8 levels
WEIGHT_LIMIT = 127  # symmetric int8: -127..127 (as onnxruntime's quantizer writes weights)
MIN_WINDOW = LEVELS  # the narrowest clipping window entropy tries, in bins: one bin a level
WINDOW_GROWTH = 1.02  # each clipping window entropy tries is this much wider than the last


class CalibrationMethod(enum.Enum):
    """How an activation's value range is picked from its calibration values."""

    MINMAX = "minmax"  # the smallest and largest values seen
    PERCENTILE = "percentile"  # the central `percentile` per cent of the values (half the rest clipped at each end)
    ENTROPY = "entropy"  # the clipping range whose uint8 histogram is nearest the float one (least KL divergence)


@dataclass(frozen=True)
class ActivationParams:
    """uint8 quantization of a tensor: q = clip(round(x / scale) + zero_point, 0, 255)."""

    scale: float
    zero_point: int


@dataclass(frozen=True)
class WeightParams:
    """int8 weights per output channel (axis 0): w ~ values * scale[channel]."""

    values: np.ndarray
    scale: np.ndarray

    def dequantized(self) -> np.ndarray:
        """values * scale as float32 (exactly what the integer kernels recover)."""
        shape = (-1,) + (1,) * (self.values.ndim - 1)
        return (self.values.astype(np.float32) * self.scale.reshape(shape)).astype(np.float32)


def activation_params(low: float, high: float) -> ActivationParams:
    """The uint8 scale and zero point of a range widened to hold 0 (a zero padding stays exact), as onnxruntime's
    quantizer computes them."""
    low, high = min(float(low), 0.0), max(float(high), 0.0)
    scale = float(np.float32((high - low) / (LEVELS - 1))) if high > low else 1.0
    return ActivationParams(scale, int(np.clip(round(-low / scale), 0, LEVELS - 1)))


def weight_params(w: np.ndarray) -> WeightParams:
    """Symmetric int8 values and a scale per output channel (axis 0): the largest magnitude over 127."""
    magnitude = np.abs(w.reshape(w.shape[0], -1)).max(axis=1)
    scale = np.where(magnitude > 0, magnitude / np.float32(WEIGHT_LIMIT), np.float32(1)).astype(np.float32)
    shape = (-1,) + (1,) * (w.ndim - 1)
    values = np.clip(np.round(w / scale.reshape(shape)), -WEIGHT_LIMIT, WEIGHT_LIMIT).astype(np.int8)
    return WeightParams(values, scale)


class RangeCollector:
    """The values one tensor takes over the calibration runs: their extremes, then (for the histogram methods, a
    second sweep over the same runs) a histogram over those extremes."""

    def __init__(self) -> None:
        self.low, self.high = np.inf, -np.inf
        self.histogram: np.ndarray | None = None
        self.channel_sum: np.ndarray | None = None
        self.channel_count = 0

    def observe_range(self, x: np.ndarray) -> None:
        """First sweep: the extremes."""
        self.low, self.high = min(self.low, float(x.min(initial=np.inf))), max(self.high, float(x.max(initial=-np.inf)))

    def observe_mean(self, x: np.ndarray, axis: int) -> None:
        """First sweep too: the sum of each channel (along `axis`), for the channels' means."""
        rows = np.moveaxis(x, axis, -1).reshape(-1, x.shape[axis])
        sums = rows.sum(axis=0, dtype=np.float64)
        self.channel_sum = sums if self.channel_sum is None else self.channel_sum + sums
        self.channel_count += rows.shape[0]

    @property
    def channel_mean(self) -> np.ndarray | None:
        """Each channel's mean over every value observed (None when no means were observed)."""
        return None if self.channel_sum is None else self.channel_sum / max(self.channel_count, 1)

    def observe_histogram(self, x: np.ndarray) -> None:
        """Second sweep: the histogram over [min(low, 0), max(high, 0)] of the values but zeros, which every such range
        holds exactly (the zero point): ReLU's zeros, half its values, would otherwise make entropy clip the range to
        give them a level of their own."""
        counts, _ = np.histogram(x[x != 0], BINS, self.edges_range)
        self.histogram = counts if self.histogram is None else self.histogram + counts

    @property
    def edges_range(self) -> tuple[float, float]:
        low, high = min(self.low, 0.0), max(self.high, 0.0)
        return low, (high if high > low else low + 1.0)

    def params(self, method: CalibrationMethod, percentile: float) -> ActivationParams:
        """The tensor's uint8 parameters by `method`."""
        if method is CalibrationMethod.MINMAX:
            return activation_params(self.low, self.high)
        if self.histogram is None:
            raise ValueError(f"{method.value}: no histogram collected")
        edges = np.linspace(*self.edges_range, BINS + 1)
        if method is CalibrationMethod.PERCENTILE:
            start, stop = percentile_window(self.histogram, percentile)
        else:
            start, stop = entropy_window(self.histogram, self._zero_bin())
        return activation_params(edges[start], edges[stop])

    def _zero_bin(self) -> float:
        low, high = self.edges_range
        return -low / (high - low) * BINS


def percentile_window(histogram: np.ndarray, percentile: float) -> tuple[int, int]:
    """Bins [start, stop) holding the central `percentile` per cent of the counts (half the rest cut at each end)."""
    if not 0 < percentile <= 100:
        raise ValueError(f"percentile {percentile}: expected a number in (0, 100]")
    cumulative = np.cumsum(histogram) / max(histogram.sum(), 1)
    tail = (100 - percentile) / 200
    start = int(np.searchsorted(cumulative, tail, side="right"))
    stop = int(np.searchsorted(cumulative, 1 - tail, side="left")) + 1
    return min(start, stop - 1), min(stop, len(histogram))


def entropy_window(histogram: np.ndarray, zero_bin: float) -> tuple[int, int]:
    """Bins [start, stop) of the clipping window, shrunk towards zero from the whole histogram, whose uint8
    quantization (LEVELS levels, outliers clipped into its end bins) loses the least information: the least
    KL(P || Q) of the clipped histogram P and its quantized form Q."""
    n = len(histogram)
    best, window = np.inf, (0, n)
    for width in map(int, _widths(n)):
        start = round(zero_bin * (1 - width / n))
        stop = start + width
        divergence = _divergence(histogram, start, stop)
        if divergence < best:
            best, window = divergence, (start, stop)
    return window


def _widths(n: int) -> Iterable[int]:
    """Window widths from MIN_WINDOW bins to all n, each WINDOW_GROWTH times the last (rounded)."""
    steps = int(np.ceil(np.log(n / MIN_WINDOW) / np.log(WINDOW_GROWTH)))
    return sorted({*np.minimum(np.round(MIN_WINDOW * WINDOW_GROWTH ** np.arange(steps + 1)).astype(int), n), n})


def _divergence(histogram: np.ndarray, start: int, stop: int) -> float:
    """KL(P || Q): P the histogram in [start, stop) with the counts outside added to its end bins, Q its LEVELS
    levels, each level's count spread evenly over the level's non-empty bins."""
    window = histogram[start:stop].astype(np.float64)
    p = window.copy()
    p[0] += histogram[:start].sum()
    p[-1] += histogram[stop:].sum()
    if p.sum() == 0:
        return np.inf
    level = np.minimum((np.arange(len(window)) * LEVELS) // len(window), LEVELS - 1)
    totals = np.bincount(level, weights=window, minlength=LEVELS)
    filled = np.bincount(level, weights=window > 0, minlength=LEVELS)
    q = np.where(window > 0, totals[level] / np.maximum(filled[level], 1), 0.0)
    p, q = p / p.sum(), q / max(q.sum(), 1e-30)
    present = p > 0
    # a bin P holds and Q leaves empty (outliers clipped into an empty end bin) costs as if Q held a sliver
    return float(np.sum(p[present] * np.log(p[present] / np.maximum(q[present], 1e-12))))
