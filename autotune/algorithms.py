"""Convolution algorithms chosen by measurement, as cuDNN's find does: each Winograd-eligible conv shape of a model
runs direct and as each Winograd tile size (ROUNDS times, interleaved), the variant's kernels built alone with their
default schedules and timed by the tuner's runner (cache flushed, a crash or hang is a failed variant); every
measurement goes to the schedule log as a record whose workload is the shape's key (`winograd/...`) and whose trace
names the tile, and compile applies the fastest. The estimate in cinn.compiler.passes.winograd was measured on one machine;
these choices are the machine's own."""
from __future__ import annotations

import json
import math
import os
import statistics
import warnings
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from autotune.database import Record, append_records, read_records
from autotune.measure import MeasureInput, Runner
from autotune.task import Task
from autotune.tuner import record_versions
from cinn.compiler.lower import lower_program
from cinn.compiler.passes.pipeline import winograd_shapes
from cinn.compiler.passes.winograd import ALGORITHM_FAMILY, ALGORITHM_PREFIX, DIRECT, TILES, ConvShape
from cinn.core.builder import NetBuilder
from cinn.core.ir import Program
from cinn.core.target import Target

TILE_FIELD = "winograd_tile"  # the trace of an algorithm record: {"winograd_tile": m}, 0 for the direct conv
ROUNDS = 3  # measurements of each algorithm (one alone picked F(2x2) for resnet50's 64->64 on 56x56 once)
MARGIN = 0.95  # a Winograd conv is chosen where it takes under this share of the direct conv's time: a tie is noise


def select_winograd(programs: Sequence[Program], target: Target, log: str | os.PathLike, runner: Runner,
                    resume: bool = False, progress: Callable[[int, int, ConvShape, int | None], None] | None = None
                    ) -> dict[str, int]:
    """Measure every algorithm of each eligible conv shape of the programs (with `resume`, only the shapes the log
    has no choice for), append the records to the log, and return the log's choices. progress(done, total, shape,
    chosen tile or None where every algorithm failed) follows each shape."""
    shapes = list(dict.fromkeys(s for p in programs for s in winograd_shapes(p, target)))
    known = winograd_choices(read_records(log), target) if resume else {}
    todo = [s for s in shapes if s.key not in known]
    for i, shape in enumerate(todo):
        # rounds interleaved, so a stretch of noise on a shared machine hits every algorithm, not one
        variants = {tile: _kernels(shape, tile, target) for tile in (DIRECT, *TILES)}
        records = [_measure(shape, tile, tasks, target, runner) for _ in range(ROUNDS) for tile, tasks in variants.items()]
        append_records(log, records)
        if progress:
            progress(i + 1, len(todo), shape, _choice(records))
    return winograd_choices(read_records(log), target)


def winograd_choices(records: Iterable[Record], target: Target) -> dict[str, int]:
    """The measured algorithm per conv shape key among a schedule log's records, for this target."""
    by_shape: dict[str, list[Record]] = {}
    stale = 0
    for rec in (r for r in records if r.target == str(target)):
        if rec.workload.startswith(ALGORITHM_PREFIX):
            by_shape.setdefault(rec.workload, []).append(rec)
        elif rec.workload.startswith(ALGORITHM_FAMILY):
            stale += 1
    if stale:
        warnings.warn(f"{stale} conv algorithm records of the schedule log were measured with earlier Winograd "
                      "kernels and are ignored (the built-in estimate decides); `cinn-tune --resume` measures those "
                      "shapes again", stacklevel=2)
    choices = {key: _choice(records) for key, records in by_shape.items()}
    return {key: tile for key, tile in choices.items() if tile is not None}


def _choice(records: Sequence[Record]) -> int | None:
    """The algorithm with the least median time over its measurements (medians: one disturbed round of three must
    not decide), but the direct conv (exact up to rounding) unless a Winograd one is clearly faster; an algorithm
    with a failed measurement is ruled out. None where none ran."""
    runs: dict[int, list[float]] = {}
    failed: set[int] = set()
    for rec in records:
        tile = _tile(rec.trace)
        if tile is not None and (rec.failed or not rec.costs):
            failed.add(tile)
        elif tile is not None:
            runs.setdefault(tile, []).append(statistics.median(rec.costs))
    costs = {tile: statistics.median(times) for tile, times in runs.items() if tile not in failed}
    if not costs:
        return None
    best = min(costs, key=costs.__getitem__)
    return best if costs[best] < MARGIN * costs.get(DIRECT, math.inf) else DIRECT


def conv_program(shape: ConvShape, seed: int = 0) -> Program:
    """The conv of this shape alone, with random constant weights."""
    b = NetBuilder("conv_" + shape.key.removeprefix(ALGORITHM_PREFIX).replace("/", "_").replace(",", "_"))
    x = b.create_input("float32", (shape.batch, shape.channels, *shape.size), "x")
    w = np.random.default_rng(seed).standard_normal((shape.out_channels, shape.channels, 3, 3)).astype("float32")
    return b.build([b.conv2d(x, b.create_constant(w, "w"), paddings=list(shape.paddings))])


def _kernels(shape: ConvShape, tile: int, target: Target) -> list[Task]:
    """The kernels of one algorithm of a conv shape, as tasks to measure."""
    _, lowered = lower_program(conv_program(shape), target=target, winograd_choices={shape.key: tile})
    return [Task.from_func(lg.func, lg.group.kind, lg.group.name) for lg in lowered]


def _measure(shape: ConvShape, tile: int, tasks: Sequence[Task], target: Target, runner: Runner) -> Record:
    """One measurement of an algorithm: the summed costs of its kernels, or the first kernel's failure."""
    results = runner.measure([MeasureInput(t, None) for t in tasks], target)
    failed = next((r for r in results if not r.ok), None)
    costs = () if failed else tuple(sum(c) for c in zip(*(r.costs for r in results), strict=True))
    return Record(shape.key, str(target), json.dumps({TILE_FIELD: tile}), costs, record_versions(),
                  failed.detail if failed else "", failed.failure if failed else None)


def _tile(trace: str) -> int | None:
    """The tile an algorithm record's trace names; None (with a warning) for a trace that names none."""
    try:
        tile = json.loads(trace)[TILE_FIELD]
    except (ValueError, KeyError, TypeError) as err:
        warnings.warn(f"cinn: skipping an algorithm record whose trace names no tile ({err!r})", stacklevel=3)
        return None
    if tile != DIRECT and tile not in TILES:
        warnings.warn(f"cinn: skipping an algorithm record with unknown tile {tile!r}", stacklevel=3)
        return None
    return int(tile)
