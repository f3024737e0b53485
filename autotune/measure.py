"""Measurement: build schedule candidates in worker processes, time them one at a time, check their outputs.

Builds run in parallel in a pool of reused worker processes; timing runs go, one candidate at a time, to a
separate single-worker pool (local) or to a device leased from a TVM RPC tracker (RpcRunner). A candidate that
fails to build, crashes its worker, hangs past the timeout or computes a different result than the workload's
default schedule gives a failed MeasureResult; measure() itself does not raise for a bad candidate. measure()
returns after its last timing run, so the builds of the next batch never overlap a timing run.

A candidate's build is part of what tuning spends: one that outlasts its limit (MeasureConfig.build_timeout, by
default BUILD_LIMIT_S stretched by the machine's load) is cut off and recorded as a BUILD_TIMEOUT naming the limit.
"""
from __future__ import annotations

import contextlib
import enum
import math
import os
import socket
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

import numpy as np
import tvm
from tvm import rpc
from tvm.s_tir import Schedule

from autotune.database import FailureKind
from autotune.task import Task
from cinn.compiler.build import KernelSpec, build_kernel, load_library
from cinn.core.target import Target
from cinn.core.utils import random_arrays
from cinn.runtime.cuda_module import require_device
from cinn.runtime.machine import configure_threads
from cinn.runtime.worker_pool import WorkerPool

T = TypeVar("T")

# seconds a candidate's build may take on an idle core: the default schedules build well within it
# (docs/notes/build-time-limits.md); a tuned one past it costs more tuning time than it can win back
BUILD_LIMIT_S = 10.0
MAX_LOAD_SCALE = 4.0  # how far a loaded machine stretches the default build limit: a hang must still end


def build_limit(base: float = BUILD_LIMIT_S) -> float:
    """The default per-candidate build limit on this machine now: `base` seconds stretched by the load per core (a
    build sharing its core runs slower, not forever), at most MAX_LOAD_SCALE times."""
    load = os.getloadavg()[0] / (os.cpu_count() or 1)
    return base * min(max(1.0, load), MAX_LOAD_SCALE)


@dataclass(frozen=True)
class MeasureConfig:
    """How candidates are built, timed and checked."""

    # seconds a candidate's build may take; None: build_limit() when the runner is made
    build_timeout: float | None = None
    run_timeout: float = 10.0  # seconds per candidate run: load, warm-up call, timing, output download
    hang_grace: float = 10.0  # seconds past either timeout after which a worker that has not answered is killed
    repeat: int = 3  # timed repeats; MeasureResult.costs has one entry per repeat
    # the repeats are split into this many passes over a round's candidates (see _PoolRunner._timed)
    passes: int = 3
    number: int = 1  # calls averaged within one repeat
    min_repeat_ms: int = 20  # TVM raises `number` until one repeat lasts this long
    build_workers: int = field(default_factory=lambda: os.cpu_count() or 1)
    check_correctness: bool = True  # compare outputs with the workload's default schedule
    # CPU: before every timed call, flush the caches of all arguments but the first (the weights, the output), which a
    # kernel inside a model finds cold; each repeat is then one call (number and min_repeat_ms do not apply)
    cache_flush: bool = False
    rtol: float = 1e-4
    atol: float = 1e-4
    seed: int = 0  # of the random kernel arguments

    def __post_init__(self):
        if min(self.build_timeout or 1.0, self.run_timeout, self.hang_grace) <= 0:
            raise ValueError(f"MeasureConfig: timeouts must be positive, got {self.build_timeout}, {self.run_timeout}, "
                             f"{self.hang_grace}")
        if min(self.repeat, self.passes, self.number, self.build_workers) < 1:
            raise ValueError(f"MeasureConfig: repeat, passes, number and build_workers must be >= 1, got {self}")


@dataclass(frozen=True)
class MeasureInput:
    """One candidate: a task and its schedule trace (JSON text as the schedule log stores it; None = default)."""

    task: Task
    trace: str | None


@dataclass(frozen=True)
class MeasureResult:
    """Seconds per timed repeat, or () with the kind of failure and its details when the candidate failed."""

    costs: tuple[float, ...]
    failure: FailureKind | None = None
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.failure is None

    def __str__(self) -> str:
        return f"{self.failure}: {self.detail}" if self.failure else f"ok: {self.median:.3g} s"

    @property
    def median(self) -> float:
        """Median seconds per run (a slow pass of a shared machine moves it least); inf when failed."""
        return statistics.median(self.costs) if self.costs and self.ok else math.inf


class Runner(Protocol):
    """What the tuner measures candidates with."""

    def measure(self, inputs: Sequence[MeasureInput], target: Target) -> list[MeasureResult]: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class ArgInfo:
    """One kernel parameter: shape, dtype and whether the kernel writes it."""

    shape: tuple[int, ...]
    dtype: str
    is_output: bool


@dataclass(frozen=True)
class Timing:
    """time_evaluator's settings."""

    number: int
    repeat: int
    min_repeat_ms: int
    cache_flush: bool = False


@dataclass(frozen=True)
class RpcEndpoint:
    """Where RpcRunner leases its device: a tracker address and device key."""

    host: str
    port: int
    key: str
    session_timeout: float  # the server ends a session that lasts longer

    def __str__(self) -> str:
        return f"{self.key}@{self.host}:{self.port}"


@dataclass(frozen=True)
class RunRequest:
    """What a run function needs: the library, its arguments, where and how to time it."""

    lib_path: str
    args: tuple[ArgInfo, ...]
    target: Target
    timing: Timing
    seed: int
    fetch_outputs: bool
    trace: str | None  # the candidate's schedule (None = default), so a run function can tell candidates apart
    remote: RpcEndpoint | None = None  # None: this machine


@dataclass(frozen=True)
class RunOutput:
    """Seconds per repeat and the outputs of the warm-up call (empty unless requested)."""

    costs: tuple[float, ...]
    outputs: tuple[np.ndarray, ...]


BuildFn = Callable[[KernelSpec, Target, str], str]
RunFn = Callable[[RunRequest], RunOutput]


def arg_infos(task: Task) -> tuple[ArgInfo, ...]:
    """The kernel's parameters in call order (inputs, then outputs), from its unscheduled PrimFunc."""
    sch = Schedule(task.module())
    func = sch.mod["main"]  # the schedule's copy: its blocks write these very buffers
    written = [r.source for b in sch.get_child_blocks(sch.get_sblock("root")) for r in sch.get(b).writes]
    return tuple(
        ArgInfo(tuple(int(d) for d in p.shape), str(p.dtype), any(w.same_as(p) for w in written)) for p in func.params
    )


def run_kernel(request: RunRequest) -> RunOutput:
    """Load a kernel library (here or on the RPC device), call it once on seeded arguments, then time it."""
    module, dev, config_threads = _open_local(request) if request.remote is None else _open_remote(request)
    if not request.target.is_cuda and request.remote is None:  # TVM's pool defaults to one thread on some machines
        configure_threads(request.target.num_cores, config_threads)
    elif not request.target.is_cuda:  # an RPC call cannot carry the CPU list: such a server needs TVM_NUM_THREADS
        config_threads(1, request.target.num_cores)
    args = [tvm.runtime.tensor(a, dev) for a in random_arrays([(a.shape, a.dtype) for a in request.args], request.seed)]
    module["main"](*args)
    dev.sync()
    outputs = tuple(t.numpy() for t, a in zip(args, request.args, strict=True) if a.is_output) if request.fetch_outputs else ()
    t = request.timing
    flush = t.cache_flush and not request.target.is_cuda
    timer = module.time_evaluator("main", dev, number=1 if flush else t.number, repeat=t.repeat,
                                  min_repeat_ms=0 if flush else t.min_repeat_ms,
                                  f_preproc="cache_flush_cpu_non_first_arg" if flush else "")
    return RunOutput(tuple(float(c) for c in timer(*args).results), outputs)


def _open_local(request: RunRequest):
    """The loaded library, its device and the thread-pool setter, on this machine."""
    if request.target.is_cuda:
        require_device()
    dev = tvm.cuda(0) if request.target.is_cuda else tvm.cpu(0)
    return load_library(request.lib_path, request.target), dev, tvm.get_global_func("runtime.config_threadpool")


def _open_remote(request: RunRequest):
    """The uploaded library, its device and the thread-pool setter, on a device leased from the tracker."""
    remote = request.remote
    if remote is None:
        raise ValueError("_open_remote: the request names no RPC device")
    _probe(remote, min(remote.session_timeout, 5.0))
    try:
        session = rpc.connect_tracker(remote.host, remote.port).request(remote.key, session_timeout=remote.session_timeout)
    except Exception as err:
        raise ConnectionError(f"RPC: no session for {remote}: {_short(err)}") from err
    dev = session.cuda(0) if request.target.is_cuda else session.cpu(0)
    if not dev.exist:
        raise RuntimeError(f"RPC device {remote} has no {'CUDA' if request.target.is_cuda else 'CPU'} device 0")
    session.upload(request.lib_path)
    module = session.load_module(os.path.basename(request.lib_path))
    return module, dev, session.get_function("runtime.config_threadpool")


def compare_outputs(expected: Sequence[np.ndarray], actual: Sequence[np.ndarray], rtol: float, atol: float) -> str:
    """'' when the outputs match (allclose for floats, exact otherwise), else where they differ most."""
    if len(expected) != len(actual):
        return f"{len(actual)} outputs, expected {len(expected)}"
    for k, (e, a) in enumerate(zip(expected, actual, strict=True)):
        if e.shape != a.shape:
            return f"output {k} has shape {a.shape}, expected {e.shape}"
        if np.issubdtype(e.dtype, np.inexact):
            bad = ~np.isclose(a, e, rtol=rtol, atol=atol, equal_nan=True)
        else:
            bad = a != e
        if bad.any():
            err = np.where(bad, np.abs(a.astype(np.float64) - e.astype(np.float64)), 0.0)
            idx = np.unravel_index(np.argmax(np.nan_to_num(err, nan=np.inf)), err.shape)
            return f"max abs err {err[idx]:.3g} at {tuple(int(i) for i in idx)} of output {k} (expected {e[idx]}, got {a[idx]})"
    return ""


@dataclass(frozen=True)
class _Outcome(Generic[T]):
    """A worker's value, or why there is none."""

    value: T | None
    failure: FailureKind | None = None
    detail: str = ""

    @property
    def result(self) -> T:
        """The value of a successful outcome."""
        if self.value is None:
            raise RuntimeError(f"no value: {self.failure}: {self.detail}")
        return self.value


def _guarded(fn: Callable[..., T], *args) -> _Outcome[T]:
    """Run in a worker: exceptions become short messages (the pool would ship whole tracebacks, or fail
    to rebuild exception types with other constructors); the caller knows the stage, and so the failure kind."""
    try:
        return _Outcome(fn(*args))
    except Exception as err:
        return _Outcome(None, FailureKind.UNKNOWN, _short(err))


def _short(err: BaseException) -> str:
    """The exception's type, the first line of its message and TVM's 'Error message:' line (not the IR dump)."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    text = " ".join(lines[:1] + [ln for ln in lines[1:] if ln.startswith("Error message:")])
    name = type(err).__name__
    return (text if text.startswith(name) else f"{name}: {text}")[:300]


class _Stage(enum.Enum):
    """A measurement stage: its failure kinds (error, timeout, crash), and what it is called and its limit set."""

    BUILD = (FailureKind.BUILD_ERROR, FailureKind.BUILD_TIMEOUT, FailureKind.BUILD_CRASH, "build",
             "MeasureConfig.build_timeout, cinn-tune --build-timeout")
    RUN = (FailureKind.RUN_ERROR, FailureKind.RUN_TIMEOUT, FailureKind.RUN_CRASH, "run",
           "MeasureConfig.run_timeout, cinn-tune --timeout")


def _collect(future, stage: _Stage, timeout: float, grace: float, pool: WorkerPool) -> _Outcome:
    """A pool future's outcome, its failure given the stage's kind. A worker that does not answer `grace` seconds
    past its own timeout is killed (a candidate that corrupted its heap left it deadlocked in malloc, the worker's
    timeout thread with it, and the tuner waiting for ever)."""
    error, timed_out, crashed, what, limit = stage.value
    try:
        out = future.result(timeout=timeout + grace)
    except TimeoutError:
        if not future.done():
            pool.kill_workers()
            with contextlib.suppress(Exception):  # the blocked receive now fails: the worker restarts on demand
                future.result(timeout=grace)
            return _Outcome(None, timed_out, f"the {what} did not answer {timeout + grace:g} s after it started, past "
                                              f"its limit of {timeout:g} s ({limit}): the worker was killed")
        return _Outcome(None, timed_out, f"the {what} outlasted its limit of {timeout:g} s ({limit}); cut off")
    except ChildProcessError:
        return _Outcome(None, crashed, "the worker process died (segfault, abort or out of memory)")
    except Exception as err:
        return _Outcome(None, error, _short(err))
    return out if out.failure is None else _Outcome(None, error, out.detail)


def _import_compiler() -> None:
    """Worker initializer: import TVM and the schedules before the first (timed-out) build."""
    import schedules  # noqa: F401  (runs in the worker process: its purpose is the import)


def _import_runtime() -> None:
    """Worker initializer: import TVM before the first (timed-out) run."""
    import tvm  # noqa: F401  (runs in the worker process: its purpose is the import)


@dataclass(frozen=True)
class _Reference:
    """A workload's default-schedule outputs, or why there are none."""

    outputs: tuple[np.ndarray, ...]
    error: str = ""


class _PoolRunner:
    """The measure loop shared by the local and RPC runners: parallel builds, then one run at a time."""

    def __init__(self, config: MeasureConfig, build_fn: BuildFn, run_fn: RunFn, remote: RpcEndpoint | None):
        self.config = config
        self._build_fn = build_fn
        self._run_fn = run_fn
        self._remote = remote
        self.build_timeout = config.build_timeout if config.build_timeout is not None else build_limit()
        self._build_pool: WorkerPool | None = None
        self._run_pool: WorkerPool | None = None
        self._args: dict[str, tuple[ArgInfo, ...]] = {}
        self._refs: dict[tuple[Target, str], _Reference] = {}  # by target and workload

    def measure(self, inputs: Sequence[MeasureInput], target: Target) -> list[MeasureResult]:
        """Build all candidates, then time them one by one; results in input order."""
        specs = [KernelSpec(i.task.workload, i.task.func(), i.task.kind, i.trace) for i in inputs]
        ref_specs: dict[str, KernelSpec] = {}  # the first candidate's func defines a new workload's reference
        if self.config.check_correctness:
            for s in specs:
                if (target, s.workload) not in self._refs:
                    ref_specs.setdefault(s.workload, KernelSpec(s.workload, s.func, s.kind))
        for i in inputs:
            if i.task.workload not in self._args:
                self._args[i.task.workload] = arg_infos(i.task)
        with tempfile.TemporaryDirectory(prefix="cinn-measure-") as tmp:
            built = self._build(list(dict.fromkeys([*ref_specs.values(), *specs])), target, tmp)
            for workload, spec in ref_specs.items():
                self._refs[target, workload] = self._reference(spec, built[spec], target)
            return self._timed(specs, built, target)

    def _timed(self, specs: list[KernelSpec], built: dict[KernelSpec, _Outcome[str]],
               target: Target) -> list[MeasureResult]:
        """Time the candidates in `passes` passes, every candidate in each, alternating order, a pass taking its share
        of the repeats. A slow stretch of a shared machine (a kernel at half speed for a tenth of a second: a whole
        candidate's repeats; see docs/notes/measurement-noise.md) then spoils one pass of a
        candidate, which the median passes over, and not every repeat of the one timed then. Outputs are checked in
        the first pass."""
        c = self.config
        passes = min(c.passes, c.repeat)
        costs: list[list[float]] = [[] for _ in specs]
        failed: dict[int, MeasureResult] = {}
        for p in range(passes):
            repeat = c.repeat // passes + (p < c.repeat % passes)
            for i in range(len(specs)) if p % 2 == 0 else reversed(range(len(specs))):
                if i not in failed:
                    result = self._measure_one(specs[i], built[specs[i]], target, repeat, check=p == 0)
                    if result.ok:
                        costs[i] += result.costs
                    else:
                        failed[i] = result
        return [failed.get(i) or MeasureResult(tuple(costs[i])) for i in range(len(specs))]

    def close(self) -> None:
        """Stop the worker processes."""
        for pool in (self._build_pool, self._run_pool):
            if pool is not None:
                pool.shutdown()
        self._build_pool = self._run_pool = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _build(self, specs: list[KernelSpec], target: Target, tmp: str) -> dict[KernelSpec, _Outcome[str]]:
        """Build every spec in parallel workers, each into its own file under tmp."""
        if self._build_pool is None:
            self._build_pool = WorkerPool(
                max_workers=self.config.build_workers, timeout=self.build_timeout, initializer=_import_compiler
            )
        futures = {
            s: self._build_pool.submit(_guarded, self._build_fn, s, target, os.path.join(tmp, f"c{n}.so"))
            for n, s in enumerate(specs)
        }
        return {s: _collect(f, _Stage.BUILD, self.build_timeout, self.config.hang_grace, self._build_pool)
                for s, f in futures.items()}

    def _run(self, spec: KernelSpec, lib: str, target: Target, timing: Timing, fetch: bool) -> _Outcome[RunOutput]:
        """Run one built candidate in the run worker (restarted by the pool after a crash or timeout)."""
        if self._run_pool is None:
            self._run_pool = WorkerPool(max_workers=1, timeout=self.config.run_timeout, initializer=_import_runtime)
        c = self.config
        args = self._args[spec.workload]
        request = RunRequest(lib, args, target, timing, c.seed, fetch, spec.trace, self._remote)
        return _collect(self._run_pool.submit(_guarded, self._run_fn, request), _Stage.RUN, c.run_timeout, c.hang_grace,
                        self._run_pool)

    def _reference(self, spec: KernelSpec, built: _Outcome[str], target: Target) -> _Reference:
        """Outputs of the workload's default schedule: what every candidate must reproduce."""
        if built.failure:
            return _Reference((), f"{built.failure}: {built.detail}")
        out = self._run(spec, built.result, target, Timing(1, 1, 0), fetch=True)
        return _Reference(out.result.outputs) if out.failure is None else _Reference((), f"{out.failure}: {out.detail}")

    def _measure_one(self, spec: KernelSpec, built: _Outcome[str], target: Target, repeat: int,
                     check: bool) -> MeasureResult:
        """`repeat` timed runs of one candidate, its outputs compared with the reference's where `check`."""
        if built.failure:
            return MeasureResult((), built.failure, built.detail)
        ref = self._refs.get((target, spec.workload)) if self.config.check_correctness and check else None
        if ref is not None and ref.error:
            return MeasureResult((), FailureKind.NO_REFERENCE, f"the default schedule failed ({ref.error})")
        c = self.config
        out = self._run(spec, built.result, target, Timing(c.number, repeat, c.min_repeat_ms, c.cache_flush),
                        fetch=ref is not None)
        if out.failure:
            return MeasureResult((), out.failure, out.detail)
        mismatch = compare_outputs(ref.outputs, out.result.outputs, c.rtol, c.atol) if ref is not None else ""
        return MeasureResult((), FailureKind.WRONG_RESULT, mismatch) if mismatch else MeasureResult(out.result.costs)


class LocalRunner(_PoolRunner):
    """Builds in parallel worker processes and times one candidate at a time in a separate worker."""

    def __init__(self, config: MeasureConfig = MeasureConfig(), build_fn: BuildFn = build_kernel, run_fn: RunFn = run_kernel):
        super().__init__(config, build_fn, run_fn, remote=None)


class RpcRunner(_PoolRunner):
    """Builds here, times on a device leased from a TVM RPC tracker ('host:port') under `key`."""

    def __init__(
        self,
        tracker: str,
        key: str,
        config: MeasureConfig = MeasureConfig(),
        session_timeout: float | None = None,  # default: the run timeout
        build_fn: BuildFn = build_kernel,
        run_fn: RunFn = run_kernel,
        connect_timeout: float = 5.0,
    ):
        host, sep, port = tracker.rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"RpcRunner: tracker must be 'host:port', got {tracker!r}")
        remote = RpcEndpoint(host, int(port), key, session_timeout if session_timeout is not None else config.run_timeout)
        _check_tracker(remote, connect_timeout)
        super().__init__(config, build_fn, run_fn, remote)


def _check_tracker(remote: RpcEndpoint, timeout: float) -> None:
    """Fail now, clearly, if the tracker is unreachable or has never seen a device under the key."""
    _probe(remote, timeout)
    deadline = time.monotonic() + timeout
    while True:  # a server registers with the tracker shortly after it starts
        queues = rpc.connect_tracker(remote.host, remote.port).summary()["queue_info"]
        if remote.key in queues:
            return
        if time.monotonic() > deadline:
            where = f"{remote.host}:{remote.port}"
            raise ConnectionError(f"RpcRunner: the tracker at {where} has no device {remote.key!r}; it has {sorted(queues)}")
        time.sleep(0.2)


def _probe(remote: RpcEndpoint, timeout: float) -> None:
    """Raise ConnectionError unless the tracker accepts connections (connect_tracker retries for a minute)."""
    try:
        socket.create_connection((remote.host, remote.port), timeout=timeout).close()
    except OSError as err:
        raise ConnectionError(f"cannot reach the RPC tracker at {remote.host}:{remote.port} ({err})") from err
