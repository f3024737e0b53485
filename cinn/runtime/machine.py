"""The machine's limits, measured once and cached: the FMA peak and the memory bandwidth of a CPU target.

The profiler states every kernel's rate as a percent of these. Both are measured with TVM kernels built for the
target and run on all its cores: a loop of independent register FMAs (12 vector accumulators, more than the FMA
latency times the FMA ports), and a parallel vectorized copy of 256 MiB (read plus write bytes).
"""
from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import tvm
from tvm.script import tirx as T

from cinn.core.target import Target
from cinn.runtime import thread_pool

ACCUMULATORS = 12
FMA_ITERS = 1 << 20
COPY_FLOATS = 64 << 20  # 256 MiB: far past any cache
SHARE_ALL_CORES = -3  # TVM's AffinityMode kSpecifyThreadShareAllCore: each worker may run on any listed CPU


@dataclass(frozen=True)
class Peaks:
    """What the machine can do: FMA GFLOP/s and memory GB/s, on all of the target's cores."""

    gflops: float
    gbps: float


def configure_threads(n: int, config: Callable | None = None) -> None:
    """Run the calling thread's parallel loops on n threads, on cinn's pool and on TVM's. Asked for n threads alone,
    TVM keeps one worker on machines whose cores it cannot rank (these VMs), so this process's CPUs are listed
    explicitly. `config` is the runtime.config_threadpool function to call (default: this process's)."""
    config = config or tvm.get_global_func("runtime.config_threadpool")
    config(SHARE_ALL_CORES, n, [str(c) for c in sorted(os.sched_getaffinity(0))[:n]])
    thread_pool.set_threads(n)


def machine_peaks(target: Target, cache_dir: pathlib.Path) -> Peaks:
    """The target's peaks from the cache, else measured (about a second) and cached."""
    path = cache_dir / f"peaks-{target.mcpu}-{target.num_cores}.json"
    try:
        return Peaks(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        pass
    configure_threads(target.num_cores)  # TVM's default pool has one worker here: the peaks of one core
    peaks = Peaks(float(_fma_gflops(target)), float(_copy_gbps(target)))
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(peaks)))
    except OSError:  # a read-only cache: measured again next time
        pass
    return peaks


def _seconds(func, target: Target, *arrays: np.ndarray) -> float:
    """Median seconds of one call of a TVMScript kernel built for the target."""
    lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=target.tvm())
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(a, dev) for a in arrays]
    return lib.mod.time_evaluator("main", dev, number=1, repeat=5)(*args).median


def _fma_gflops(target: Target) -> float:
    lanes, cores = target.vector_bits // 32, target.num_cores
    vector = f"float32x{lanes}"

    @T.prim_func
    def fma(a: T.Buffer((cores, ACCUMULATORS * lanes), "float32")):  # type: ignore[valid-type]
        for c in T.parallel(cores):
            # a buffer of vector elements: each accumulator is one register, not lanes LLVM may scalarize
            acc = T.alloc_buffer((ACCUMULATORS,), vector)
            for j in range(ACCUMULATORS):
                acc[j] = T.Broadcast(a[c, 2], lanes)
            for _ in range(FMA_ITERS):
                for r in T.unroll(ACCUMULATORS):
                    acc[r] = acc[r] * T.Broadcast(a[c, 0], lanes) + T.Broadcast(a[c, 1], lanes)
            for j in range(ACCUMULATORS):
                a[c, T.Ramp(j * lanes, 1, lanes)] = acc[j]

    seconds = _seconds(fma, target, np.full((cores, ACCUMULATORS * lanes), 0.5, "float32"))
    return 2 * cores * ACCUMULATORS * lanes * FMA_ITERS / seconds / 1e9


def _copy_gbps(target: Target) -> float:
    lanes = target.vector_bits // 32
    rows = COPY_FLOATS // lanes

    @T.prim_func
    def copy(a: T.Buffer((rows, lanes), "float32"), b: T.Buffer((rows, lanes), "float32")):  # type: ignore[valid-type]
        for i in T.parallel(rows):
            for j in T.vectorized(lanes):
                b[i, j] = a[i, j]

    data = np.ones((rows, lanes), "float32")
    return 2 * data.nbytes / _seconds(copy, target, data, np.empty_like(data)) / 1e9
