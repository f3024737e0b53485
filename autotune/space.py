"""The search space: cinn's schedules with their knobs sampled; every candidate is a replayable TVM trace.

A candidate is the list of decisions its schedule took, each keyed by its knob and occurrence (the second `rows` the
schedule asked for). A plan maps keys to values; replaying it re-runs the schedule, taking a planned value where its
key comes up and still fits and sampling the rest, so mutating one decision may change which knobs follow it.
"""
from __future__ import annotations

import json
import math
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import tvm
from tvm.s_tir import Schedule

from autotune.task import Task
from cinn.core.target import Target
from schedules import apply_default
from schedules.knobs import Knob
from schedules.replay import replay as checked_replay

DecisionKey = tuple[Knob, int]  # a knob and how many times the schedule had asked for it before
DecisionValue = int | tuple[int, ...]


@dataclass(frozen=True)
class Choice:
    """A categorical decision: one of `candidates`."""

    knob: Knob
    occurrence: int
    value: int
    candidates: tuple[int, ...]

    @property
    def key(self) -> DecisionKey:
        return (self.knob, self.occurrence)


@dataclass(frozen=True)
class Split:
    """A perfect-tile decision: factors multiplying to a loop's extent, the innermost at most `max_innermost`."""

    knob: Knob
    occurrence: int
    factors: tuple[int, ...]
    max_innermost: int

    @property
    def key(self) -> DecisionKey:
        return (self.knob, self.occurrence)

    @property
    def value(self) -> tuple[int, ...]:
        return self.factors


Decision = Choice | Split
Decisions = tuple[Decision, ...]
# Planned values by decision key; a plain sequence replays a recorded trace's decisions in their order
Plan = Mapping[DecisionKey, DecisionValue] | Sequence[DecisionValue]


def key(decisions: Decisions) -> tuple:
    """What identifies a candidate: its keyed decision values, in the order the schedule took them."""
    return tuple((d.key, d.value) for d in decisions)


def plan_of(decisions: Decisions) -> dict[DecisionKey, DecisionValue]:
    """The decisions as a plan that replays them."""
    return {d.key: d.value for d in decisions}


class SampledKnobs:
    """Knobs that record each decision as a TVM sampling instruction: planned values are taken where they fit,
    otherwise the hand-written default (`use_defaults`) or a random value."""

    def __init__(self, rng: random.Random, planned: Plan = (), use_defaults: bool = False):
        self.rng = rng
        self.keyed = dict(planned) if isinstance(planned, Mapping) else None
        self.positional = None if isinstance(planned, Mapping) else list(planned)
        self.use_defaults = use_defaults
        self.taken: list[Decision] = []
        self._asked: Counter[Knob] = Counter()

    def _plan(self, knob: Knob) -> tuple[int, DecisionValue | None]:
        """The occurrence of this knob and its planned value (None: none planned)."""
        occurrence = self._asked[knob]
        self._asked[knob] += 1
        if self.keyed is not None:
            return occurrence, self.keyed.get((knob, occurrence))
        i, planned = len(self.taken), self.positional or []
        return occurrence, planned[i] if i < len(planned) else None

    def choose(self, sch: Schedule, knob: Knob, candidates: Sequence[int], default: int) -> int:
        cands = [int(c) for c in candidates]
        occurrence, want = self._plan(knob)
        if isinstance(want, int) and want in cands:
            value = want
        else:
            value = default if self.use_defaults else self.rng.choice(cands)
        sch.sample_categorical(cands, [1.0 / len(cands)] * len(cands), decision=cands.index(value))
        self.taken.append(Choice(knob, occurrence, value, tuple(cands)))
        return value

    def tile(self, sch: Schedule, knob: Knob, loop, n: int, default: Sequence[int], max_innermost: int) -> list:
        extent = math.prod(default)
        occurrence, want = self._plan(knob)
        if _fits(want, n, extent, max_innermost):
            factors = tuple(want)  # type: ignore[arg-type]
        else:
            factors = tuple(default) if self.use_defaults else random_tile(self.rng, extent, n, max_innermost)
        rvs = sch.sample_perfect_tile(loop, n, max_innermost, decision=list(factors))
        self.taken.append(Split(knob, occurrence, factors, max_innermost))
        return rvs


def _fits(want, n: int, extent: int, max_innermost: int) -> bool:
    """Whether a planned value is a valid perfect tile for this loop."""
    return isinstance(want, tuple) and len(want) == n and math.prod(want) == extent and want[-1] <= max_innermost


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


def sample(task: Task, target: Target, rng: random.Random, planned: Plan = (), use_defaults: bool = False,
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


def mutate(decisions: Decisions, rng: random.Random) -> dict[DecisionKey, DecisionValue]:
    """A plan with one decision changed: another candidate, or a prime factor moved between split levels."""
    plan = plan_of(decisions)
    mutable = [d for d in decisions if _can_mutate(d)]
    if mutable:
        d = rng.choice(mutable)
        plan[d.key] = rng.choice([c for c in d.candidates if c != d.value]) if isinstance(d, Choice) else _move_factor(d, rng)
    return plan


def _can_mutate(d: Decision) -> bool:
    return len(d.candidates) > 1 if isinstance(d, Choice) else math.prod(d.factors) > 1


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
    return random_tile(rng, math.prod(d.factors), len(d.factors), d.max_innermost)


def crossover(a: Decisions, b: Decisions, rng: random.Random) -> dict[DecisionKey, DecisionValue]:
    """A plan taking each decision from either parent, matched by knob and occurrence; a decision only one parent
    took (its schedule asked for a knob the other's did not) comes from that parent."""
    plan_a, plan_b = plan_of(a), plan_of(b)
    return {k: rng.choice((plan_a[k], plan_b[k])) if k in plan_a and k in plan_b else {**plan_b, **plan_a}[k]
            for k in {**plan_a, **plan_b}}


def decisions_of_trace(trace_text: str) -> list[DecisionValue]:
    """The decision values recorded in a logged trace, in order: a positional plan that replays it through the space
    (the trace's sampling instructions carry no knob names)."""
    insts, decided = json.loads(trace_text)
    by_inst = dict((int(i), d) for i, d in decided)
    values: list[DecisionValue] = []
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
    checked_replay(sch, trace_text)
    return sch

