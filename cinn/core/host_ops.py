"""Host ops: ops whose output size is known only when they run (NonZero's count, NonMaxSuppression's selections).

No kernel computes them: the runtime runs each on the host between two stages of a program (see
cinn.core.symbolic.StagedProgram), on the arrays the first stage computed, and the size of what it returns binds a
symbol of the next stage. Their inputs are small next to a model's activations (masks, boxes and scores), and a
count must reach the host anyway before the next stage's buffers can be sized.
"""
from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cinn.core.ir import Attrs, NoAttrs

Dim = int | str  # a static size, or the symbol the op's run binds
# NonMaxSuppression's clusters of boxes up to this size compute their overlaps at once (4 MiB of booleans)
MATRIX_BOXES = 2048


class HostOpKind(enum.Enum):
    """The host ops."""

    NONZERO = "nonzero"
    NON_MAX_SUPPRESSION = "non_max_suppression"


@dataclass(frozen=True)
class NmsAttrs(Attrs):
    """NonMaxSuppression's box format: corners ([y1, x1, y2, x2], either diagonal) or [x_center, y_center, width,
    height]."""

    center_point_box: bool = False


@dataclass(frozen=True)
class HostOp:
    """One host op between two stages: it reads values by name (a stage's outputs; "" for an omitted optional
    input) and makes the next stage's inputs `outputs`; `name` is the model's node, for messages."""

    kind: HostOpKind
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: Attrs = field(default_factory=NoAttrs)
    name: str = ""

    def run(self, arrays: Sequence[np.ndarray | None]) -> list[np.ndarray]:
        """Its outputs from its inputs' arrays (None for an omitted one)."""
        return _IMPLEMENTATIONS[self.kind](arrays, self.attrs)


def output_dims(kind: HostOpKind, input_shapes: Sequence[tuple[int, ...] | None], symbol: str) -> tuple[Dim, ...]:
    """The dims of a host op's (single) output, `symbol` standing for the size its run gives."""
    if kind is HostOpKind.NONZERO:
        assert input_shapes[0] is not None
        return (max(len(input_shapes[0]), 1), symbol)  # a 0-d input counts as one element (as onnxruntime)
    return (symbol, 3)


def nonzero(arrays: Sequence[np.ndarray | None], attrs: Any) -> list[np.ndarray]:
    """The indices of x's nonzero elements (NaN counts), [rank, count] int64 in row-major order."""
    x = arrays[0]
    assert x is not None
    return [np.array(np.nonzero(np.atleast_1d(x)), dtype=np.int64).reshape(max(x.ndim, 1), -1)]


def non_max_suppression(arrays: Sequence[np.ndarray | None], attrs: Any) -> list[np.ndarray]:
    """ONNX NonMaxSuppression: per batch and class, boxes in order of falling score (ties: the lower index first),
    each kept unless a kept box of its class overlaps it by an IoU above the threshold; at most
    max_output_boxes_per_class per class. [selected, 3] int64 rows (batch, class, box), as onnxruntime orders them;
    IoUs are float32 computations in onnxruntime's order of operations."""
    boxes, scores, limit, iou, threshold = (list(arrays) + [None] * 5)[:5]
    assert boxes is not None and scores is not None
    max_out = max(int(_scalar(limit, 0)), 0)
    iou_threshold = np.float32(_scalar(iou, 0.0))
    if not 0 <= iou_threshold <= 1:
        raise ValueError(f"NonMaxSuppression: iou_threshold {float(iou_threshold)} must be in [0, 1]")
    selected = []
    for batch in range(boxes.shape[0]):
        extents = _extents(boxes[batch].astype(np.float32), attrs.center_point_box)
        for cls in range(scores.shape[1]):
            kept = _select(extents, scores[batch, cls].astype(np.float32), threshold, iou_threshold, max_out)
            selected += [(batch, cls, int(i)) for i in kept]
    return [np.array(selected, np.int64).reshape(-1, 3)]


def _scalar(array: np.ndarray | None, default: float) -> float:
    return default if array is None or array.size == 0 else array.reshape(-1)[0].item()


@dataclass(frozen=True)
class _Extents:
    """Each box's x and y intervals (float32) and area, as onnxruntime's IoU reads them."""

    x_min: np.ndarray
    x_max: np.ndarray
    y_min: np.ndarray
    y_max: np.ndarray
    area: np.ndarray

    @classmethod
    def of(cls, x_min: np.ndarray, x_max: np.ndarray, y_min: np.ndarray, y_max: np.ndarray) -> _Extents:
        """The extents of these intervals, with their areas."""
        return cls(x_min, x_max, y_min, y_max, (x_max - x_min) * (y_max - y_min))


def _extents(boxes: np.ndarray, center_point_box: bool) -> _Extents:
    if center_point_box:  # [x_center, y_center, width, height]
        half_w, half_h = boxes[:, 2] / np.float32(2), boxes[:, 3] / np.float32(2)
        return _Extents.of(boxes[:, 0] - half_w, boxes[:, 0] + half_w, boxes[:, 1] - half_h, boxes[:, 1] + half_h)
    return _Extents.of(np.minimum(boxes[:, 1], boxes[:, 3]), np.maximum(boxes[:, 1], boxes[:, 3]),
                    np.minimum(boxes[:, 0], boxes[:, 2]), np.maximum(boxes[:, 0], boxes[:, 2]))


def _select(e: _Extents, scores: np.ndarray, threshold: np.ndarray | None, iou: np.float32, max_out: int) -> list[int]:
    """One class's kept boxes in onnxruntime's order. Boxes whose x intervals do not overlap never suppress each
    other: the greedy pass runs within each cluster of overlapping intervals (torchvision's batched NMS offsets each
    class's boxes apart: one cluster per class, not one quadratic pass over every class's boxes), and the clusters'
    selections merge by score."""
    candidates = np.arange(len(scores))
    if threshold is not None:
        candidates = candidates[scores > np.float32(_scalar(threshold, 0.0))]
    if max_out == 0 or not len(candidates):
        return []
    kept = np.concatenate([_greedy(e, scores, cluster, iou, max_out) for cluster in _clusters(e, candidates)])
    order = np.lexsort((kept, -scores[kept]))  # falling score, then rising index
    return kept[order][:max_out].tolist()


def _clusters(e: _Extents, candidates: np.ndarray) -> list[np.ndarray]:
    """The candidates grouped so that boxes of different groups have disjoint x intervals (they cannot overlap)."""
    lo = np.minimum(e.x_min[candidates], e.x_max[candidates])
    hi = np.maximum(e.x_min[candidates], e.x_max[candidates])
    order = np.argsort(lo, kind="stable")
    reach = np.maximum.accumulate(hi[order])
    starts = np.flatnonzero(~(lo[order][1:] < reach[:-1])) + 1  # a box starting past every earlier one's end
    return np.split(candidates[order], starts)


def _greedy(e: _Extents, scores: np.ndarray, cluster: np.ndarray, iou: np.float32, max_out: int) -> np.ndarray:
    """Greedy NMS of one cluster: the highest-scored remaining box is kept and suppresses the rest it overlaps. The
    overlaps of a cluster of up to MATRIX_BOXES boxes are computed at once (a pass over the boxes then costs a few
    microseconds each); a larger one's, row by row as boxes are kept."""
    order = cluster[np.lexsort((cluster, -scores[cluster]))]
    if len(order) > MATRIX_BOXES:
        return _greedy_rows(e, order, iou, max_out)
    suppresses = _suppresses(e, order[:, None], order[None, :], iou)
    removed = np.zeros(len(order), bool)
    kept: list[int] = []
    for i in range(len(order)):
        if not removed[i]:
            kept.append(order[i])
            if len(kept) == max_out:
                break
            removed |= suppresses[i]
    return np.array(kept, np.int64)


def _greedy_rows(e: _Extents, order: np.ndarray, iou: np.float32, max_out: int) -> np.ndarray:
    """Greedy NMS over boxes in score order, each kept box's overlaps computed with the boxes still remaining."""
    kept: list[int] = []
    remaining = order
    while len(remaining) and len(kept) < max_out:
        kept.append(remaining[0])
        remaining = remaining[1:][~_suppresses(e, remaining[0], remaining[1:], iou)]
    return np.array(kept, np.int64)


def _suppresses(e: _Extents, kept: np.ndarray, other: np.ndarray, iou: np.float32) -> np.ndarray:
    """Whether kept boxes suppress other boxes (broadcast indices): onnxruntime's SuppressByIOU in float32."""
    ix = np.minimum(e.x_max[kept], e.x_max[other]) - np.maximum(e.x_min[kept], e.x_min[other])
    iy = np.minimum(e.y_max[kept], e.y_max[other]) - np.maximum(e.y_min[kept], e.y_min[other])
    inter = ix * iy
    area = e.area
    union = area[kept] + area[other] - inter
    with np.errstate(divide="ignore", invalid="ignore"):
        return (ix > 0) & (iy > 0) & (inter > 0) & (area[kept] > 0) & (area[other] > 0) & (union > 0) & \
            (inter / union > iou)


# each takes its own kind's Attrs (Any: a Callable's parameters are contravariant)
_IMPLEMENTATIONS: dict[HostOpKind, Callable[[Sequence[np.ndarray | None], Any], list[np.ndarray]]] = {
    HostOpKind.NONZERO: nonzero,
    HostOpKind.NON_MAX_SUPPRESSION: non_max_suppression,
}
