"""Cost-model features: TVM MetaSchedule's per-store features (one row per buffer store) of scheduled modules."""
from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Sequence

import numpy as np
import tvm
from tvm.s_tir import Schedule
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule import _ffi_api as _ms_ffi

from cinn.core.target import Target


@functools.lru_cache(maxsize=1)
def _extractor() -> ms.feature_extractor.PerStoreFeature:
    return ms.feature_extractor.PerStoreFeature()


def num_features() -> int:
    """Length of one store's feature row."""
    return int(_extractor().feature_vector_length)


@functools.cache
def _context(target: Target, num_threads: int) -> ms.TuneContext:
    """A bare tuning context: the extractor reads only its target and thread count (extract_workload is off)."""
    # built through the FFI constructor: TuneContext.__init__ imports tvm.s_tir.tensor_intrin, which takes ~40 s
    ctx = ms.TuneContext.__new__(ms.TuneContext)
    ctx.__init_handle_by_constructor__(_ms_ffi.TuneContext, None, target.tvm(), None, None, "main", num_threads, -1, None)
    return ctx


def extract(
    mods: Sequence[tvm.IRModule | Schedule], target: Target, num_threads: int | None = None
) -> list[np.ndarray]:
    """Per scheduled module (a Schedule's sch.mod, entry 'main'), a float32 array (n_stores, num_features()).

    Passing the Schedules themselves saves re-parsing each module (about a third of the time);
    num_threads defaults to all cores.
    """
    if not mods:
        return []
    # the extractor reads only each candidate's module: argument info is left empty
    cands = [ms.MeasureCandidate(_schedule(m), []) for m in mods]
    ctx = _context(target, num_threads or os.cpu_count() or 1)
    try:
        return [_rows(f) for f in _extractor().extract_from(ctx, cands)]
    except (RuntimeError, ValueError, TypeError):
        # one bad module fails the whole batch: redo one by one so only the bad ones lose their features
        return [_extract_one(ctx, cand) for cand in cands]


def _schedule(mod: tvm.IRModule | Schedule) -> Schedule:
    return mod if isinstance(mod, Schedule) else Schedule(mod, enable_check=False)


def _extract_one(ctx: ms.TuneContext, cand: ms.MeasureCandidate) -> np.ndarray:
    """Features of one candidate; a module the extractor rejects gets one zero row (and a warning)."""
    try:
        return _rows(_extractor().extract_from(ctx, [cand])[0])
    except (RuntimeError, ValueError, TypeError) as err:
        warnings.warn(f"feature extraction failed, using a zero row: {err}", stacklevel=3)
        return np.zeros((1, num_features()), np.float32)


def _rows(tensor) -> np.ndarray:
    rows = tensor.numpy().astype(np.float32)
    # a module without stores still needs one row so every candidate has a feature vector
    return rows if rows.shape[0] else np.zeros((1, num_features()), np.float32)
