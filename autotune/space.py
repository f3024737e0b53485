"""The search space: cinn's schedules with their knobs sampled; every candidate is a replayable TVM trace.

A candidate is the list of decisions its schedule took. Replaying a decision list re-runs the schedule with those
decisions where they still fit and samples the rest, so mutating one decision may change what follows it.
"""
from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass

import tvm
from tvm.s_tir import Schedule, Trace

from cinn.autotune.task import Task
from cinn.schedules import apply_default
from cinn.target import Target


@dataclass(frozen=True)
class Choice:
    """A categorical decision: one of `candidates`."""

    name: str
    value: int
    candidates: tuple[int, ...]


@dataclass(frozen=True)
class Split:
    """A perfect-tile decision: factors multiplying to a loop's extent, the innermost at most `max_innermost`."""

    name: str
    factors: tuple[int, ...]
    max_innermost: int


Decision = Choice | Split
Decisions = tuple[Decision, ...]


def key(decisions: Decisions) -> tuple:
    """What identifies a candidate: its decision values."""
    return tuple(d.value if isinstance(d, Choice) else d.factors for d in decisions)


class SampledKnobs:
    """Knobs that record each decision as a TVM sampling instruction: planned values are taken where they fit,
    otherwise the hand-written default (`use_defaults`) or a random value."""

    def __init__(self, rng: random.Random, planned: Sequence = (), use_defaults: bool = False):
        self.rng = rng
        self.planned = list(planned)
        self.use_defaults = use_defaults
        self.taken: list[Decision] = []

    def _plan(self):
        i = len(self.taken)
        return self.planned[i] if i < len(self.planned) else None

    def choose(self, sch: Schedule, name: str, candidates: Sequence[int], default: int) -> int:
        cands = [int(c) for c in candidates]
        want = self._plan()
        if want in cands:
            value = want
        else:
            value = default if self.use_defaults else self.rng.choice(cands)
        sch.sample_categorical(cands, [1.0 / len(cands)] * len(cands), decision=cands.index(value))
        self.taken.append(Choice(name, value, tuple(cands)))
        return value

    def tile(self, sch: Schedule, name: str, loop, n: int, default: Sequence[int], max_innermost: int) -> list:
        extent = _prod(default)
        want = self._plan()
        if _fits(want, n, extent, max_innermost):
            factors = tuple(want)
        else:
            factors = tuple(default) if self.use_defaults else random_tile(self.rng, extent, n, max_innermost)
        rvs = sch.sample_perfect_tile(loop, n, max_innermost, decision=list(factors))
        self.taken.append(Split(name, factors, max_innermost))
        return rvs


def _prod(values) -> int:
    out = 1
    for v in values:
        out *= int(v)
    return out


def _fits(want, n: int, extent: int, max_innermost: int) -> bool:
    """Whether a planned value is a valid perfect tile for this loop."""
    return isinstance(want, tuple) and len(want) == n and _prod(want) == extent and want[-1] <= max_innermost


def random_tile(rng: random.Random, extent: int, n: int, max_innermost: int) -> tuple[int, ...]:
    """A random perfect tile: each prime factor of the extent goes to a random level (innermost kept in bound)."""
    while True:
        factors = [1] * n
        for p in _primes(extent):
            factors[rng.randrange(n)] *= p
        if factors[-1] <= max_innermost:
            return tuple(factors)


def _primes(n: int) -> list[int]:
    out, p = [], 2
    while p * p <= n:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out + ([n] if n > 1 else [])


@dataclass(frozen=True)
class Candidate:
    """A schedule of a task and the decisions that made it."""

    decisions: Decisions
    sch: Schedule

    @property
    def key(self) -> tuple:
        return key(self.decisions)

    def trace_json(self) -> str:
        """The schedule as replayable trace JSON (what the log stores)."""
        return trace_json(self.sch)


def trace_json(sch: Schedule) -> str:
    """A schedule's trace as JSON text (the trace holds IntImm values that json cannot write as they are)."""
    return json.dumps(sch.trace.as_json(), default=lambda o: o.value, separators=(",", ":"))


def sample(task: Task, target: Target, rng: random.Random, planned: Sequence = (), use_defaults: bool = False,
           module: tvm.IRModule | None = None) -> Candidate | None:
    """Apply the task's schedule with sampled knobs; None when the decisions do not give a valid schedule."""
    sch = Schedule(module if module is not None else task.module())
    knobs = SampledKnobs(rng, planned, use_defaults)
    try:
        apply_default(sch, task.kind, target, knobs)
    except (RuntimeError, ValueError):  # a decision TVM rejects (its ScheduleError and InternalError are RuntimeErrors)
        return None
    return Candidate(tuple(knobs.taken), sch)


def default_candidate(task: Task, target: Target, module: tvm.IRModule | None = None) -> Candidate:
    """The hand-written default schedule, as a point of the space."""
    cand = sample(task, target, random.Random(0), use_defaults=True, module=module)
    if cand is None:
        raise RuntimeError(f"cinn: the default schedule of task {task.name} ({task.workload}) failed")
    return cand


def mutate(decisions: Decisions, rng: random.Random) -> list:
    """Planned values with one decision changed: another candidate, or a prime factor moved between split levels."""
    values = list(key(decisions))
    mutable = [i for i, d in enumerate(decisions) if _can_mutate(d)]
    if not mutable:
        return values
    i = rng.choice(mutable)
    d = decisions[i]
    if isinstance(d, Choice):
        values[i] = rng.choice([c for c in d.candidates if c != d.value])
    else:
        values[i] = _move_factor(d, rng)
    return values


def _can_mutate(d: Decision) -> bool:
    return len(d.candidates) > 1 if isinstance(d, Choice) else _prod(d.factors) > 1


def _move_factor(d: Split, rng: random.Random) -> tuple[int, ...]:
    """Move one prime factor from one level to another (MetaSchedule's tile-size mutation); a fresh tile if stuck."""
    for _ in range(8):
        src, dst = rng.sample(range(len(d.factors)), 2)
        if d.factors[src] == 1:
            continue
        p = rng.choice(_primes(d.factors[src]))
        out = list(d.factors)
        out[src] //= p
        out[dst] *= p
        if out[-1] <= d.max_innermost:
            return tuple(out)
    return random_tile(rng, _prod(d.factors), len(d.factors), d.max_innermost)


def crossover(a: Decisions, b: Decisions, rng: random.Random) -> list:
    """Planned values taking each decision from either parent (where their structures agree)."""
    va, vb = key(a), key(b)
    return [rng.choice(pair) for pair in zip(va, vb)] + list(va[len(vb) :])


def decisions_of_trace(trace_text: str) -> list:
    """The decision values recorded in a logged trace, in order (to replay it through the space)."""
    insts, decided = json.loads(trace_text)
    by_inst = dict((int(i), d) for i, d in decided)
    values = []
    for i, inst in enumerate(insts):
        kind, attrs = inst[0], inst[2]
        if kind == "SampleCategorical":
            values.append(int(attrs[0][int(by_inst[i])]))
        elif kind == "SamplePerfectTile":
            values.append(tuple(int(f) for f in by_inst[i]))
    return values


def replay(task: Task, target: Target, trace_text: str) -> Schedule:
    """Apply a logged trace to the task's func."""
    sch = Schedule(task.module())
    Trace.apply_json_to_schedule(json.loads(trace_text), sch)
    return sch

