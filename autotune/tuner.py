"""The tuning loop: rounds of search + measurement per task, chosen by the task scheduler, logged as they finish."""
from __future__ import annotations

import math
import os
import random
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import tvm

from autotune import space
from autotune.cost_model import CostModel
from autotune.database import Record, Scope, TracePool, append_records, read_records
from autotune.measure import LocalRunner, MeasureInput, MeasureResult, Runner
from autotune.scheduler import TaskProgress, next_task, round_size
from autotune.search import SearchConfig, TaskSearch
from autotune.space import Candidate
from autotune.task import Task
from cinn.compiler.build import code_version
from cinn.core.target import Target


@dataclass(frozen=True)
class TuneConfig:
    """Trial budget over all tasks (as MetaSchedule's max_trials_global), trials per round, seed, search settings,
    and how many of each task's best candidates are re-measured with its default at the end (0: none)."""

    trials: int = 64
    batch: int = 16
    seed: int = 0
    verify: int = 3
    search: SearchConfig = field(default_factory=SearchConfig)


@dataclass(frozen=True)
class TaskSummary:
    """How tuning went for one task: trials measured, default and best cost (seconds), the best trace. The costs are
    those of the verification, which times the default and the best side by side, where it ran (measured rounds
    apart, a shared machine's slow stretch in one of them reads as a speed-up or a loss), else pooled over every
    measurement."""

    task: Task
    trials: int
    default_cost: float
    best_cost: float
    best_trace: str | None

    @property
    def speedup(self) -> float:
        return self.default_cost / self.best_cost if math.isfinite(self.best_cost) and self.best_cost else math.nan


@dataclass(frozen=True)
class Progress:
    """A round finished: trials so far out of the budget, the task tuned and its costs now."""

    trials: int
    total: int
    task_index: int
    summary: TaskSummary


class _TaskState:
    """One task's search, scheduler view, default and best."""

    def __init__(self, task: Task, target: Target, config: TuneConfig, seed: int):
        self.search = TaskSearch(task, target, config.search, random.Random(seed))
        self.progress = TaskProgress(weight=task.weight)
        self.default = space.default_candidate(task, target, self.search.module)
        self.default_trace: str | None = None
        self.pool = TracePool()
        self.side_by_side = TracePool()  # the verification's measurements alone
        self.verified = False  # whether the log's records of this task end with a verification (re-measurements)

    @property
    def task(self) -> Task:
        return self.search.task

    def note(self, cand: Candidate, trace: str, result: MeasureResult) -> None:
        """Record one measurement."""
        self.search.record(cand, result.median)
        if cand.key == self.default.key:
            self.default_trace = trace
        self.pool.add(trace, result.costs, result.failure)

    def finalists(self, k: int) -> list[str]:
        """The k best traces and the default's, to re-measure back to back."""
        best = self.pool.ranked()[:k]
        return best + [self.default_trace] if self.default_trace and self.default_trace not in best else best

    def summary(self) -> TaskSummary:
        best_trace = self.pool.best()[1]
        verified = all(math.isfinite(self.side_by_side.cost(t)) for t in (best_trace, self.default_trace))
        costs = self.side_by_side if verified else self.pool
        return TaskSummary(self.task, self.progress.trials, costs.cost(self.default_trace), costs.cost(best_trace),
                           best_trace)


def tune(
    tasks: Sequence[Task],
    target: Target,
    log: str | os.PathLike,
    config: TuneConfig = TuneConfig(),
    *,
    runner: Runner | None = None,
    model: CostModel | None = None,
    resume: bool = False,
    progress: Callable[[Progress], None] | None = None,
) -> list[TaskSummary]:
    """Tune tasks within the trial budget, appending every measured candidate to the log.

    With resume, the log's records for these tasks and target count towards the budget, seed the search and train
    the cost model; the default schedule of each task is measured first, as the baseline and correctness reference.
    """
    states = [_TaskState(t, target, config, config.seed + i) for i, t in enumerate(tasks)]
    model = model if model is not None else CostModel(seed=config.seed)
    own_runner = runner is None
    runner = runner if runner is not None else LocalRunner()
    used = _resume(states, target, log, model) if resume else 0
    logged = [s.progress.trials for s in states]
    try:
        while used < config.trials:
            views = [s.progress for s in states]
            i = next_task(views)
            if i is None:
                break
            n = round_size(views, i, config.batch, config.trials - used)
            used += _round(states[i], target, log, model, runner, n)
            if progress:
                progress(Progress(used, config.trials, i, states[i].summary()))
        for i, state in enumerate(states):
            if state.progress.trials == logged[i] and state.verified:
                continue  # nothing new since the log's own verification (a run killed before it gets one now)
            if _verify(state, target, log, runner, config.verify) and progress:
                progress(Progress(used, config.trials, i, state.summary()))
    finally:
        if own_runner:
            runner.close()
    return [s.summary() for s in states]


def _round(state: _TaskState, target: Target, log, model: CostModel, runner: Runner, n: int) -> int:
    """Propose, measure, log and learn from up to n candidates of one task; returns how many were measured."""
    first = [state.default] if not state.progress.history else []
    cands = first + state.search.propose(n - len(first), model)
    if not cands:
        state.progress.exhausted = True
        return 0
    traces = [c.trace_json() for c in cands]
    results = runner.measure([MeasureInput(state.task, t) for t in traces], target)
    append_records(log, [_record(state.task, target, t, r) for t, r in zip(traces, results, strict=True)])
    for c, t, r in zip(cands, traces, results, strict=True):
        state.note(c, t, r)
    model.update(state.task.workload, state.search.features(cands), [r.median for r in results])
    state.progress.add_round(len(cands), state.pool.best()[0])
    return len(cands)


def _verify(state: _TaskState, target: Target, log, runner: Runner, k: int) -> bool:
    """Re-measure a task's k best candidates and its default back to back and log them: on a noisy machine the
    fastest of many measurements is often a lucky one, and pooled costs (as the log's best_traces pools them) let
    the re-measurement overrule it. Returns whether it measured anything."""
    traces = state.finalists(k) if k else []
    if len(traces) < 2:
        return False
    results = runner.measure([MeasureInput(state.task, t) for t in traces], target)
    append_records(log, [_record(state.task, target, t, r) for t, r in zip(traces, results, strict=True)])
    for t, r in zip(traces, results, strict=True):
        state.pool.add(t, r.costs, r.failure)
        state.side_by_side.add(t, r.costs, r.failure)
    return True


def _record(task: Task, target: Target, trace: str, result: MeasureResult) -> Record:
    return Record(task.workload, str(target), trace, tuple(result.costs), record_versions(), result.detail, result.failure)


def record_versions() -> tuple[tuple[str, str], ...]:
    """The versions a record notes: TVM's and this code's."""
    return (("tvm", tvm.__version__), ("cinn", code_version()))


def _resume(states: list[_TaskState], target: Target, log, model: CostModel) -> int:
    """Feed the log's records of these tasks back into the search and the model; returns how many distinct
    candidates they measured (re-measurements count once)."""
    by_workload = {s.task.workload: s for s in states}
    seen: dict[str, list[tuple[Candidate, str, MeasureResult]]] = {}
    stale = 0
    for rec in read_records(log):
        state = by_workload.get(rec.workload)
        if state is None or rec.target != str(target) or rec.scope is not Scope.KERNEL:
            continue
        cand = space.sample(state.task, target, random.Random(0), space.decisions_of_trace(rec.trace),
                            module=state.search.module)
        # decisions are read by position: where the schedule's knobs changed since, they make another schedule,
        # which must not take the record's measurement
        if cand is None or cand.trace_json() != rec.trace:
            stale += 1
            continue
        seen.setdefault(rec.workload, []).append((cand, rec.trace, MeasureResult(rec.costs, rec.failure, rec.error)))
    if stale:
        warnings.warn(f"{stale} records of {log} no longer replay as this code's schedules (its knobs changed since): "
                      "not resumed; compile still applies them by their traces", stacklevel=3)
    for workload, items in seen.items():
        state = by_workload[workload]
        for cand, trace, result in items:
            state.note(cand, trace, result)
        # re-measured pools move the ranking, so the finalists read back may differ from those the log verified
        state.verified = any(t == items[-1][1] for _, t, _ in items[:-1])
        model.update(workload, state.search.features([c for c, _, _ in items]), [r.median for _, _, r in items])
        state.progress.add_round(len({t for _, t, _ in items}), state.pool.best()[0])
    return sum(state.progress.trials for state in states)
