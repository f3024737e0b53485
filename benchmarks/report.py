"""Benchmark reports: a text table, a CSV file and a bar chart (generic helpers and the cinn-bench columns)."""
from __future__ import annotations

import csv
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from benchmarks.harness import Engine, ModelResult

R = TypeVar("R")


@dataclass(frozen=True)
class Column(Generic[R]):
    """One report column: header, how to get its value from a row, and its text format."""

    header: str
    value: Callable[[R], float | str | None]
    fmt: str = "{:.3f}"

    def text(self, r: R) -> str:
        v = self.value(r)
        if v is None:
            return "-"
        return v if isinstance(v, str) else self.fmt.format(v)


def render_table(cols: Sequence[Column[R]], rows: Sequence[R]) -> str:
    """An aligned text table: the first column left-aligned, the others right-aligned."""
    cells = [[c.header for c in cols]] + [[c.text(r) for c in cols] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cols))]
    lines = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths, strict=True)))
             for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def write_rows_csv(cols: Sequence[Column[R]], rows: Sequence[R], path: str) -> None:
    """Rows as CSV (numbers unformatted, missing values empty)."""
    _make_parent(path)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow([c.header for c in cols])
        for r in rows:
            w.writerow(["" if (v := c.value(r)) is None else v for c in cols])


def bar_chart(categories: Sequence[str], series: Mapping[str, Sequence[float | None]], ylabel: str, title: str, path: str) -> None:
    """A grouped bar chart (log scale) as a PNG: one group per category, one bar per series; None values are left out."""
    import matplotlib  # an optional extra (bench): imported only when a plot is asked for

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    _make_parent(path)
    width = 0.8 / max(len(series), 1)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(categories) + 2), 4.5))
    for i, (label, values) in enumerate(series.items()):
        offset = (i - (len(series) - 1) / 2) * width
        points = [(j + offset, v) for j, v in enumerate(values) if v]
        ax.bar([x for x, _ in points], [v for _, v in points], width, label=label)
    ax.set_xticks(range(len(categories)), list(categories))
    if any(v for values in series.values() for v in values):  # a log axis without data cannot be drawn
        ax.set_yscale("log")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------
# cinn-bench


def _ratio(num: Engine, den: Engine) -> Callable[[ModelResult], float | None]:
    def value(r: ModelResult) -> float | None:
        a, b = r.ms(num), r.ms(den)
        return a / b if a is not None and b else None

    return value


def _vs_best_peer(engine: Engine) -> Callable[[ModelResult], float | None]:
    def value(r: ModelResult) -> float | None:
        a, b = r.ms(engine), r.best_peer_ms()
        return a / b if a is not None and b else None

    return value


def _paired(engine: Engine) -> Callable[[ModelResult], float | None]:
    return lambda r: r.paired_vs_best_peer(engine)


def _paired_to(engine: Engine, reference: Engine) -> Callable[[ModelResult], float | None]:
    return lambda r: r.paired(engine, reference)


def _fused_field(name: str) -> Callable[[ModelResult], float | None]:
    def value(r: ModelResult) -> float | None:
        res = r.results.get(Engine.FUSED)
        return getattr(res, name) if res else None

    return value


def _status(r: ModelResult) -> str:
    if r.errors:
        return "FAILED: " + ", ".join(e.value for e in r.errors)
    if any(not c.ok for c in r.checks):
        return "MISMATCH"
    return "ok" if r.checks else "unchecked"


def columns(tuned: bool, baseline: bool = False, paddle: bool = False, openvino_default: bool = False
            ) -> list[Column[ModelResult]]:
    """The cinn-bench columns; the tuned ones only when a schedule log was given, the baseline's only with one, Paddle
    Inference's and OpenVINO's at its default precision only where they ran."""
    cols: list[Column[ModelResult]] = [
        Column("model", lambda r: r.model, "{}"),
        Column("fused ms", lambda r: r.ms(Engine.FUSED)),
    ]
    if baseline:
        cols.append(Column("baseline ms", lambda r: r.ms(Engine.BASELINE)))
    cols.append(Column("unfused ms", lambda r: r.ms(Engine.UNFUSED)))
    if tuned:
        cols.append(Column("tuned ms", lambda r: r.ms(Engine.TUNED)))
    cols += [
        Column("ORT ms", lambda r: r.ms(Engine.ORT)),
        Column("OpenVINO ms", lambda r: r.ms(Engine.OPENVINO)),
        *([Column("OpenVINO default ms", lambda r: r.ms(Engine.OPENVINO_DEFAULT))] if openvino_default else []),
        *([Column("Paddle ms", lambda r: r.ms(Engine.PADDLE))] if paddle else []),
        Column("fused speed-up vs unfused", _ratio(Engine.UNFUSED, Engine.FUSED), "{:.2f}x"),
    ]
    if tuned:
        cols.append(Column("tuned speed-up vs fused", _ratio(Engine.FUSED, Engine.TUNED), "{:.2f}x"))
    cols.append(Column("ORT/fused", _ratio(Engine.ORT, Engine.FUSED), "{:.2f}x"))
    if tuned:
        cols.append(Column("ORT/tuned", _ratio(Engine.ORT, Engine.TUNED), "{:.2f}x"))
    # our time over the faster peer's: the goal is <= 1.0; "paired" takes the ratio in each round, then the median
    cols.append(Column("fused/best peer", _vs_best_peer(Engine.FUSED), "{:.2f}x"))
    cols.append(Column("fused/best peer paired", _paired(Engine.FUSED), "{:.2f}x"))
    if baseline:
        # this cinn over the baseline's, round by round: above 1.0x, this one is slower
        cols.append(Column("baseline/best peer paired", _paired(Engine.BASELINE), "{:.2f}x"))
        cols.append(Column("fused/baseline paired", _paired_to(Engine.FUSED, Engine.BASELINE), "{:.3f}x"))
    if tuned:
        cols.append(Column("tuned/best peer", _vs_best_peer(Engine.TUNED), "{:.2f}x"))
        cols.append(Column("tuned/best peer paired", _paired(Engine.TUNED), "{:.2f}x"))
    cols += [
        Column("kernels fused", _fused_field("num_kernels"), "{}"),
        Column("compile cold s", _fused_field("compile_cold_s"), "{:.2f}"),
        Column("compile cached s", _fused_field("compile_cached_s"), "{:.2f}"),
        Column("check", _status, "{}"),
    ]
    return cols


def format_table(results: Sequence[ModelResult], tuned: bool, baseline: bool = False) -> str:
    """An aligned text table, one row per model."""
    return render_table(columns(tuned, baseline, _ran(results, Engine.PADDLE), _ran(results, Engine.OPENVINO_DEFAULT)),
                        results)


def write_csv(results: Sequence[ModelResult], tuned: bool, path: str, baseline: bool = False) -> None:
    """The table as CSV (numbers unformatted, missing values empty)."""
    write_rows_csv(columns(tuned, baseline, _ran(results, Engine.PADDLE), _ran(results, Engine.OPENVINO_DEFAULT)),
                   results, path)


def _ran(results: Sequence[ModelResult], engine: Engine) -> bool:
    return any(engine in r.results or engine in r.errors for r in results)


def write_plot(results: Sequence[ModelResult], engines: Sequence[Engine], path: str) -> None:
    """A grouped bar chart of median latency (log scale) per model and engine, as a PNG."""
    series = {e.value: [r.ms(e) for r in results] for e in engines}
    bar_chart([r.model for r in results], series, "median latency (ms, log scale)", "cinn vs its peers", path)


def _make_parent(path: str) -> None:
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
