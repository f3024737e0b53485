"""cinn-tune's in-model check: tuned kernels timed inside runs of the model against the default schedules."""
from __future__ import annotations

import random

import numpy as np
import pytest

import cinn
from cinn import in_model
from cinn.autotune import space
from cinn.autotune.database import DEFAULT_TRACE, Record, Scope, append_records, best_traces, read_records
from cinn.autotune.task import extract_tasks
from cinn.frontend import NetBuilder
from cinn.runtime import Executable
from cinn.target import parse_target

TARGET = parse_target("llvm")


def _matmul_relu():
    b = NetBuilder("mm")
    x = b.create_input("float32", (32, 48), "x")
    y = b.create_input("float32", (48, 64), "y")
    return b.build([b.relu(b.matmul(x, y))])


@pytest.mark.parametrize("tuned_s, kept", [(3e-3, False), (0.5e-3, True)])
def test_the_faster_schedule_inside_runs_is_applied(tmp_path, tmp_cache, monkeypatch, tuned_s, kept):
    program = _matmul_relu()
    (task,) = extract_tasks(program)
    trace = space.sample(task, TARGET, random.Random(5)).trace_json()
    log = tmp_path / "log.jsonl"
    append_records(log, [Record(task.workload, str(TARGET), trace, (1e-3,))])  # the tuner's: faster alone
    builds: list[Executable] = []

    def compile_(*args, **kwargs):
        builds.append(cinn.compile(*args, cache_dir=tmp_cache, **kwargs))
        return builds[-1]

    monkeypatch.setattr(in_model, "compile_program", compile_)
    # the tuned build is compiled first; inside runs it takes tuned_s, the default build 1 ms
    monkeypatch.setattr(Executable, "kernel_times", lambda self, feeds, repeat: [tuned_s if self is builds[0] else 1e-3])
    (verdict,) = in_model.judge_in_model([program], TARGET, log, rounds=3, repeat=1)
    assert (verdict.kept, verdict.tuned_s, verdict.default_s, verdict.kernels) == (kept, tuned_s, 1e-3, 1)
    model = [r for r in read_records(log) if r.scope is Scope.MODEL]
    assert [(r.trace, r.costs) for r in model] == [(trace, (tuned_s,) * 3), (DEFAULT_TRACE, (1e-3,) * 3)]
    assert best_traces(log, TARGET).get(task.workload) == (trace if kept else None)
    monkeypatch.undo()
    exe = cinn.compile(program, tuning_log=log, cache_dir=tmp_cache)
    default = cinn.compile(program, cache_dir=tmp_cache)
    assert (exe.kernel_sources() == default.kernel_sources()) == (not kept)
    x, y = np.random.rand(32, 48).astype("float32"), np.random.rand(48, 64).astype("float32")
    np.testing.assert_allclose(exe.run({"x": x, "y": y})[0], np.maximum(x @ y, 0), rtol=1e-5)


def test_a_log_without_tuned_kernels_judges_nothing(tmp_path, tmp_cache):
    log = tmp_path / "log.jsonl"
    log.touch()
    assert in_model.judge_in_model([_matmul_relu()], TARGET, log, rounds=1, repeat=1) == []
    assert list(read_records(log)) == []


def test_cuda_without_a_gpu_is_not_judged(tmp_path, monkeypatch):
    monkeypatch.setattr(in_model.cuda_module, "device_present", lambda: False)
    assert in_model.judge_in_model([_matmul_relu()], parse_target("cuda"), tmp_path / "log.jsonl") == []
