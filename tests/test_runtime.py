"""Runtime and API: clear errors for bad input, the kernel cache, buffer reuse, kernel sources."""
from __future__ import annotations

import pathlib
import subprocess
import sys
import time

import numpy as np
import pytest

import cinn
from cinn.core.ir import Node, Program, TensorType, Value
from tests.timeouts import scaled

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _small_program():
    b = cinn.NetBuilder("small")
    x = b.create_input("float32", (2, 3), "x")
    y = b.create_input("float32", (3,), "y")
    return b.build([b.relu(b.add(x, y))])


@pytest.fixture(scope="module")
def small_exe(tmp_cache):
    return cinn.compile(_small_program(), cache_dir=tmp_cache)


def test_shape_mismatch_names_op_and_shapes():
    b = cinn.NetBuilder("bad")
    x = b.create_input("float32", (2, 3), "x")
    y = b.create_input("float32", (4,), "y")
    with pytest.raises(ValueError, match=r"add: shapes \(2, 3\) and \(4,\) do not broadcast"):
        b.add(x, y)


def test_dtype_mismatch_names_op():
    b = cinn.NetBuilder("bad")
    x = b.create_input("float32", (2,), "x")
    y = b.create_input("int32", (2,), "y")
    with pytest.raises(TypeError, match="add"):
        b.add(x, y)


def test_unknown_op_names_op_and_node(tmp_cache):
    x = Value("x", TensorType((2,), "float32"))
    out = Value("y", TensorType((2,), "float32"))
    program = Program("p", (x,), (Node("frobnicate", (x,), (out,), name="node7"),), (out,))
    with pytest.raises(NotImplementedError, match=r"frobnicate.*node7"):
        cinn.compile(program, cache_dir=tmp_cache)
    with pytest.raises(AttributeError, match="frobnicate"):
        _ = cinn.NetBuilder().frobnicate


def test_feeds_are_validated_before_running(small_exe):
    good = {"x": np.ones((2, 3), "float32"), "y": np.ones(3, "float32")}
    with pytest.raises(ValueError, match="missing inputs \\['y'\\]"):
        small_exe.run({"x": good["x"]})
    with pytest.raises(ValueError, match="unexpected inputs \\['z'\\]"):
        small_exe.run({**good, "z": good["y"]})
    with pytest.raises(ValueError, match=r"input 'x' has shape \(3, 2\), expected \(2, 3\)"):
        small_exe.run({**good, "x": np.ones((3, 2), "float32")})
    with pytest.raises(TypeError, match="input 'y' has dtype bool"):
        small_exe.run({**good, "y": np.ones(3, bool)})
    np.testing.assert_array_equal(small_exe.run(good)[0], np.full((2, 3), 2, "float32"))


def test_kernel_sources_and_count(small_exe):
    assert small_exe.num_kernels == 1
    (src,) = small_exe.kernel_sources()
    assert ("def main" in src and "parallel" in src) or "vectorized" in src or "for" in src


def test_second_compile_hits_cache(tmp_path):
    program = _small_program()
    cinn.compile(program, cache_dir=tmp_path)
    libs = sorted(tmp_path.glob("*.so"))
    files = [p.stat().st_ino for p in libs]  # a rebuilt library is renamed into place: another inode
    start = time.perf_counter()
    cinn.compile(program, cache_dir=tmp_path)
    assert time.perf_counter() - start < scaled(1.0)
    assert [p.stat().st_ino for p in libs] == files


_COMPILE_SMALL = """
import sys, warnings, numpy as np, cinn
from tests.test_runtime import _small_program
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    exe = cinn.compile(_small_program(), cache_dir=sys.argv[1])
out = exe.run({"x": np.ones((2, 3), "float32"), "y": -np.ones(3, "float32")})[0]
assert (out == 0).all(), out
print("|".join(str(w.message) for w in caught))
"""


def test_corrupt_cache_entry_is_rebuilt(tmp_path):
    # a fresh process, as in real use: a library already loaded here would be reused by dlopen
    argv = [sys.executable, "-c", _COMPILE_SMALL, str(tmp_path)]
    run = lambda: subprocess.run(argv, capture_output=True, text=True, check=True, cwd=ROOT)
    run()
    for lib in tmp_path.glob("*.so"):
        lib.write_bytes(b"not a shared library")
    assert "corrupt cache entry" in run().stdout
    assert "corrupt cache entry" not in run().stdout


@pytest.mark.parametrize("keep", [0.3, 0.45, 0.6, 0.9])
def test_truncated_cache_entry_is_rebuilt_without_a_crash(tmp_path, keep):
    """A library cut short made dlopen die with SIGBUS on every later compile: entries are checked before loading."""
    argv = [sys.executable, "-c", _COMPILE_SMALL, str(tmp_path)]
    run = lambda: subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=scaled(300))
    assert run().returncode == 0
    for lib in tmp_path.glob("*.so"):
        data = lib.read_bytes()
        lib.write_bytes(data[: int(len(data) * keep)])
    again = run()
    assert again.returncode == 0, f"status {again.returncode}: {again.stderr[-2000:]}"
    assert "corrupt cache entry" in again.stdout and "does not match its digest" in again.stdout
    assert "corrupt cache entry" not in run().stdout


def test_an_entry_rewritten_while_it_is_read_is_never_seen_half_replaced(tmp_path):
    """Two builds of one kernel may write different bytes; a reader must not meet one library with the other's
    digest (it would throw the entry away): the files of an entry change together under the cache's lock."""
    import threading
    import warnings

    from cinn.compiler import build
    from cinn.core.target import parse_target
    from cinn.runtime import trust

    target = parse_target("llvm")
    libs = []
    for k in range(2):  # two different valid libraries
        b = cinn.NetBuilder(f"k{k}")
        x = b.create_input("float32", (4, 5 + k), "x")
        cinn.compile(b.build([b.relu(x)]), cache_dir=tmp_path / f"src{k}")
        libs.append(next((tmp_path / f"src{k}").glob("*.so")).read_bytes())
    path = str(tmp_path / "entry.so")
    secret = trust.key()
    stop = threading.Event()

    def write() -> None:
        try:
            for k in range(200):
                build._store(path, "source", lambda tmp, k=k: pathlib.Path(tmp).write_bytes(libs[k % 2]), secret)
        finally:
            stop.set()

    writer = threading.Thread(target=write)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        writer.start()
        while not stop.is_set():
            build.load_cached(path, target)
        writer.join()
    assert not [w for w in caught if "corrupt cache entry" in str(w.message)]


def test_cache_dir_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("CINN_CACHE_DIR", str(tmp_path / "envcache"))
    cinn.compile(_small_program())
    assert list((tmp_path / "envcache").glob("*.so"))


def test_intermediate_buffers_are_reused(tmp_cache):
    b = cinn.NetBuilder("long")
    x = b.create_input("float32", (256,), "x")
    y = x
    for _ in range(12):
        y = b.relu(b.scale(y, 0.5, 1.0))
    exe = cinn.compile(b.build([y]), fuse=False, cache_dir=tmp_cache)
    assert exe.num_kernels == 24
    # input + output + two alternating temporaries, not 24 buffers
    assert exe.peak_bytes <= 4 * 256 * 4
    xv = np.linspace(-2, 2, 256).astype("float32")
    ref = xv
    for _ in range(12):
        ref = np.maximum(ref * 0.5 + 1, 0)
    np.testing.assert_allclose(exe.run({"x": xv})[0], ref, rtol=1e-6)


def test_freed_buffers_of_other_sizes_are_reused_most_recent_first(tmp_cache):
    b = cinn.NetBuilder("shrinking")
    x = b.create_input("float32", (1024,), "x")
    a = b.relu(x)
    c = b.relu(b.slice(a, axes=[0], starts=[0], ends=[512]))
    e = b.relu(b.slice(c, axes=[0], starts=[0], ends=[256]))
    exe = cinn.compile(b.build([e]), fuse=False, passes=False, cache_dir=tmp_cache)
    assert exe.num_kernels == 5
    # the feed's copy buffer (4 KB), a (4 KB), its slice (2 KB); relu's 2 KB take a's freed slot, the next slice the
    # first slice's: 10 KB, where buffers shared only by values of one size took 4 + 4 + 2 + 2 + 1 KB
    assert exe.workspace_bytes == (1024 + 1024 + 512) * 4
    xv = np.linspace(-2, 2, 1024).astype("float32")
    np.testing.assert_array_equal(exe.run({"x": xv})[0], np.maximum(xv[:256], 0))


def test_program_output_that_is_an_input(tmp_cache):
    b = cinn.NetBuilder("passthrough")
    x = b.create_input("float32", (3,), "x")
    exe = cinn.compile(b.build([x, b.relu(x)]), cache_dir=tmp_cache)
    xv = np.array([-1, 0, 1], "float32")
    a, r = exe.run({"x": xv})
    np.testing.assert_array_equal(a, xv)
    np.testing.assert_array_equal(r, np.maximum(xv, 0))


def test_unknown_target_is_clear():
    with pytest.raises(ValueError, match="unknown target 'metal'"):
        cinn.compile(_small_program(), target="metal")


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_a_cache_dir_that_is_a_file_is_refused(tmp_path, monkeypatch, how):
    cache = tmp_path / "cache"
    cache.write_text("not a directory")
    b = cinn.NetBuilder("p")
    x = b.create_input("float32", (4,), "x")
    program = b.build([b.relu(x)])
    kwargs = {"cache_dir": cache} if how == "argument" else {}
    if how == "environment":
        monkeypatch.setenv("CINN_CACHE_DIR", str(cache))
    with pytest.raises(NotADirectoryError, match=r"kernel cache .*cache is not a directory .*CINN_CACHE_DIR"):
        cinn.compile(program, **kwargs)
