"""The pass manager: named passes, the pipelines they form, and a sequencer that runs a pipeline with instruments
(per-pass timing, the program printed after chosen passes: CINN_PRINT_IR_AFTER)."""
from __future__ import annotations

import enum
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

from cinn.core.ir import Program
from cinn.core.precision import FP32, PrecisionPolicy
from cinn.core.target import Target
from cinn.runtime.executable import PassTime

PRINT_IR_AFTER_ENV = "CINN_PRINT_IR_AFTER"
ALL = "all"


class PassName(enum.StrEnum):
    """Every graph pass, by the name the options and the environment give it."""

    ZERO_SIZE = "zero_size"
    INTEGER_KERNELS = "integer_kernels"
    SINK_TRANSPOSES = "sink_transposes"
    SIMPLIFY = "simplify"
    FUSE_ATTENTION = "fuse_attention"
    FOLD_ATTENTION_SLICES = "fold_attention_slices"
    DECOMPOSE = "decompose"
    CONV_FORMS = "conv_forms"
    FOLD_CONSTANTS = "fold_constants"
    MARK_CAUSAL = "mark_causal"
    CSE = "cse"
    DCE = "dce"
    WINOGRAD = "winograd"
    CHANNELS_LAST = "channels_last"
    PACK_WEIGHTS = "pack_weights"


class PipelineName(enum.StrEnum):
    """The declared pipelines."""

    TARGET_INDEPENDENT = "target-independent"
    VNNI = "vnni"
    CPU = "cpu"
    CPU_VNNI = "cpu-vnni"
    CUDA = "cuda"
    UNOPTIMIZED = "unoptimized"


@dataclass(frozen=True)
class PassContext:
    """What a pass reads besides the program: the target (None: no target's rewrites), the measured conv
    algorithms (winograd's `choices`) and the precision policy (which ops compute in bf16)."""

    target: Target | None = None
    winograd_choices: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    precision: PrecisionPolicy = FP32


@dataclass(frozen=True)
class Pass:
    """A named program -> program rewrite; `required` says why lowering needs it (empty: it may be disabled)."""

    name: PassName
    apply: Callable[[Program, PassContext], Program]
    required: str = ""


@dataclass(frozen=True)
class Pipeline:
    """Passes run in this order (a pass may run more than once)."""

    name: PipelineName
    passes: tuple[Pass, ...]

    def before(self, name: PassName) -> Pipeline:
        """The passes that run before the first run of `name` (all of them without one)."""
        names = [p.name for p in self.passes]
        return Pipeline(self.name, self.passes[: names.index(name)] if name in names else self.passes)


class Instrument(Protocol):
    """Called after each pass the sequencer runs."""

    def after_pass(self, name: PassName, program: Program, seconds: float) -> None: ...


@dataclass
class PassTimer:
    """Collects each pass's time, in the order the passes ran."""

    times: list[PassTime] = field(default_factory=list)

    def after_pass(self, name: PassName, program: Program, seconds: float) -> None:
        self.times.append(PassTime(name.value, seconds))


@dataclass(frozen=True)
class IRPrinter:
    """Prints the program to stderr after the passes named (all of them with `every`)."""

    names: frozenset[PassName]
    every: bool = False

    def after_pass(self, name: PassName, program: Program, seconds: float) -> None:
        if self.every or name in self.names:
            print(f"// IR after {name.value}\n{program}", file=sys.stderr, flush=True)


def ir_printer() -> IRPrinter | None:
    """The printer CINN_PRINT_IR_AFTER asks for (pass names, comma-separated, or `all`); None where it is unset."""
    text = os.environ.get(PRINT_IR_AFTER_ENV, "").strip()
    if not text:
        return None
    names = {n.strip() for n in text.split(",") if n.strip()}
    if ALL in names:
        return IRPrinter(frozenset(), every=True)
    return IRPrinter(pass_names(names, f"${PRINT_IR_AFTER_ENV}"))


def pass_names(names: Iterable[str | PassName], where: str) -> frozenset[PassName]:
    """The passes named; ValueError listing the known names for a name that is none."""
    if isinstance(names, str):
        raise TypeError(f"{where}: a list of pass names, got the string {names!r}")
    known = {p.value: p for p in PassName}
    unknown = sorted(str(n) for n in names if str(n) not in known)
    if unknown:
        raise ValueError(f"{where}: unknown pass {', '.join(map(repr, unknown))}; the passes are "
                         f"{', '.join(known)}")
    return frozenset(known[str(n)] for n in names)


def disabled(names: Iterable[str | PassName], passes: Iterable[Pass], where: str) -> frozenset[PassName]:
    """The passes to skip; ValueError for a name that is no pass, or a pass that lowering needs."""
    chosen = pass_names(names, where)
    for p in passes:
        if p.name in chosen and p.required:
            raise ValueError(f"{where}: pass {p.name.value!r} cannot be disabled: {p.required}")
    return chosen


def timing_table(times: Sequence[PassTime]) -> str:
    """Each pass's runs and total time, in the order they first ran, and the sum."""
    runs: dict[str, list[float]] = {}
    for t in times:
        runs.setdefault(t.name, []).append(t.seconds)
    total = sum(t.seconds for t in times)
    rows = [(name, len(s), sum(s)) for name, s in runs.items()] + [("total", len(times), total)]
    width = max(len(name) for name, _, _ in rows)
    return "\n".join([f"{'pass':<{width}}  runs        ms      %"]
                     + [f"{name:<{width}}  {n:>4}  {s * 1e3:8.2f}  {100 * s / max(total, 1e-12):5.1f}"
                        for name, n, s in rows])


def run(pipeline: Pipeline, program: Program, context: PassContext, skip: frozenset[PassName] = frozenset(),
        instruments: Sequence[Instrument] = ()) -> Program:
    """Run the pipeline's passes but those in `skip`, each instrument called after each pass."""
    for p in pipeline.passes:
        if p.name in skip:
            continue
        start = time.perf_counter()
        program = p.apply(program, context)
        seconds = time.perf_counter() - start
        for instrument in instruments:
            instrument.after_pass(p.name, program, seconds)
    return program
