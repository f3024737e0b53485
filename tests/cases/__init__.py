"""Op test rows: one module per op family, each with CASES: list[Case]."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Case:
    """One op test row: input shapes/dtypes (or a generator of arrays), attrs and tolerances."""

    op: str
    inputs: tuple[tuple[tuple[int, ...], str], ...] = ()
    attrs: dict[str, Any] = field(default_factory=dict)
    make: Callable[[np.random.Generator], list[np.ndarray]] | None = None  # custom inputs (e.g. valid indices)
    constant_inputs: tuple[int, ...] = ()  # input positions passed as constants instead of feeds
    rtol: float | None = None
    atol: float | None = None
    id: str = ""

    def tolerance(self, dtype: str) -> tuple[float, float]:
        """(rtol, atol) for an output of this dtype: the case's own where it sets one (0 included), else the dtype's."""
        rtol, atol = TOLERANCE.get(dtype, (0.0, 0.0))
        return (rtol if self.rtol is None else self.rtol), (atol if self.atol is None else self.atol)

    def arrays(self, rng: np.random.Generator) -> list[np.ndarray]:
        """The input arrays of this case."""
        if self.make is not None:
            return self.make(rng)
        return [random_array(rng, shape, dtype) for shape, dtype in self.inputs]


def random_array(rng: np.random.Generator, shape, dtype: str) -> np.ndarray:
    """Random data suited to the dtype (floats in [-2, 2), small ints, random bools)."""
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if np.dtype(dtype).kind in "iu":
        return rng.integers(-5, 6, size=shape).astype(dtype)
    return (rng.random(shape) * 4 - 2).astype(dtype)


def positive(shape, dtype="float32"):
    """An input maker for ops needing positive inputs (log, sqrt...)."""
    return lambda rng: [(rng.random(shape) * 3 + 0.1).astype(dtype)]


TOLERANCE = {"float32": (1e-5, 1e-5), "float16": (1e-2, 1e-2), "float64": (1e-10, 1e-10)}
