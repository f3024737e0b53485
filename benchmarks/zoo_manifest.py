"""The zoo's manifest: each exported model file, its inputs and how to fill them, its exporter and its source.

The exporter (`benchmarks.zoo`, in an environment with torch) writes it; cinn-bench `--zoo` and the zoo check
(`benchmarks.zoo_check`, in cinn's environment) read it. So this module needs numpy alone: no torch, no cinn.
"""
from __future__ import annotations

import dataclasses
import enum
import json
import os
import pathlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

MANIFEST = "manifest.json"
FORMAT = 1
SEED = 0
OPSET = 17
# the largest relative difference (to the output's largest magnitude) allowed between two engines' outputs; an
# output "changes with its input" when two random inputs move it by more, else an agreement would prove nothing
RTOL = 1e-3

Dim = int | str  # a str dim is symbolic: its size comes from a binding


class Exporter(enum.StrEnum):
    """Which torch.onnx exporter wrote a file."""

    DYNAMO = "dynamo"
    TORCHSCRIPT = "torchscript"


class Fill(enum.StrEnum):
    """How an input is filled with random data."""

    NORMAL = "normal"  # floats from the standard normal: images, audio, spectrogram features
    TOKENS = "tokens"  # integers uniform in [0, high): token ids
    ONES = "ones"  # an attention mask that attends to every token


@dataclass(frozen=True)
class ZooInput:
    """One graph input: its shape as the file has it (str dims symbolic), dtype and fill."""

    name: str
    shape: tuple[Dim, ...]
    dtype: str
    fill: Fill
    high: int = 0  # TOKENS: the exclusive upper bound (the vocabulary size)

    def shape_at(self, binding: Mapping[str, int]) -> tuple[int, ...]:
        """The static shape where the symbols take the binding's sizes."""
        return tuple(binding[d] if isinstance(d, str) else d for d in self.shape)

    def random(self, rng: np.random.Generator, binding: Mapping[str, int]) -> np.ndarray:
        """Random data of this input at a binding."""
        shape = self.shape_at(binding)
        if self.fill is Fill.TOKENS:
            return rng.integers(0, self.high, shape).astype(self.dtype)
        if self.fill is Fill.ONES:
            return np.ones(shape, self.dtype)
        return rng.standard_normal(shape).astype(self.dtype)


def random_feeds(inputs: Sequence[ZooInput], seed: int, binding: Mapping[str, int]) -> dict[str, np.ndarray]:
    """Seeded random data for the inputs at a binding, by name."""
    rng = np.random.default_rng(seed)
    return {i.name: i.random(rng, binding) for i in inputs}


@dataclass(frozen=True)
class Source:
    """Where a model came from: the library, its version, and the constructor call (random weights, nothing loaded)."""

    library: str
    version: str
    constructor: str


@dataclass(frozen=True)
class ZooEntry:
    """One exported model."""

    name: str
    file: str  # relative to the manifest's directory
    source: Source
    exporter: Exporter
    inputs: tuple[ZooInput, ...]
    outputs: tuple[str, ...]
    # the sizes of the symbols to run a dynamic model at, the first the export's own; a static model has one, empty
    bindings: tuple[Mapping[str, int], ...] = ({},)
    exporter_note: str = ""  # why the dynamo exporter's file was not taken
    reseeded: tuple[str, ...] = ()  # weights the library initializes to zeros, drawn at random instead
    calibrated_batchnorms: int = 0  # BatchNorm layers whose running statistics were measured on random inputs

    @property
    def dynamic(self) -> bool:
        return any(isinstance(d, str) for i in self.inputs for d in i.shape)

    def shapes(self, binding: Mapping[str, int] | None = None) -> dict[str, tuple[int, ...]]:
        """Each input's static shape at a binding (default: the export's)."""
        b = self.bindings[0] if binding is None else binding
        return {i.name: i.shape_at(b) for i in self.inputs}

    def feeds(self, seed: int, binding: Mapping[str, int] | None = None) -> dict[str, np.ndarray]:
        """Seeded random inputs at a binding (default: the export's)."""
        return random_feeds(self.inputs, seed, self.bindings[0] if binding is None else binding)


@dataclass(frozen=True)
class Manifest:
    """A zoo directory's models, with the versions of the tools that wrote them."""

    models: tuple[ZooEntry, ...]
    versions: Mapping[str, str] = dataclasses.field(default_factory=dict)
    opset: int = OPSET
    seed: int = SEED

    def entry(self, name: str) -> ZooEntry:
        """The model of that name; ValueError naming the known ones."""
        for e in self.models:
            if e.name == name:
                return e
        raise ValueError(f"no model {name!r} in the zoo; it has: {', '.join(e.name for e in self.models)}")

    def merged(self, entries: Sequence[ZooEntry], versions: Mapping[str, str]) -> Manifest:
        """This manifest with `entries` added or replacing those of the same names."""
        new = {e.name for e in entries}
        return Manifest(tuple(e for e in self.models if e.name not in new) + tuple(entries), versions, self.opset, self.seed)


def manifest_path(directory: str | os.PathLike) -> pathlib.Path:
    return pathlib.Path(directory) / MANIFEST


def _input(d: Mapping[str, Any]) -> ZooInput:
    return ZooInput(d["name"], tuple(d["shape"]), d["dtype"], Fill(d["fill"]), int(d.get("high", 0)))


def _entry(d: Mapping[str, Any]) -> ZooEntry:
    return ZooEntry(d["name"], d["file"], Source(**d["source"]), Exporter(d["exporter"]),
                    tuple(_input(i) for i in d["inputs"]), tuple(d["outputs"]),
                    tuple(dict(b) for b in d.get("bindings", [{}])), d.get("exporter_note", ""),
                    tuple(d.get("reseeded", ())), int(d.get("calibrated_batchnorms", 0)))


def read_manifest(directory: str | os.PathLike) -> Manifest:
    """The manifest of a zoo directory; OSError when there is none, ValueError when it does not read as one."""
    path = manifest_path(directory)
    if not path.is_file():
        raise FileNotFoundError(f"no zoo manifest {path} (python -m benchmarks.zoo export DIR writes one)")
    with open(path) as f:
        try:
            d = json.load(f)
            if d.get("format") != FORMAT:
                raise ValueError(f"format {d.get('format')!r}, expected {FORMAT}")
            return Manifest(tuple(_entry(e) for e in d["models"]), dict(d.get("versions", {})), int(d["opset"]),
                            int(d["seed"]))
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise ValueError(f"{path}: not a zoo manifest ({err})") from None


def write_manifest(directory: str | os.PathLike, manifest: Manifest) -> pathlib.Path:
    """Write the manifest (whole, or not at all: a crash leaves the previous one)."""
    path = manifest_path(directory)
    tmp = path.with_suffix(".json.tmp")
    with open(tmp, "w") as f:
        json.dump({"format": FORMAT, **dataclasses.asdict(manifest)}, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)
    return path


def relative_difference(got: Sequence[np.ndarray], want: Sequence[np.ndarray]) -> float:
    """The largest difference of each output pair over the largest magnitude of the wanted output, the worst pair's;
    infinite where the outputs' number or shapes differ."""
    if len(got) != len(want) or any(np.shape(g) != np.shape(w) for g, w in zip(got, want, strict=True)):
        return float("inf")
    worst = 0.0
    for g, w in zip(got, want, strict=True):
        g64, w64 = np.asarray(g, np.float64), np.asarray(w, np.float64)
        diff = float(np.max(np.abs(g64 - w64), initial=0.0))
        if np.isnan(diff):  # a NaN on either side (np.max propagates it) is no agreement
            return float("inf")
        scale = max(float(np.max(np.abs(w64), initial=0.0)), float(np.finfo(np.float32).tiny))
        worst = max(worst, diff / scale)
    return worst


def changes(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> bool:
    """Whether outputs for two inputs differ by more than RTOL (their number or shapes differing counts)."""
    return relative_difference(a, b) > RTOL


def error_line(err: BaseException, innermost: bool = False) -> str:
    """What went wrong in one line, without terminal colours; innermost: its innermost cause's (torch.onnx wraps the
    error that tells)."""
    while innermost and err.__cause__ is not None:
        err = err.__cause__
    lines = re.sub(r"\x1b\[[0-9;]*m", "", str(err)).strip().splitlines()
    return f"{type(err).__name__}: {lines[0] if lines else ''}"[:300]
