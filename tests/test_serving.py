"""Serving: one executable run from many threads, zero-copy feeds and outputs, `out=` arrays, the profiler."""
from __future__ import annotations

import concurrent.futures as cf
import threading

import numpy as np
import pytest

import cinn
from cinn.core.target import parse_target
from cinn.runtime import executable as runtime
from cinn.runtime import machine
from cinn.runtime.executable import ALIGNMENT, aligned_empty
from cinn.runtime.machine import Peaks

RNG = np.random.default_rng(0)


def _mlp_softmax():
    b = cinn.NetBuilder("mlp_softmax")
    x = b.create_input("float32", (64, 256), "x")
    w = b.create_constant(RNG.standard_normal((256, 128)).astype("float32") * 0.1, "w")
    return b.build([b.softmax(b.relu(b.matmul(x, w)))])


def _conv():
    b = cinn.NetBuilder("conv")
    x = b.create_input("float32", (1, 8, 16, 16), "x")
    w = b.create_constant(RNG.standard_normal((16, 8, 3, 3)).astype("float32") * 0.2, "w")
    y = b.relu(b.conv2d(x, w, paddings=[1, 1]))
    return b.build([y, b.reduce_sum(y, dim=[2, 3])])


@pytest.fixture(scope="module")
def models(tmp_cache):
    return {"mlp": cinn.compile(_mlp_softmax(), cache_dir=tmp_cache), "conv": cinn.compile(_conv(), cache_dir=tmp_cache)}


def _feeds(exe, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {v.name: rng.standard_normal(v.shape).astype(v.dtype) for v in exe.program.inputs}


def test_many_threads_share_one_executable(models):
    """8 threads x 2 models x 12 calls on different inputs: every result equals the single-threaded one."""
    jobs = [(name, seed) for name in models for seed in range(8)]
    feeds = {job: _feeds(models[job[0]], job[1]) for job in jobs}
    want = {job: models[job[0]].run(feeds[job]) for job in jobs}

    def call(job):
        got = models[job[0]].run(feeds[job])
        return all(np.array_equal(g, w) for g, w in zip(got, want[job], strict=True))

    with cf.ThreadPoolExecutor(8) as pool:
        ok = list(pool.map(call, jobs * 12))
    assert all(ok), f"{ok.count(False)} of {len(ok)} concurrent results differ"


def test_each_calling_thread_gets_the_configured_pool(models, monkeypatch):
    """TVM's thread pool is per calling thread: a new thread's first run sizes its own."""
    sized = []
    monkeypatch.setattr(runtime, "configure_threads", lambda n, config=None: sized.append((threading.get_ident(), n)))
    exe = models["mlp"]
    feeds = _feeds(exe, 0)
    thread = threading.Thread(target=lambda: [exe.run(feeds) for _ in range(3)])
    thread.start()
    thread.join()
    assert sized == [(thread.ident, exe._threads)]


@pytest.fixture
def copies(monkeypatch) -> list[np.ndarray]:
    """The feeds the runtime copies into its workspace, recorded as it runs."""
    copied: list[np.ndarray] = []
    real = runtime._copied
    monkeypatch.setattr(runtime, "_copied", lambda *a: copied.append(a[-1]) or real(*a))
    return copied


@pytest.mark.parametrize("offset", [0, 4, 16, 36])
def test_contiguous_feed_is_read_in_place(models, copies, offset):
    """Kernel parameters are element-aligned: a feed at any float32 offset from a cache line is read in place."""
    exe = models["mlp"]
    x = _at_offset(_feeds(exe, 1)["x"], offset)
    want = exe.run({"x": x.copy()})
    assert x.ctypes.data % ALIGNMENT == offset
    copies.clear()
    np.testing.assert_array_equal(exe.run({"x": x})[0], want[0])
    assert copies == []


def _at_offset(x: np.ndarray, offset: int) -> np.ndarray:
    """A C-contiguous copy of x whose data starts `offset` bytes after a 64-byte boundary."""
    raw = aligned_empty((x.nbytes + ALIGNMENT,), "uint8")
    y = raw[offset:offset + x.nbytes].view(x.dtype).reshape(x.shape)
    y[...] = x
    return y


@pytest.mark.parametrize("how", ["float64", "non-contiguous", "unaligned", "list", "read-only"])
def test_feeds_that_need_a_copy_are_converted_once(models, how, copies):
    exe = models["mlp"]
    x = _feeds(exe, 2)["x"]
    want = exe.run({"x": x})[0]
    feed = {"float64": x.astype(np.float64),
            "non-contiguous": np.asfortranarray(x),
            "unaligned": _at_offset(x.view("uint8"), 2).view("float32"),  # 2 bytes off its element
            "list": x.tolist(),
            "read-only": _read_only(x)}[how]
    copies.clear()
    np.testing.assert_array_equal(exe.run({"x": feed})[0], want)
    assert len(copies) == 1


def _read_only(x: np.ndarray) -> np.ndarray:
    """An aligned array that cannot be written (numpy refuses to export it through DLPack 0.x)."""
    y = aligned_empty(x.shape, x.dtype)
    y[...] = x
    y.flags.writeable = False
    return y


def test_outputs_are_fresh_aligned_arrays(models):
    exe = models["conv"]
    feeds = _feeds(exe, 3)
    first, second = exe.run(feeds), exe.run(feeds)
    for a, b in zip(first, second, strict=True):
        assert not np.may_share_memory(a, b)
        assert a.flags.writeable and a.flags.c_contiguous and a.ctypes.data % ALIGNMENT == 0
    assert not np.may_share_memory(first[0], first[1])
    first[0][...] = 0  # the caller owns them: writing one changes no later result
    np.testing.assert_array_equal(exe.run(feeds)[0], second[0])


def test_out_arrays_are_written_in_place(models):
    exe = models["conv"]
    feeds = _feeds(exe, 4)
    want = exe.run(feeds)
    out = [aligned_empty(w.shape, w.dtype) for w in want]
    got = exe.run(feeds, out=out)
    assert all(g is o for g, o in zip(got, out, strict=True))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
    for offset in (4, 2):  # element-aligned: written in place; 2 bytes off: through an aligned stand-in
        out = [_at_offset(np.zeros(w.shape, w.dtype).view("uint8"), offset).view(w.dtype) for w in want]
        got = exe.run(feeds, out=out)
        assert all(g is o for g, o in zip(got, out, strict=True))
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g, w)


def test_out_arrays_are_checked(models):
    exe = models["conv"]
    feeds = _feeds(exe, 5)
    y, s = (np.zeros(v.shape, v.dtype) for v in exe.program.outputs)
    with pytest.raises(TypeError, match="out must be a list of 2 arrays"):
        exe.run(feeds, out=[y])
    with pytest.raises(TypeError, match=r"out\[1\] .* must be a numpy array"):
        exe.run(feeds, out=[y, s.tolist()])
    with pytest.raises(ValueError, match=r"out\[0\] .* is float64\[1, 16, 16, 16\], expected float32\[1, 16, 16, 16\]"):
        exe.run(feeds, out=[y.astype("float64"), s])
    with pytest.raises(ValueError, match=r"out\[1\] .* is float32\[16, 1\], expected float32\[1, 16\]"):
        exe.run(feeds, out=[y, np.empty((16, 1), "float32")])
    with pytest.raises(ValueError, match="C-contiguous and writable"):
        exe.run(feeds, out=[np.asfortranarray(y), s])
    with pytest.raises(ValueError, match="shares memory with a feed or another out array"):
        exe.run(feeds, out=[y, y.reshape(-1)[:16].reshape(1, 16)])


def test_out_may_not_alias_a_feed(tmp_cache):
    b = cinn.NetBuilder("inplace")
    x = b.create_input("float32", (8,), "x")
    exe = cinn.compile(b.build([b.relu(x)]), cache_dir=tmp_cache)
    x_value = aligned_empty((8,), "float32")
    x_value[...] = np.arange(-4, 4)
    with pytest.raises(ValueError, match="shares memory with a feed"):
        exe.run({"x": x_value}, out=[x_value])


def test_outputs_that_no_kernel_writes_are_copies(tmp_cache):
    b = cinn.NetBuilder("passthrough")
    x = b.create_input("float32", (3,), "x")
    r = b.relu(x)
    c = b.create_constant(np.array([1, 2, 3], "float32"), "c")
    exe = cinn.compile(b.build([x, r, r, c]), cache_dir=tmp_cache)
    xv = aligned_empty((3,), "float32")
    xv[...] = [-1, 0, 1]
    a, r1, r2, cv = exe.run({"x": xv})
    np.testing.assert_array_equal(a, xv)
    np.testing.assert_array_equal(r1, [0, 0, 1])
    np.testing.assert_array_equal(r2, r1)
    np.testing.assert_array_equal(cv, [1, 2, 3])
    assert not np.may_share_memory(a, xv) and not np.may_share_memory(r1, r2)


def test_peak_bytes_counts_workspace_and_constants(models):
    exe = models["mlp"]
    assert exe.constant_bytes == 256 * 128 * 4
    assert exe.peak_bytes == exe.workspace_bytes + exe.constant_bytes
    # the feed's copy buffer; the output is the array run() returns, not workspace
    assert exe.workspace_bytes <= 64 * 256 * 4 + 64 * 128 * 4 * 2


def test_profile_accounts_for_every_kernel(models):
    exe = models["conv"]
    prof = exe.profile(_feeds(exe, 6), repeat=5)
    assert len(prof.kernels) == exe.num_kernels
    assert all(k.in_run_ms > 0 and k.alone_ms > 0 for k in prof.kernels)
    assert prof.run_ms > 0
    text = prof.table()
    assert "outside the kernels" in text and prof.kernels[0].name[:20] in text
    conv = next(k for k in prof.kernels if k.name.startswith("fused_conv2d"))
    assert conv.flops == 2 * 16 * 16 * 16 * 8 * 3 * 3 + 16 * 16 * 16  # the conv's multiply-adds, then the relu
    assert conv.nbytes == 4 * (8 * 16 * 16 + 16 * 8 * 3 * 3 + 16 * 16 * 16)  # input, weights, output
    assert conv.gflops == pytest.approx(conv.flops / conv.in_run_ms / 1e6)


def test_an_embedding_lookup_counts_the_rows_it_gathers_not_the_table(tmp_cache):
    # BERT's embedding kernel had counted its 94 MB table: "98% FMA" and "2683% mem" of the peaks
    b = cinn.NetBuilder("embedding")
    ids = b.create_input("int64", (4,), "ids")
    table = b.create_constant(np.ones((1000, 16), "float32"), "table")
    exe = cinn.compile(b.build([b.relu(b.gather(table, ids, axis=0))]), cache_dir=tmp_cache)
    (k,) = exe.profile({"ids": np.array([1, 5, 7, 999])}, repeat=2).kernels
    assert k.flops == 2 * 4 * 16  # the gather's and the relu's elements
    assert k.nbytes == 4 * 8 + 2 * 4 * 16 * 4  # the ids, the 4 rows read, the output


def test_profile_states_percent_of_the_machine_peaks(models):
    exe = models["conv"]
    prof = exe.profile(_feeds(exe, 6), repeat=3, peaks=Peaks(gflops=1e-3, gbps=1e6))
    lines = prof.table().splitlines()
    assert lines[0].startswith("machine: FMA peak 0 GFLOP/s, memory 1000000.0 GB/s")
    kernels = len(prof.kernels)
    assert all(line.endswith("FMA") for line in lines[2:2 + kernels])  # 1 MFLOP/s: every kernel is far past that peak
    # then the kernels by name: each name once, with its count, time and time-weighted percent of both peaks
    assert lines[2 + kernels].startswith("by name: kernels, in run ms, share, time-weighted % of peaks")
    names = {k.name for k in prof.kernels}
    by_name = lines[3 + kernels:-1]
    assert sorted(line.split()[0] for line in by_name) == sorted(names)
    assert sum(int(line.split()[1][1:]) for line in by_name) == kernels
    assert all(line.endswith(" mem") and " FMA " in line for line in by_name)


def test_machine_peaks_are_measured_once_and_cached(tmp_path, monkeypatch):
    target = parse_target("llvm")
    sized = []
    monkeypatch.setattr(machine, "configure_threads", sized.append)
    first = machine.machine_peaks(target, tmp_path)
    assert sized == [target.num_cores]  # all the target's cores measured, whatever pool the process had
    assert 1 < first.gflops < 1e5 and 0.1 < first.gbps < 1e4
    monkeypatch.setattr(machine, "_fma_gflops", lambda target: pytest.fail("measured again"))
    assert machine.machine_peaks(target, tmp_path) == first


@pytest.mark.parametrize("preset", [None, "9"])
def test_openblas_threads_do_not_spin_after_importing_cinn(preset):
    """OpenBLAS's spinning idle threads take the cores from cinn's kernels: cinn shortens their spin unless the user
    chose a value (benchmarks/contention.py measures the effect)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    if preset:
        env["OPENBLAS_THREAD_TIMEOUT"] = preset
    code = "import os, cinn, numpy; print(os.environ['OPENBLAS_THREAD_TIMEOUT'])"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == (preset or "4")


def test_device_path_copies_feeds_in_and_outputs_out(tmp_cache, monkeypatch):
    """A GPU's kernels cannot read numpy arrays: feeds go through the workspace's device buffers and outputs come
    back by copy. Exercised here on the CPU, with the host check answering no."""
    for program in (_mlp_softmax(), _conv()):
        exe = cinn.compile(program, cache_dir=tmp_cache)
        with monkeypatch.context() as patch:
            patch.setattr(runtime, "_is_host", lambda device: False)
            device_like = cinn.compile(program, cache_dir=tmp_cache)
        feeds = _feeds(exe, 7)
        want = exe.run(feeds)
        for _ in range(2):
            got = device_like.run(feeds)
            for g, w in zip(got, want, strict=True):
                np.testing.assert_array_equal(g, w)
        assert not np.may_share_memory(got[0], device_like.run(feeds)[0])
