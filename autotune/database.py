"""The schedule log: JSON lines, one record per measured candidate; compile applies the best per workload."""
from __future__ import annotations

import json
import math
import os
import warnings
from dataclasses import asdict, dataclass
from typing import Iterator

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
