"""cinn-tune's in-model check: tuned kernels timed inside runs of the model against the default schedules."""
from __future__ import annotations

import dataclasses
import random
import warnings

import numpy as np
import pytest

import cinn
from autotune import space
from autotune.database import DEFAULT_TRACE, Record, Scope, append_records, best_traces, read_records
from autotune.task import extract_tasks
from cinn.core.target import parse_target
from cinn.facade import in_model
from cinn.runtime.executable import Executable
from frontend import NetBuilder

TARGET = parse_target("llvm")


def _matmul_relu():
    b = NetBuilder("mm")
    x = b.create_input("float32", (32, 48), "x")
    y = b.create_input("float32", (48, 64), "y")
    return b.build([b.relu(b.matmul(x, y))])


def _judged(tmp_path, tmp_cache, monkeypatch, tuned_s):
    """A log of one tuned matmul (faster alone), judged in the model where it takes tuned_s against the default's
    1 ms: (program, its task, the tuned trace, the log, the verdict)."""
    program = _matmul_relu()
    (task,) = extract_tasks(program)
    trace = space.sample(task, TARGET, random.Random(5)).trace_json()
    log = tmp_path / "log.jsonl"
    append_records(log, [Record(task.workload, str(TARGET), trace, (1e-3,))])  # the tuner's: faster alone
    builds: list[Executable] = []

    def compile_(*args, **kwargs):
        builds.append(cinn.compile(*args, cache_dir=tmp_cache, **kwargs))
        return builds[-1]

    with monkeypatch.context() as m:
        m.setattr(in_model, "compile_program", compile_)
        # the tuned build is compiled first; inside runs it takes tuned_s, the default build 1 ms
        m.setattr(Executable, "kernel_times", lambda self, feeds, repeat: [tuned_s if self is builds[0] else 1e-3])
        (verdict,) = in_model.judge_in_model([program], TARGET, log, rounds=3, repeat=1)
    return program, task, trace, log, verdict


@pytest.mark.parametrize("tuned_s, kept", [(3e-3, False), (0.5e-3, True)])
def test_the_faster_schedule_inside_runs_is_applied(tmp_path, tmp_cache, monkeypatch, tuned_s, kept):
    program, task, trace, log, verdict = _judged(tmp_path, tmp_cache, monkeypatch, tuned_s)
    assert (verdict.kept, verdict.tuned_s, verdict.default_s, verdict.kernels) == (kept, tuned_s, 1e-3, 1)
    model = [r for r in read_records(log) if r.scope is Scope.MODEL]
    assert [(r.trace, r.costs) for r in model] == [(trace, (tuned_s,) * 3), (DEFAULT_TRACE, (1e-3,) * 3)]
    assert best_traces(log, TARGET).get(task.workload) == (trace if kept else None)
    exe = cinn.compile(program, tuning_log=log, cache_dir=tmp_cache)
    default = cinn.compile(program, cache_dir=tmp_cache)
    assert (exe.kernel_sources() == default.kernel_sources()) == (not kept)
    x, y = np.random.rand(32, 48).astype("float32"), np.random.rand(48, 64).astype("float32")
    np.testing.assert_allclose(exe.run({"x": x, "y": y})[0], np.maximum(x @ y, 0), rtol=1e-5)


def test_a_verdict_against_a_default_changed_since_is_not_applied(tmp_path, tmp_cache, monkeypatch):
    """The verdict notes the default schedule's fingerprint; compile applies the tuned schedule only while today's
    default has that fingerprint, else keeps the default and says why (a log older than this cinn's schedules)."""
    program, _, _, log, verdict = _judged(tmp_path, tmp_cache, monkeypatch, 0.5e-3)
    assert verdict.kept
    records = list(read_records(log))
    assert all(r.baseline for r in records if r.scope is Scope.MODEL)
    default = cinn.compile(program, cache_dir=tmp_cache)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cinn.compile(program, tuning_log=records, cache_dir=tmp_cache).kernel_sources() != default.kernel_sources()
    older = [dataclasses.replace(r, baseline="0" * 16) if r.scope is Scope.MODEL else r for r in records]
    with pytest.warns(UserWarning, match=r"schedules for 1 kernels \(fused_matmul_relu\) were judged inside the model "
                                         r"against default schedules that have changed since"):
        exe = cinn.compile(program, tuning_log=older, cache_dir=tmp_cache)
    assert exe.kernel_sources() == default.kernel_sources()
    unnoted = [dataclasses.replace(r, baseline="") for r in records if r.scope is Scope.MODEL]
    with warnings.catch_warnings():  # a verdict from before the fingerprints decides, as documented: no warning
        warnings.simplefilter("error")
        exe = cinn.compile(program, tuning_log=older + unnoted, cache_dir=tmp_cache)
    assert exe.kernel_sources() != default.kernel_sources()


def test_a_log_without_tuned_kernels_judges_nothing(tmp_path, tmp_cache):
    log = tmp_path / "log.jsonl"
    log.touch()
    assert in_model.judge_in_model([_matmul_relu()], TARGET, log, rounds=1, repeat=1) == []
    assert list(read_records(log)) == []


def test_cuda_without_a_gpu_is_not_judged(tmp_path, monkeypatch):
    monkeypatch.setattr(in_model.cuda_module, "device_present", lambda: False)
    assert in_model.judge_in_model([_matmul_relu()], parse_target("cuda"), tmp_path / "log.jsonl") == []
