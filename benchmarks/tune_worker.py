"""tune-bench workers: each step of benchmarks/tune_bench.py in its own interpreter; the result is the last stdout line.

``python -m benchmarks.tune_worker tune WORKLOAD --tuner ours|ms --trials N --target T``  -> TuneOutcome JSON
``python -m benchmarks.tune_worker retime PLAN.json``                                  -> Retimed JSON
``python -m benchmarks.tune_worker numpy WORKLOAD``                                    -> GFLOP/s
The parent sets the thread-count environment variables before these processes start.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence

import numpy as np
import tvm
from tvm.s_tir import Schedule, Trace

from autotune.database import read_records
from autotune.measure import arg_infos
from autotune.space import trace_json
from autotune.task import Task
from autotune.tuner import TuneConfig, tune
from benchmarks.harness import ATOL, RTOL
from benchmarks.tune_bench import Candidate, NumpyRate, Retimed, RetimePlan, TuneOutcome, Tuner, Workload, get_workload
from cinn.compiler.build import KernelSpec, build_kernel, load_library
from cinn.compiler.lower import lower_program
from cinn.core.target import Target, parse_target
from cinn.core.utils import interleaved_medians, median_seconds, random_arrays
from cinn.runtime.machine import configure_threads
from cinn.runtime.worker_pool import die_with_spawner

SAMPLE_S = 0.01  # each interleaved timing sample runs the kernel for about this long
MS_FAILED_S = 1e9  # MetaSchedule's database records a failed candidate with a run time of 1e10 s
TunerResult = tuple[str | None, float | None, dict[str, int]]  # best trace, its cost as measured, failures by kind


def workload_task(workload: Workload) -> Task:
    """The workload's single fused kernel as a tuning task: both tuners start from this PrimFunc."""
    _, lowered = lower_program(workload.build())
    if len(lowered) != 1:
        names = ", ".join(lg.group.name for lg in lowered)
        raise RuntimeError(f"{workload.name}: lowered to {len(lowered)} kernels ({names}); the benchmark needs exactly one")
    lg = lowered[0]
    return Task.from_func(lg.func, lg.group.kind, lg.group.name)


# ---------------------------------------------------------------------------------------------
# tuning


def _fast_build(mod, target, _params):
    """MetaSchedule's default build without `import tvm.s_tir.tensor_intrin` (~38 s per builder worker)."""
    return tvm.tirx.build(mod, target=target)


def tune_ms(task: Task, target: Target, trials: int, work_dir: str) -> TunerResult:
    """Tune with MetaSchedule (XGBoost cost model): the best trace, the best cost it measured, failures."""
    from tvm.s_tir import meta_schedule as ms  # slow to import, and only the MetaSchedule run needs it

    tvm_target = target.tvm()
    db = ms.tune_tir(
        mod=task.module(),
        target=tvm_target,
        work_dir=work_dir,
        max_trials_global=trials,
        num_trials_per_iter=min(32, trials),
        cost_model="xgb",
        builder=ms.builder.LocalBuilder(f_build=_fast_build, timeout_sec=60),
        runner=ms.runner.LocalRunner(),
        seed=1,
    )
    sch = ms.tir_integration.compile_tir(db, task.module(), tvm_target)
    if sch is None:
        raise RuntimeError(f"MetaSchedule found no valid schedule for {task.name} in {trials} trials")
    record = db.query_tuning_record(task.module(), tvm_target, "main")
    costs = [float(c) for c in record.run_secs] if record is not None and record.run_secs else []
    failed = sum(1 for r in db.get_all_tuning_records() if not r.run_secs or min(float(c) for c in r.run_secs) >= MS_FAILED_S)
    return trace_json(sch), (sum(costs) / len(costs) if costs else None), ({"build or run": failed} if failed else {})


def tune_ours(task: Task, target: Target, trials: int, work_dir: str) -> TunerResult:
    """Tune with our tuner into a fresh log: the best trace (None = default schedule), its cost, failures by kind."""
    log = os.path.join(work_dir, "tuning.jsonl")
    (summary,) = tune([task], target, log, TuneConfig(trials=trials, seed=0))
    failures = Counter(str(r.failure) for r in read_records(log) if r.failed)
    return summary.best_trace, summary.best_cost if math.isfinite(summary.best_cost) else None, dict(failures)


TUNERS = {Tuner.OURS: tune_ours, Tuner.MS: tune_ms}


def _import_tuner(tuner: Tuner) -> None:
    """Import MetaSchedule before its clock starts (ours is imported with this module): the wall time compares searches,
    not imports (MetaSchedule's TuneContext imports tvm.s_tir.tensor_intrin, ~40 s here, which would otherwise dominate
    its time)."""
    if tuner is Tuner.MS:
        import tvm.s_tir.tensor_intrin  # noqa: F401
        from tvm.s_tir import meta_schedule  # noqa: F401


def run_tune(tuner: Tuner, workload: Workload, trials: int, target: Target) -> TuneOutcome:
    """One tuning run; tune_s is the wall time of the tuner call alone (no interpreter start-up or lowering)."""
    task = workload_task(workload)
    _import_tuner(tuner)
    with tempfile.TemporaryDirectory(prefix=f"tune-bench-{tuner.value}-") as work_dir:
        t0 = time.perf_counter()
        trace, best, failures = TUNERS[tuner](task, target, trials, work_dir)
        tune_s = time.perf_counter() - t0
    return TuneOutcome(tuner, workload.name, trials, task.workload, tune_s, trace, best, failures)


# ---------------------------------------------------------------------------------------------
# re-timing


def _build(task: Task, cand: Candidate, target: Target, lib_dir: str):
    """Build a candidate exactly as cinn.compile builds a tuned kernel, and load it."""
    path = os.path.join(lib_dir, f"{len(os.listdir(lib_dir))}.so")
    if cand.tuner is Tuner.MS and cand.trace is not None:
        # MetaSchedule's trace, from the search this benchmark ran: TVM's own instructions, which cinn replays only
        # where its schedules emit them (a tuning log is not trusted), so it is applied and built here as TVM would
        sch = Schedule(tvm.IRModule({"main": task.func()}))
        Trace.apply_json_to_schedule(json.loads(cand.trace), sch)
        tvm.compile(sch.mod, target=target.tvm()).export_library(path)
    else:
        build_kernel(KernelSpec(task.workload, task.func(), task.kind, cand.trace), target, path)
    return load_library(path, target)


def run_retime(plan: RetimePlan) -> Retimed:
    """Build every candidate, check its outputs against the default schedule's, time them interleaved."""
    target = parse_target(plan.target)
    configure_threads(target.num_cores)
    task = workload_task(get_workload(plan.workload))
    data = random_arrays([(info.shape, info.dtype) for info in arg_infos(task)], 0)
    dev = tvm.cpu(0)
    errors: dict[str, str] = {}
    evaluators = {}
    reference = None
    with tempfile.TemporaryDirectory(prefix="tune-bench-retime-") as lib_dir:
        for cand in plan.candidates:
            try:
                mod = _build(task, cand, target, lib_dir)
            except Exception as err:
                errors[cand.label] = f"build failed: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
                continue
            args = [tvm.runtime.tensor(a.copy(), dev) for a in data]
            mod["main"](*args)
            out = [a.numpy() for a in args]
            reference = out if reference is None else reference
            if not all(np.allclose(o, w, rtol=RTOL, atol=ATOL) for o, w in zip(out, reference, strict=True)):
                errors[cand.label] = "MISMATCH with the first candidate's outputs"
                continue
            evaluators[cand.label] = _evaluator(mod, dev, args)
        return Retimed(interleaved_medians(evaluators, plan.repeat, plan.warmup), errors)


def _evaluator(mod, dev, args):
    """A zero-argument timer returning seconds per run, batching runs so one sample lasts about SAMPLE_S."""
    once = mod.time_evaluator("main", dev, number=1, repeat=3)(*args).median
    number = max(1, math.ceil(SAMPLE_S / max(once, 1e-9)))
    f = mod.time_evaluator("main", dev, number=number, repeat=1)
    return lambda: f(*args).mean


# ---------------------------------------------------------------------------------------------
# numpy baseline


def run_numpy(workload: Workload, repeat: int, warmup: int) -> NumpyRate:
    """numpy's matmul GFLOP/s on the workload's shape (threads from the environment the parent set), and the BLAS
    kernel it ran."""
    if not workload.matmul:
        raise ValueError(f"{workload.name} is not a matmul workload")
    m, n, k = workload.matmul
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)
    c = np.empty((m, n), np.float32)
    seconds = median_seconds(lambda: np.matmul(a, b, out=c), repeat, warmup)
    return NumpyRate(2.0 * m * n * k / seconds / 1e9, blas_kernel())


def blas_kernel() -> str:
    """The BLAS library numpy calls, its version and the CPU kernel it chose, as threadpoolctl reports them."""
    from threadpoolctl import threadpool_info  # the bench extra: only this worker needs it

    blas = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    return "; ".join(f"{i.get('internal_api')} {i.get('version')} {i.get('architecture', '?')}" for i in blas) or "none"


# ---------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.tune_worker", description="One step of the tuner benchmark.")
    sub = p.add_subparsers(dest="step", required=True)
    t = sub.add_parser("tune", help="tune one workload with one tuner")
    t.add_argument("workload")
    t.add_argument("--tuner", required=True, choices=[x.value for x in Tuner])
    t.add_argument("--trials", type=int, required=True)
    t.add_argument("--target", default="llvm")
    r = sub.add_parser("retime", help="build and time the candidates of a plan file")
    r.add_argument("plan", help="RetimePlan JSON file")
    n = sub.add_parser("numpy", help="numpy matmul GFLOP/s on a matmul workload's shape")
    n.add_argument("workload")
    n.add_argument("--repeat", type=int, default=30)
    n.add_argument("--warmup", type=int, default=5)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    if a.step == "tune":
        result = run_tune(Tuner(a.tuner), get_workload(a.workload), a.trials, parse_target(a.target)).to_json()
    elif a.step == "retime":
        with open(a.plan, encoding="utf-8") as f:
            result = run_retime(RetimePlan.from_json(f.read())).to_json()
    else:
        result = run_numpy(get_workload(a.workload), a.repeat, a.warmup).to_json()
    print(result, flush=True)
    return 0


if __name__ == "__main__":
    die_with_spawner()
    sys.exit(main())
