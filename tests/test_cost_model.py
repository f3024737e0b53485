"""Auto-tuner cost model: per-store features of scheduled kernels, and an XGBoost ranker that learns from measurements."""
from __future__ import annotations

import io
import json
import math
import os
import pathlib
import re
import subprocess
import sys
import zipfile

import numpy as np
import pytest
import tvm
from tvm.s_tir import Schedule

import cinn
from autotune import features
from autotune.cost_model import CostModel, CostModelConfig, NotACostModel
from cinn.core.target import parse_target
from cinn.runtime.machine import configure_threads
from frontend import NetBuilder
from tests.test_onnx_import import tiny_relu_model

TARGET = parse_target("llvm")


def matmul_func(m: int, k: int, n: int, relu: bool):
    """The PrimFunc cinn lowers for x(m,k) @ w(k,n) [+ relu]."""
    b = NetBuilder(f"mm{m}x{k}x{n}")
    y = b.matmul(b.create_input("float32", (m, k), "x"), b.create_input("float32", (k, n), "w"))
    _, (lowered,) = cinn.compiler.lower.lower_program(b.build([b.relu(y) if relu else y]))
    return lowered.func


def random_schedule(func, seed: int) -> Schedule:
    """A random tiling of the matmul block: perfect splits, inner-loop order, optional parallel/vectorize/unroll."""
    rng = np.random.default_rng(seed)
    sch = Schedule(tvm.IRModule({"main": func}), seed=seed + 1)
    block = sch.get_sblock("matmul")
    i, j, k = sch.get_loops(block)
    it = sch.split(i, sch.sample_perfect_tile(i, n=3, max_innermost_factor=16))
    jt = sch.split(j, sch.sample_perfect_tile(j, n=3, max_innermost_factor=32))
    kt = sch.split(k, sch.sample_perfect_tile(k, n=2, max_innermost_factor=16))
    inner = [kt[1], it[2], jt[2]]
    if rng.random() < 0.5:
        inner = [inner[p] for p in rng.permutation(3)]
    sch.reorder(it[0], jt[0], it[1], jt[1], kt[0], *inner)
    if rng.random() < 0.5:
        sch.parallel(sch.fuse(it[0], jt[0]))
    if inner[-1] == jt[2] and rng.random() < 0.7:
        sch.vectorize(jt[2])
    sch.annotate(sch.get_sblock("root"), "pragma_auto_unroll_max_step", int(rng.choice([0, 16, 64])))
    sch.decompose_reduction(block, kt[0])
    return sch


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Rank correlation (the data has no ties: costs and scores are continuous)."""
    return float(np.corrcoef(np.argsort(np.argsort(a)), np.argsort(np.argsort(b)))[0, 1])


def synthetic(rng: np.random.Generator, n: int) -> tuple[list[np.ndarray], list[float]]:
    """Random per-store features with a cost that depends on them, so a model has something to learn."""
    feats = [rng.random((int(rng.integers(1, 4)), features.num_features()), dtype=np.float32) for _ in range(n)]
    return feats, [1e-4 * (1 + f[:, 0].sum()) for f in feats]


# -- features -------------------------------------------------------------------------------------------


def test_features_of_scheduled_kernels():
    func = matmul_func(32, 64, 48, relu=True)
    schs = [random_schedule(func, s) for s in range(6)]
    rows = features.extract([s.mod for s in schs], TARGET)
    assert len(rows) == 6
    for r in rows:
        assert r.dtype == np.float32 and r.shape == (2, features.num_features())  # matmul update + relu stores
        assert np.isfinite(r).all()
    assert len({r.tobytes() for r in rows}) > 1  # different schedules, different features
    # a Schedule can be passed directly (saves re-parsing its module) and gives the same rows
    assert all(np.array_equal(a, b) for a, b in zip(rows, features.extract(schs, TARGET, num_threads=1), strict=True))


def test_features_of_unscheduled_and_cuda_kernels():
    func = matmul_func(16, 32, 8, relu=False)
    (cpu,) = features.extract([tvm.IRModule({"main": func})], TARGET)
    assert cpu.shape == (1, features.num_features())
    (gpu,) = features.extract([tvm.IRModule({"main": func})], parse_target("cuda -arch=sm_80"))
    assert np.isfinite(gpu).all() and gpu.shape == cpu.shape
    assert features.extract([], TARGET) == []


def test_feature_extraction_failure_gives_a_zero_row(monkeypatch):
    func = matmul_func(16, 32, 8, relu=False)
    good, bad = tvm.IRModule({"main": func}), tvm.IRModule({"main": func.with_attr("test.reject", 1)})
    real = features._extractor()

    class Failing:
        """Rejects the marked module, as TVM's extractor would one it cannot analyse."""

        feature_vector_length = real.feature_vector_length

        def extract_from(self, ctx, cands):
            if any("test.reject" in c.sch.mod["main"].attrs for c in cands):
                raise RuntimeError("unsupported")
            return real.extract_from(ctx, cands)

    monkeypatch.setattr(features, "_extractor", Failing)
    with pytest.warns(UserWarning, match="feature extraction failed"):
        rows = features.extract([good, bad], TARGET)
    assert rows[0].any() and rows[1].shape == (1, real.feature_vector_length) and not rows[1].any()


# -- model mechanics ------------------------------------------------------------------------------------


def test_random_but_seeded_until_warmed_up():
    feats, costs = synthetic(np.random.default_rng(0), 10)
    a, b, c = CostModel(seed=1), CostModel(seed=1), CostModel(seed=2)
    a.update("w", feats, costs)
    pa = a.predict("w", feats)
    assert pa.shape == (10,) and a.num_samples == 10 and a.fitted_samples == 0
    assert np.array_equal(pa, b.predict("w", feats)) and not np.array_equal(pa, c.predict("w", feats))


def test_retrains_after_enough_new_data():
    rng = np.random.default_rng(0)
    model = CostModel(config=CostModelConfig(warmup_samples=16, retrain_growth=0.5, retrain_every=1000, num_boost_round=5))
    seen = []
    for _ in range(8):
        model.update("w", *synthetic(rng, 4))
        seen.append(model.fitted_samples)
    # first fit at warm-up (16); then whenever the data grew by half since the last fit
    assert seen == [0, 0, 0, 16, 16, 24, 24, 24]


def test_failed_candidates_and_bad_costs():
    rng = np.random.default_rng(0)
    model = CostModel(config=CostModelConfig(warmup_samples=8, num_boost_round=5))
    feats, costs = synthetic(rng, 8)
    model.update("w", feats, costs[:6] + [math.inf, math.inf])
    assert model.fitted_samples == 8 and np.isfinite(model.predict("w", feats)).all()
    with pytest.raises(ValueError, match="positive"):
        model.update("w", feats[:1], [-1.0])
    with pytest.raises(ValueError, match="2 feature arrays but 1 costs"):
        model.update("w", feats[:2], [1.0])
    with pytest.raises(ValueError, match="3 features per store, earlier updates had"):
        model.update("w", [np.ones((2, 3), np.float32)], [1.0])
    with pytest.raises(ValueError, match="non-empty 2-D"):
        model.predict("w", [np.ones(features.num_features(), np.float32)])


def test_save_load_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    feats, costs = synthetic(rng, 40)
    cold = CostModel(seed=3)
    cold.update("a", feats[:10], costs[:10])
    cold.save(tmp_path / "cold.npz")
    assert np.array_equal(CostModel.load(tmp_path / "cold.npz").predict("a", feats), cold.predict("a", feats))

    model = CostModel(seed=3, config=CostModelConfig(warmup_samples=16, num_boost_round=10))
    model.update("a", feats[:20], costs[:20])
    model.update("b", feats[20:], costs[20:])
    path = tmp_path / "model"
    model.save(path)
    loaded = CostModel.load(path)
    assert loaded.config == model.config and loaded.num_samples == 40 and loaded.fitted_samples == model.fitted_samples
    assert np.array_equal(loaded.predict("a", feats), model.predict("a", feats))
    # the loaded model keeps learning from new measurements
    more, more_costs = synthetic(rng, 30)
    loaded.update("c", more, more_costs)
    assert loaded.num_samples == 70 and loaded.fitted_samples == 70



# -- bad model files (issue 49, finding 8): "not a cinn cost model file", never a traceback or a huge allocation ---


def _saved(tmp_path) -> pathlib.Path:
    """A small trained model, saved."""
    feats, costs = synthetic(np.random.default_rng(0), 20)
    model = CostModel(seed=3, config=CostModelConfig(warmup_samples=16, num_boost_round=5))
    model.update("a", feats, costs)
    model.save(tmp_path / "model.npz")
    return tmp_path / "model.npz"


def _members(path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as z:
        return {name: z.read(name) for name in z.namelist()}


def _rewritten(path, out, **changes: bytes):
    """A copy of a saved model's zip with some members' bytes replaced."""
    members = {**_members(path), **changes}
    with zipfile.ZipFile(out, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return out


def _written(path: pathlib.Path, data: bytes) -> pathlib.Path:
    path.write_bytes(data)
    return path


def _npy(descr: str, shape: tuple, data: bytes = b"") -> bytes:
    """A .npy file's bytes: a header declaring `descr` and `shape`, then `data`."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False, "shape": shape})
    return buf.getvalue() + data


def _meta(path, **config) -> bytes:
    """The meta member of a saved model with config values replaced."""
    with np.load(path) as z:
        meta = json.loads(str(z["meta"]))
    meta["config"].update(config)
    buf = io.BytesIO()
    np.save(buf, np.array(json.dumps(meta)))
    return buf.getvalue()


BAD_FILES = {
    "empty": lambda good, out: _written(out, b""),
    "random bytes": lambda good, out: _written(out, np.random.default_rng(0).bytes(4096)),
    "truncated zip": lambda good, out: _written(out, good.read_bytes()[: good.stat().st_size // 2]),
    "huge declared shape": lambda good, out: _rewritten(good, out, **{"rows_0.npy": _npy("<f4", (1, 2**40), b"0" * 64)}),
    "wrong dtype": lambda good, out: _rewritten(good, out, **{"costs_0.npy": _npy("<i8", (20,), bytes(160))}),
    "pickled objects": lambda good, out: _rewritten(good, out, **{"workloads.npy": _npy("|O", (1,), b"x" * 64)}),
    "unknown member": lambda good, out: _rewritten(good, out, **{"extra.npy": _npy("<f4", (1,), bytes(4))}),
    "costs not positive": lambda good, out: _rewritten(good, out, **{"costs_0.npy": _npy("<f8", (20,), bytes(160))}),
    "depth out of range": lambda good, out: _rewritten(good, out, **{"meta.npy": _meta(good, max_depth=10**6)}),
    "eta not a number": lambda good, out: _rewritten(good, out, **{"meta.npy": _meta(good, eta=float("nan"))}),
    "rounds negative": lambda good, out: _rewritten(good, out, **{"meta.npy": _meta(good, num_boost_round=-1)}),
    "threads a string": lambda good, out: _rewritten(good, out, **{"meta.npy": _meta(good, nthread="8")}),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_a_bad_model_file_is_not_a_cost_model(case, tmp_path):
    bad = BAD_FILES[case](_saved(tmp_path), tmp_path / "bad.npz")
    with pytest.raises(NotACostModel, match=rf"^not a cinn cost model file: {re.escape(str(bad))} \("):
        CostModel.load(bad)


def test_a_rewritten_valid_file_still_loads(tmp_path):
    """The checks refuse only what is wrong: the same members written again load, and predict alike."""
    good = _saved(tmp_path)
    again = CostModel.load(_rewritten(good, tmp_path / "again.npz"))
    feats, _ = synthetic(np.random.default_rng(1), 5)
    assert np.array_equal(again.predict("a", feats), CostModel.load(good).predict("a", feats))


def test_settings_out_of_range_are_refused():
    with pytest.raises(ValueError, match=r"max_depth = 0 is not in \[1, 32\]"):
        CostModelConfig(max_depth=0)
    with pytest.raises(ValueError, match="eta"):
        CostModelConfig(eta=math.inf)
    with pytest.raises(ValueError, match="warmup_samples"):
        CostModelConfig(warmup_samples=True)


@pytest.mark.parametrize("case", ["empty", "huge declared shape"])
def test_cinn_tune_exits_2_on_a_bad_cost_model(case, tmp_path):
    model = tiny_relu_model(tmp_path / "tiny.onnx")
    bad = BAD_FILES[case](_saved(tmp_path), tmp_path / "bad.npz")
    done = subprocess.run([sys.executable, "-m", "autotune", str(model), "--cost-model", str(bad), "--trials", "1",
                           "--log", str(tmp_path / "log.jsonl")], capture_output=True, text=True,
                          env={**os.environ, "CINN_CACHE_DIR": str(tmp_path / "cache")})
    assert done.returncode == 2, done.stderr
    assert f"not a cinn cost model file: {bad}" in done.stderr and "Traceback" not in done.stderr

# -- model quality on measured schedules ----------------------------------------------------------------


def measure(mod: tvm.IRModule, args) -> float:
    """Seconds per run, best of 3 repeats of ~0.3 ms each (min is robust to other processes on the cores)."""
    lib = tvm.compile(mod, target=TARGET.tvm())
    once = lib.mod.time_evaluator("main", tvm.cpu(), number=1, repeat=1)(*args).mean
    number = max(1, int(3e-4 / once))
    return min(lib.mod.time_evaluator("main", tvm.cpu(), number=number, repeat=3)(*args).results)


@pytest.fixture(scope="module")
def measured():
    """48 random schedules of each of two matmul workloads, measured on one thread: (workload, features, costs)."""
    configure_threads(1)  # one thread: stable timings on a shared machine
    rng = np.random.default_rng(0)
    out = []
    for m, k, n, relu in [(64, 128, 64, True), (128, 64, 128, False)]:
        func = matmul_func(m, k, n, relu)
        args = [tvm.runtime.tensor(rng.random(s, dtype=np.float32), tvm.cpu()) for s in [(m, k), (k, n), (m, n)]]
        schs = [random_schedule(func, s) for s in range(48)]
        out.append((f"{m}x{k}x{n}", features.extract(schs, TARGET), np.array([measure(s.mod, args) for s in schs])))
    return out


def test_model_ranks_held_out_schedules(measured):
    model = CostModel(seed=0, config=CostModelConfig(warmup_samples=32))
    rng = np.random.default_rng(0)
    held_out = []
    for workload, feats, costs in measured:
        order = rng.permutation(len(costs))
        train, test = order[:34], order[34:]
        model.update(workload, [feats[i] for i in train], costs[train])
        held_out.append((workload, [feats[i] for i in test], costs[test]))
    assert model.fitted_samples == 68
    rhos = [spearman(model.predict(w, f), -c) for w, f, c in held_out]
    # random scores give 0 on average; the trained ranker measured ~0.6-0.8 here
    assert np.mean(rhos) > 0.3, rhos
