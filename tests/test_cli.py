"""The three commands alike: a user error is one line and exit 2, Ctrl-C one line and exit 130; killed or
interrupted, a command leaves no worker process behind."""
from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass

import numpy as np
import onnx
import psutil
import pytest
from onnx import TensorProto, helper, numpy_helper

from cinn.facade.command import ExitStatus
from cinn.facade.tune_cli import INTERRUPTED
from cinn.runtime.worker_pool import WorkerPool, stop_all
from tests.timeouts import scaled


@dataclass(frozen=True)
class Command:
    """A command: its name in messages, its `python -m` module, the arguments it needs besides the model, the
    arguments that keep it busy for long, and a piece of the progress it prints while it compiles or tunes."""

    prog: str
    module: str
    args: tuple[str, ...]
    busy: tuple[str, ...]
    progress: str
    interrupted: str = "interrupted"


COMMANDS = [
    Command("cinn-run", "cinn", (), ("--repeat", "100000000"), "compiling: "),
    Command("cinn-tune", "autotune", ("--log", "{tmp}/log.jsonl"), ("--trials", "100000", "--no-model-check"),
            " tasks, ", INTERRUPTED),
    Command("cinn-bench", "benchmarks", (), ("--repeat", "100000000"), "cinn-fused preparing"),
]
IDS = [c.prog for c in COMMANDS]


def _model(path) -> str:
    """Three matmuls, each with its own epilogue: several kernels to build (or tune)."""
    nodes, inits, x = [], [], "x"
    for k, act in enumerate(("Relu", "Sigmoid", "Tanh")):
        inits.append(numpy_helper.from_array(np.full((64, 64), 0.01 * (k + 1), "float32"), f"w{k}"))
        nodes += [helper.make_node("MatMul", [x, f"w{k}"], [f"m{k}"]), helper.make_node(act, [f"m{k}"], [f"a{k}"])]
        x = f"a{k}"
    graph = helper.make_graph(nodes, "three", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [32, 64])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, [32, 64])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, path)
    return str(path)


def _env(tmp_path) -> dict[str, str]:
    return {**os.environ, "CINN_CACHE_DIR": str(tmp_path / "cache")}  # empty: every kernel is built


def _argv(cmd: Command, model: str, tmp_path, *extra: str) -> list[str]:
    return [sys.executable, "-m", cmd.module, model, *(a.format(tmp=tmp_path) for a in cmd.args), *extra]


@pytest.fixture
def bad_files(tmp_path) -> dict[str, str]:
    """A file that is no model, a model, and a path that does not exist."""
    (tmp_path / "notmodel.onnx").write_bytes(b"this is not a protobuf\x00\xff")
    return {"bad": str(tmp_path / "notmodel.onnx"), "model": _model(tmp_path / "three.onnx"),
            "missing": str(tmp_path / "missing.onnx")}


@pytest.mark.parametrize("case, extra, message", [
    ("bad", (), "not a valid ONNX model"),
    ("model", ("--input-shape", "x=8,,16"), "--input-shape 'x=8,,16': expected NAME=D0,D1,... with integer dims"),
    ("missing", (), "missing.onnx"),
], ids=["bad-model-file", "bad-usage-arg", "missing-file"])
@pytest.mark.parametrize("cmd", COMMANDS, ids=IDS)
def test_a_user_error_is_one_line_and_exit_2(cmd, case, extra, message, bad_files, tmp_path):
    proc = subprocess.run(_argv(cmd, bad_files[case], tmp_path, *extra), capture_output=True, text=True,
                          env=_env(tmp_path), timeout=scaled(300))
    last = proc.stderr.splitlines()[-1] if proc.stderr else ""
    assert proc.returncode == ExitStatus.USAGE, proc.stderr
    assert "Traceback" not in proc.stderr and last.startswith(f"{cmd.prog}: error: ") and message in last, proc.stderr


@pytest.mark.parametrize("cmd", COMMANDS, ids=IDS)
def test_ctrl_c_is_one_line_and_exit_130(cmd, tmp_path):
    """SIGINT while the command compiles or tunes: exit 130 with one line, and no worker process left."""
    model = _model(tmp_path / "three.onnx")
    proc = subprocess.Popen(_argv(cmd, model, tmp_path, *cmd.busy), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env=_env(tmp_path))
    try:
        err = _read_until(proc, cmd.progress)
        descendants = psutil.Process(proc.pid).children(recursive=True)
        proc.send_signal(signal.SIGINT)
        _, rest = proc.communicate(timeout=scaled(300))
    finally:
        proc.kill()
    err += rest.decode()
    assert proc.returncode == ExitStatus.INTERRUPTED, err
    assert "Traceback" not in err and err.splitlines()[-1] == f"{cmd.prog}: {cmd.interrupted}", err
    _, alive = psutil.wait_procs(descendants, timeout=scaled(30))
    assert not alive, [p.cmdline() for p in alive]
    log = tmp_path / "log.jsonl"
    if log.exists():  # cinn-tune's: whole records only
        assert all(json.loads(line) for line in log.read_text().splitlines())


def _read_until(proc: subprocess.Popen, marker: str) -> str:
    """The process's stderr up to the end of the first line with `marker` (progress: no fixed sleep, which a busy
    machine outruns)."""
    assert proc.stderr is not None
    text, deadline = "", time.monotonic() + scaled(600)
    while marker not in text or "\n" not in text[text.index(marker):]:
        assert time.monotonic() < deadline and proc.poll() is None, f"no {marker!r} in the output:\n{text}"
        if select.select([proc.stderr], [], [], 1.0)[0]:
            text += os.read(proc.stderr.fileno(), 65536).decode(errors="replace")
    return text


_SLOW_BUILDS = r"""
import os, sys, time
import cinn, cinn.compiler.build
from tests.test_cli import _model

def slow_build(spec, target, path, secret):  # a kernel that takes minutes to build, as a big one does
    os.write(1, b"building\n")  # one write: two workers' lines do not interleave
    time.sleep(3600)

cinn.compiler.build.build_cached = slow_build  # the workers are sent this function, by value
cinn.compile(cinn.load_onnx(_model(sys.argv[1])), cache_dir=sys.argv[2], workers=2)
"""


def test_build_workers_die_with_a_killed_parent(tmp_path):
    """A compile killed with SIGKILL (a harness's timeout) takes its busy build workers with it."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_SLOW_BUILDS), str(tmp_path / "m.onnx"),
                             str(tmp_path / "cache")], stdout=subprocess.PIPE, text=True, cwd=root)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "building\n"  # a worker is busy
    except BaseException:
        proc.kill()
        raise
    _kill_and_check_children_die(proc, psutil.Process(proc.pid).children(), "build workers")


def _kill_and_check_children_die(proc: subprocess.Popen, children: list[psutil.Process], what: str) -> None:
    """SIGKILL proc, then assert that its `children` end too (and end them, should they not)."""
    try:
        proc.kill()
        proc.wait()
        _, alive = psutil.wait_procs(children, timeout=scaled(30))
        assert children and not alive, f"{what} outlived their parent"
    finally:
        for child in children:
            with contextlib.suppress(psutil.Error):
                child.kill()


def test_bench_engine_workers_die_with_a_killed_bench(tmp_path):
    """cinn-bench killed with SIGKILL while its engines prepare takes its engine workers with it."""
    bench = COMMANDS[-1]
    proc = subprocess.Popen(_argv(bench, _model(tmp_path / "three.onnx"), tmp_path, *bench.busy),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=_env(tmp_path))
    workers: list[psutil.Process] = []
    try:
        _read_until(proc, bench.progress)
        deadline = time.monotonic() + scaled(60)
        while not workers and time.monotonic() < deadline:  # the line comes just before the worker starts
            workers = psutil.Process(proc.pid).children()
            time.sleep(0.1)
    except BaseException:
        proc.kill()
        raise
    _kill_and_check_children_die(proc, workers, "engine workers")


_SPAWNER = r"""
import subprocess, sys
from cinn.runtime.worker_pool import spawner_env
child = subprocess.Popen([sys.executable, "-c", "from cinn.runtime.worker_pool import die_with_spawner; die_with_spawner(); "
                          "print(flush=True); import time; time.sleep(3600)"], env=spawner_env(), stdout=subprocess.PIPE)
child.stdout.readline()  # it has asked for its signal
print(child.pid, flush=True)
child.wait()
"""


def test_a_worker_that_asks_dies_with_its_spawner():
    """How cinn-bench's engine workers start: SIGKILL to the spawner ends a busy worker too."""
    parent = subprocess.Popen([sys.executable, "-c", _SPAWNER], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    _kill_and_check_children_die(parent, [psutil.Process(int(parent.stdout.readline()))], "a worker")


def test_a_pool_stopped_while_idle_serves_its_next_tasks():
    """stop_all (an interrupted or failed command) kills idle workers too: the next compile must not fail on them."""
    pool = WorkerPool(max_workers=2)
    try:
        first = {f.result() for f in [pool.submit(os.getpid) for _ in range(4)]}
        stop_all()
        second = {f.result() for f in [pool.submit(os.getpid) for _ in range(4)]}
        assert first and second and not first & second
    finally:
        pool.shutdown()
