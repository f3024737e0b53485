"""Tuner benchmark (benchmarks/tune_bench.py): workloads, report, CLI, and a real MetaSchedule smoke run."""
from __future__ import annotations

import csv
import os
from collections import Counter

import pytest

from benchmarks import tune_bench
from benchmarks.report import render_table, write_rows_csv
from benchmarks.tune_bench import (
    WORKLOADS,
    BenchSettings,
    Candidate,
    NumpyRate,
    Retimed,
    RetimePlan,
    Row,
    TuneOutcome,
    Tuner,
    get_workload,
    main,
    numpy_rate,
    retime,
    run_tuner,
    tune_columns,
    write_tune_plot,
)
from benchmarks.tune_worker import workload_task
from cinn.core.target import parse_target
from tests.timeouts import scaled

TINY = "matmul_64"


def _settings(**kw) -> BenchSettings:
    return BenchSettings(parse_target("llvm"), **({"repeat": 3, "warmup": 1, "timeout": scaled(600.0)} | kw))


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_workload_is_one_kernel(name):
    task = workload_task(get_workload(name))
    assert task.workload == workload_task(get_workload(name)).workload  # deterministic: both tuners get this PrimFunc


def _rows() -> list[Row]:
    ok = Row("matmul_64", 64, 2e-3, {Tuner.OURS: 1e-3, Tuner.MS: 2e-3}, {Tuner.OURS: 10.0, Tuner.MS: 40.0}, 2.0 * 64**3,
             NumpyRate(50.0, "openblas 0.3.30 SkylakeX"))
    failed = Row("softmax", 64, 1e-4, {Tuner.MS: 5e-5}, {Tuner.MS: 30.0}, errors=("ours tuning failed: boom",))
    return [ok, failed]


def test_table_shows_ratios_and_failures():
    header, _, ok, failed = render_table(tune_columns(), _rows()).splitlines()
    assert "ours/MS" in header and "tune ours/MS" in header and "ours/numpy" in header
    assert "0.50" in ok and "0.25" in ok  # latency and tuning-time ratios
    assert f"{2.0 * 64**3 / 1e-3 / 1e9:.1f}" in ok and "SkylakeX" in ok  # our GFLOP/s, the BLAS kernel
    assert "ours tuning failed: boom" in failed and failed.split()[3] == "-"


def test_csv_and_plot(tmp_path):
    path = tmp_path / "out" / "tune.csv"
    write_rows_csv(tune_columns(), _rows(), str(path))
    with open(path) as f:
        rows = list(csv.DictReader(f))
    assert [r["workload"] for r in rows] == ["matmul_64", "softmax"]
    assert float(rows[0]["ours/MS"]) == pytest.approx(0.5) and rows[1]["ours ms"] == ""
    assert rows[0]["status"] == "ok"
    png = tmp_path / "tune.png"
    write_tune_plot(_rows(), str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_help(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "--trials" in out and "--workloads" in out and "conv3x3" in out


@pytest.mark.parametrize("argv, message", [(["--workloads", "nope"], "unknown"), (["--tuners", "ours,autotvm"], "--tuners"),
                                           (["--trials", "0"], "--trials")])
def test_cli_rejects_bad_arguments(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_failed_tuner_is_reported_with_exit_1(monkeypatch, capsys):
    def fake_tuner(tuner, workload, trials, settings):
        if tuner is Tuner.OURS:
            raise RuntimeError("boom")
        return TuneOutcome(tuner, workload, trials, "key", 1.0, None, 1e-3)

    monkeypatch.setattr(tune_bench, "run_tuner", fake_tuner)
    monkeypatch.setattr(tune_bench, "retime", lambda plan, settings: Retimed({c.label: 1e-3 for c in plan.candidates}))
    monkeypatch.setattr(tune_bench, "numpy_rate", lambda workload, settings: NumpyRate(10.0, "openblas"))
    assert main(["--workloads", TINY, "--trials", "2"]) == 1
    out = capsys.readouterr().out
    assert "ours tuning failed: boom" in out


def test_outcome_keeps_failure_counts_through_json():
    out = TuneOutcome(Tuner.OURS, TINY, 4, "key", 1.0, None, None, {"run: timeout": 2})
    assert TuneOutcome.from_json(out.to_json()) == out


def test_our_tuner_counts_failures_by_kind(tmp_path, monkeypatch):
    """tune_ours counts the log's failed records by their FailureKind, not by parsing messages."""
    from autotune.database import FailureKind, Record, append_records
    from benchmarks import tune_worker

    log = tmp_path / "tuning.jsonl"
    recs = [Record("w", "llvm", "[[], []]", (), error="after 10 s", failure=FailureKind.RUN_TIMEOUT),
            Record("w", "llvm", "[[], []]", (), error="after 10 s", failure=FailureKind.RUN_TIMEOUT),
            Record("w", "llvm", "[[], []]", (), error="max abs err 0.5", failure=FailureKind.WRONG_RESULT),
            Record("w", "llvm", "[[], []]", (1e-3,))]
    append_records(log, recs)
    assert Counter(str(r.failure) for r in tune_worker.read_records(log) if r.failed) == {
        "run_timeout": 2, "wrong_result": 1}


def test_retime_and_numpy_workers():
    settings = _settings()
    plan = RetimePlan(TINY, str(settings.target), 3, 1, (Candidate("default", None), Candidate("again", None)))
    timed = retime(plan, settings)
    assert not timed.errors and set(timed.median_s) == {"default", "again"} and all(s > 0 for s in timed.median_s.values())
    rate = numpy_rate(get_workload(TINY), settings)
    assert rate.gflops > 0 and rate.blas


def test_numpy_runs_without_the_environments_blas_overrides(monkeypatch):
    """OPENBLAS_CORETYPE=Haswell would run AVX2 kernels on an AVX-512 machine: numpy's worker never sees it."""
    seen = {}

    def fake_spawn(module, args, timeout, env=None, unset=()):
        seen["env"] = {k: v for k, v in dict(os.environ, **(env or {})).items() if k not in unset}
        return NumpyRate(1.0, "openblas 0.3 SkylakeX").to_json()

    monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")
    monkeypatch.setenv("OPENBLAS_L2_SIZE", "1048576")
    monkeypatch.setattr(tune_bench, "spawn_module", fake_spawn)
    rate = numpy_rate(get_workload(TINY), _settings())
    assert rate == NumpyRate(1.0, "openblas 0.3 SkylakeX")
    assert "OPENBLAS_CORETYPE" not in seen["env"] and "OPENBLAS_L2_SIZE" not in seen["env"]
    assert seen["env"]["OPENBLAS_NUM_THREADS"] == str(_settings().target.num_cores)


@pytest.mark.slow
def test_metaschedule_tunes_and_retimes_tiny_matmul():
    settings = _settings(tuners=(Tuner.MS,))
    out = run_tuner(Tuner.MS, TINY, 2, settings)
    assert out.tuner is Tuner.MS and out.trace and out.tune_s > 0 and not out.failures
    assert out.workload_key == workload_task(get_workload(TINY)).workload
    plan = RetimePlan(TINY, str(settings.target), 3, 1, (Candidate("default", None), Candidate("ms@2", out.trace, Tuner.MS)))
    timed = retime(plan, settings)
    assert not timed.errors and timed.median_s["ms@2"] > 0  # built from the trace, outputs agree with the default's
