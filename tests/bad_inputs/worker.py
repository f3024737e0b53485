"""The process that runs the cases that share one: `python -m tests.bad_inputs.worker JOBS.json` runs each job in
turn (a Python API call, or a command's main(argv) as `python -m` would run it) and prints a line before it (so a
crash names its case) and its result after it."""
from __future__ import annotations

import contextlib
import functools
import importlib
import io
import json
import os
import pathlib
import sys
import traceback
import warnings
from collections.abc import Callable

import numpy as np

from tests.bad_inputs import tiny
from tests.bad_inputs.core import Action, Entry

START, RESULT = "@@bad-input-start@@ ", "@@bad-input-result@@ "
CLEAR_ERRORS = (ValueError, TypeError, NotImplementedError, OSError)
# Compared as tests/test_fuzz.py compares float32 kernels: a matmul's sums may be taken in another order.
RTOL, ATOL = 1e-4, 1e-5


@functools.cache
def _tiny_executable(model: pathlib.Path):
    """The tiny model compiled once per process (the feed cases share it)."""
    import cinn

    return cinn.compile(cinn.load_model(str(model)), workers=1)


def _data() -> np.ndarray:
    return np.linspace(-2, 2, 16, dtype=np.float32).reshape(tiny.SHAPE)


def _load(d: pathlib.Path, path: str, arg: str) -> Callable[[], None] | None:
    import cinn

    cinn.load_model(str(d / path))
    return None


def _load_compile(d: pathlib.Path, path: str, arg: str) -> Callable[[], None] | None:
    import cinn
    from cinn.core.utils import random_feeds

    program = cinn.load_model(str(d / path))
    cinn.compile(program, workers=1).run(random_feeds(program.inputs, 0))
    return None


def _compile_tiny(d: pathlib.Path, path: str, arg: str) -> Callable[[], None] | None:
    import cinn

    exe = cinn.compile(cinn.load_model(str(d / tiny.NAME)), tuning_log=path or None, workers=1)
    got = exe.run({tiny.INPUT: _data()})[0]
    return lambda: np.testing.assert_allclose(got, tiny.reference(d / tiny.NAME, _data()), RTOL, ATOL)


def _feed(d: pathlib.Path, path: str, arg: str) -> Callable[[], None] | None:
    from tests.bad_inputs.feeds import FEEDS

    exe = _tiny_executable(d / tiny.NAME)
    feeds, out = FEEDS[arg][0]()
    got = (exe.run(feeds) if out is None else exe.run(feeds, out))[0]  # type: ignore[arg-type]
    want = tiny.reference(d / tiny.NAME, np.asarray(feeds[tiny.INPUT]))  # type: ignore[index]
    return lambda: np.testing.assert_allclose(np.asarray(got), np.asarray(want), RTOL, ATOL, equal_nan=True)


def _cost_model(d: pathlib.Path, path: str, arg: str) -> Callable[[], None] | None:
    from autotune.cost_model import CostModel

    CostModel.load(d / path)
    return None


ACTIONS: dict[Action, Callable[[pathlib.Path, str, str], Callable[[], None] | None]] = {
    Action.LOAD: _load, Action.LOAD_COMPILE: _load_compile, Action.COMPILE_TINY: _compile_tiny, Action.FEED: _feed,
    Action.COST_MODEL: _cost_model,
}


def run_job(job: dict) -> dict:
    """One case in the case's folder, with its cache: a command's or an API call's answer."""
    d = pathlib.Path(job["dir"])
    os.chdir(d)
    os.environ["CINN_CACHE_DIR"] = str(d / "cache")
    return {"name": job["name"], **(run_command(job) if "entry" in job else run_api(job, d))}


def run_api(job: dict, d: pathlib.Path) -> dict:
    """An API call: the error it raised (type, whether of a clear kind, message), a wrong result, the warnings."""
    error, clear, message, wrong = "", False, "", ""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            check = ACTIONS[Action[job["action"]]](d, job["path"], job["arg"])
        except Exception as e:
            error, clear, message, check = type(e).__name__, isinstance(e, CLEAR_ERRORS), str(e), None
    if check is not None:
        try:
            check()
        except AssertionError as e:
            wrong = str(e)[-1000:]
    return {"error": error, "clear": clear, "message": message[:2000], "wrong": wrong,
            "warnings": [str(w.message)[:1000] for w in caught]}


def run_command(job: dict) -> dict:
    """A command's main(argv), as `python -m ENTRY ARGS` runs it: its exit status, what it printed (warnings
    shown as a fresh process shows them, an uncaught error's traceback)."""
    main = importlib.import_module(f"{Entry[job['entry']].value}.__main__").main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
        try:
            status = main(job["args"])
        except SystemExit as e:
            status = _exit_status(e.code)
        except Exception:
            traceback.print_exc()
            status = 1
    return {"status": status, "out": out.getvalue()[-4000:], "err": err.getvalue()[-4000:]}


def _exit_status(code: object) -> int:
    """The status sys.exit(code) ends a process with (a message: printed, status 1)."""
    if code is None or isinstance(code, int):
        return code or 0
    print(code, file=sys.stderr)
    return 1


def main(jobs_file: str) -> None:
    for job in json.loads(pathlib.Path(jobs_file).read_text()):
        print(START + json.dumps(job["name"]), flush=True)
        print("\n" + RESULT + json.dumps(run_job(job)), flush=True)


def warm(folder: str) -> None:
    """Compile and run the tiny model in `folder` (its cache: folder/cache)."""
    d = pathlib.Path(folder)
    run_job({"name": "warm", "dir": folder, "action": Action.COMPILE_TINY.name, "path": "", "arg": ""})
    if not any((d / "cache").glob("*.so")):
        raise SystemExit(f"warming the cache in {d} built nothing")


if __name__ == "__main__":
    (warm if sys.argv[1] == "--warm" else main)(sys.argv[-1])
