"""The schedule log: JSON lines, one record per measured candidate; compile applies the best per workload."""
from __future__ import annotations

import enum
import fcntl
import json
import math
import os
import statistics
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from types import MappingProxyType

from cinn.compiler.passes.winograd import ALGORITHM_FAMILY
from cinn.core.target import Target
from schedules import replay


class FailureKind(enum.StrEnum):
    """Why a measured candidate has no cost."""

    BUILD_ERROR = "build_error"  # scheduling or compiling raised
    BUILD_TIMEOUT = "build_timeout"
    BUILD_CRASH = "build_crash"  # the build worker died (segfault, abort, out of memory)
    RUN_ERROR = "run_error"  # loading or calling the kernel raised
    RUN_TIMEOUT = "run_timeout"
    RUN_CRASH = "run_crash"  # the run worker died
    WRONG_RESULT = "wrong_result"  # outputs differ from the default schedule's
    NO_REFERENCE = "no_reference"  # the default schedule failed, so no candidate of the workload can be checked
    UNKNOWN = "unknown"  # a failed record from a log written before failure kinds were recorded


class Scope(enum.StrEnum):
    """Where a record's costs were measured."""

    KERNEL = "kernel"  # the kernel alone, by the tuner's runner (caches flushed)
    MODEL = "model"  # inside runs of the whole model, against the default schedule (cinn-tune's in-model check)


DEFAULT_TRACE = ""  # the trace of a model-scope record of the default schedule


@dataclass(frozen=True)
class Record:
    """One measured schedule candidate of a workload on a target."""

    workload: str  # structural hash of the group's PrimFunc
    target: str
    trace: str  # the schedule as a replayable TVM trace (JSON text)
    costs: tuple[float, ...]  # seconds per run; empty when the candidate failed
    versions: tuple[tuple[str, str], ...] = ()
    error: str = ""  # what went wrong, for people (the failure's details)
    failure: FailureKind | None = None
    scope: Scope = Scope.KERNEL
    # model scope: the fingerprint of the default schedule it was judged against (cinn.compiler.build.default_fingerprint);
    # "" in logs written before it was noted
    baseline: str = ""

    @property
    def failed(self) -> bool:
        return self.failure is not None

    @property
    def schedule_trace(self) -> bool:
        """Whether the trace is a schedule to replay: not the default schedule's, nor a conv algorithm's choice."""
        return self.trace != DEFAULT_TRACE and not self.workload.startswith(ALGORITHM_FAMILY)

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, line: str) -> Record:
        d = json.loads(line)
        return cls(
            workload=str(d["workload"]),
            target=str(d["target"]),
            trace=str(d["trace"]),
            costs=tuple(float(c) for c in d["costs"]),
            versions=tuple((str(k), str(v)) for k, v in d.get("versions", ())),
            error=str(d.get("error", "")),
            failure=FailureKind(d["failure"]) if d.get("failure") else FailureKind.UNKNOWN if d.get("error") else None,
            scope=Scope(d.get("scope", Scope.KERNEL)),
            baseline=str(d.get("baseline", "")),
        )


def append_records(path: str | os.PathLike, records: Sequence[Record]) -> None:
    """Append records as whole lines under an exclusive lock, so concurrent tuners never interleave, and fsync;
    after a torn last line (a writer killed mid-line) a newline is written first, so only that line is lost."""
    if not records:
        return
    data = "".join(r.to_json() + "\n" for r in records).encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if _ends_torn(path):
            data = b"\n" + data
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)  # releases the lock


def _ends_torn(path: str | os.PathLike) -> bool:
    """Whether a non-empty file lacks its final newline."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        if f.tell() == 0:
            return False
        f.seek(-1, os.SEEK_END)
        return f.read(1) != b"\n"


def read_records(path: str | os.PathLike) -> Iterator[Record]:
    """Records of a log; corrupt or torn lines, and records whose trace holds anything cinn's schedules never emit
    (schedules.replay: a trace could link code into a kernel), are skipped with a warning naming the line."""
    if not os.path.exists(path):
        return
    with open(path, encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = Record.from_json(line)
            except (ValueError, KeyError, TypeError, RecursionError) as err:
                warnings.warn(f"{path}:{lineno}: skipping corrupt tuning record ({err})", stacklevel=2)
                continue
            try:
                if rec.schedule_trace:
                    replay.check(rec.trace)
            except replay.TraceRefused as err:
                warnings.warn(f"{path}:{lineno}: skipping a tuning record whose trace cinn's schedules never emit "
                              f"({err})", stacklevel=2)
                continue
            yield rec


class TracePool:
    """Measurements pooled per trace: a trace costs the median of all its timed runs, so a re-measured candidate is
    judged on every measurement rather than its luckiest, and a slow stretch of the machine in one of them moves it
    least; one failed measurement rules a trace out."""

    def __init__(self) -> None:
        self._costs: dict[str, list[float]] = {}
        self._failed: set[str] = set()

    def add(self, trace: str, costs: Sequence[float], failure: FailureKind | None = None) -> None:
        if failure is not None or not costs:
            self._failed.add(trace)
        else:
            self._costs.setdefault(trace, []).extend(costs)

    def cost(self, trace: str | None) -> float:
        """Median seconds per run; inf when never measured or failed."""
        costs = self._costs.get(trace) if trace is not None and trace not in self._failed else None
        return statistics.median(costs) if costs else math.inf

    def ranked(self) -> list[str]:
        """Successful traces, fastest first."""
        return sorted((t for t in self._costs if t not in self._failed), key=self.cost)

    def best(self) -> tuple[float, str | None]:
        """The fastest successful trace and its cost; (inf, None) when there is none."""
        ranked = self.ranked()
        return (self.cost(ranked[0]), ranked[0]) if ranked else (math.inf, None)


def best_traces(path: str | os.PathLike, target: Target) -> dict[str, str]:
    """The fastest successful trace per workload measured on this target (measurements pooled per trace)."""
    return fastest_traces(read_records(path), target)


def fastest_traces(records: Iterable[Record], target: Target,
                   baselines: Mapping[str, str] = MappingProxyType({})) -> dict[str, str]:
    """best_traces over records already read. A workload measured inside the model is decided by those measurements
    alone: a schedule that wins alone with flushed caches can lose among its neighbours; where the default schedule
    wins there, the workload has no trace. `baselines` maps workloads to the fingerprint of today's default schedule:
    a model-scope record judged against another (its default changed since) does not count, and a workload whose
    every verdict is such keeps the default (a tuned schedule is applied only where it beat the default it replaces)."""
    pools: dict[tuple[str, Scope], TracePool] = {}
    for rec in records:
        if rec.target == str(target):
            key = (rec.workload, rec.scope)
            if key not in pools:
                pools[key] = TracePool()
            if rec.scope is Scope.KERNEL or rec.baseline in ("", baselines.get(rec.workload, rec.baseline)):
                pools[key].add(rec.trace, rec.costs, rec.failure)
    best = {}
    for (workload, scope), pool in pools.items():
        if scope is Scope.MODEL or (workload, Scope.MODEL) not in pools:
            best[workload] = pool.best()[1]
    return {w: t for w, t in best.items() if t is not None and t != DEFAULT_TRACE}


def noted_baselines(records: Iterable[Record], target: Target) -> dict[str, set[str]]:
    """The default-schedule fingerprints each workload's model-scope records on this target were judged against ("" for
    records written before the fingerprints)."""
    noted: dict[str, set[str]] = {}
    for rec in records:
        if rec.target == str(target) and rec.scope is Scope.MODEL:
            noted.setdefault(rec.workload, set()).add(rec.baseline)
    return noted
