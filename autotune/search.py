"""Evolutionary search over one task's space, guided by the cost model (as MetaSchedule's EvolutionarySearch)."""
from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from autotune import features, space
from autotune.space import Candidate, Decisions, Plan
from autotune.task import Task
from cinn.core.target import Target


@dataclass(frozen=True)
class SearchConfig:
    """Evolution settings: population scored per generation, generations per round, elites kept, exploration."""

    population: int = 64
    generations: int = 3
    elites: int = 8
    eps: float = 0.2  # share of each batch picked at random among the unmeasured, so the model sees new regions
    crossover: float = 0.2  # share of children made by crossover instead of mutation


class Model(Protocol):
    """What the search needs of a cost model."""

    def predict(self, workload: str, feats: Sequence[np.ndarray]) -> np.ndarray:
        """Scores, higher = predicted faster."""


class TaskSearch:
    """The search state of one task: measured candidates and cached features."""

    def __init__(self, task: Task, target: Target, config: SearchConfig, rng: random.Random):
        self.task, self.target, self.config, self.rng = task, target, config, rng
        self.module = task.module()
        self.measured: dict[tuple, float] = {}
        self.elites: list[tuple[float, Decisions]] = []
        self._features: dict[tuple, np.ndarray] = {}

    def record(self, cand: Candidate, cost: float) -> None:
        """Note a measured candidate (cost in seconds, inf when it failed)."""
        self.measured[cand.key] = cost
        if math.isfinite(cost):
            self.elites = sorted([*self.elites, (cost, cand.decisions)], key=lambda e: e[0])[: self.config.elites]

    def features(self, cands: Sequence[Candidate]) -> list[np.ndarray]:
        """Features of candidates, extracted once per candidate."""
        todo = [c for c in cands if c.key not in self._features]
        for c, f in zip(todo, features.extract([c.sch for c in todo], self.target), strict=True):
            self._features[c.key] = f
        return [self._features[c.key] for c in cands]

    def propose(self, n: int, model: Model) -> list[Candidate]:
        """Up to n unmeasured candidates: the model's best of an evolved population, plus a random share."""
        pool: dict[tuple, Candidate] = {}
        half = self.config.population // 2  # the first population: half random, half mutants of the elites
        self._grow(pool, [{} for _ in range(half)] + [self._child() for _ in range(self.config.population - half)])
        for _ in range(self.config.generations):
            parents = [c.decisions for c in self._ranked(pool, model)[: max(2, self.config.population // 4)]]
            parents += [d for _, d in self.elites]
            self._grow(pool, [self._child(parents) for _ in range(self.config.population)])
            pool = {c.key: c for c in self._ranked(pool, model)[: self.config.population]}
        ranked = self._ranked(pool, model)
        k = min(n, len(ranked))
        explore = round(k * self.config.eps)
        return ranked[: k - explore] + self.rng.sample(ranked[k - explore :], explore)

    def _child(self, parents: Sequence[Decisions] = ()) -> Plan:
        """A plan for a new candidate: random without parents, else a mutant or a crossover."""
        parents = list(parents) or [d for _, d in self.elites]
        if not parents:
            return {}
        if len(parents) > 1 and self.rng.random() < self.config.crossover:
            a, b = self.rng.sample(parents, 2)
            return space.crossover(a, b, self.rng)
        return space.mutate(self.rng.choice(parents), self.rng)

    def _grow(self, pool: dict, plans: Sequence[Plan]) -> None:
        """Add the candidates of plans that are new and unmeasured."""
        for plan in plans:
            planned = tuple(plan.items()) if isinstance(plan, dict) else ()
            if planned and (planned in pool or planned in self.measured):
                continue  # a complete plan replays to its own key: skip applying the schedule again
            cand = space.sample(self.task, self.target, self.rng, plan, module=self.module)
            if cand is not None and cand.key not in self.measured:
                pool.setdefault(cand.key, cand)

    def _ranked(self, pool: dict, model: Model) -> list[Candidate]:
        """Pool candidates, best predicted first."""
        cands = list(pool.values())
        if not cands:
            return []
        scores = model.predict(self.task.workload, self.features(cands))
        order = np.argsort(-np.asarray(scores), kind="stable")
        return [cands[i] for i in order]
