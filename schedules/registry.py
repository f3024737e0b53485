"""Schedule rules and post-processors, registered per kind of target.

A kernel's default schedule is the applicable rule of highest priority for its target kind; each kind has a generic
rule at priority FALLBACK that applies to every kernel. A rule module registers its rules itself
(`@schedule_rule`), and `schedules/__init__.py` imports every rule module once. Every scheduled module, by default or
by a tuned trace, then passes through its target kind's post-processors (`@postprocessor`) before it is compiled.
An op whose kernels need a dedicated rule declares it (OpDef.needs_rules): a kernel holding the op that the rule
does not schedule raises MissingRule instead of falling silently to a generic schedule.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import tvm
from tvm.s_tir import Schedule

from cinn.core.ops import OPS, PatternKind, RuleName, TargetKind
from cinn.core.target import Target
from schedules.analysis import blocks
from schedules.knobs import DEFAULT, Knobs

FALLBACK = 0  # the priority of a target kind's generic rule


class ScheduleRule(Protocol):
    """A default schedule for the kernels it recognizes."""

    def applicable(self, sch: Schedule, kind: PatternKind, target: Target, knobs: Knobs) -> bool:
        """Whether the rule schedules this kernel (of a group of pattern kind `kind`)."""

    def apply(self, sch: Schedule, target: Target, knobs: Knobs) -> None:
        """Schedule the kernel, asking `knobs` for every tunable decision."""


PostProcessor = Callable[[tvm.IRModule], tvm.IRModule]
R = TypeVar("R", bound=ScheduleRule)
P = TypeVar("P", bound=PostProcessor)


@dataclass(frozen=True)
class Registered:
    """A rule as registered: its target kind, its priority (higher is tried first) and the name that ops needing
    it use (OpDef.needs_rules)."""

    rule: ScheduleRule
    target_kind: TargetKind
    priority: int
    serves: RuleName | None = None

    @property
    def name(self) -> str:
        return type(self.rule).__name__


@dataclass(frozen=True)
class Registry:
    """The registered rules (highest priority first) and post-processors (in registration order) by target kind."""

    rules: dict[TargetKind, list[Registered]] = field(default_factory=dict)
    postprocessors: dict[TargetKind, list[PostProcessor]] = field(default_factory=dict)

    def add_rule(self, entry: Registered) -> None:
        """Register a rule; two rules of one target kind may not share a priority (their order would be arbitrary)."""
        entries = self.rules.setdefault(entry.target_kind, [])
        clash = next((e for e in entries if e.priority == entry.priority), None)
        if clash is not None:
            raise ValueError(f"schedule rules {clash.name} and {entry.name} share priority {entry.priority} "
                             f"on {entry.target_kind.name}")
        entries.append(entry)
        entries.sort(key=lambda e: -e.priority)

    def copy(self) -> Registry:
        """An independent copy (a test registers rules into it)."""
        return Registry({k: list(v) for k, v in self.rules.items()}, {k: list(v) for k, v in self.postprocessors.items()})


REGISTRY = Registry()


class MissingRule(RuntimeError):
    """A kernel holds an op that needs a schedule rule, and that rule does not schedule it."""


def schedule_rule(target_kind: TargetKind, priority: int, serves: RuleName | None = None) -> Callable[[type[R]], type[R]]:
    """Class decorator: register an instance of the rule class for `target_kind` at `priority` (under the name
    `serves`, where ops need the rule)."""
    if serves is not None and serves.target_kind is not target_kind:
        raise ValueError(f"rule {serves.name} is for {serves.target_kind.name}, not {target_kind.name}")

    def register(cls: type[R]) -> type[R]:
        REGISTRY.add_rule(Registered(cls(), target_kind, priority, serves))
        return cls

    return register


def postprocessor(target_kind: TargetKind) -> Callable[[P], P]:
    """Function decorator: run this module-to-module rewrite over every scheduled module of `target_kind`."""

    def register(fn: P) -> P:
        REGISTRY.postprocessors.setdefault(target_kind, []).append(fn)
        return fn

    return register


def rules(target_kind: TargetKind) -> tuple[Registered, ...]:
    """The rules of a target kind, highest priority first."""
    return tuple(REGISTRY.rules.get(target_kind, ()))


def pick(sch: Schedule, kind: PatternKind, target: Target, knobs: Knobs = DEFAULT) -> Registered:
    """The applicable rule of highest priority for the kernel; MissingRule where an op of the kernel needs another."""
    target_kind = TargetKind.of(target)
    chosen = next((e for e in rules(target_kind) if e.rule.applicable(sch, kind, target, knobs)), None)
    for op, need in _needed(sch, target_kind):
        if chosen is None or chosen.serves is not need:
            registered = any(e.serves is need for e in rules(target_kind))
            why = (f"it does not apply to this kernel (a group of kind {kind.name})" if registered
                   else "no rule is registered under that name")
            raise MissingRule(f"cinn: op {op!r} needs the schedule rule {need.name} on {target_kind.name}, but {why}")
    if chosen is None:
        raise MissingRule(f"cinn: no schedule rule applies on {target_kind.name} (is its FALLBACK rule registered?)")
    return chosen


def _needed(sch: Schedule, target_kind: TargetKind) -> list[tuple[str, RuleName]]:
    """The ops of the kernel (found by their output blocks' names) that need a rule on this target kind, and it."""
    names = {sch.get(b).name_hint for b in blocks(sch)}
    return [(name, need) for name in sorted(names & OPS.keys()) for need in OPS[name].needs_rules
            if need.target_kind is target_kind]


def apply_default(sch: Schedule, kind: PatternKind, target: Target, knobs: Knobs = DEFAULT) -> None:
    """Schedule a kernel of a group of this kind by its rule; the knobs decide its tunable choices (default:
    hand-written)."""
    pick(sch, kind, target, knobs).rule.apply(sch, target, knobs)


def postprocess(mod: tvm.IRModule, target: Target) -> tvm.IRModule:
    """A scheduled module through the post-processors of its target kind."""
    for fn in REGISTRY.postprocessors.get(TargetKind.of(target), ()):
        mod = fn(mod)
    return mod
