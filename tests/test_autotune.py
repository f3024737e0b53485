"""The auto-tuner: search space, evolutionary search, task scheduler, tuning loop, log, resume, cinn-tune."""
from __future__ import annotations

import dataclasses
import json
import math
import random
import subprocess
import sys
import warnings

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm.s_tir import Schedule, Trace

import cinn
from autotune import space
from autotune.algorithms import ROUNDS
from autotune.database import (
    DEFAULT_TRACE,
    FailureKind,
    Record,
    Scope,
    append_records,
    best_traces,
    read_records,
)
from autotune.measure import MeasureConfig, MeasureResult
from autotune.scheduler import TaskProgress, next_task, round_size
from autotune.search import SearchConfig, TaskSearch
from autotune.task import Task, extract_tasks
from autotune.tuner import TuneConfig, tune
from cinn.compiler.build import element_aligned
from cinn.core.target import parse_target
from cinn.facade.in_model import ROUNDS as ROUNDS_IN_MODEL
from frontend import NetBuilder
from schedules import apply_default
from schedules.knobs import Knob
from tests.timeouts import scaled

TARGET = parse_target("llvm")
FAST = MeasureConfig(repeat=1, min_repeat_ms=1, build_timeout=scaled(30.0), run_timeout=scaled(20.0))


def _matmul_relu(m=32, k=48, n=64):
    b = NetBuilder("mm")
    x = b.create_input("float32", (m, k), "x")
    y = b.create_input("float32", (k, n), "y")
    return b.build([b.relu(b.matmul(x, y))])


def _softmax():
    b = NetBuilder("sm")
    x = b.create_input("float32", (8, 64), "x")
    return b.build([b.softmax(x, axes=[-1])])


def _conv_relu():
    b = NetBuilder("conv")
    x = b.create_input("float32", (1, 8, 10, 10), "x")
    w = b.create_input("float32", (16, 8, 3, 3), "w")
    return b.build([b.relu(b.conv2d(x, w, strides=[1, 1], paddings=[1, 1]))])


def _task(program) -> Task:
    (task,) = extract_tasks(program)
    return task


class RandomModel:
    """A stand-in cost model: seeded random scores."""

    def __init__(self):
        self.rng = np.random.default_rng(0)

    def predict(self, workload, feats):
        return self.rng.random(len(feats))


@pytest.fixture(scope="module")
def runner():
    from autotune.measure import LocalRunner

    r = LocalRunner(FAST)
    yield r
    r.close()


@pytest.mark.parametrize("make", [_matmul_relu, _softmax])
def test_default_is_a_point_of_the_space(make):
    task = _task(make())
    cand = space.default_candidate(task, TARGET)
    ref = Schedule(task.module())
    apply_default(ref, task.kind, TARGET)
    assert tvm_ffi.structural_equal(cand.sch.mod, ref.mod)
    assert space.decisions_of_trace(cand.trace_json()) == [value for _, value in cand.key]


def test_samples_replay_from_their_traces():
    task = _task(_matmul_relu())
    rng = random.Random(3)
    for _ in range(5):
        cand = space.sample(task, TARGET, rng)
        assert cand is not None
        again = space.sample(task, TARGET, rng, space.decisions_of_trace(cand.trace_json()))
        assert again.key == cand.key
        assert tvm_ffi.structural_equal(space.replay(task, TARGET, cand.trace_json()).mod, cand.sch.mod)


def test_register_tiled_sketch_keeps_builds_small():
    # large auto-unroll budgets over the explicitly unrolled register tile, and tiles beyond the register file, took
    # seconds to minutes to build
    from schedules.cpu_common import lanes
    from schedules.knobs import TILED_UNROLL_STEPS

    task = _task(_conv_relu())
    rng = random.Random(0)
    width, registers = lanes("float32", TARGET), TARGET.vector_registers
    for _ in range(20):
        sketch0 = space.sample(task, TARGET, rng, {(Knob.SKETCH, 0): 0}).decisions  # cinn's register tiling
        d = {x.knob: x for x in sketch0}
        assert d[Knob.UNROLL].candidates == TILED_UNROLL_STEPS
        assert max(1, d[Knob.COLS].value // width) * d[Knob.ROWS].value * d[Knob.ROWS2].value <= registers
    ssrsrs = space.sample(task, TARGET, rng, {(Knob.SKETCH, 0): 1}).decisions
    assert 512 in next(x for x in ssrsrs if x.knob is Knob.UNROLL).candidates


def test_mutation_changes_one_decision():
    task = _task(_matmul_relu())
    rng = random.Random(0)
    cand = space.sample(task, TARGET, rng)
    for _ in range(20):
        planned = space.mutate(cand.decisions, rng)
        before = dict(cand.key)
        assert planned.keys() == before.keys()
        changed = [k for k in planned if planned[k] != before[k]]
        assert len(changed) == 1
        split = next(d for d in cand.decisions if d.key == changed[0])
        if isinstance(split, space.Split):
            assert math.prod(planned[changed[0]]) == math.prod(split.factors)


def test_crossover_matches_decisions_by_knob_not_position():
    """Parents whose schedules asked for different knobs: each knob's value still comes from a parent's same knob."""
    choice = space.Choice
    a = (choice(Knob.SKETCH, 0, 0, (0, 1)), choice(Knob.COLS, 0, 16, (8, 16)), choice(Knob.PARALLEL, 0, 1, (0, 1)))
    b = (choice(Knob.SKETCH, 0, 0, (0, 1)), choice(Knob.PACK, 0, 0, (0, 1)), choice(Knob.COLS, 0, 8, (8, 16)),
         choice(Knob.PARALLEL, 0, 0, (0, 1)))
    rng = random.Random(0)
    seen = set()
    for _ in range(40):
        plan = space.crossover(a, b, rng)
        assert set(plan) == {(Knob.SKETCH, 0), (Knob.COLS, 0), (Knob.PARALLEL, 0), (Knob.PACK, 0)}
        assert plan[(Knob.COLS, 0)] in (16, 8) and plan[(Knob.PARALLEL, 0)] in (0, 1)
        assert plan[(Knob.PACK, 0)] == 0  # only b took it
        seen.add((plan[(Knob.COLS, 0)], plan[(Knob.PARALLEL, 0)]))
    assert len(seen) == 4  # each shared knob is drawn from either parent independently


def test_repeated_knobs_are_keyed_by_occurrence():
    """The SSRSRS sketch asks for one spatial tile per loop: each occurrence is its own decision, and a plan for the
    second one lands on the second loop."""
    task = _task(_matmul_relu())
    cand = space.sample(task, TARGET, random.Random(0), {(Knob.SKETCH, 0): 1})
    tiles = [d for d in cand.decisions if d.knob is Knob.SPATIAL_TILE]
    assert [d.occurrence for d in tiles] == list(range(len(tiles))) and len(tiles) >= 2
    second = tiles[1]
    alt = space.random_tile(random.Random(5), math.prod(second.factors), len(second.factors), second.max_innermost)
    again = space.sample(task, TARGET, random.Random(1), {(Knob.SKETCH, 0): 1, second.key: alt})
    assert next(d for d in again.decisions if d.key == second.key).factors == alt


def test_a_plan_replays_to_its_candidate():
    task = _task(_conv_relu())
    rng = random.Random(2)
    for _ in range(3):
        cand = space.sample(task, TARGET, rng)
        again = space.sample(task, TARGET, random.Random(9), space.plan_of(cand.decisions))
        assert again.key == cand.key
        assert tvm_ffi.structural_equal(again.sch.mod, cand.sch.mod)


def test_search_proposes_new_distinct_candidates():
    task = _task(_matmul_relu())
    search = TaskSearch(task, TARGET, SearchConfig(population=16, generations=1), random.Random(0))
    default = space.default_candidate(task, TARGET)
    search.record(default, 1.0)
    cands = search.propose(8, RandomModel())
    keys = [c.key for c in cands]
    assert len(cands) == 8 and len(set(keys)) == 8 and default.key not in keys


@pytest.mark.parametrize("make, sketch", [(_matmul_relu, 0), (_matmul_relu, 1), (_conv_relu, 0), (_conv_relu, 1),
                                          (_softmax, None)])
def test_sampled_schedules_are_correct(make, sketch, runner):
    """Random points of the space (both tiling sketches for matmul/conv) build and match the default schedule's
    output (checked by the runner)."""
    from autotune.measure import MeasureInput

    task = _task(make())
    rng = random.Random(1)
    planned = {} if sketch is None else {(Knob.SKETCH, 0): sketch}
    cands = [space.sample(task, TARGET, rng, planned) for _ in range(4)]
    assert all(c is not None for c in cands)
    if sketch is not None:
        assert all(c.decisions[0] == space.Choice(Knob.SKETCH, 0, sketch, (0, 1)) for c in cands)
    results = runner.measure([MeasureInput(task, c.trace_json()) for c in cands], TARGET)
    assert all(r.ok for r in results), [str(r) for r in results]


def test_scheduler_warms_up_round_robin_then_follows_the_gradient():
    tasks = [TaskProgress(weight=1.0), TaskProgress(weight=3.0)]
    assert next_task(tasks) == 0
    tasks[0].add_round(4, 1.0)
    assert next_task(tasks) == 1
    tasks[1].add_round(4, 1.0)
    assert next_task(tasks) == 1  # same latency, three times the weight
    tasks[1].exhausted = True
    assert next_task(tasks) == 0
    tasks[0].exhausted = True
    assert next_task(tasks) is None


def test_warm_up_shares_a_small_budget_among_all_tasks():
    tasks = [TaskProgress(weight=1.0) for _ in range(3)]
    assert round_size(tasks, 0, batch=16, left=10) == 3  # 10 trials, 3 tasks waiting for their first round
    tasks[0].add_round(3, 1.0)
    assert round_size(tasks, 1, batch=16, left=7) == 3
    assert round_size(tasks, 0, batch=16, left=7) == 7  # after the warm-up a task's round is a batch
    assert round_size(tasks, 1, batch=16, left=1) == 1  # fewer trials than tasks: the default alone
    assert round_size(tasks, 1, batch=2, left=100) == 2


def test_summary_tells_untuned_tasks_from_failed_ones():
    from autotune.tuner import TaskSummary
    from cinn.facade.tune_cli import format_summary

    task = extract_tasks(_softmax())[0]
    table = format_summary([TaskSummary(task, 4, 2e-3, 1e-3, "t"), TaskSummary(task, 0, math.inf, math.inf, None),
                            TaskSummary(task, 2, math.inf, math.inf, None)])
    rows = table.splitlines()
    assert "2.00x" in rows[1] and "not tuned" in rows[2] and "failed" in rows[3] and "not tuned" not in rows[3]
    assert "total (weighted, tuned tasks)" in rows[4]


class FlakyRunner:
    """Wraps a runner: every third candidate fails as a crash, a hang or a wrong result would."""

    FAILURES = (FailureKind.RUN_CRASH, FailureKind.RUN_TIMEOUT, FailureKind.WRONG_RESULT)

    def __init__(self, inner):
        self.inner, self.count = inner, 0

    def measure(self, inputs, target):
        out = []
        for _inp, res in zip(inputs, self.inner.measure(inputs, target), strict=True):
            self.count += 1
            out.append(MeasureResult((), self.FAILURES[self.count % 3], "injected") if self.count % 3 == 0 else res)
        return out

    def close(self):
        pass


def test_tune_logs_every_candidate_and_survives_failures(tmp_path, runner, tmp_cache):
    program = _matmul_relu()
    tasks = extract_tasks(program)
    log = tmp_path / "log.jsonl"
    config = TuneConfig(trials=9, batch=3, search=SearchConfig(population=16, generations=1))
    (summary,) = tune(tasks, TARGET, log, config, runner=FlakyRunner(runner))
    records = list(read_records(log))
    trials, verified = records[:9], records[9:]
    assert summary.trials == 9 == len({r.trace for r in trials})
    assert sum(1 for r in trials if r.failed) == 3
    # the best three successful candidates and the default are measured once more
    assert 2 <= len(verified) <= 4 and {r.trace for r in verified} <= {r.trace for r in trials if not r.failed}
    # which of best and default is faster is a timing on a shared machine, not a property (benchmarks judge it); the
    # default's own measurement may be one of the injected failures (an infinite cost)
    assert 0 < summary.best_cost < math.inf and summary.default_cost > 0
    x, y = np.random.rand(32, 48).astype("float32"), np.random.rand(48, 64).astype("float32")
    exe = cinn.compile(program, tuning_log=log, cache_dir=tmp_cache)
    np.testing.assert_allclose(exe.run({"x": x, "y": y})[0], np.maximum(x @ y, 0), rtol=1e-5)


def test_resume_counts_logged_trials(tmp_path, runner):
    tasks = extract_tasks(_softmax())
    log = tmp_path / "log.jsonl"
    config = TuneConfig(trials=4, batch=4, search=SearchConfig(population=16, generations=1))
    tune(tasks, TARGET, log, config, runner=runner)
    logged = len(list(read_records(log)))  # 4 trials and their verification
    (again,) = tune(tasks, TARGET, log, config, runner=runner, resume=True)
    assert again.trials == 4 and len(list(read_records(log))) == logged  # the budget was already spent
    more = TuneConfig(trials=7, batch=4, search=config.search)
    (resumed,) = tune(tasks, TARGET, log, more, runner=runner, resume=True)
    records = list(read_records(log))
    assert resumed.trials == 7 and len(records) > logged + 3
    assert len({r.trace for r in records}) == 7  # resumed search does not re-measure logged candidates


def test_resume_skips_records_whose_decisions_make_another_schedule_now(tmp_path, runner, monkeypatch):
    # a record's decisions are read by position: after a change to the schedule's knobs they make another schedule,
    # which must not take the record's measurement; such records are skipped with a warning, and the budget is not
    # spent on them
    tasks = extract_tasks(_softmax())
    log = tmp_path / "log.jsonl"
    config = TuneConfig(trials=4, batch=4, search=SearchConfig(population=16, generations=1))
    tune(tasks, TARGET, log, config, runner=runner)
    logged = len(list(read_records(log)))
    monkeypatch.setattr(space.Candidate, "trace_json", lambda self: "another schedule")  # as if the knobs had moved
    with pytest.warns(UserWarning, match=f"{logged} records of .* no longer replay as this code's schedules"):
        (resumed,) = tune(tasks, TARGET, log, TuneConfig(trials=0, verify=0, search=config.search), runner=runner,
                          resume=True)
    assert resumed.trials == 0


class LuckyRunner:
    """Times every candidate at a fixed cost per trace, except that its first non-default candidate is the slowest
    and is measured, the first time only, as far faster than all (a noise-favoured measurement)."""

    def __init__(self):
        self.lucky, self.calls = None, 0

    def measure(self, inputs, target):
        out = []
        for inp in inputs:
            self.calls += 1
            if self.lucky is None and self.calls > 1:
                self.lucky = inp.trace
                out.append(MeasureResult((1e-4,)))
            else:
                out.append(MeasureResult((1e-2 if inp.trace == self.lucky else 1e-3 + self.calls * 1e-6,)))
        return out

    def close(self):
        pass


@pytest.mark.parametrize("verify", [0, 3])
def test_verification_overrules_a_lucky_measurement(tmp_path, verify):
    tasks = extract_tasks(_softmax())
    log = tmp_path / "log.jsonl"
    config = TuneConfig(trials=6, batch=6, verify=verify, search=SearchConfig(population=16, generations=1))
    runner = LuckyRunner()
    (summary,) = tune(tasks, TARGET, log, config, runner=runner)
    picked = best_traces(log, TARGET)[tasks[0].workload]
    assert (picked == runner.lucky) == (verify == 0)  # unverified, the lucky slowest candidate would be applied
    assert summary.best_trace == picked


class SlowStartRunner:
    """Times every candidate at 1 ms, except the first measurement (the default's, in its first round) at 5 ms: a
    slow stretch of the machine."""

    def __init__(self):
        self.calls = 0

    def measure(self, inputs, target):
        self.calls += len(inputs)
        return [MeasureResult((5e-3 if self.calls == len(inputs) and i == 0 else 1e-3,)) for i in range(len(inputs))]

    def close(self):
        pass


@pytest.mark.parametrize("verify", [0, 3])
def test_the_summary_compares_the_default_and_the_best_side_by_side(tmp_path, verify):
    """The summary's speed-up is the verification's, which timed both in one round, not the first round's slow
    default against a later round's candidate."""
    config = TuneConfig(trials=6, batch=6, verify=verify, search=SearchConfig(population=16, generations=1))
    (summary,) = tune(extract_tasks(_softmax()), TARGET, tmp_path / "log.jsonl", config, runner=SlowStartRunner())
    assert summary.speedup == pytest.approx(1.0 if verify else 5.0)


def test_resume_after_a_verification_that_moved_the_ranking_measures_nothing(tmp_path):
    """The verification measured the lucky candidate again, slow, so the finalists read back from the log are not
    the ones it verified; with the budget spent, a resumed run still measures nothing (it verified them again)."""
    tasks = extract_tasks(_softmax())
    log = tmp_path / "log.jsonl"
    config = TuneConfig(trials=6, batch=6, verify=3, search=SearchConfig(population=16, generations=1))
    tune(tasks, TARGET, log, config, runner=LuckyRunner())
    logged = len(list(read_records(log)))
    runner = LuckyRunner()
    tune(tasks, TARGET, log, config, runner=runner, resume=True)
    assert runner.calls == 0 and len(list(read_records(log))) == logged


def test_resume_verifies_a_log_that_ends_unverified(tmp_path):
    """A run killed between its last trial and its verification: resumed with the budget spent, it verifies now."""
    tasks = extract_tasks(_softmax())
    log = tmp_path / "log.jsonl"
    config = TuneConfig(trials=6, batch=6, verify=3, search=SearchConfig(population=16, generations=1))
    tune(tasks, TARGET, log, dataclasses.replace(config, verify=0), runner=LuckyRunner())
    logged = len(list(read_records(log)))
    runner = LuckyRunner()
    tune(tasks, TARGET, log, config, runner=runner, resume=True)
    assert runner.calls == len(list(read_records(log))) - logged >= 3  # the best three (and the default) again


def test_apply_best_picks_the_fastest_record(tmp_path, tmp_cache):
    program = _matmul_relu()
    task = _task(program)
    rng = random.Random(5)
    cands = [space.sample(task, TARGET, rng) for _ in range(3)]
    log = tmp_path / "log.jsonl"
    costs = [3e-3, 1e-3, 2e-3]
    append_records(log, [Record(task.workload, str(TARGET), c.trace_json(), (t,)) for c, t in zip(cands, costs, strict=True)])
    append_records(log, [Record("ffffffffffffffff", str(TARGET), "[[], []]", (1e-9,))])  # an unknown workload
    assert best_traces(log, TARGET)[task.workload] == cands[1].trace_json()
    exe = cinn.compile(program, tuning_log=log, cache_dir=tmp_cache)
    # the build replays the trace on the func with element-aligned parameters (build.element_aligned)
    expected = Schedule(tvm.IRModule({"main": element_aligned(task.func())}))
    Trace.apply_json_to_schedule(json.loads(cands[1].trace_json()), expected)
    assert exe.kernel_sources()[0].strip() == expected.mod.script().strip()


def test_stale_trace_falls_back_to_the_default(tmp_path, tmp_cache):
    program = _matmul_relu()
    other = _task(_softmax())
    log = tmp_path / "log.jsonl"
    trace = space.default_candidate(other, TARGET).trace_json()
    append_records(log, [Record(_task(program).workload, str(TARGET), trace, (1e-3,))])
    with pytest.warns(UserWarning, match="does not apply"):
        exe = cinn.compile(program, tuning_log=log, cache_dir=tmp_cache)
    assert exe.num_kernels == 1


def test_torn_last_line_loses_only_itself(tmp_path):
    log = tmp_path / "log.jsonl"
    rec = Record("a", "llvm", "[[], []]", (1.0,))
    append_records(log, [rec])
    with open(log, "a") as f:
        f.write('{"workload": "b", "tar')  # a tuner killed mid-write
    append_records(log, [rec])
    with pytest.warns(UserWarning, match="log.jsonl:2: skipping corrupt"):
        assert list(read_records(log)) == [rec, rec]


def test_garbage_lines_are_skipped(tmp_path):
    log = tmp_path / "log.jsonl"
    rec = Record("a", "llvm", "[[], []]", (1.0,))
    log.write_text("not json\n" + '{"workload": 1}\n' + "\x00\xff\n" + rec.to_json() + "\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert list(read_records(log)) == [rec]
    assert len(caught) == 3


def test_concurrent_appends_do_not_interleave(tmp_path):
    log = tmp_path / "log.jsonl"
    code = (
        "import sys; from autotune.database import Record, append_records\n"
        "for i in range(150):\n"
        "    append_records(sys.argv[1], [Record(sys.argv[2] + str(i), 'llvm', '[[],' + ' ' * 3000 + '[]]', (1.0,))])\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code, str(log), tag]) for tag in ("p", "q")]
    assert all(p.wait(timeout=scaled(120)) == 0 for p in procs)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        records = list(read_records(log))
    assert sorted(r.workload for r in records) == sorted(f"{t}{i}" for t in "pq" for i in range(150))


def _matmul_relu_onnx(tmp_path):
    """An ONNX file of relu(x @ w) with constant w."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [16, 32])],
        [onnx.numpy_helper.from_array(np.random.rand(32, 32).astype("float32"), "w")])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_cinn_tune_cli(tmp_path, capsys):
    from cinn.facade import tune_cli as cli

    path = _matmul_relu_onnx(tmp_path)
    log = tmp_path / "log.jsonl"
    assert cli.main([str(path), "--trials", "3", "--batch", "3", "--repeat", "1", "--log", str(log)]) == 0
    out = capsys.readouterr()
    assert "speed-up" in out.out and "3/3 trials" in out.err
    assert "in-model check: " in out.out and f"round {ROUNDS_IN_MODEL}/{ROUNDS_IN_MODEL}" in out.err
    records = list(read_records(log))
    kernel = [r for r in records if r.scope is Scope.KERNEL]
    assert len({r.trace for r in kernel}) == 3 and len(kernel) == 6  # 3 trials, then all 3 verified
    # then the fastest, and the default schedule, timed inside runs of the model
    model = [r for r in records if r.scope is Scope.MODEL]
    assert [r.trace == DEFAULT_TRACE for r in model] == [False, True]
    assert all(len(r.costs) == ROUNDS_IN_MODEL for r in model)
    args = [str(path), "--trials", "3", "--repeat", "1", "--verify", "0", "--log", str(log), "--resume"]
    assert cli.main([*args, "--no-model-check"]) == 0
    assert len(list(read_records(log))) == 8  # the budget was spent: nothing measured, nothing verified



def test_no_in_model_check_for_a_device_behind_rpc(tmp_path, monkeypatch):
    """With --rpc-tracker the candidates run on the tracker's device; the model would run here, so it is not judged."""
    from autotune.measure import LocalRunner
    from cinn.facade import tune_cli as cli

    monkeypatch.setattr(cli, "RpcRunner", lambda tracker, key, config: LocalRunner(config))
    monkeypatch.setattr(cli, "judge_in_model", lambda *a, **k: pytest.fail("the model was judged on this machine"))
    log = tmp_path / "log.jsonl"
    args = ["--trials", "2", "--repeat", "1", "--verify", "0", "--log", str(log), "--rpc-tracker", "h:9190", "--rpc-key", "k"]
    assert cli.main([str(_matmul_relu_onnx(tmp_path)), *args]) == 0
    assert {r.scope for r in read_records(log)} == {Scope.KERNEL}


def test_cinn_tune_measures_conv_algorithms_first(tmp_path, capsys):
    """A 3x3 conv's algorithms (direct, Winograd F(4x4), F(2x2)) are measured and logged before its kernels are
    tuned; the tasks are those of the chosen algorithm, and a resumed run measures them again only for new shapes."""
    from cinn.facade import tune_cli as cli

    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 12, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 12, 12])],
        [onnx.numpy_helper.from_array(np.random.rand(32, 16, 3, 3).astype("float32"), "w")])
    path = tmp_path / "conv.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    log = tmp_path / "log.jsonl"
    args = [str(path), "--trials", "1", "--repeat", "1", "--verify", "0", "--log", str(log)]
    assert cli.main(args) == 0
    err = capsys.readouterr().err
    assert "cinn-tune: conv algorithm 1/1 1x16x12x12/32/1,1,1,1: " in err
    algorithms = [r for r in read_records(log) if r.workload.startswith("winograd/")]
    assert [json.loads(r.trace)["winograd_tile"] for r in algorithms] == [0, 4, 2] * ROUNDS
    assert cli.main(args + ["--resume"]) == 0
    assert "conv algorithm" not in capsys.readouterr().err
    assert len([r for r in read_records(log) if r.workload.startswith("winograd/")]) == 3 * ROUNDS

def test_cinn_tune_usage_errors(tmp_path, capsys):
    from cinn.facade import tune_cli as cli

    assert cli.main([str(tmp_path / "missing.onnx"), "--log", str(tmp_path / "l.jsonl")]) == 2
    assert cli.main(["encoder", "--log", "l", "--rpc-key", "k"]) == 2
    proc = subprocess.run([sys.executable, "-m", "autotune", "--help"], capture_output=True, text=True, timeout=scaled(120))
    assert proc.returncode == 0 and "--trials" in proc.stdout
