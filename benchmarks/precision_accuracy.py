"""How far bf16 moves a model's outputs: ``python -m benchmarks.precision_accuracy DIR [MODEL ...]`` compiles each
model in fp32 and at a bf16 precision, runs both on the same seeded random inputs, and prints a markdown table of the
relative L2 error and the largest absolute difference of the outputs against fp32's, each checked against the
harness's budget (BF16_REL_L2). Models: files in DIR (``python -m benchmarks.real_models DIR`` writes the ten CNNs)
and built-in models (bert_base); default: the ten CNNs and bert_base. One model at a time: each compiles twice.
A model ending in a softmax is compared on the softmax's input, its logits: random weights' logits are far apart, and
their softmax is a one-hot vector that bf16 leaves unchanged (an error of 0 that says nothing)."""
from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

import cinn
from benchmarks.harness import BF16_REL_L2
from benchmarks.real_models import MODELS as CNNS
from cinn.core.ir import Program, Value
from cinn.core.precision import Precision, PrecisionPolicy
from frontend.zoo import get_model

BUILT_INS = ("bert_base",)
RESHAPES = ("reshape", "squeeze", "flatten")  # ops between a softmax and a model's output that move no value


@dataclass(frozen=True)
class Accuracy:
    """One model's bf16 outputs against its fp32 ones: the worst output's relative L2 error and largest |difference|."""

    model: str
    rel_l2: float
    max_abs: float

    @property
    def within(self) -> bool:
        return self.rel_l2 <= BF16_REL_L2

    def row(self) -> str:
        return f"| {self.model} | {self.rel_l2:.2e} | {self.max_abs:.2e} | {'yes' if self.within else 'NO'} |"


HEADER = ("| model | rel L2 | max abs | within " + f"{BF16_REL_L2:g} |", "|---|---|---|---|")


def errors(got: Sequence[np.ndarray], want: Sequence[np.ndarray]) -> tuple[float, float]:
    """The largest relative L2 error and the largest absolute difference over the outputs."""
    pairs = [(g.astype(np.float64), w.astype(np.float64)) for g, w in zip(got, want, strict=True)]
    rel = max(float(np.linalg.norm(g - w)) / max(float(np.linalg.norm(w)), 1e-30) for g, w in pairs)
    return rel, max(float(np.max(np.abs(g - w), initial=0.0)) for g, w in pairs)


def logits(program: Program) -> Program:
    """The program with each output a softmax computes (then perhaps reshaped) replaced by that softmax's input."""
    producers = program.producers()

    def before_softmax(v: Value) -> Value:
        node = producers.get(v.name)
        while node is not None and node.op in RESHAPES:
            node = producers.get(node.inputs[0].name)
        return node.inputs[0] if node is not None and node.op == "softmax" else v

    outputs = tuple(before_softmax(v) for v in program.outputs)
    needed: set[int] = set()  # the ids of the nodes the outputs read
    stack = [v.name for v in outputs]
    while stack:
        node = producers.get(stack.pop())
        if node is not None and id(node) not in needed:
            needed.add(id(node))
            stack += [i.name for i in node.inputs]
    return program.replace(outputs=outputs, nodes=tuple(n for n in program.nodes if id(n) in needed))


def outputs(program: Program, feeds: Mapping[str, np.ndarray], precision: Precision | PrecisionPolicy) -> list[np.ndarray]:
    """The outputs of one compile of `program` at `precision` on `feeds`."""
    return [np.asarray(o) for o in cinn.compile(program, precision=precision).run(dict(feeds))]


def accuracy(name: str, precision: Precision | PrecisionPolicy) -> Accuracy:
    """A model's bf16 error: a file path or a built-in model's name."""
    model = get_model(name)
    program = logits(model.program)
    rel, worst = errors(outputs(program, model.feeds, precision), outputs(program, model.feeds, Precision.FP32))
    return Accuracy(model.name, rel, worst)


def _paths(directory: str, models: Sequence[str]) -> list[str]:
    return [m if m in BUILT_INS else os.path.join(directory, f"{m}.onnx") for m in models]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.precision_accuracy", description=__doc__.split("\n\n")[0])
    p.add_argument("directory", help="where `python -m benchmarks.real_models` wrote the CNNs")
    p.add_argument("models", nargs="*", help=f"default: {', '.join([*CNNS, *BUILT_INS])}")
    p.add_argument("--keep-fp32", default=None, metavar="KINDS",
                   help="a policy of bf16 for every op kind but these (comma-separated, e.g. stem_conv); default: "
                        "precision='bf16' as cinn.compile resolves it")
    a = p.parse_args(argv)
    precision: Precision | PrecisionPolicy = Precision.BF16 if a.keep_fp32 is None else \
        PrecisionPolicy.bf16_except([k for k in a.keep_fp32.split(",") if k])
    print("\n".join(HEADER), flush=True)
    failed = 0
    for path in _paths(a.directory, a.models or [*CNNS, *BUILT_INS]):
        result = accuracy(path, precision)
        failed += not result.within
        print(result.row(), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
