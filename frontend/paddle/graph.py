"""A Paddle inference program as both formats decode to it: inputs, parameters, ops, fetched values."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any


class PaddleImportError(ValueError):
    """A model that cannot be converted (bad file, missing shapes, an op used in an unsupported way)."""


@dataclass(frozen=True)
class Operand:
    """The values one input or output slot of an op names (legacy: slot `X` -> var names; PIR: one value id)."""

    slot: str
    names: tuple[str, ...]


@dataclass(frozen=True)
class PaddleOp:
    """One op: its type without dialect (`matmul_v2`, `matmul`, `builtin.combine`), slots and raw attributes."""

    type: str
    name: str  # for messages: the first output's name
    inputs: tuple[Operand, ...]
    outputs: tuple[Operand, ...]
    attrs: Mapping[str, Any]

    def __post_init__(self):
        object.__setattr__(self, "attrs", MappingProxyType(dict(self.attrs)))


@dataclass(frozen=True)
class Tensor:
    """A graph input or parameter: the key ops refer to it by, its Paddle name, dtype and declared shape."""

    key: str
    name: str
    dtype: str
    shape: tuple[int, ...]  # -1: dynamic


@dataclass(frozen=True)
class PaddleModel:
    """A decoded inference program in either format; `pir` selects how converters read op slots."""

    path: str
    pir: bool
    inputs: tuple[Tensor, ...]  # in feed order
    params: tuple[Tensor, ...]
    ops: tuple[PaddleOp, ...]  # feed/fetch/data/parameter ops removed
    outputs: tuple[str, ...]  # fetched value keys, in fetch order
