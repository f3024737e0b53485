"""The schedule log as compile reads it: best record per workload, corrupt lines skipped."""
from __future__ import annotations

import json

import numpy as np
import pytest

import cinn
from cinn.autotune.database import DEFAULT_TRACE, FailureKind, Record, Scope, best_traces, fastest_traces, noted_baselines
from cinn.target import parse_target


def _rec(workload, cost, target="llvm -mcpu=x -num-cores=2", error=""):
    return Record(workload, target, json.dumps([["trace", cost]]), (cost,) if cost else (), error=error)


def test_best_record_per_workload_and_target(tmp_path):
    log = tmp_path / "log.jsonl"
    recs = [_rec("a", 3.0), _rec("a", 1.0), _rec("a", 0.5, target="cuda -arch=sm_90"), _rec("b", 2.0), _rec("b", 0.1, error="crashed")]
    log.write_text("".join(r.to_json() + "\n" for r in recs) + '{"workload": "torn', encoding="utf-8")
    with pytest.warns(UserWarning, match="log.jsonl:6: skipping corrupt"):
        best = best_traces(log, parse_target("llvm -mcpu=x -num-cores=2"))
    assert best == {"a": recs[1].trace, "b": recs[3].trace}


def test_compile_with_log_of_unknown_workloads_falls_back(tmp_path, tmp_cache):
    log = tmp_path / "log.jsonl"
    log.write_text(_rec("0123", 1.0).to_json() + "\n")
    b = cinn.NetBuilder("p")
    x = b.create_input("float32", (4,), "x")
    exe = cinn.compile(b.build([b.relu(x)]), tuning_log=log, cache_dir=tmp_cache)
    np.testing.assert_array_equal(exe.run({"x": np.array([-1, 2, -3, 4], "float32")})[0], [0, 2, 0, 4])


def test_re_measured_trace_is_judged_on_all_its_runs(tmp_path):
    log = tmp_path / "log.jsonl"
    lucky, steady, flaky = _rec("a", 0.1), _rec("a", 1.0), _rec("a", 0.2)
    again = Record("a", lucky.target, lucky.trace, (3.0, 3.0))  # the lucky one re-measured: mean 2.03 over 3 runs
    crashed = Record("a", flaky.target, flaky.trace, (), error="crashed")  # one failure rules a trace out
    log.write_text("".join(r.to_json() + "\n" for r in (lucky, steady, flaky, again, crashed)), encoding="utf-8")
    assert best_traces(log, parse_target("llvm -mcpu=x -num-cores=2")) == {"a": steady.trace}


def test_failure_kinds_round_trip_and_old_lines_load():
    """A record's failure kind is written and read back; lines from logs written before kinds existed still load."""
    rec = Record("a", "llvm", "[]", (), error="after 10 s", failure=FailureKind.RUN_TIMEOUT)
    again = Record.from_json(rec.to_json())
    assert again == rec and again.failed and json.loads(rec.to_json())["failure"] == "run_timeout"
    old_failed = Record.from_json('{"workload": "a", "target": "llvm", "trace": "[]", "costs": [], "error": "run: boom"}')
    old_ok = Record.from_json('{"workload": "a", "target": "llvm", "trace": "[]", "costs": [1.0]}')
    assert old_failed.failure is FailureKind.UNKNOWN and old_failed.error == "run: boom"
    assert old_ok.failure is None and not old_ok.failed


def test_a_missing_tuning_log_is_an_error(tmp_path, tmp_cache):
    b = cinn.NetBuilder("p")
    x = b.create_input("float32", (4,), "x")
    with pytest.raises(FileNotFoundError, match=r"tuning_log .*nope\.jsonl.*no such schedule log"):
        cinn.compile(b.build([b.relu(x)]), tuning_log=tmp_path / "nope.jsonl", cache_dir=tmp_cache)


def test_model_scope_records_decide_where_present():
    """Times inside the model (cinn-tune's in-model check) overrule the kernel's own: the default schedule
    (DEFAULT_TRACE) winning there leaves the workload without a trace; medians, so one slow round does not decide."""
    target = parse_target("llvm -mcpu=x -num-cores=2")
    fast_alone, slow_alone = _rec("a", 0.1), _rec("a", 0.3)

    def model(trace, *costs):
        return Record("a", fast_alone.target, trace, costs, scope=Scope.MODEL)

    assert fastest_traces([fast_alone, slow_alone], target) == {"a": fast_alone.trace}
    loses = [model(fast_alone.trace, 2.0, 2.0, 2.0), model(DEFAULT_TRACE, 1.0, 1.0, 1.0)]
    assert fastest_traces([fast_alone, slow_alone, *loses], target) == {}
    one_slow_round = [model(fast_alone.trace, 0.5, 0.5, 9.0), model(DEFAULT_TRACE, 1.0, 1.0, 1.0)]
    assert fastest_traces([fast_alone, slow_alone, *one_slow_round], target) == {"a": fast_alone.trace}
    assert fastest_traces([*loses, _rec("b", 0.2)], target) == {"b": _rec("b", 0.2).trace}


def test_scope_round_trips_and_old_lines_are_kernel_scope():
    rec = Record("a", "llvm", DEFAULT_TRACE, (1e-3, 2e-3), scope=Scope.MODEL)
    assert Record.from_json(rec.to_json()) == rec and json.loads(rec.to_json())["scope"] == "model"
    old = Record.from_json('{"workload": "a", "target": "llvm", "trace": "[]", "costs": [1.0]}')
    assert old.scope is Scope.KERNEL


def test_verdicts_judged_against_another_default_do_not_count():
    """A model-scope verdict notes the fingerprint of the default schedule it beat: once today's default differs (a
    newer cinn), the tuned schedule is not applied on the old verdict's word, nor on the kernel's own times; verdicts
    against today's default (re-judged) and old lines without a fingerprint count."""
    target = parse_target("llvm -mcpu=x -num-cores=2")
    alone = _rec("a", 0.1)

    def model(trace, cost, baseline):
        return Record("a", alone.target, trace, (cost,) * 3, scope=Scope.MODEL, baseline=baseline)

    wins_old = [model(alone.trace, 0.5, "old"), model(DEFAULT_TRACE, 1.0, "old")]
    assert fastest_traces([alone, *wins_old], target) == {"a": alone.trace}  # no fingerprint asked: as before
    assert fastest_traces([alone, *wins_old], target, {"a": "old"}) == {"a": alone.trace}
    assert fastest_traces([alone, *wins_old], target, {"a": "new"}) == {}
    loses_new = [model(alone.trace, 2.0, "new"), model(DEFAULT_TRACE, 1.0, "new")]
    assert fastest_traces([alone, *wins_old, *loses_new], target, {"a": "new"}) == {}
    wins_new = [model(alone.trace, 0.5, "new"), model(DEFAULT_TRACE, 1.0, "new")]
    assert fastest_traces([alone, *wins_new], target, {"a": "new"}) == {"a": alone.trace}
    unnoted = [model(alone.trace, 0.5, ""), model(DEFAULT_TRACE, 1.0, "")]
    assert fastest_traces([alone, *unnoted], target, {"a": "new"}) == {"a": alone.trace}
    assert noted_baselines([alone, *wins_old, *wins_new, *unnoted], target) == {"a": {"old", "new", ""}}


def test_baseline_round_trips_and_old_lines_have_none():
    rec = Record("a", "llvm", DEFAULT_TRACE, (1e-3,), scope=Scope.MODEL, baseline="00ff")
    assert Record.from_json(rec.to_json()) == rec and json.loads(rec.to_json())["baseline"] == "00ff"
    assert Record.from_json('{"workload": "a", "target": "llvm", "trace": "", "costs": [1.0], "scope": "model"}').baseline == ""
