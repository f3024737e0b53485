"""The tuner's measurement layer: builds, timed runs, correctness checks and failures of candidates."""
from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import socket
import sys
import time

import cloudpickle
import numpy as np
import pytest

import frontend
from autotune.database import FailureKind, read_records
from autotune.measure import (
    BUILD_LIMIT_S,
    MAX_LOAD_SCALE,
    ArgInfo,
    LocalRunner,
    MeasureConfig,
    MeasureInput,
    RpcRunner,
    RunOutput,
    RunRequest,
    arg_infos,
    build_limit,
    compare_outputs,
    run_kernel,
)
from autotune.search import SearchConfig
from autotune.task import Task
from autotune.tuner import TuneConfig, tune
from cinn.compiler.build import KernelSpec, build_kernel
from cinn.compiler.lower import lower_program
from cinn.core.target import Target, parse_target
from tests.timeouts import FOREVER_S, scaled

# the workers unpickle this module's injected build/run functions: ship them by value, whatever the cwd
cloudpickle.register_pickle_by_value(sys.modules[__name__])

# a run's timeout covers a fresh worker's start (import tvm): a loaded machine needs longer
FAST = MeasureConfig(repeat=2, min_repeat_ms=1, build_workers=2, build_timeout=scaled(30.0), run_timeout=scaled(3.0),
                     hang_grace=scaled(2.0))
FAULT = "measure_test.fault"  # block annotation naming the failure the injected functions simulate
NO_DEFAULT = "workload-without-default"  # a workload whose default schedule fails to build


def _task(epilogue: str = "relu") -> Task:
    b = frontend.NetBuilder("mm")
    x = b.create_input("float32", (64, 64), "x")
    w = b.create_input("float32", (64, 64), "w")
    _, (lg,) = lower_program(b.build([getattr(b, epilogue)(b.matmul(x, w))]))
    return Task.from_func(lg.func, lg.group.kind)


def _trace(task: Task, fault: str = "") -> str:
    """A valid hand-made schedule: split and vectorize the epilogue's inner loop; optionally tag a fault."""
    from tvm.s_tir import Schedule

    sch = Schedule(task.module())
    block = sch.get_sblock("relu")
    _, j = sch.get_loops(block)
    _, inner = sch.split(j, [None, 8])
    sch.vectorize(inner)
    if fault:
        sch.annotate(block, FAULT, fault)
    return json.dumps(sch.trace.as_json(), default=lambda o: o.value)


def _fault(trace: str | None) -> str:
    faults = ("build_crash", "slow_build", "crash", "deadlock", "hang", "perturb")
    return next((f for f in faults if trace and f in trace), "")


def _faulty_build(spec: KernelSpec, target: Target, path: str) -> str:
    if _fault(spec.trace) == "build_crash":
        os.abort()
    if _fault(spec.trace) == "slow_build":  # a build that never ends (time.sleep lets the worker's timeout run)
        time.sleep(FOREVER_S)
    if spec.workload == NO_DEFAULT and spec.trace is None:
        raise RuntimeError("no default schedule for you")
    return build_kernel(dataclasses.replace(spec, trace=_without_fault(spec.trace)), target, path)


def _without_fault(trace: str | None) -> str | None:
    """The trace without its fault tag (its last instruction): builds replay only what cinn's schedules emit."""
    if not _fault(trace):
        return trace
    instructions, decisions = json.loads(trace)
    return json.dumps([instructions[:-1], decisions])


def _faulty_run(request: RunRequest) -> RunOutput:
    fault = _fault(request.trace)
    if fault == "crash":
        os.abort()
    if fault == "hang":
        time.sleep(FOREVER_S)
    if fault == "deadlock":  # libc's sleep called holding the GIL: the worker's own timeout thread never runs
        ctypes.PyDLL(None).sleep(int(FOREVER_S))
    out = run_kernel(request)
    if fault == "perturb":
        return RunOutput(out.costs, tuple(o + 1 for o in out.outputs))
    return out


def _clocked_run(request: RunRequest) -> RunOutput:
    """The real run, each repeat's cost replaced by the (system-wide) time it ran at."""
    out = run_kernel(request)
    return RunOutput((time.monotonic(),) * len(out.costs), out.outputs)


@pytest.fixture(scope="module")
def task() -> Task:
    return _task()


@pytest.fixture(scope="module")
def target() -> Target:
    return parse_target("llvm")


@pytest.fixture(scope="module")
def runner():
    """One runner for all local tests (worker start-up is the slow part); untagged candidates get the real
    build and run functions."""
    with LocalRunner(FAST, build_fn=_faulty_build, run_fn=_faulty_run) as r:
        yield r


def _assert_ok(result) -> None:
    assert result.ok, str(result)
    assert len(result.costs) == FAST.repeat and 0 < result.median < 1


@pytest.mark.parametrize("flush", [False, True])
def test_cache_flush_times_one_cold_call_per_repeat(task, target, monkeypatch, flush):
    """With cache_flush, every timed call follows a flush of the weights' and outputs' caches (TVM's preprocessor),
    so a repeat is one call; without it, calls are batched to min_repeat_ms on warm caches."""
    import tvm

    import autotune.measure as measure

    seen = {}

    class FakeModule:
        def __getitem__(self, name):
            return lambda *args: None

        def time_evaluator(self, name, dev, **kwargs):
            seen.update(kwargs)
            return lambda *args: type("Result", (), {"results": [1e-3] * kwargs["repeat"]})()

    monkeypatch.setattr(measure, "_open_local", lambda request: (FakeModule(), tvm.cpu(0), lambda *a: None))
    timing = measure.Timing(number=4, repeat=3, min_repeat_ms=20, cache_flush=flush)
    out = measure.run_kernel(measure.RunRequest("unused.so", arg_infos(task), target, timing, 0, False, None))
    assert out.costs == (1e-3,) * 3
    want = {"number": 1, "min_repeat_ms": 0, "f_preproc": "cache_flush_cpu_non_first_arg"} if flush else {
        "number": 4, "min_repeat_ms": 20, "f_preproc": ""}
    assert {k: seen[k] for k in want} == want


def test_arg_infos(task):
    f32 = "float32"
    assert arg_infos(task) == (ArgInfo((64, 64), f32, False), ArgInfo((64, 64), f32, False), ArgInfo((64, 64), f32, True))


def test_default_handmade_and_garbage_traces(runner, task, target):
    default, handmade, garbage, not_json = runner.measure(
        [MeasureInput(task, None), MeasureInput(task, _trace(task)), MeasureInput(task, '[["nonsense"]]'), MeasureInput(task, "{")],
        target,
    )
    _assert_ok(default)
    _assert_ok(handmade)
    for bad in (garbage, not_json):
        assert bad.failure is FailureKind.BUILD_ERROR and bad.costs == () and bad.median == float("inf")


def test_different_func_under_same_workload_is_wrong(runner, task, target):
    impostor = dataclasses.replace(task, func_json=_task("sigmoid").func_json)
    # the first candidate of a workload sets its reference (unless an earlier test did); the impostor is measured in
    # a batch of its own (within one batch, specs equal by workload, kind and trace are built once)
    first, ok = runner.measure([MeasureInput(task, None), MeasureInput(task, _trace(task))], target)
    (wrong,) = runner.measure([MeasureInput(impostor, None)], target)
    assert wrong.failure is FailureKind.WRONG_RESULT and wrong.detail.startswith("max abs err"), str(wrong)
    _assert_ok(first)
    _assert_ok(ok)


@pytest.mark.parametrize(
    "fault, failure, detail",
    [
        ("crash", FailureKind.RUN_CRASH, "the worker process died"),
        ("hang", FailureKind.RUN_TIMEOUT, f"the run outlasted its limit of {FAST.run_timeout:g} s"),
        ("deadlock", FailureKind.RUN_TIMEOUT, f"the run did not answer {FAST.run_timeout + FAST.hang_grace:g} s"),
        ("perturb", FailureKind.WRONG_RESULT, "max abs err 1 at"),
        ("build_crash", FailureKind.BUILD_CRASH, "the worker process died"),
    ],
    ids=["crash", "hang", "deadlock", "perturb", "build_crash"],  # the same in every xdist worker, whatever the scale
)
def test_failed_candidate_does_not_stop_the_next(runner, task, target, fault, failure, detail):
    bad, good = runner.measure([MeasureInput(task, _trace(task, fault)), MeasureInput(task, _trace(task))], target)
    assert bad.failure is failure and bad.detail.startswith(detail) and bad.costs == (), str(bad)
    _assert_ok(good)  # the pool restarted the dead or killed worker


def _slow_candidate_build(spec: KernelSpec, target: Target, path: str) -> str:
    """Build the default schedule; a candidate's build never ends."""
    if spec.trace is not None:
        time.sleep(FOREVER_S)
    return build_kernel(spec, target, path)


def test_a_build_past_its_limit_is_cut_off(task, target):
    """A candidate whose build outlasts the limit fails as BUILD_TIMEOUT, saying which limit and where it is set;
    a candidate built beside it is measured."""
    config = dataclasses.replace(FAST, build_timeout=scaled(5.0))
    with LocalRunner(config, build_fn=_faulty_build, run_fn=_faulty_run) as r:
        slow, ok = r.measure([MeasureInput(task, _trace(task, "slow_build")), MeasureInput(task, _trace(task))], target)
    assert slow.failure is FailureKind.BUILD_TIMEOUT and slow.costs == (), str(slow)
    assert slow.detail.startswith(f"the build outlasted its limit of {config.build_timeout:g} s")
    assert "--build-timeout" in slow.detail
    _assert_ok(ok)


def test_the_tuner_logs_a_cut_off_build_as_a_failed_candidate(task, target, tmp_path):
    config = dataclasses.replace(FAST, build_timeout=scaled(5.0))
    log = tmp_path / "log.jsonl"
    with LocalRunner(config, build_fn=_slow_candidate_build) as r:
        tune([task], target, log, TuneConfig(trials=2, batch=2, verify=0, search=SearchConfig(population=16, generations=1)),
             runner=r)
    records = list(read_records(log))
    assert len(records) == 2
    assert all(rec.failure is FailureKind.BUILD_TIMEOUT and "outlasted its limit" in rec.error for rec in records)


def test_the_default_build_limit_follows_the_load(monkeypatch):
    """10 s on an idle machine; stretched by the load per core, at most MAX_LOAD_SCALE times."""
    cores = os.cpu_count() or 1
    for load, scale in [(0.0, 1.0), (2.5 * cores, 2.5), (100.0 * cores, MAX_LOAD_SCALE)]:
        monkeypatch.setattr(os, "getloadavg", lambda load=load: (load, load, load))
        assert build_limit() == pytest.approx(BUILD_LIMIT_S * scale)
        assert LocalRunner(dataclasses.replace(FAST, build_timeout=None)).build_timeout == pytest.approx(
            BUILD_LIMIT_S * scale)
    assert LocalRunner(FAST).build_timeout == FAST.build_timeout  # a limit the user sets is kept


def test_candidates_are_timed_in_interleaved_passes(task, target):
    """Each candidate's repeats are split over passes that take the candidates in turn, alternating order, so a slow
    stretch of the machine spoils one pass of a candidate and not all its repeats."""
    config = dataclasses.replace(FAST, repeat=5, passes=2, run_timeout=scaled(30.0))  # a fresh worker starts under the first run
    with LocalRunner(config, build_fn=_faulty_build, run_fn=_clocked_run) as r:
        a, b, c = (res.costs for res in r.measure([MeasureInput(task, _trace(task))] * 3, target))
    assert len(a) == len(b) == len(c) == 5  # 3 repeats in the first pass, 2 in the second
    assert a[0] < b[0] < c[0] < c[3] < b[3] < a[3]


def test_failed_reference_fails_every_candidate(runner, task, target):
    orphan = dataclasses.replace(task, workload=NO_DEFAULT)
    results = runner.measure([MeasureInput(orphan, _trace(task)), MeasureInput(orphan, "[]")], target)
    assert [r.failure for r in results] == [FailureKind.NO_REFERENCE, FailureKind.BUILD_ERROR]
    assert results[0].detail.startswith("the default schedule failed (build_error: RuntimeError: no default")


def test_compare_outputs():
    f = np.zeros((2, 3), "float32")
    assert compare_outputs([f], [f + 1e-6], 1e-4, 1e-4) == ""
    g = f.copy()
    g[1, 2] = np.nan
    assert compare_outputs([f], [g], 1e-4, 1e-4).startswith("max abs err nan at (1, 2) of output 0")
    ints = np.arange(4)
    assert compare_outputs([ints], [ints + (ints == 3)], 1e-4, 10).startswith("max abs err 1 at (3,)")
    assert compare_outputs([f], [f.ravel()], 1e-4, 1e-4) == "output 0 has shape (6,), expected (2, 3)"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def rpc_device():
    """A tracker and one server under the key 'cinn-test', on loopback."""
    pytest.importorskip("tornado", reason="TVM's RPC tracker needs tornado")
    from tvm.rpc.server import Server
    from tvm.rpc.tracker import Tracker

    port = _free_port()
    tracker = Tracker(host="127.0.0.1", port=port, port_end=port + 100, silent=True)
    port = _free_port()
    tracker_addr = ("127.0.0.1", tracker.port)
    server = Server(host="127.0.0.1", port=port, port_end=port + 100, tracker_addr=tracker_addr, key="cinn-test", silent=True)
    yield tracker
    server.terminate()
    tracker.terminate()


def test_rpc_runner_construction_errors(rpc_device):
    with pytest.raises(ConnectionError, match="has no device 'nope'"):
        RpcRunner(f"127.0.0.1:{rpc_device.port}", "nope", FAST, connect_timeout=0.5)
    with pytest.raises(ConnectionError, match="cannot reach the RPC tracker"):
        RpcRunner(f"127.0.0.1:{_free_port()}", "cinn-test", FAST)


def test_rpc_runner_on_loopback(rpc_device, task, target):
    with RpcRunner(f"127.0.0.1:{rpc_device.port}", "cinn-test", FAST) as r:
        ok, bad = r.measure([MeasureInput(task, _trace(task)), MeasureInput(task, "[]x")], target)
        _assert_ok(ok)
        assert bad.failure is FailureKind.BUILD_ERROR
        rpc_device.terminate()  # the last RPC test: the tracker goes away mid-tuning
        (lost,) = r.measure([MeasureInput(task, None)], target)
    assert lost.failure is FailureKind.RUN_ERROR, str(lost)
    assert lost.detail.startswith("ConnectionError: cannot reach the RPC tracker"), str(lost)
