"""Shared machinery of the graph passes: re-emit a Program node by node with value substitutions."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from cinn.core.builder import Names, new_node, program_names
from cinn.core.ir import Attrs, Node, Program, TensorType, Value


class Rewriter:
    """Re-emits a program's nodes; a dropped value is redirected to its substitute in later uses.

    Rules read the source program (`has_single_use`) and the rewritten one so far (`producer`,
    `constant`), so a chain such as reshape -> reshape -> reshape collapses in one sweep.
    """

    def __init__(self, program: Program):
        self.program = program
        self.constants: dict[str, np.ndarray] = dict(program.constants)
        self._nodes: list[Node] = []
        self._subst: dict[str, Value] = {}
        self._producer: dict[str, Node] = {}
        self._users = program.consumers()
        self._outputs = {v.name for v in program.outputs}
        self._names = Names(program_names(program))

    # -- queries ----------------------------------------------------------------------------
    def value(self, v: Value) -> Value:
        """The value that now stands for v."""
        return self._subst.get(v.name, v)

    def inputs(self, node: Node) -> tuple[Value, ...]:
        """A node's inputs after substitution."""
        return tuple(self.value(v) for v in node.inputs)

    def producer(self, v: Value) -> Node | None:
        """The rewritten node producing v (None for inputs and constants)."""
        return self._producer.get(v.name)

    def constant(self, v: Value) -> np.ndarray | None:
        """The data of v when it is a constant."""
        return self.constants.get(v.name)

    def has_single_use(self, v: Value) -> bool:
        """True when exactly one node of the source program reads v and it is not a program output."""
        return v.name not in self._outputs and len(self._users.get(v.name, ())) == 1

    def users(self, v: Value) -> tuple[Node, ...] | None:
        """The nodes of the source program that read v; None when v is a program output (read outside too)."""
        return None if v.name in self._outputs else tuple(self._users.get(v.name, ()))

    # -- edits ------------------------------------------------------------------------------
    def keep(self, node: Node, **changes) -> Node:
        """Emit a node with substituted inputs, optionally changing fields (inputs given must be final)."""
        new = dataclasses.replace(node, **{"inputs": self.inputs(node), **changes})
        self._nodes.append(new)
        for v in new.outputs:
            self._producer[v.name] = new
        return new

    def emit(self, op: str, inputs: Sequence[Value], attrs: Attrs | None = None) -> tuple[Value, ...]:
        """Emit a new op application with inferred output types and fresh names."""
        return self.keep(new_node(op, inputs, attrs, self._names)).outputs

    def new_constant(self, array: np.ndarray, prefix: str) -> Value:
        """Add a constant under a fresh name (the array's dtype is kept)."""
        array = np.asarray(array, order="C")  # ascontiguousarray would make a 0-d array 1-d
        value = Value(self._names.fresh(prefix), TensorType(array.shape, str(array.dtype)))
        self.constants[value.name] = array
        return value

    def make_constant(self, v: Value, array: np.ndarray) -> None:
        """Turn a value whose node is dropped into a constant of the same name and type."""
        if tuple(array.shape) != v.shape:
            raise ValueError(f"constant {v.name!r}: data of shape {tuple(array.shape)} for a value of shape {v.shape}")
        self.constants[v.name] = np.asarray(array, dtype=v.dtype, order="C")

    def substitute(self, old: Value, new: Value) -> None:
        """Redirect every later use of old (a value whose node is dropped) to new."""
        new = self.value(new)
        if old.type != new.type:
            raise ValueError(f"cannot replace %{old.name} {old.type} by %{new.name} {new.type}")
        self._subst[old.name] = new

    def finish(self) -> Program:
        """The rewritten program (unused constants stay until dce)."""
        outputs = tuple(self.value(v) for v in self.program.outputs)
        return self.program.replace(nodes=tuple(self._nodes), outputs=outputs, constants=self.constants)


# A rule rewrites one node and returns True, or returns False to keep the node unchanged.
Rule = Callable[[Rewriter, Node], bool]


def rewrite(program: Program, rule: Rule) -> Program:
    """One sweep of a rule over the nodes in topological order."""
    rw = Rewriter(program)
    for node in program.nodes:
        if not rule(rw, node):
            rw.keep(node)
    return rw.finish()


def same_graph(a: Program, b: Program) -> bool:
    """True when two programs have the same nodes and outputs (a fixed point was reached)."""
    return a.nodes == b.nodes and a.outputs == b.outputs
