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

from cinn.utils import atomic_write


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
            return cls._load(path)
        except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile, xgb.core.XGBoostError) as e:
            raise ValueError(f"cost model {os.fspath(path)}: not a cinn cost model file ({type(e).__name__}: {e})") from None

    @classmethod
    def _load(cls, path: str | os.PathLike) -> CostModel:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            model = cls(meta["seed"], CostModelConfig(**meta["config"]))
            model._rng.bit_generator.state = meta["rng"]
            model._fitted_samples = meta["fitted_samples"]
            for i, w in enumerate(z["workloads"]):
                model._data[str(w)] = _WorkloadData(z[f"rows_{i}"], z[f"costs_{i}"])
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
