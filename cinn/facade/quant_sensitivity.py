"""Which quantized layers cost the most accuracy, and the fewest of them to keep in float to meet an error budget.

Each candidate set of float layers would need its own compiled program (minutes on a large model), so the analysis
compiles one: every quantized op is computed both in float and quantized, and a per-layer switch input (0 or 1)
picks f + switch * (q - f) as the layer's output. Runs then cost no compile: one with every switch on, one per layer
with only that layer's on (the error it causes alone), and then, most costly first, a run per prefix of layers
turned off until the budget holds. That is 2N + 1 runs at most for N layers (rather than a compile per candidate, or
N^2 runs for a greedy that re-ranks after each choice).

Ranking by the error with every layer quantized but one was tried first: on mobilenet_v2, where the error is
spread over 36 layers, each such error differs from the all-quantized one by under a tenth, in the noise of a few
feeds, and the budget took 17 float layers against 12 ranked by the error alone.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from cinn.compiler.passes.dce import dce
from cinn.compiler.passes.rewrite import Rewriter
from cinn.core.ir import Node, Program, TensorType, Value

SWITCH_PREFIX = "quantize_switch_"  # the switch inputs' names: this and the layer's index
SWITCH_TYPE = TensorType((1,), "float32")


@dataclass(frozen=True)
class FloatLayer:
    """A layer kept in float, and why: the error it causes quantized alone, against the error with all quantized."""

    name: str
    error_alone: float  # the output's relative L2 error with only this layer quantized
    error_with_all: float  # ... with every layer quantized


@dataclass(frozen=True)
class FloatChoice:
    """The layers to keep in float: indices into the candidates, most costly first, and why each."""

    layers: tuple[int, ...]
    ranked: tuple[FloatLayer, ...]  # the chosen layers, with the errors that ranked them


# Emits a layer's quantized computation from the rewritten node's float inputs; returns its output.
EmitQuantized = Callable[[Rewriter, Node], Value]
# The output error of the switchable program with the given layers in float (the rest quantized).
Measure = Callable[[frozenset[int]], float]


def switchable(program: Program, layers: Sequence[Node], emit: EmitQuantized) -> tuple[Program, tuple[Value, ...]]:
    """The program with each of `layers` computed in float and quantized, mixed by a switch input of its own (1:
    quantized, 0: float); returns it and the switches, in the order of `layers`."""
    rw = Rewriter(program)
    index = {n.outputs[0].name: i for i, n in enumerate(layers)}
    switches = tuple(Value(f"{SWITCH_PREFIX}{i}", SWITCH_TYPE) for i in range(len(layers)))
    for node in program.nodes:
        kept = rw.keep(node)
        i = index.get(node.outputs[0].name)
        if i is None:
            continue
        f = kept.outputs[0]
        (d,) = rw.emit("subtract", [emit(rw, node), f])
        (d,) = rw.emit("multiply", [d, switches[i]])
        (y,) = rw.emit("add", [f, d])
        rw.substitute(node.outputs[0], y)
    return dce(rw.finish().replace(inputs=(*program.inputs, *switches))), switches


def switch_feed(switches: Sequence[Value], floats: frozenset[int]) -> dict[str, np.ndarray]:
    """The switch inputs that keep the layers `floats` in float and quantize the rest."""
    return {s.name: np.full(SWITCH_TYPE.shape, 0.0 if i in floats else 1.0, np.float32) for i, s in enumerate(switches)}


def choose_float_layers(names: Sequence[str], measure: Measure, budget: float) -> FloatChoice:
    """The fewest layers, in the order of the error each causes quantized alone (the largest first), whose staying
    float brings `measure` within `budget` (every layer, if nothing less does)."""
    everything = measure(frozenset())
    every_layer = frozenset(range(len(names)))
    alone = [measure(every_layer - {i}) for i in range(len(names))]
    order = sorted(range(len(names)), key=lambda i: -alone[i])
    error = everything
    chosen: list[int] = []
    for i in order:
        if error <= budget:
            break
        chosen.append(i)
        error = measure(frozenset(chosen))
    ranked = tuple(FloatLayer(names[i], alone[i], everything) for i in chosen)
    return FloatChoice(tuple(chosen), ranked)
