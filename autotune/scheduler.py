"""The task scheduler: which task gets the next round of trials (Ansor's gradient rule after a round-robin warm-up)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

ALPHA = 0.2  # weight of the measured (backward) gradient against the optimistic (forward) one, as Ansor


@dataclass
class TaskProgress:
    """What the scheduler knows of a task: its weight, trials so far and the best cost after each round."""

    weight: float
    trials: int = 0
    history: list[float] = field(default_factory=list)  # best cost (s) after each round
    last_round: int = 0  # trials in the latest round
    exhausted: bool = False  # the search found no new candidate

    @property
    def best(self) -> float:
        return self.history[-1] if self.history else math.inf

    def add_round(self, trials: int, best: float) -> None:
        """Record a round of `trials` measurements after which the task's best cost is `best`."""
        self.trials += trials
        self.last_round = trials
        self.history.append(best)


def next_task(tasks: list[TaskProgress]) -> int | None:
    """The task to tune next: every task once in order, then the one whose weighted latency is expected to fall
    fastest per trial; None when all are exhausted."""
    live = [i for i, t in enumerate(tasks) if not t.exhausted]
    if not live:
        return None
    fresh = [i for i in live if not tasks[i].history]
    return fresh[0] if fresh else max(live, key=lambda i: _gradient(tasks[i]))


def round_size(tasks: list[TaskProgress], i: int, batch: int, left: int) -> int:
    """Trials for task i's next round: a batch, except that while tasks wait for their first round the budget left
    is shared among them, so a budget smaller than tasks x batch still measures every task (its default first)."""
    fresh = sum(1 for t in tasks if not t.history and not t.exhausted)
    share = left // fresh if not tasks[i].history and fresh else left
    return max(1, min(batch, share, left))


def _gradient(t: TaskProgress) -> float:
    """Expected weighted latency saved per trial: the last round's measured gain and an optimistic 1/trials decay."""
    if not math.isfinite(t.best):
        return math.inf if t.trials == 0 else 0.0  # failures only: nothing to gain from more of the same
    prev = t.history[-2] if len(t.history) > 1 else t.best
    backward = (prev - t.best) / max(1, t.last_round) if math.isfinite(prev) else 0.0
    forward = t.best / max(1, t.trials)
    return t.weight * (ALPHA * backward + (1 - ALPHA) * forward)
