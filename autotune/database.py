"""The schedule log: JSON lines, one record per measured candidate; compile applies the best per workload."""
from __future__ import annotations

import fcntl
import json
import math
import os
import warnings
from dataclasses import asdict, dataclass
from typing import Iterator, Sequence

from cinn.target import Target


@dataclass(frozen=True)
class Record:
    """One measured schedule candidate of a workload on a target."""

    workload: str  # structural hash of the group's PrimFunc
    target: str
    trace: str  # the schedule as a replayable TVM trace (JSON text)
    costs: tuple[float, ...]  # seconds per run; empty when the candidate failed
    versions: tuple[tuple[str, str], ...] = ()
    error: str = ""

    @property
    def mean_cost(self) -> float:
        return sum(self.costs) / len(self.costs) if self.costs and not self.error else math.inf

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, line: str) -> "Record":
        d = json.loads(line)
        return cls(
            workload=str(d["workload"]),
            target=str(d["target"]),
            trace=str(d["trace"]),
            costs=tuple(float(c) for c in d["costs"]),
            versions=tuple((str(k), str(v)) for k, v in d.get("versions", ())),
            error=str(d.get("error", "")),
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
    """Records of a log; corrupt or torn lines are skipped with a warning naming the line."""
    if not os.path.exists(path):
        return
    with open(path, encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield Record.from_json(line)
            except (ValueError, KeyError, TypeError) as err:
                warnings.warn(f"{path}:{lineno}: skipping corrupt tuning record ({err})", stacklevel=2)


def best_traces(path: str | os.PathLike, target: Target) -> dict[str, str]:
    """The fastest successful trace per workload measured on this target."""
    best: dict[str, Record] = {}
    for rec in read_records(path):
        if rec.target == str(target) and math.isfinite(rec.mean_cost):
            if rec.workload not in best or rec.mean_cost < best[rec.workload].mean_cost:
                best[rec.workload] = rec
    return {k: r.trace for k, r in best.items()}
