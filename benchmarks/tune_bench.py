"""Tuner benchmark: our auto-tuner vs TVM MetaSchedule on the same PrimFuncs, at equal trial budgets.

``python -m benchmarks.tune_bench [--workloads ...] [--trials 64 256] [--csv PATH] [--plot PATH]``

Each workload is a NetBuilder program that cinn lowers to exactly one fused PrimFunc, so both tuners get the
identical function. Every step runs in a fresh interpreter (benchmarks/tune_worker.py): one tuning run per
(tuner, workload, budget), the numpy matmul baseline, and one re-timing process per workload that builds every
best schedule through the same code path and times them interleaved with identical time_evaluator settings.
"""
from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from benchmarks.harness import spawn_module
from benchmarks.report import Column, bar_chart, render_table, write_rows_csv
from cinn.core.ir import Program
from cinn.core.target import Target, parse_target
from frontend import NetBuilder

WORKER = "benchmarks.tune_worker"
# what a failed worker process raises (spawn_module): noted in the report, the run goes on
WORKER_ERRORS = (RuntimeError, OSError, ValueError, subprocess.TimeoutExpired)
DEFAULT_TRIALS = (64, 256)


class Tuner(enum.StrEnum):
    """Who tunes the schedule."""

    OURS = "ours"
    MS = "ms"  # tvm.s_tir.meta_schedule with the XGBoost cost model

    @property
    def label(self) -> str:
        return "MetaSchedule" if self is Tuner.MS else "ours"


# ---------------------------------------------------------------------------------------------
# workloads


@dataclass(frozen=True)
class Workload:
    """A one-kernel program to tune; `matmul` = (M, N, K) for the numpy baseline and GFLOP/s."""

    name: str
    description: str
    build: Callable[[], Program]
    matmul: tuple[int, int, int] | None = None

    @property
    def flops(self) -> float | None:
        return 2.0 * math.prod(self.matmul) if self.matmul else None


def _matmul(n: int) -> Callable[[], Program]:
    def build() -> Program:
        b = NetBuilder(f"matmul_{n}")
        x, y = b.create_input("float32", (n, n), "a"), b.create_input("float32", (n, n), "b")
        return b.build([b.matmul(x, y)])

    return build


def _conv3x3() -> Program:
    b = NetBuilder("conv3x3")
    x = b.create_input("float32", (1, 64, 56, 56), "x")
    w = b.create_input("float32", (64, 64, 3, 3), "w")
    bias = b.create_input("float32", (1, 64, 1, 1), "bias")  # pre-shaped so no reshape kernel splits the group
    y = b.conv2d(x, w, strides=[1, 1], paddings=[1, 1], dilations=[1, 1], groups=1)
    return b.build([b.relu(b.add(y, bias))])


def _softmax() -> Program:
    b = NetBuilder("softmax")
    x = b.create_input("float32", (12, 128, 128), "x")
    return b.build([b.softmax(x, axes=[-1])])


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload("matmul_512", "fp32 matmul 512x512x512", _matmul(512), (512, 512, 512)),
        Workload("matmul_1024", "fp32 matmul 1024x1024x1024", _matmul(1024), (1024, 1024, 1024)),
        Workload("conv3x3", "resnet conv 1x64x56x56, 64 out, 3x3, pad 1, + bias + relu", _conv3x3),
        Workload("softmax", "attention softmax 12x128x128 over the last axis", _softmax),
        Workload("matmul_64", "fp32 matmul 64x64x64 (smoke test; not run by default)", _matmul(64), (64, 64, 64)),
    )
}
DEFAULT_WORKLOADS = ("matmul_512", "matmul_1024", "conv3x3", "softmax")


def get_workload(name: str) -> Workload:
    """A workload by name."""
    try:
        return WORKLOADS[name]
    except KeyError:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}") from None


# ---------------------------------------------------------------------------------------------
# what the workers report


@dataclass(frozen=True)
class TuneOutcome:
    """One tuning run: wall time of the tuner call, the best schedule's trace (None = cinn's default schedule),
    the best cost the tuner measured itself, and its failed candidates counted by kind (timeouts cost wall time)."""

    tuner: Tuner
    workload: str
    trials: int
    workload_key: str
    tune_s: float
    trace: str | None
    tuner_best_s: float | None
    failures: Mapping[str, int] = dataclasses.field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self) | {"tuner": self.tuner.value})

    @classmethod
    def from_json(cls, text: str) -> TuneOutcome:
        data = json.loads(text)
        return cls(**(data | {"tuner": Tuner(data["tuner"])}))


@dataclass(frozen=True)
class Candidate:
    """A schedule to re-time: its label, trace (None = cinn's default schedule) and the tuner that found it."""

    label: str
    trace: str | None
    tuner: Tuner | None = None


@dataclass(frozen=True)
class RetimePlan:
    """What the re-timing worker builds and times."""

    workload: str
    target: str
    repeat: int
    warmup: int
    candidates: tuple[Candidate, ...]

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> RetimePlan:
        data = json.loads(text)
        return cls(**(data | {"candidates": tuple(Candidate(c["label"], c["trace"], c["tuner"] and Tuner(c["tuner"]))
                                                       for c in data["candidates"])}))


@dataclass(frozen=True)
class Retimed:
    """Median seconds per candidate label; errors name the candidates that failed to build or disagree."""

    median_s: Mapping[str, float]
    errors: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"median_s": dict(self.median_s), "errors": dict(self.errors)})

    @classmethod
    def from_json(cls, text: str) -> Retimed:
        data = json.loads(text)
        return cls(data["median_s"], data["errors"])


@dataclass(frozen=True)
class NumpyRate:
    """numpy's matmul rate on a workload's shape, and the BLAS kernel that ran it (threadpoolctl's report)."""

    gflops: float
    blas: str

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> NumpyRate:
        data = json.loads(text)
        return cls(float(data["gflops"]), str(data["blas"]))


# ---------------------------------------------------------------------------------------------
# results and report


DEFAULT_LABEL = "default"


def label(tuner: Tuner, trials: int) -> str:
    """The re-timing label of a tuner's best schedule at a budget."""
    return f"{tuner.value}@{trials}"


@dataclass(frozen=True)
class Row:
    """One (workload, budget): re-timed best latencies, tuning wall times, numpy's matmul rate, and failures."""

    workload: str
    trials: int
    default_s: float | None
    best_s: Mapping[Tuner, float]
    tune_s: Mapping[Tuner, float]
    flops: float | None = None
    numpy: NumpyRate | None = None
    errors: tuple[str, ...] = ()

    def ms(self, tuner: Tuner) -> float | None:
        s = self.best_s.get(tuner)
        return s * 1e3 if s is not None else None

    def gflops(self, tuner: Tuner) -> float | None:
        s = self.best_s.get(tuner)
        return self.flops / s / 1e9 if self.flops and s else None


def _div(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def tune_columns() -> list[Column[Row]]:
    """The tuner report's columns (ratio ours/MS <= 1 means ours is at least as fast)."""
    o, m = Tuner.OURS, Tuner.MS
    return [
        Column("workload", lambda r: r.workload, "{}"),
        Column("trials", lambda r: r.trials, "{}"),
        Column("default ms", lambda r: r.default_s * 1e3 if r.default_s is not None else None),
        Column("ours ms", lambda r: r.ms(o)),
        Column("MS ms", lambda r: r.ms(m)),
        Column("ours/MS", lambda r: _div(r.ms(o), r.ms(m)), "{:.2f}"),
        Column("ours tune s", lambda r: r.tune_s.get(o), "{:.1f}"),
        Column("MS tune s", lambda r: r.tune_s.get(m), "{:.1f}"),
        Column("tune ours/MS", lambda r: _div(r.tune_s.get(o), r.tune_s.get(m)), "{:.2f}"),
        Column("numpy GFLOP/s", lambda r: r.numpy.gflops if r.numpy else None, "{:.1f}"),
        Column("numpy BLAS", lambda r: r.numpy.blas if r.numpy else None, "{}"),
        Column("ours GFLOP/s", lambda r: r.gflops(o), "{:.1f}"),
        Column("ours/numpy", lambda r: _div(r.gflops(o), r.numpy.gflops if r.numpy else None), "{:.2f}"),
        Column("MS GFLOP/s", lambda r: r.gflops(m), "{:.1f}"),
        Column("status", lambda r: "; ".join(r.errors) if r.errors else "ok", "{}"),
    ]


def write_tune_plot(rows: Sequence[Row], path: str) -> None:
    """Re-timed latency per (workload, budget): default, ours and MetaSchedule."""
    series = {DEFAULT_LABEL: [r.default_s * 1e3 if r.default_s is not None else None for r in rows]}
    series |= {t.label: [r.ms(t) for r in rows] for t in Tuner}
    bar_chart([f"{r.workload}\n@{r.trials}" for r in rows], series, "re-timed median latency (ms, log scale)", "ours vs MetaSchedule", path)


# ---------------------------------------------------------------------------------------------
# parent side


@dataclass(frozen=True)
class BenchSettings:
    """What to run and how."""

    target: Target
    trials: tuple[int, ...] = DEFAULT_TRIALS
    tuners: tuple[Tuner, ...] = (Tuner.OURS, Tuner.MS)
    repeat: int = 30
    warmup: int = 5
    timeout: float = 3600.0

    def thread_env(self) -> dict[str, str]:
        """Every worker uses the target's core count: TVM's pool and numpy's BLAS alike."""
        n = str(self.target.num_cores)
        return {"TVM_NUM_THREADS": n, "OMP_NUM_THREADS": n, "OPENBLAS_NUM_THREADS": n, "MKL_NUM_THREADS": n}


def _progress(msg: str) -> None:
    print(f"[tune-bench] {msg}", file=sys.stderr, flush=True)


def _spawn(args: Sequence[str], settings: BenchSettings) -> str:
    return spawn_module(WORKER, args, settings.timeout, settings.thread_env())


def run_tuner(tuner: Tuner, workload: str, trials: int, settings: BenchSettings) -> TuneOutcome:
    """Tune one workload with one tuner in its own process."""
    args = ["tune", workload, "--tuner", tuner.value, "--trials", str(trials), "--target", str(settings.target)]
    return TuneOutcome.from_json(_spawn(args, settings))


def retime(plan: RetimePlan, settings: BenchSettings) -> Retimed:
    """Build and time every candidate of a workload in one fresh process."""
    with tempfile.TemporaryDirectory(prefix="tune-bench-") as tmp:
        path = os.path.join(tmp, "plan.json")
        with open(path, "w", encoding="utf-8") as f:
            f.write(plan.to_json())
        return Retimed.from_json(_spawn(["retime", path], settings))


# the environment may pin OpenBLAS to an older kernel (OPENBLAS_CORETYPE=Haswell runs AVX2 code at about half the rate
# on an AVX-512 machine): numpy's process runs without them, so it gets the kernel OpenBLAS picks for this CPU
BLAS_OVERRIDES = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


def numpy_rate(workload: Workload, settings: BenchSettings) -> NumpyRate:
    """numpy's matmul rate on the workload's shape, in its own process with the same thread count and without the
    environment's BLAS kernel overrides."""
    args = ["numpy", workload.name, "--repeat", str(settings.repeat), "--warmup", str(settings.warmup)]
    return NumpyRate.from_json(spawn_module(WORKER, args, settings.timeout, settings.thread_env(), unset=BLAS_OVERRIDES))


def _tune_all(workload: Workload, settings: BenchSettings, errors: dict[int, list[str]]) -> dict[tuple[Tuner, int], TuneOutcome]:
    """Every (budget, tuner) tuning run of a workload; failures are noted per budget."""
    outcomes: dict[tuple[Tuner, int], TuneOutcome] = {}
    for trials in settings.trials:
        for tuner in settings.tuners:
            _progress(f"{workload.name}: tuning with {tuner.value}, {trials} trials ...")
            try:
                out = run_tuner(tuner, workload.name, trials, settings)
            except WORKER_ERRORS as err:
                errors[trials].append(f"{tuner.value} tuning failed: {err}")
                _progress(f"{workload.name}: {tuner.value}@{trials} FAILED: {err}")
                continue
            own = f"{out.tuner_best_s * 1e3:.3f} ms" if out.tuner_best_s is not None else "n/a"
            failed = ", ".join(f"{n} x {kind}" for kind, n in out.failures.items()) or "none"
            _progress(f"{workload.name}: {tuner.value}@{trials} tuned in {out.tune_s:.1f} s (its own best {own}; "
                      f"failed candidates: {failed})")
            outcomes[(tuner, trials)] = out
    keys = {o.workload_key for o in outcomes.values()}
    if len(keys) > 1:  # both tuners must have tuned the identical PrimFunc
        for msgs in errors.values():
            msgs.append(f"tuners saw different PrimFuncs (workload keys {sorted(keys)})")
    return outcomes


def bench_workload(workload: Workload, settings: BenchSettings) -> list[Row]:
    """Tune a workload with each tuner at each budget, re-time all best schedules together, one row per budget."""
    errors: dict[int, list[str]] = {t: [] for t in settings.trials}
    outcomes = _tune_all(workload, settings, errors)
    candidates = (Candidate(DEFAULT_LABEL, None),) + tuple(Candidate(label(t, n), o.trace, t) for (t, n), o in outcomes.items())
    _progress(f"{workload.name}: re-timing {len(candidates)} schedules ...")
    try:
        timed = retime(RetimePlan(workload.name, str(settings.target), settings.repeat, settings.warmup, candidates), settings)
    except WORKER_ERRORS as err:
        timed = Retimed({}, {c.label: f"re-timing failed: {err}" for c in candidates})
    rate = None
    if workload.matmul:
        try:
            rate = numpy_rate(workload, settings)
        except WORKER_ERRORS as err:
            for msgs in errors.values():
                msgs.append(f"numpy failed: {err}")
    return [_row(workload, trials, outcomes, timed, rate, errors[trials], settings) for trials in settings.trials]


def _row(workload: Workload, trials: int, outcomes: Mapping[tuple[Tuner, int], TuneOutcome], timed: Retimed,
         rate: NumpyRate | None, errors: list[str], settings: BenchSettings) -> Row:
    present = [t for t in settings.tuners if (t, trials) in outcomes]
    mine = {DEFAULT_LABEL} | {label(t, trials) for t in present}
    errs = list(errors) + [f"{lbl}: {msg}" for lbl, msg in timed.errors.items() if lbl in mine]
    return Row(
        workload=workload.name,
        trials=trials,
        default_s=timed.median_s.get(DEFAULT_LABEL),
        best_s={t: timed.median_s[label(t, trials)] for t in present if label(t, trials) in timed.median_s},
        tune_s={t: outcomes[(t, trials)].tune_s for t in present},
        flops=workload.flops,
        numpy=rate,
        errors=tuple(errs),
    )


def run_bench(workloads: Sequence[str], settings: BenchSettings) -> list[Row]:
    """All rows, workload by workload."""
    return [row for name in workloads for row in bench_workload(get_workload(name), settings)]


# ---------------------------------------------------------------------------------------------
# command line


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.tune_bench",
        description="Tune the same one-kernel PrimFuncs with our tuner (autotune.tuner) and TVM MetaSchedule (XGBoost cost "
        "model) at equal trial budgets; re-time both best schedules in one fresh process, interleaved; compare tuning "
        "wall time; matmul rates against numpy. Exit status: 0 all ran, 1 a tuner/build/check failed, 2 usage error.",
        epilog="workloads: " + "; ".join(f"{w.name} ({w.description})" for w in WORKLOADS.values()),
    )
    p.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS), help=f"comma-separated (default: {','.join(DEFAULT_WORKLOADS)})")
    p.add_argument("--trials", type=int, nargs="+", default=list(DEFAULT_TRIALS),
                   help="trial budgets, each given to both tuners (default: 64 256)")
    p.add_argument("--tuners", default="ours,ms", help="comma-separated subset of ours,ms (default: both)")
    p.add_argument("--target", default="llvm", help="CPU target (default: llvm, the host CPU with all cores)")
    p.add_argument("--repeat", type=int, default=30,
                   help="re-timing samples per schedule, interleaved; the median is reported (default: 30)")
    p.add_argument("--warmup", type=int, default=5, help="untimed runs per schedule before re-timing (default: 5)")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds allowed per worker process (default: 3600)")
    p.add_argument("--csv", default=None, metavar="PATH", help="also write the table as CSV")
    p.add_argument("--plot", default=None, metavar="PATH", help="also write a latency bar chart (PNG)")
    return p


def _split(text: str) -> list[str]:
    return list(dict.fromkeys(s.strip() for s in text.split(",") if s.strip()))


def _settings(args: argparse.Namespace, p: argparse.ArgumentParser) -> tuple[list[str], BenchSettings]:
    workloads = _split(args.workloads)
    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown or not workloads:
        p.error(f"--workloads: unknown or empty {unknown}; known: {', '.join(WORKLOADS)}")
    try:
        tuners = tuple(Tuner(t) for t in _split(args.tuners))
    except ValueError:
        p.error(f"--tuners: expected a subset of {','.join(t.value for t in Tuner)}, got {args.tuners!r}")
    if not tuners or any(n < 1 for n in args.trials) or args.repeat < 1 or args.warmup < 0:
        p.error("need at least one tuner, --trials >= 1, --repeat >= 1 and --warmup >= 0")
    try:
        target = parse_target(args.target)
    except ValueError as err:
        p.error(f"--target: {err}")
    if target.is_cuda:
        p.error("--target: the tuner benchmark runs on the host CPU (llvm) only")
    trials = tuple(dict.fromkeys(args.trials))
    return workloads, BenchSettings(target, trials, tuners, args.repeat, args.warmup, args.timeout)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the tuner benchmark; the exit status is 1 when anything failed."""
    p = _parser()
    args = p.parse_args(argv)
    workloads, settings = _settings(args, p)
    _progress(f"target {settings.target}; workloads {', '.join(workloads)}; budgets {list(settings.trials)}")
    rows = run_bench(workloads, settings)
    cols = tune_columns()
    print(render_table(cols, rows))
    if args.csv:
        write_rows_csv(cols, rows, args.csv)
    if args.plot:
        write_tune_plot(rows, args.plot)
    failed = [f"{r.workload}@{r.trials}" for r in rows if r.errors]
    if failed:
        print(f"tune-bench: FAILED for {', '.join(failed)} (see the status column)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
