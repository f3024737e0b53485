"""cinn's thread pool: loaded kernels' parallel loops run on it, in step with TVM's pool, and it falls back cleanly."""
from __future__ import annotations

import ctypes
import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tvm
from tvm.script import tirx as T

import cinn
from cinn.compiler.build import load_library
from cinn.core.target import parse_target
from cinn.runtime import thread_pool
from cinn.runtime.machine import configure_threads
from tests.timeouts import scaled

RNG = np.random.default_rng(0)


def _program():
    b = cinn.NetBuilder("pool")
    x = b.create_input("float32", (96, 512), "x")
    w = b.create_constant(np.random.default_rng(1).standard_normal((512, 256)).astype("float32") * 0.05, "w")
    return b.build([b.relu(b.matmul(x, w)), b.reduce_sum(b.exp(x), dim=[1])])


def _launchers(cache: pathlib.Path) -> list[int]:
    """The parallel-launch pointers of the kernel libraries in a cache that have one."""
    found = []
    for path in sorted(cache.glob("*.so")):
        try:
            found.append(ctypes.c_void_p.in_dll(ctypes.CDLL(str(path)), thread_pool.LAUNCH_POINTER).value)
        except ValueError:  # a kernel without parallel loops, or the pool itself
            continue
    return found


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    cache = tmp_path_factory.mktemp("pool-cache")
    exe = cinn.compile(_program(), cache_dir=cache)
    x = RNG.standard_normal((96, 512)).astype("float32")
    return exe, cache, x


def test_parallel_loops_run_on_cinns_pool(compiled):
    exe, cache, x = compiled
    exe.run({"x": x})
    if thread_pool.chosen() is not thread_pool.Pool.CINN:
        pytest.skip("CINN_THREAD_POOL=tvm")
    pool = thread_pool._State.library
    assert pool is not None
    launch = ctypes.cast(pool.cinn_pool_launch, ctypes.c_void_p).value
    launchers = _launchers(cache)
    assert launchers and all(p == launch for p in launchers), (launch, launchers)


def test_many_runs_agree_with_one_thread(compiled):
    """Each launch hands out its tasks anew (the shares, then stealing): 300 runs equal a one-thread run."""
    exe, _, x = compiled
    want = exe.run({"x": x})
    for _ in range(300):
        got = exe.run({"x": x})
        assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))
    one = cinn.compile(_program(), "llvm -num-cores=1", cache_dir=compiled[1]).run({"x": x})
    for g, w in zip(one, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


_CHILD = textwrap.dedent("""
    import sys, warnings
    import numpy as np
    import cinn
    b = cinn.NetBuilder("p")
    x = b.create_input("float32", (64, 4096), "x")
    exe = cinn.compile(b.build([b.relu(x)]), cache_dir=sys.argv[1])
    a = np.random.default_rng(0).standard_normal((64, 4096)).astype("float32")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = exe.run({"x": a})[0]
    assert np.array_equal(got, np.maximum(a, 0))
    print("|".join(str(w.message) for w in caught))
""")


def _child(cache: pathlib.Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _CHILD, str(cache)], capture_output=True, text=True, timeout=scaled(300),
                          env={**os.environ, **env})


def test_tvm_pool_on_request(tmp_path):
    done = _child(tmp_path, CINN_THREAD_POOL="tvm")
    assert done.returncode == 0, done.stderr
    assert not list(tmp_path.glob("thread-pool-*.so"))


def test_without_a_c_compiler_kernels_keep_tvms_pool(tmp_path, monkeypatch):
    """The pool is built on the process's first kernel load: here it cannot be, and the kernels run on TVM's."""
    exe = cinn.compile(_program(), cache_dir=tmp_path)  # TVM links the kernels with $CC: build them first
    monkeypatch.setattr(thread_pool._State, "tried", False)
    monkeypatch.setattr(thread_pool._State, "library", None)
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.warns(UserWarning, match="kernels run on TVM's thread pool: cinn's could not be built"):
        again = cinn.compile(_program(), cache_dir=tmp_path)
    x = RNG.standard_normal((96, 512)).astype("float32")
    for g, w in zip(again.run({"x": x}), exe.run({"x": x}), strict=True):
        np.testing.assert_array_equal(g, w)


def test_an_unknown_pool_is_named(monkeypatch):
    monkeypatch.setenv("CINN_THREAD_POOL", "openmp")
    with pytest.raises(ValueError, match="CINN_THREAD_POOL='openmp': expected one of cinn, tvm"):
        thread_pool.chosen()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
def test_a_forked_child_starts_its_own_workers(compiled):
    """The workers do not survive a fork: the child's first launch starts new ones (and never waits for the old)."""
    exe, _, x = compiled
    want = exe.run({"x": x})
    pid = os.fork()
    if pid == 0:  # the child: exit status 0 when its runs match
        ok = all(all(np.array_equal(g, w) for g, w in zip(exe.run({"x": x}), want, strict=True)) for _ in range(20))
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


@T.prim_func
def _checked(a: T.Buffer((64,), "float32"), b: T.Buffer((64,), "float32")):
    for i in T.parallel(64):
        assert a[i] < T.float32(100), "value too large for the test"
        b[i] = a[i] + T.float32(1)


@pytest.mark.parametrize("bad", [0, 31, 32, 63])
def test_a_tasks_error_is_raised_on_the_calling_thread(tmp_path, bad):
    """The assertion fails in the first or the second thread's share: either way the caller gets its message."""
    target = parse_target("llvm")
    path = str(tmp_path / "checked.so")
    tvm.compile(tvm.IRModule({"main": _checked.with_attr("global_symbol", "main")}), target=target.tvm()).export_library(path)
    module = load_library(path, target)
    configure_threads(2)
    a = np.zeros(64, "float32")
    b = tvm.runtime.tensor(np.zeros(64, "float32"))
    module["main"](tvm.runtime.tensor(a), b)
    np.testing.assert_array_equal(b.numpy(), a + 1)
    a[bad] = 1000
    for _ in range(10):
        with pytest.raises(RuntimeError, match="value too large for the test"):
            module["main"](tvm.runtime.tensor(a), b)
