"""The tuner's cost model: XGBoost ranking of schedule candidates per workload, from per-store features."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import xgboost as xgb
from numpy.lib import format as npy

from cinn.core.utils import atomic_write


@dataclass(frozen=True)
class CostModelConfig:
    """Training settings of the cost model."""

    # below this many measured candidates, predictions are random scores; one round of 16 is enough to start
    # ranking: our space is the default schedule with its knobs opened, so even a small model orders it usefully
    warmup_samples: int = 16
    retrain_growth: float = 0.5  # refit once the data grew by this fraction since the last fit ...
    retrain_every: int = 256  # ... or by this many samples, whichever comes first
    num_boost_round: int = 100
    max_depth: int = 5
    eta: float = 0.1
    min_child_weight: float = 1.0
    pairs_per_sample: int = 32  # random pairs per candidate for the pairwise loss
    nthread: int = 1  # the training sets are small: one thread is enough, and leaves the cores to measurement

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value, (low, high) = getattr(self, f.name), _RANGES[f.name]
            exact = type(value) is int if isinstance(low, int) else type(value) in (int, float)
            if not (exact and low <= value <= high):
                raise ValueError(f"cost model setting {f.name} = {value!r} is not in [{low}, {high}]")


# the range of each setting (ints where the bounds are): what trains in bounded time and memory
_RANGES: dict[str, tuple[float, float]] = {
    "warmup_samples": (1, 1 << 20), "retrain_growth": (1e-3, 1e3), "retrain_every": (1, 1 << 20),
    "num_boost_round": (1, 10_000), "max_depth": (1, 32), "eta": (1e-6, 1.0), "min_child_weight": (0.0, 1e6),
    "pairs_per_sample": (1, 1024), "nthread": (1, 1024),
}


class NotACostModel(ValueError):
    """A file that is not a cost model saved by cinn, or one that would not load in bounded memory."""


# the arrays of a saved model and their dtypes (text: any length); per workload i, rows_i and costs_i
_ARRAYS = {"meta": (np.dtype("U"), 0), "workloads": (np.dtype("U"), 1), "booster": (np.dtype(np.uint8), 1),
           "rows": (np.dtype(np.float32), 2), "costs": (np.dtype(np.float64), 1)}


class CostModel:
    """Ranks candidates of one workload: higher predicted score = predicted faster."""

    def __init__(self, seed: int = 0, config: CostModelConfig = CostModelConfig()):
        self.seed = seed
        self.config = config
        self._rng = np.random.default_rng(seed)
        self._data: dict[str, _WorkloadData] = {}
        self._booster: xgb.Booster | None = None
        self._fitted_samples = 0

    @property
    def num_samples(self) -> int:
        """Measured candidates seen, over all workloads."""
        return sum(len(d.costs) for d in self._data.values())

    @property
    def fitted_samples(self) -> int:
        """Samples the current XGBoost model was trained on (0 while predictions are random)."""
        return self._fitted_samples

    def update(self, workload: str, features: Sequence[np.ndarray], costs: Sequence[float]) -> None:
        """Add measured candidates (costs in seconds; math.inf = failed) and refit when enough data arrived."""
        if len(features) != len(costs):
            raise ValueError(f"cost model update: {len(features)} feature arrays but {len(costs)} costs")
        if len(costs) == 0:
            return
        if any(not c > 0 for c in costs):
            raise ValueError(f"cost model update: costs must be positive seconds or math.inf, got {list(costs)}")
        rows = aggregate(features)
        known = next(iter(self._data.values()), None)
        if known is not None and known.rows.shape[1] != rows.shape[1]:
            raise ValueError(
                f"cost model update: {features[0].shape[1]} features per store, earlier updates had {known.store_columns}"
            )
        prev = self._data.get(workload)
        self._data[workload] = _WorkloadData(rows, np.asarray(costs, np.float64)) if prev is None else prev.extended(rows, costs)
        if self._should_fit():
            self._fit()

    def predict(self, workload: str, features: Sequence[np.ndarray]) -> np.ndarray:
        """Scores of candidates of `workload` (comparable within one workload): seeded random until warmed up."""
        if self._booster is None:
            return self._rng.random(len(features))
        if len(features) == 0:
            return np.zeros(0)
        return self._booster.predict(xgb.DMatrix(aggregate(features)))

    def save(self, path: str | os.PathLike) -> None:
        """Write the model, its training data and its random state to one .npz file."""
        arrays = {
            "meta": np.array(json.dumps(self._meta())),
            "workloads": np.array(list(self._data), dtype=str),
            "booster": np.frombuffer(bytes(self._booster.save_raw("ubj")), np.uint8) if self._booster else np.zeros(0, np.uint8),
        }
        for i, d in enumerate(self._data.values()):
            arrays[f"rows_{i}"], arrays[f"costs_{i}"] = d.rows, d.costs
        def write(tmp: str) -> None:
            with open(tmp, "wb") as f:  # a file object keeps np.savez from appending ".npz" to the name
                np.savez(f, **arrays)  # type: ignore[arg-type]  # numpy's stub types **kwds as allow_pickle

        atomic_write(os.fspath(path), write)  # a crash mid-write must not leave a file every later run chokes on

    @classmethod
    def load(cls, path: str | os.PathLike) -> CostModel:
        """A model saved by save(): it predicts as before and keeps learning from further updates."""
        try:
            return cls._load(read_arrays(path))
        except (OSError, EOFError, ValueError, KeyError, TypeError, RecursionError, zipfile.BadZipFile,
                xgb.core.XGBoostError) as e:
            raise NotACostModel(f"not a cinn cost model file: {os.fspath(path)} ({type(e).__name__}: {e})") from None

    @classmethod
    def _load(cls, z: dict[str, np.ndarray]) -> CostModel:
        meta = json.loads(str(z["meta"]))
        if type(meta["fitted_samples"]) is not int or meta["fitted_samples"] < 0:
            raise ValueError(f"fitted_samples {meta['fitted_samples']!r} is not a count")
        model = cls(meta["seed"], CostModelConfig(**meta["config"]))
        model._rng.bit_generator.state = meta["rng"]
        model._fitted_samples = meta["fitted_samples"]
        for i, w in enumerate(z["workloads"]):
            model._data[str(w)] = _WorkloadData.checked(z[f"rows_{i}"], z[f"costs_{i}"])
        if len({d.rows.shape[1] for d in model._data.values()}) > 1:
            raise ValueError("workloads with different feature widths")
        if z["booster"].size:
            model._booster = xgb.Booster(model_file=bytearray(z["booster"].tobytes()))
        return model

    def _meta(self) -> dict:
        return {
            "seed": self.seed,
            "config": dataclasses.asdict(self.config),
            "rng": self._rng.bit_generator.state,
            "fitted_samples": self._fitted_samples,
        }

    def _should_fit(self) -> bool:
        n = self.num_samples
        if n < self.config.warmup_samples:
            return False
        if self._booster is None:
            return True
        new = n - self._fitted_samples
        return new >= min(self.config.retrain_every, self.config.retrain_growth * self._fitted_samples)

    def _fit(self) -> None:
        # one query group per workload: the ranking objective only compares candidates of the same workload,
        # whose labels share one scale (min_cost / cost)
        data = list(self._data.values())
        dtrain = xgb.DMatrix(
            np.concatenate([d.rows for d in data]),
            label=np.concatenate([d.labels() for d in data]),
            qid=np.repeat(np.arange(len(data)), [len(d.costs) for d in data]),
        )
        c = self.config
        params = {
            # pairwise ranking: the search only needs the order of candidates within a workload, not their costs
            "objective": "rank:pairwise",
            # pairs drawn over the whole list ('topk', the default, trains on the top few only and ranked worse here)
            "lambdarank_pair_method": "mean",
            "lambdarank_num_pair_per_sample": c.pairs_per_sample,
            "max_depth": c.max_depth,
            "eta": c.eta,
            "min_child_weight": c.min_child_weight,
            "tree_method": "hist",
            "nthread": c.nthread,
            "seed": self.seed,
        }
        self._booster = xgb.train(params, dtrain, num_boost_round=c.num_boost_round)
        self._fitted_samples = self.num_samples


@dataclass(frozen=True)
class _WorkloadData:
    """Aggregated feature rows and measured costs of one workload's candidates."""

    rows: np.ndarray  # (n, aggregated features) float32
    costs: np.ndarray  # (n,) seconds; inf = failed

    @property
    def store_columns(self) -> int:
        """Per-store feature count the rows were aggregated from (see aggregate)."""
        return (self.rows.shape[1] - 1) // 2

    @classmethod
    def checked(cls, rows: np.ndarray, costs: np.ndarray) -> _WorkloadData:
        """Data read from a file: one positive cost (seconds, or inf) per row."""
        if len(rows) != len(costs) or not np.all(costs > 0):
            raise ValueError(f"{len(rows)} feature rows but {len(costs)} costs, or a cost not positive")
        return cls(rows, costs)

    def extended(self, rows: np.ndarray, costs: Sequence[float]) -> _WorkloadData:
        return _WorkloadData(np.concatenate([self.rows, rows]), np.concatenate([self.costs, np.asarray(costs, np.float64)]))

    def labels(self) -> np.ndarray:
        """min_cost / cost: 1 for the fastest candidate, 0 for failed ones."""
        best = self.costs.min()
        # x / inf is 0, so failed candidates need no special case; all failed: all labels 0
        return (best / self.costs if math.isfinite(best) else np.zeros_like(self.costs)).astype(np.float32)


def aggregate(features: Sequence[np.ndarray]) -> np.ndarray:
    """One fixed-length row per candidate from its (n_stores, F) per-store features."""
    # sum = all stores' work together, max = the dominant store, plus the store count; this lets xgboost's built-in
    # ranking objective work on one vector per candidate (MetaSchedule instead sums per-store scores in a custom loss)
    for f in features:
        if f.ndim != 2 or f.shape[0] == 0 or f.shape[1] != features[0].shape[1]:
            raise ValueError(f"cost model: per-store features must be non-empty 2-D arrays of one width, got shape {f.shape}")
    return np.stack([np.concatenate([f.sum(0), f.max(0), [math.log2(1 + len(f))]]) for f in features]).astype(np.float32)


def read_arrays(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The arrays of a saved model (np.savez: an uncompressed zip of .npy files), each checked against _ARRAYS by its
    header before its data is read, which must fit in its zip member: a header cannot make it allocate more than the
    file holds (np.load trusts a declared shape)."""
    arrays = {}
    with zipfile.ZipFile(path) as z:
        for info in z.infolist():
            name = info.filename.removesuffix(".npy")
            dtype, ndim = _ARRAYS.get(name.rsplit("_", 1)[0] if name[-1:].isdigit() else name, (None, 0))
            if dtype is None or info.compress_type != zipfile.ZIP_STORED or info.file_size > os.path.getsize(path):
                raise ValueError(f"unexpected member {info.filename!r} (or compressed, or larger than the file)")
            with z.open(info) as f:
                version = npy.read_magic(f)
                if version not in ((1, 0), (2, 0)):
                    raise ValueError(f"{info.filename}: .npy format version {version}")
                header = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0
                shape, fortran, found = header(f)
                nbytes = math.prod(shape) * found.itemsize
                if found.kind != dtype.kind or (dtype.kind != "U" and found != dtype) or len(shape) != ndim \
                        or fortran or nbytes > info.file_size:
                    raise ValueError(f"{info.filename}: {found} {shape} where {dtype} with {ndim} axes is expected "
                                     f"in {info.file_size} bytes")
                data = f.read(nbytes)
            if len(data) != nbytes:
                raise ValueError(f"{info.filename}: truncated")
            arrays[name] = np.frombuffer(data, found).reshape(shape)
    return arrays
