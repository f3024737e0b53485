"""Tuning tasks: the unique fused groups of a model, keyed by the structural hash of their PrimFunc."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import tvm

from cinn.compiler.build import workload_key
from cinn.compiler.lower import lower_program
from cinn.core.ir import Program
from cinn.core.ops import PatternKind
from cinn.core.target import Target


@dataclass(frozen=True)
class Task:
    """One unique kernel to tune: its workload key, unscheduled PrimFunc (TVM JSON), kind and occurrence count."""

    workload: str
    func_json: str
    kind: PatternKind
    name: str
    weight: int = 1

    @classmethod
    def from_func(cls, func, kind: PatternKind, name: str = "main", weight: int = 1) -> Task:
        """A task for a PrimFunc."""
        func = func.with_attr("global_symbol", "main")
        return cls(workload_key(func), tvm.ir.save_json(func), kind, name, weight)

    def func(self):
        """The unscheduled PrimFunc."""
        return tvm.ir.load_json(self.func_json)

    def module(self) -> tvm.IRModule:
        """The unscheduled PrimFunc as the IRModule a Schedule starts from."""
        return tvm.IRModule({"main": self.func()})


def extract_tasks(program: Program | Sequence[Program], fuse: bool = True, passes: bool = True,
                  target: Target | None = None, winograd_choices: Mapping[str, int] = MappingProxyType({})) -> list[Task]:
    """The unique kernels `cinn.compile` would build for a Program (or several: a symbolic program's bindings), in
    first-use order, weighted by occurrences; `target` and `winograd_choices` pick its rewrites
    (cinn.compiler.passes.pipeline.optimize)."""
    tasks: dict[str, Task] = {}
    for p in [program] if isinstance(program, Program) else program:
        for lg in lower_program(p, fuse, passes, target=target, winograd_choices=winograd_choices)[1]:
            t = Task.from_func(lg.func, lg.group.kind, lg.group.name)
            prev = tasks.get(t.workload)
            tasks[t.workload] = t if prev is None else dataclasses.replace(prev, weight=prev.weight + 1)
    return list(tasks.values())
