"""Tuned schedules judged inside the model, cinn-tune's last step. The tuner times each kernel alone with its caches
flushed; inside a run its inputs come warm from the kernel before it, and a schedule that won alone can lose there
(see docs/notes/measurement-noise.md). So the model is compiled twice, with
the log's tuned schedules and with the default ones (the log's conv algorithms in both: the same kernels), both are
timed kernel by kernel inside runs in interleaved rounds, and every tuned workload's times go to the log as
model-scope records, which compile then prefers to the kernel-scope ones."""
from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from autotune.database import DEFAULT_TRACE, Record, Scope, append_records, fastest_traces, read_records
from autotune.tuner import record_versions
from cinn.compiler.passes.winograd import ALGORITHM_PREFIX
from cinn.core.ir import Program
from cinn.core.target import Target
from cinn.core.utils import random_feeds, wall_seconds
from cinn.facade.api import compile as compile_program
from cinn.facade.api import default_fingerprints
from cinn.runtime import cuda_module
from cinn.runtime.executable import Executable

ROUNDS = 5  # interleaved: a slow stretch of a shared machine hits both variants, and the median drops it
REPEAT = 10  # runs per round at most; each kernel's median of them is the round's time
MIN_REPEAT = 3
ROUND_S = 1.0  # a build's runs per round are fewer where they would take longer (a large model's run nears a second)


@dataclass(frozen=True)
class Verdict:
    """One tuned workload inside the model: its in-run seconds (summed over its kernels, median over the rounds)
    with the tuned schedule and with the default one."""

    workload: str
    name: str  # its first kernel's
    kernels: int
    tuned_s: float
    default_s: float

    @property
    def kept(self) -> bool:
        """Whether the tuned schedule stays (compile's choice: the lower median)."""
        return self.tuned_s <= self.default_s


def judge_in_model(programs: Sequence[Program], target: Target, log: str | os.PathLike, rounds: int = ROUNDS,
                   repeat: int = REPEAT, progress: Callable[[int, int], None] | None = None) -> list[Verdict]:
    """Time the log's tuned kernels of each program inside runs against the default schedules, append the times to
    the log as model-scope records and return the verdicts (none where the target's device is absent). A round
    takes `repeat` runs of each build, fewer (down to MIN_REPEAT) where they would take over ROUND_S.
    progress(done, total) follows each round."""
    kernel_scope = [r for r in read_records(log) if r.scope is Scope.KERNEL]
    traces = fastest_traces(kernel_scope, target)
    if not traces or (target.is_cuda and not cuda_module.device_present()):
        return []
    algorithms = [r for r in kernel_scope if r.workload.startswith(ALGORITHM_PREFIX)]
    verdicts: list[Verdict] = []
    for i, program in enumerate(programs):
        tuned = compile_program(program, target, tuning_log=kernel_scope)
        default = compile_program(program, target, tuning_log=algorithms)
        if tuned.kernel_workloads != default.kernel_workloads:
            raise RuntimeError(f"cinn-tune: {program.name}: the tuned and default builds have different kernels")
        step = None if progress is None else (lambda r, i=i: progress(i * rounds + r, len(programs) * rounds))
        times = _interleaved(tuned, default, random_feeds(program.inputs, 0), rounds, repeat, step)
        baselines = default_fingerprints(program, target, traces, algorithms)
        verdicts += _judge(tuned, times, traces, baselines, target, log)
    return verdicts


def _interleaved(tuned: Executable, default: Executable, feeds, rounds: int, repeat: int,
                 progress: Callable[[int], None] | None) -> tuple[list[list[float]], list[list[float]]]:
    """Each round's per-kernel in-run seconds of both builds, which goes first alternating."""
    for exe in (tuned, default):
        exe.run(feeds)  # warm-up: a first run starts the thread pool
    run_s = wall_seconds(lambda: default.run(feeds))()
    repeat = max(min(repeat, MIN_REPEAT), min(repeat, int(ROUND_S / max(run_s, 1e-9))))
    builds: list[tuple[Executable, list[list[float]]]] = [(tuned, []), (default, [])]
    for r in range(rounds):
        for exe, times in builds if r % 2 == 0 else builds[::-1]:
            times.append(exe.kernel_times(feeds, repeat))
        if progress:
            progress(r + 1)
    return builds[0][1], builds[1][1]


def _judge(exe: Executable, times: tuple[list[list[float]], list[list[float]]], traces: dict[str, str],
           baselines: dict[str, str], target: Target, log) -> list[Verdict]:
    """Sum each tuned workload's kernels per round, log both schedules' rounds (noting the default schedule's
    fingerprint), and return the verdicts."""
    positions: dict[str, list[int]] = {}
    for k, w in enumerate(exe.kernel_workloads):
        if w in traces:
            positions.setdefault(w, []).append(k)
    names = exe.kernel_names
    records, verdicts = [], []
    for w, ks in positions.items():
        tuned, default = ([sum(rnd[k] for k in ks) for rnd in rounds] for rounds in times)
        records += [Record(w, str(target), trace, tuple(costs), record_versions(), scope=Scope.MODEL,
                           baseline=baselines.get(w, "")) for trace, costs in ((traces[w], tuned), (DEFAULT_TRACE, default))]
        verdicts.append(Verdict(w, names[ks[0]], len(ks), statistics.median(tuned), statistics.median(default)))
    append_records(log, records)
    return verdicts
