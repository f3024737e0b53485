"""int8 accuracy table: cinn.quantize on the real CNNs (``python -m benchmarks.real_models DIR`` writes them) and the
built-in BERT-base, each with seeded random calibration and held-back inputs; prints a markdown row a model.

``python -m benchmarks.quantize_accuracy DIR [MODEL ...]``. A model whose output is a softmax (then reshaped, as the
onnx package's CNNs end) is measured on its logits: a random-weight network's softmax is near one-hot, which hides
the error.
"""
from __future__ import annotations

import argparse
import pathlib
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from benchmarks.real_models import MODELS
from cinn.compiler.passes.dce import dce
from cinn.core.ir import Program, Value
from cinn.core.symbolic import require_static
from cinn.facade.api import compile as compile_program
from cinn.facade.quantize import DEFAULT_MAX_ERROR, QuantizedModel, quantize
from frontend.loading import load_model
from frontend.zoo import bert_base

BERT = "bert_base"
SEED = 0
CALIBRATION = 16
HELD_BACK = 4
INTEGER_KERNEL_MARK = "u8i8"  # the integer kernels' ops (conv2d_u8i8, matmul_u8i8) name the groups that hold them


@dataclass(frozen=True)
class Row:
    """One model's line of the table."""

    model: str
    result: QuantizedModel
    int8_kernels: int
    kernels: int

    def markdown(self) -> str:
        """The row as a markdown table line."""
        r = self.result.report
        worst = max((o for o in r.sets[-1].outputs), key=lambda o: o.relative_l2)
        floats = ", ".join(k.name for k in r.kept_float) or "none"
        return (f"| {self.model} | {worst.relative_l2:.2e} | {worst.max_abs:.2e} | {len(r.kept_float)} ({floats}) | "
                f"{self.int8_kernels}/{self.kernels} | {'yes' if r.within_budget else 'NO'} |")


HEADER = ("| model | rel. L2 (held-back) | max abs | layers kept float | int8 kernels / total | within budget |\n"
          "|---|---|---|---|---|---|")


def logits(program: Program) -> Program:
    """The program with a final softmax cut off (its input made the output), looking through reshapes after it."""
    producers = program.producers()

    def cut(v: Value) -> Value:
        p = producers.get(v.name)
        while p is not None and p.op == "reshape":
            p = producers.get(p.inputs[0].name)
        return p.inputs[0] if p is not None and p.op == "softmax" else v

    return dce(program.replace(outputs=tuple(cut(v) for v in program.outputs)))


def feeds(program: Program, template: Mapping[str, np.ndarray], count: int, rng: np.random.Generator
          ) -> list[dict[str, np.ndarray]]:
    """Random feeds: integer inputs (token ids) drawn below the template's largest, float inputs with a template (a
    mask) as it is, other float inputs standard normal."""
    out = []
    for _ in range(count):
        feed = {}
        for v in program.inputs:
            if np.issubdtype(np.dtype(v.dtype), np.integer):
                feed[v.name] = rng.integers(0, int(template[v.name].max()) + 1, v.shape).astype(v.dtype)
            elif v.name in template:
                feed[v.name] = np.asarray(template[v.name], v.dtype)
            else:
                feed[v.name] = rng.standard_normal(v.shape).astype(v.dtype)
        out.append(feed)
    return out


def model(directory: pathlib.Path, name: str) -> tuple[Program, Mapping[str, np.ndarray]]:
    """A model of the table and its feed template (empty but for BERT's)."""
    if name == BERT:
        bench = bert_base()
        return bench.program, bench.feeds
    program = require_static(load_model(str(directory / f"{name}.onnx")), "the real models have static shapes")
    return logits(program), {}


def measure(directory: pathlib.Path, name: str, max_error: float) -> Row:
    """Quantize one model and count its kernels."""
    program, template = model(directory, name)
    rng = np.random.default_rng(SEED)
    calibration, held_back = feeds(program, template, CALIBRATION, rng), feeds(program, template, HELD_BACK, rng)
    result = quantize(program, calibration, held_back_feeds=held_back, max_error=max_error)
    exe = compile_program(result.program)
    return Row(name, result, sum(INTEGER_KERNEL_MARK in k for k in exe.kernel_names), exe.num_kernels)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.quantize_accuracy", description=__doc__.splitlines()[0])
    p.add_argument("directory", type=pathlib.Path, help="where python -m benchmarks.real_models wrote NAME.onnx")
    names = [*MODELS, BERT]
    p.add_argument("models", nargs="*", metavar="MODEL", help=f"which models (default: all): {', '.join(names)}")
    p.add_argument("--max-error", type=float, default=DEFAULT_MAX_ERROR, help="cinn.quantize's error budget")
    a = p.parse_args(argv)
    unknown = [m for m in a.models if m not in names]
    if unknown:
        p.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(names)}")
    print(HEADER, flush=True)
    for name in a.models or names:
        row = measure(a.directory, name, a.max_error)
        print(row.markdown(), flush=True)
        print(row.result.report, file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
