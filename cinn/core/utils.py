"""Small helpers shared by every layer: seeded random tensors, median timing, atomic file writes."""
from __future__ import annotations

import hashlib
import os
import pathlib
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from cinn.core.ir import Value


def random_array(rng: np.random.Generator, shape: Sequence[int], dtype: str) -> np.ndarray:
    """Floats uniform in [-1, 1), integers in {0, 1} (valid indices on any non-empty axis), random bools."""
    kind = np.dtype(dtype).kind
    if kind == "f":
        return rng.uniform(-1.0, 1.0, tuple(shape)).astype(dtype)
    if kind == "b":
        return rng.integers(0, 2, tuple(shape)).astype(bool)
    return rng.integers(0, 2, tuple(shape)).astype(dtype)


def random_arrays(specs: Sequence[tuple[Sequence[int], str]], seed: int) -> list[np.ndarray]:
    """One seeded random array per (shape, dtype)."""
    rng = np.random.default_rng(seed)
    return [random_array(rng, shape, dtype) for shape, dtype in specs]


def random_feeds(inputs: Sequence[Value], seed: int) -> dict[str, np.ndarray]:
    """Seeded random data for a program's inputs, by name."""
    return dict(zip([v.name for v in inputs], random_arrays([(v.shape, v.dtype) for v in inputs], seed), strict=True))


def wall_seconds(run: Callable[[], object]) -> Callable[[], float]:
    """A sampler timing one call of `run` with the wall clock."""

    def sample() -> float:
        t0 = time.perf_counter()
        run()
        return time.perf_counter() - t0

    return sample


def interleaved_medians(samplers: Mapping[str, Callable[[], float]], repeat: int, warmup: int) -> dict[str, float]:
    """Median of `repeat` samples per sampler, after `warmup` unrecorded ones; each round visits every sampler in a
    rotating order, so a change of machine load hits all of them alike."""
    labels = list(samplers)
    for label in labels:
        for _ in range(warmup):
            samplers[label]()
    samples: dict[str, list[float]] = {label: [] for label in labels}
    for r in range(repeat):
        for label in labels[r % len(labels) :] + labels[: r % len(labels)]:
            samples[label].append(samplers[label]())
    return {label: float(np.median(s)) for label, s in samples.items()}


# Right after a compile that kept the cores busy (cinn's build workers), runs are slower for a moment (see
# docs/notes/measurement-noise.md). Latencies reported to the user are taken after this long of untimed runs.
SETTLE_S = 1.0


def median_seconds(run: Callable[[], object], repeat: int, warmup: int, settle_s: float = 0.0) -> float:
    """Median wall time of one call of `run`, after `warmup` untimed calls that last at least `settle_s` seconds."""
    deadline = time.perf_counter() + settle_s
    while time.perf_counter() < deadline:
        run()
    return interleaved_medians({"run": wall_seconds(run)}, repeat, warmup)["run"]


def atomic_write(path: str, write: Callable[[str], object]) -> None:
    """Write through a temporary file and rename, so readers never see a torn file."""
    fd, tmp = tempfile.mkstemp(suffix=os.path.splitext(path)[1], dir=os.path.dirname(path))
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def file_digest(path: str | os.PathLike) -> str:
    """The SHA-256 of a file's bytes (a name for what it holds; cinn.runtime.trust's keyed digests say who wrote it)."""
    return hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()
