"""The zoo check: each model of a zoo directory (`python -m benchmarks.zoo export DIR`) imported, compiled with an
empty cache and run by cinn, on two random inputs at each of its bindings, against onnxruntime.

A model passes when cinn's outputs differ from onnxruntime's by at most RTOL of their largest magnitude and change
with the input. ``python -m benchmarks.zoo_check DIR [MODEL ...] [--timeout S] [--target T] [--csv PATH]`` checks
each model in a process of its own, killed past the timeout, and prints how far each got.
"""
from __future__ import annotations

import argparse
import enum
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

import cinn
from benchmarks.harness import ort_session
from benchmarks.report import Column, render_table, write_rows_csv
from benchmarks.zoo_manifest import RTOL, SEED, Manifest, ZooEntry, changes, error_line, read_manifest, relative_difference
from cinn.facade.command import ExitStatus, command, reading_arguments, seconds
from cinn.runtime.executable import Executable
from cinn.runtime.worker_pool import die_with_spawner, spawner_env
from frontend.loading import load_model

WORKER = "benchmarks.zoo_check"


class Stage(enum.StrEnum):
    """How far a model's check got: the stage it stopped in, or DONE."""

    IMPORT = "import"
    COMPILE = "compile"
    RUN = "run"
    DONE = "done"


@dataclass(frozen=True)
class ZooCheck:
    """One model's check."""

    model: str
    stage: Stage  # DONE, or the stage that failed or timed out
    error: str = ""
    import_s: float | None = None
    compile_s: float | None = None  # with an empty cache
    kernels: int | None = None  # of a static model
    rel_diff: float | None = None  # the largest relative difference from onnxruntime over every input and binding
    changes: bool | None = None  # whether cinn's outputs change between the two inputs, at every binding

    @property
    def ok(self) -> bool:
        return self.stage is Stage.DONE and self.rel_diff is not None and self.rel_diff <= RTOL and bool(self.changes)

    @property
    def status(self) -> str:
        if self.stage is not Stage.DONE:
            return f"FAILED in {self.stage.value}: {self.error}"
        if self.rel_diff is None or self.rel_diff > RTOL:
            return "MISMATCH"
        return "ok" if self.changes else "UNCHANGED"

    @staticmethod
    def from_facts(model: str, facts: dict[str, Any]) -> ZooCheck:
        """From what a worker wrote (its stage as a string)."""
        return ZooCheck(**{**facts, "model": model, "stage": Stage(facts["stage"])})


# ---------------------------------------------------------------------------------------------
# worker side


class _Facts:
    """What a worker found so far, rewritten to a file at each step: what a timeout leaves is the stage it was in."""

    def __init__(self, path: str):
        self.path, self.facts = path, {"stage": Stage.IMPORT.value}

    def update(self, **facts: Any) -> None:
        self.facts |= {k: v.value if isinstance(v, Stage) else v for k, v in facts.items()}
        tmp = f"{self.path}.tmp"
        with open(tmp, "w") as f:
            json.dump(self.facts, f)
        os.replace(tmp, self.path)


def check_model(directory: str | os.PathLike, entry: ZooEntry, target: str, facts: _Facts) -> None:
    """Check one model in this process, writing what it finds to `facts`."""
    path = os.path.join(directory, entry.file)
    try:
        t0 = time.perf_counter()
        program = load_model(path)  # symbolic for a dynamic model: compiled once for all its bindings
        facts.update(stage=Stage.COMPILE, import_s=time.perf_counter() - t0)
        with tempfile.TemporaryDirectory(prefix="cinn-zoo-cache-") as cache:  # an empty cache: a cold compile
            t0 = time.perf_counter()
            exe = cinn.compile(program, target=target, cache_dir=cache)
            compile_s = time.perf_counter() - t0
        facts.update(stage=Stage.RUN, compile_s=compile_s, kernels=exe.num_kernels if isinstance(exe, Executable) else None)
        session = ort_session(onnx.load(path), cuda=target.split()[0] == "cuda")
        worst, moved = 0.0, True
        for binding in entry.bindings:
            outputs = []
            for seed in (SEED, SEED + 1):
                feeds = entry.feeds(seed, binding)
                got = [np.asarray(o) for o in exe.run(feeds)]
                worst = max(worst, relative_difference(got, session.run(None, feeds)))
                outputs.append(got)
            moved = moved and changes(*outputs)
        facts.update(stage=Stage.DONE, rel_diff=worst, changes=moved)
    except Exception as err:  # whatever fails is the check's finding, reported with the stage it stopped in
        facts.update(error=error_line(err))


# ---------------------------------------------------------------------------------------------
# parent side


def _progress(msg: str) -> None:
    print(f"[zoo-check] {msg}", file=sys.stderr, flush=True)


def run_check(directory: pathlib.Path, entry: ZooEntry, target: str, timeout: float) -> ZooCheck:
    """Check one model in a worker process, killed (with its build workers) past `timeout` seconds."""
    with tempfile.TemporaryDirectory(prefix="cinn-zoo-check-") as tmp:
        path = os.path.join(tmp, "facts.json")
        args = [sys.executable, "-m", WORKER, str(directory), entry.name, "--target", target, "--worker", path]
        error = ""
        try:
            proc = subprocess.run(args, timeout=timeout, stdout=2, env=spawner_env())  # its prints: to stderr
            if proc.returncode != 0:
                error = f"the worker exited with status {proc.returncode}"
        except subprocess.TimeoutExpired:
            error = f"timed out after {timeout:g} s"
        try:
            with open(path) as f:
                facts = json.load(f)
        except FileNotFoundError:
            facts = {"stage": Stage.IMPORT.value}
    if error:
        facts |= {"error": error}
    return ZooCheck.from_facts(entry.name, facts)


def columns() -> list[Column[ZooCheck]]:
    return [
        Column("model", lambda c: c.model, "{}"),
        Column("import s", lambda c: c.import_s, "{:.1f}"),
        Column("compile cold s", lambda c: c.compile_s, "{:.1f}"),
        Column("kernels", lambda c: c.kernels, "{}"),
        Column("rel diff vs ORT", lambda c: c.rel_diff, "{:.1e}"),
        Column("changes with input", lambda c: None if c.changes is None else ("yes" if c.changes else "NO"), "{}"),
        Column("status", lambda c: c.status, "{}"),
    ]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m {WORKER}", description=__doc__.splitlines()[0])
    p.add_argument("directory", type=pathlib.Path, help="a zoo directory (with its manifest.json)")
    p.add_argument("models", nargs="*", metavar="MODEL", help="which of its models (default: all)")
    p.add_argument("--target", default="llvm", help="cinn target (default: llvm, the host CPU)")
    p.add_argument("--timeout", type=seconds, default=1800.0, help="seconds per model (default: 1800)")
    p.add_argument("--csv", default=None, metavar="PATH", help="also write the table as CSV")
    p.add_argument("--worker", default=None, metavar="FACTS", help=argparse.SUPPRESS)  # check one model, write FACTS
    return p


def _entries(manifest: Manifest, names: Sequence[str]) -> list[ZooEntry]:
    with reading_arguments():
        return [manifest.entry(n) for n in names] if names else list(manifest.models)


@command("zoo-check")
def main(argv: Sequence[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    with reading_arguments():
        manifest = read_manifest(a.directory)
    if a.worker is not None:
        (entry,) = _entries(manifest, a.models)
        check_model(a.directory, entry, a.target, _Facts(a.worker))
        return ExitStatus.OK
    results = []
    for entry in _entries(manifest, a.models):
        _progress(f"{entry.name} ...")
        results.append(run_check(a.directory, entry, a.target, a.timeout))
        _progress(f"{entry.name}: {results[-1].status}")
    print(render_table(columns(), results))
    if a.csv:
        write_rows_csv(columns(), results, a.csv)
    return ExitStatus.OK if all(r.ok for r in results) else ExitStatus.FAILED


if __name__ == "__main__":
    die_with_spawner()
    sys.exit(main())

