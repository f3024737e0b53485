"""Cases for the spatial index ops: col2im, max_unpool (fed by a real max pooling's indices), roi_align."""
import itertools

import numpy as np

from tests.cases import Case

F32 = "float32"


def _f(*shape):
    return (tuple(shape), F32)


def max_pooled(shape: tuple[int, ...], kernel: tuple[int, ...], strides: tuple[int, ...], pads: tuple[int, ...],
                index_dtype: str = "int64"):
    """A max pooling of random data: its values and ONNX MaxPool's indices (flat over the whole input)."""

    def make(rng: np.random.Generator) -> list[np.ndarray]:
        x = rng.permutation(np.prod(shape)).reshape(shape).astype(F32)  # distinct values: one argmax per window
        rank = len(kernel)
        counts = [(n + pads[d] + pads[rank + d] - k) // s + 1
                  for d, (n, k, s) in enumerate(zip(shape[2:], kernel, strides, strict=True))]
        values = np.empty(shape[:2] + tuple(counts), F32)
        index = np.empty(values.shape, index_dtype)
        for n, c, *window in itertools.product(*(range(d) for d in values.shape)):
            ranges = [range(max(w * s - p, 0), min(w * s - p + k, size))
                      for w, s, p, k, size in zip(window, strides, pads[:rank], kernel, shape[2:], strict=True)]
            best = max(itertools.product(*ranges), key=lambda pos, n=n, c=c: x[(n, c, *pos)])
            values[(n, c, *window)] = x[(n, c, *best)]
            index[(n, c, *window)] = np.ravel_multi_index((n, c, *best), shape)
        return [values, index]

    return make


def _rois(image: tuple[int, int], count: int, scale: float, extra: list[list[float]], batch: int, index_dtype: str):
    """x [batch, 3, *image], rois inside the map (in image coordinates: the map times 1 / scale) plus `extra`, and
    their images."""

    def make(rng: np.random.Generator) -> list[np.ndarray]:
        h, w = (d / scale for d in image)
        lo = rng.uniform(0, 0.6, (count, 2)) * (w, h)
        hi = lo + rng.uniform(0.05, 1, (count, 2)) * ((w, h) - lo)
        rois = np.concatenate([np.concatenate([lo, hi], axis=1), np.array(extra).reshape(-1, 4)]).astype(F32)
        x = rng.standard_normal((batch, 3, *image)).astype(F32)
        return [x, rois, rng.integers(0, batch, len(rois)).astype(index_dtype)]

    return make


def _roi_align(id: str, make, **attrs) -> Case:
    return Case("roi_align", attrs=attrs, make=make, id=id)


CASES = [
    Case("col2im", (_f(2, 12, 16),), {"image_shape": [5, 6], "block_shape": [2, 3]}),
    Case("col2im", (_f(1, 8, 9),), {"image_shape": [5, 6], "block_shape": [2, 2], "strides": [2, 3],
                                    "pads": [0, 1, 1, 1]}, id="col2im-strides-pads"),
    Case("col2im", (_f(1, 6, 16),), {"image_shape": [6, 7], "block_shape": [2, 3], "dilations": [3, 2],
                                     "pads": [1, 0, 0, 1]}, id="col2im-dilations"),
    Case("col2im", (_f(1, 16, 4),), {"image_shape": [8, 8], "block_shape": [4, 4], "strides": [4, 4]},
         id="col2im-patches"),
    Case("col2im", (_f(1, 24, 6),), {"image_shape": [4, 5, 3], "block_shape": [2, 2, 3], "strides": [1, 2, 1]},
         id="col2im-3d"),
    Case("col2im", (((2, 6, 6), "int32"),), {"image_shape": [3, 3], "block_shape": [2, 1]}, id="col2im:int32"),
    Case("max_unpool", make=max_pooled((2, 3, 4, 6), (2, 2), (2, 2), (0, 0, 0, 0)),
         attrs={"kernel_size": [2, 2], "strides": [2, 2]}, id="max_unpool"),
    # overlapping windows: a value two windows picked is found in both
    Case("max_unpool", make=max_pooled((1, 2, 5, 7), (3, 3), (2, 2), (1, 1, 1, 1)),
         attrs={"kernel_size": [3, 3], "strides": [2, 2], "paddings": [1, 1, 1, 1]}, id="max_unpool-overlapping-pads"),
    # an odd input pooled by 2: out_shape restores its size, past the default (pooled - 1) * 2 + 2
    Case("max_unpool", make=max_pooled((1, 2, 5, 5), (2, 2), (2, 2), (0, 0, 0, 0), "int32"),
         attrs={"kernel_size": [2, 2], "strides": [2, 2], "out_shape": [5, 5]}, id="max_unpool-out_shape:int32"),
    Case("max_unpool", make=max_pooled((2, 2, 9), (3,), (3,), (0, 0)), attrs={"kernel_size": [3], "strides": [3]},
         id="max_unpool-1d"),
    Case("max_unpool", make=max_pooled((1, 1, 4, 4, 6), (2, 2, 2), (2, 2, 2), (0,) * 6),
         attrs={"kernel_size": [2, 2, 2], "strides": [2, 2, 2]}, id="max_unpool-3d"),
    # a roi partly outside the map (samples beyond it read 0, within a pixel of it the edge)
    _roi_align("roi_align-half_pixel-ratio2", _rois((10, 12), 5, 0.5, [[-3, -4, 30, 9]], 2, "int64"),
               output_height=3, output_width=4, sampling_ratio=2, spatial_scale=0.5),
    _roi_align("roi_align-max-output_half_pixel", _rois((9, 8), 4, 1.0, [[7, 6, 7.2, 6.1]], 2, "int32"),
               output_height=2, output_width=3, sampling_ratio=3, coordinate_transformation_mode="output_half_pixel",
               mode="max"),
    # adaptive grids of 1 to 4 samples; an inverted roi has none (0)
    _roi_align("roi_align-adaptive", _rois((12, 16), 6, 0.25, [[20, 20, 10, 10]], 3, "int64"),
               output_height=3, output_width=4, spatial_scale=0.25),
    _roi_align("roi_align-adaptive-max", _rois((12, 10), 4, 1.0, [[4, 4, 3, 3]], 1, "int64"),
               output_height=4, output_width=2, mode="max"),
    _roi_align("roi_align-adaptive-output_half_pixel", _rois((7, 11), 4, 1.0, [], 2, "int64"),
               output_height=2, output_width=2, coordinate_transformation_mode="output_half_pixel"),
]
