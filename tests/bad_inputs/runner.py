"""Run the corpus: make each case's input in its own folder, feed it to cinn in a worker process, classify what happened,
and tabulate the outcomes per category."""
from __future__ import annotations

import concurrent.futures as cf
import json
import os
import pathlib
import queue
import resource
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cinn.runtime import trust
from tests.bad_inputs import cache, cli, feeds, models, tiny, tuning, worker
from tests.bad_inputs.core import (
    MARKER,
    Case,
    Category,
    Cli,
    Entry,
    Expect,
    Outcome,
    Unavailable,
    Want,
    timeout_s,
)

ROOT = pathlib.Path(__file__).resolve().parents[2]
MEMORY_VARIABLE = "CINN_BAD_INPUTS_MEMORY_GIB"  # each case's address-space limit: a model that allocates 32 GiB fails fast
BATCH = 25  # cases per worker process at most: the batches of a category (or command) run side by side
TRACEBACK = "Traceback (most recent call last)"


@dataclass(frozen=True)
class Result:
    """A case's outcome, with what it printed or raised."""

    case: Case
    outcome: Outcome
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.outcome in (Outcome.OK, Outcome.SKIPPED)


def corpus() -> list[Case]:
    """Every case; names are unique."""
    cases = models.cases() + cache.cases() + tuning.cases() + cli.cases() + feeds.cases()
    names = [c.name for c in cases]
    assert len(set(names)) == len(names), sorted(n for n in names if names.count(n) > 1)
    return cases


# -- running -----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Prepared:
    case: Case
    dir: pathlib.Path


@dataclass(frozen=True)
class Setup:
    """What the case processes of a run share: their environment, and a folder with the tiny model and a cache warmed
    by its compile (each case gets a copy)."""

    env: dict[str, str]
    warm: pathlib.Path


def set_up(folder: pathlib.Path) -> Setup:
    """Make the environment (a home and a cache key of the run's own) and the warm cache in `folder`."""
    env = _environment(folder)
    return Setup(env, _warm(folder, env))


def run_corpus(cases: Sequence[Case], work: pathlib.Path, jobs: int = 2, setup: Setup | None = None) -> list[Result]:
    """Run the cases (in `jobs` parallel processes; their folders in `work`), in the corpus' order."""
    setup = setup or set_up(work / "setup")
    units = _units([_Prepared(case, work / f"{i:03d}") for i, case in enumerate(cases)])
    with cf.ThreadPoolExecutor(jobs) as pool:  # each unit makes its inputs, then runs: the making overlaps the runs
        done = [r for rs in pool.map(lambda u: _run_unit(u, setup), units) for r in rs]
    order = {c.name: i for i, c in enumerate(cases)}
    return sorted(done, key=lambda r: order[r.case.name])


def _environment(folder: pathlib.Path) -> dict[str, str]:
    """What every case process runs with: this checkout importable, a home and a cache key of the run's own (outside
    the cases' caches, as an attacker who can write a cache cannot write it)."""
    home = folder / "home"
    home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CINN_CACHE")}
    path = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env | {"HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache"), "XDG_CONFIG_HOME": str(home / ".config"),
                  trust.KEY_VARIABLE: str(home / "cache.key"), "PYTHONPATH": path, "PYTHONDONTWRITEBYTECODE": "1"}


def _warm(folder: pathlib.Path, env: dict[str, str]) -> pathlib.Path:
    """A folder with the tiny model and a cache holding its compile."""
    warm = folder / "warm"
    warm.mkdir(parents=True, exist_ok=True)
    tiny.write(warm / tiny.NAME)
    subprocess.run([sys.executable, "-m", "tests.bad_inputs.worker", "--warm", str(warm)], check=True, capture_output=True,
                   env=env | {"CINN_CACHE_DIR": str(warm / "cache")}, timeout=timeout_s() * 2)
    return warm


_MAKING = threading.Lock()  # the makers share files (the malformed corpus) and TVM state (tuning records)


def _prepare(p: _Prepared, warm: pathlib.Path) -> Result | None:
    """Make the case's folder: the tiny model, a copy of the warm cache, the case's input; a result (skipped) when the
    input cannot be made here."""
    p.dir.mkdir(parents=True)
    shutil.copyfile(warm / tiny.NAME, p.dir / tiny.NAME)
    shutil.copytree(warm / "cache", p.dir / "cache", symlinks=True)
    try:
        with _MAKING:
            p.case.make(p.dir)
    except Unavailable as why:
        return Result(p.case, Outcome.SKIPPED, str(why))
    return None


def _units(prepared: Sequence[_Prepared]) -> list[list[_Prepared]]:
    """What each process runs: an alone case by itself, the others in batches (the API calls of a category, the
    command lines of a command); the longest first, so that the last to end is short."""
    alone = [[p] for p in prepared if p.case.alone]
    shared = [p for p in prepared if not p.case.alone]
    kinds = [*Category, *Entry]
    batched = [group[i : i + BATCH] for kind in kinds for group in [[p for p in shared if _kind(p.case) is kind]]
               for i in range(0, len(group), BATCH)]
    return sorted(batched, key=len, reverse=True) + alone


def _kind(case: Case) -> Category | Entry:
    """What a batch holds: API calls of one category, or command lines of one command (its modules imported once)."""
    return case.call.entry if isinstance(case.call, Cli) else case.category


def _bound_memory(pid: int) -> None:
    """Bound a case process's address space, so a huge allocation fails instead of taking the machine (set just after
    it starts: it imports for seconds before it reads its input)."""
    limit = int(float(os.environ.get(MEMORY_VARIABLE) or 8) * 2**30)
    resource.prlimit(pid, resource.RLIMIT_AS, (limit, limit))


def _run_unit(unit: list[_Prepared], setup: Setup) -> list[Result]:
    """Make the unit's inputs, then run them; then unmount the filesystems a case mounted on its cache."""
    try:
        skipped = [r for r in (_prepare(p, setup.warm) for p in unit) if r is not None]
        unit = [p for p in unit if p.case not in {r.case for r in skipped}]
        if not unit:
            return skipped
        first = unit[0]
        if first.case.alone and isinstance(first.case.call, Cli):
            return skipped + [_run_cli(first, first.case.call, setup.env)]
        return skipped + _run_batch(unit, setup.env)
    finally:
        for p in unit:
            if os.path.ismount(p.dir / "cache"):
                subprocess.run(["umount", "-l", str(p.dir / "cache")], check=False)


def _popen(cmd: list[str], cwd: pathlib.Path, env: dict[str, str], stdout, stderr) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, cwd=cwd, env=env | {"CINN_CACHE_DIR": str(cwd / "cache")}, stdout=stdout, stderr=stderr,
                            stdin=subprocess.DEVNULL, start_new_session=True, text=True, errors="replace")
    _bound_memory(proc.pid)
    return proc


def _kill(proc: subprocess.Popen) -> None:
    """The process and everything it started (TVM's build workers)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _args(p: _Prepared, call: Cli) -> list[str]:
    return [_text(a, p.dir) for a in call.args]


def _run_cli(p: _Prepared, call: Cli, env: dict[str, str]) -> Result:
    """`python -m ENTRY ARGS`, as a user runs it."""
    proc = _popen([sys.executable, "-m", call.entry.value, *_args(p, call)], p.dir, env, subprocess.PIPE, subprocess.PIPE)
    try:
        out, err = proc.communicate(timeout=timeout_s())
    except subprocess.TimeoutExpired:
        _kill(proc)
        return _marked(p) or Result(p.case, Outcome.HANG, f"no exit after {timeout_s():.0f} s")
    return _marked(p) or Result(p.case, *classify_cli(p.case.expect, proc.returncode, out, err, p.dir))


def _run_batch(unit: list[_Prepared], env: dict[str, str]) -> list[Result]:
    """Run the unit's cases in worker processes (tests.bad_inputs.worker): one dies or hangs, that case is classified
    so, and a new worker takes the rest."""
    pending, results = list(unit), []
    while pending:
        jobs = pending[0].dir / "jobs.json"
        jobs.write_text(json.dumps([_job(p) for p in pending]))
        with open(pending[0].dir / "worker.err", "w+") as err:
            proc = _popen([sys.executable, "-m", "tests.bad_inputs.worker", str(jobs)], pending[0].dir, env, subprocess.PIPE, err)
            results += _collect(proc, pending, err)
    return results


def _job(p: _Prepared) -> dict:
    """What tests.bad_inputs.worker.run_job reads."""
    call = p.case.call
    if isinstance(call, Cli):
        return {"name": p.case.name, "dir": str(p.dir), "entry": call.entry.name, "args": _args(p, call)}
    return {"name": p.case.name, "dir": str(p.dir), "action": call.action.name, "path": call.path, "arg": call.arg}


def _collect(proc: subprocess.Popen, pending: list[_Prepared], err) -> list[Result]:
    """Read a worker's results; removes the cases answered (or that killed it) from `pending`."""
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=lambda: ([lines.put(line) for line in proc.stdout], lines.put(None)), daemon=True).start()  # type: ignore[union-attr]
    results = []
    while True:
        try:
            line = lines.get(timeout=timeout_s())
        except queue.Empty:
            _kill(proc)
            p = pending.pop(0)
            return results + [_marked(p) or Result(p.case, Outcome.HANG, f"no answer after {timeout_s():.0f} s")]
        if line is None:
            proc.wait()
            p = pending.pop(0)
            err.seek(0)
            return results + [_marked(p) or Result(p.case, Outcome.CRASH, f"{_status(proc.returncode)}: {err.read()[-600:]}")]
        if line.startswith(worker.RESULT):
            p = pending.pop(0)
            results.append(_marked(p) or Result(p.case, *_classify(p, json.loads(line[len(worker.RESULT):]))))
            if not pending:
                proc.wait()
                return results


def _status(code: int) -> str:
    return f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"


def _marked(p: _Prepared) -> Result | None:
    """Code execution, if the case's payload left its marker."""
    return Result(p.case, Outcome.CODE_EXECUTION, f"{p.dir / MARKER} exists") if (p.dir / MARKER).exists() else None


# -- classifying ------------------------------------------------------------------------------------------------
def _text(pattern: str, d: pathlib.Path) -> str:
    return pattern.replace("{dir}", str(d))


def _classify(p: _Prepared, got: dict) -> tuple[Outcome, str]:
    if isinstance(p.case.call, Cli):
        return classify_cli(p.case.expect, got["status"], got["out"], got["err"], p.dir)
    return classify_api(p.case.expect, got, p.dir)


def classify_api(expect: Expect, got: dict, d: pathlib.Path) -> tuple[Outcome, str]:
    """A worker's answer (tests.bad_inputs.worker.run_job) judged."""
    error = f"{got['error']}: {got['message']}"
    if got["error"]:
        if expect.want is Want.RESULT:
            return Outcome.REFUSED, error
        if not got["clear"]:
            return Outcome.BAD_MESSAGE, error
        problem = _message_problem(expect, got["message"], d)
        if problem:
            return Outcome.BAD_MESSAGE, f"{problem}: {error}"
    elif expect.want is Want.ERROR:
        return Outcome.ACCEPTED, "no error"
    elif got["wrong"]:
        return Outcome.WRONG_RESULT, got["wrong"]
    if expect.warns and not any(_text(expect.warns, d) in w for w in got["warnings"]):
        warned = f"no warning naming {_text(expect.warns, d)!r}; warnings: {got['warnings']}"
        return Outcome.BAD_MESSAGE, f"{warned} {error}" if got["error"] else warned
    return Outcome.OK, error if got["error"] else ""


def _message_problem(expect: Expect, message: str, d: pathlib.Path) -> str:
    if len(message.strip()) < 10:
        return "a message of a few characters"
    if expect.names and _text(expect.names, d) not in message:
        return f"the message does not name {_text(expect.names, d)!r}"
    if expect.forbid and expect.forbid in message:
        return f"the message says {expect.forbid!r}"
    return ""


def classify_cli(expect: Expect, status: int, out: str, err: str, d: pathlib.Path) -> tuple[Outcome, str]:
    """A CLI's exit status and output judged."""
    tail = err.strip()[-600:]
    if status < 0:
        return Outcome.CRASH, f"{_status(status)}: {tail}"
    if TRACEBACK in out + err:
        return Outcome.TRACEBACK, f"exit status {status}: {tail}"
    if status == 0:
        if expect.want is Want.ERROR:
            return Outcome.ACCEPTED, "exit status 0"
    elif expect.want is Want.RESULT:
        return Outcome.REFUSED, f"exit status {status}: {tail}"
    elif status not in expect.status:
        return Outcome.WRONG_STATUS, f"exit status {status}, expected {sorted(expect.status)}: {tail}"
    elif not err.strip():
        return Outcome.BAD_MESSAGE, f"exit status {status} without a message"
    elif problem := _message_problem(expect, err, d):
        return Outcome.BAD_MESSAGE, f"{problem}: {tail}"
    if expect.warns and _text(expect.warns, d) not in err:
        return Outcome.BAD_MESSAGE, f"no warning naming {_text(expect.warns, d)!r}: {tail}"
    return Outcome.OK, tail


# -- reporting ---------------------------------------------------------------------------------------------------
def table(results: Iterable[Result], markdown: bool = False) -> str:
    """category | tried | failed, then each failure with its outcome (and the cases that could not be made here)."""
    results = list(results)
    tried = [r for r in results if r.outcome is not Outcome.SKIPPED]
    rows = [(c.value, str(sum(r.case.category is c for r in tried)), str(sum(r.case.category is c and not r.ok for r in tried)))
            for c in Category if any(r.case.category is c for r in tried)]
    rows.append(("total", str(len(tried)), str(sum(not r.ok for r in tried))))
    failures = [r for r in results if not r.ok]
    if markdown:
        lines = ["| category | tried | failed |", "|---|---:|---:|", *(f"| {a} | {b} | {c} |" for a, b, c in rows)]
        lines += ["", "| category | case | outcome | detail |", "|---|---|---|---|"] if failures else []
        lines += [f"| {r.case.category.value} | {r.case.name} | {r.outcome.value} | {_one_line(r.detail)} |" for r in failures]
    else:
        width = max(len(a) for a, _, _ in rows)
        lines = [f"{'category'.ljust(width)}  tried  failed", *(f"{a.ljust(width)}  {b:>5}  {c:>6}" for a, b, c in rows)]
        lines += ["", "failures:"] if failures else []
        lines += [f"  [{r.case.category.value}] {r.case.name}: {r.outcome.value} -- {_one_line(r.detail)}" for r in failures]
    skipped = [f"{r.case.name} ({r.detail})" for r in results if r.outcome is Outcome.SKIPPED]
    lines += ["", f"skipped, their input cannot be made here: {'; '.join(skipped)}"] if skipped else []
    return "\n".join(lines)


def _one_line(text: str, limit: int = 240) -> str:
    flat = " ".join(text.split()).replace("|", "/")
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."
