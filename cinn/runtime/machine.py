"""The machine's limits, measured once and cached: the FMA peak and the memory bandwidth of a CPU target.

The profiler states every kernel's rate as a percent of these, and the host's CpuModel decides by them
(cinn.core.cpu_model: they are its calibration, one file per CPU, which `cinn-calibrate` writes). Both are measured
with TVM kernels built for the target and run on all its cores: a loop of independent register FMAs (12 vector
accumulators, more than the FMA latency times the FMA ports), and a parallel vectorized copy of 256 MiB (read plus
write bytes). On an AVX-512 CPU the calibration also times one core's FMAs at 256 and at 512 bits: the 512-bit ones
complete at twice the rate only on cores with two full-width FMA units; on a CPU with AVX512_BF16 it times one core's
vdpbf16ps in the same loop, whose FLOP rate over the 512-bit FMAs' is the CpuModel's bf16_rate.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import tvm
from tvm.script import tirx as T

from cinn.core import cpu_model
from cinn.core.cpu_model import Calibration, Peak
from cinn.core.target import Target
from cinn.core.utils import atomic_write
from cinn.runtime import thread_pool

ACCUMULATORS = 12
LOOP_ITERS = 1 << 20
COPY_FLOATS = 64 << 20  # 256 MiB: far past any cache
QUICK_SHARE = 16  # a quick calibration's share of the FMA loop and the copy (the copy still past any L2)
REPEAT, QUICK_REPEAT = 5, 3
SHARE_ALL_CORES = -3  # TVM's AffinityMode kSpecifyThreadShareAllCore: each worker may run on any listed CPU
# 512-bit FMAs at this many times the 256-bit rate or more run on full-width units, at this or less on split ones;
# between the two the measurement is noise and the table of known CPUs decides
DOUBLED_RATIO, SPLIT_RATIO = 1.6, 1.25
BF16_HALVES = 0x3C003C00  # a pair of bf16 2**-7: products of 2**-14, summed over the loop without overflow


@dataclass(frozen=True)
class StandIn:
    """How the compiler calls an intrinsic TVM cannot (cinn.compiler.llvm_calls, above this layer): the stand-in
    intrinsic a kernel calls, and what makes a built module's calls of it calls of the wanted one."""

    name: str
    resolve: Callable[[tvm.runtime.Executable], tvm.runtime.Executable]


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
    """The target's peaks on its cores from its calibration, else measured (about a second) and added to it."""
    path = cpu_model.calibration_path(target.mcpu, cache_dir)
    calibration = cpu_model.read_calibration(path, target.mcpu)
    point = next((p for p in calibration.peaks if p.cores == target.num_cores), None) if calibration else None
    if point is None:
        point = measure(target)
        with contextlib.suppress(OSError):  # a read-only cache: measured again next time
            save(path, cpu_model.merged(calibration, Calibration(target.mcpu, (point,))))
    return Peaks(point.flops / 1e9, point.bandwidth / 1e9)


def measure(target: Target, quick: bool = False) -> Peak:
    """The FMA peak and the copy bandwidth of the target's cores."""
    configure_threads(target.num_cores)  # TVM's default pool has one worker here: the peaks of one core
    share = QUICK_SHARE if quick else 1
    repeat = QUICK_REPEAT if quick else REPEAT
    return Peak(target.num_cores, _fma_gflops(target, LOOP_ITERS // share, repeat) * 1e9,
                _copy_gbps(target, COPY_FLOATS // share, repeat) * 1e9)


def calibrate(host: Target, cores: Sequence[int], quick: bool = False,
              progress: Callable[[str], None] = lambda _: None, dpbf16: StandIn | None = None) -> Calibration:
    """The host's calibration: its peaks on each count of `cores`, on an AVX-512 CPU its FMA width, and on one with
    AVX512_BF16 its bf16 rate where `dpbf16` says how kernels call vdpbf16ps."""
    peaks = []
    for n in cores:
        progress(f"FMA peak and memory bandwidth on {n} core{'s' if n > 1 else ''}")
        peaks.append(measure(dataclasses.replace(host, num_cores=n), quick))
    if host.vector_bits < 512:
        return Calibration(host.mcpu, tuple(peaks))
    progress("256- and 512-bit FMAs on one core")
    one = dataclasses.replace(host, num_cores=1)
    configure_threads(1)
    iters, repeat = (LOOP_ITERS // QUICK_SHARE, QUICK_REPEAT) if quick else (LOOP_ITERS, REPEAT)
    half, full = (_fma_gflops(one, iters, repeat, bits) for bits in (256, 512))
    notes = {"fma256_gflops": half, "fma512_gflops": full}
    if dpbf16 is None or not host.model.bf16:
        return Calibration(host.mcpu, tuple(peaks), fma_width(full / half), notes)
    progress("bf16 dot products on one core")
    bf16 = _dpbf16_gflops(one, dpbf16, iters, repeat)
    return Calibration(host.mcpu, tuple(peaks), fma_width(full / half), {**notes, "dpbf16_gflops": bf16}, bf16 / full)


def fma_width(ratio: float) -> int:
    """The bits an FMA unit completes per cycle, from the 512-bit FMA rate over the 256-bit one (0: unclear)."""
    return 512 if ratio >= DOUBLED_RATIO else 256 if ratio <= SPLIT_RATIO else 0


def save(path: pathlib.Path, calibration: Calibration) -> None:
    """Cache a calibration, and forget the host's model read before it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = cpu_model.calibration_json(calibration)
    atomic_write(str(path), lambda tmp: pathlib.Path(tmp).write_text(text))
    cpu_model.host_model.cache_clear()


def _seconds(func, target: Target, repeat: int, *arrays: np.ndarray, stand_in: StandIn | None = None) -> float:
    """The fastest of `repeat` calls of a TVMScript kernel built for the target (its calls of `stand_in` resolved): a
    peak, which other processes on a shared machine only slow down."""
    lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=target.tvm())
    lib = stand_in.resolve(lib) if stand_in is not None else lib
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(a, dev) for a in arrays]
    return min(lib.mod.time_evaluator("main", dev, number=1, repeat=repeat)(*args).results)


def _fma_gflops(target: Target, iters: int = LOOP_ITERS, repeat: int = REPEAT, bits: int = 0) -> float:
    """GFLOP/s of independent FMAs on the target's cores, on vectors of `bits` (default: its widest)."""
    lanes, cores = (bits or target.vector_bits) // 32, target.num_cores
    vector = f"float32x{lanes}"

    @T.prim_func
    def fma(a: T.Buffer((cores, ACCUMULATORS * lanes), "float32")):  # type: ignore[valid-type]
        for c in T.parallel(cores):
            # a buffer of vector elements: each accumulator is one register, not lanes LLVM may scalarize
            acc = T.alloc_buffer((ACCUMULATORS,), vector)
            for j in range(ACCUMULATORS):
                acc[j] = T.Broadcast(a[c, 2], lanes)
            for _ in range(iters):
                for r in T.unroll(ACCUMULATORS):
                    acc[r] = acc[r] * T.Broadcast(a[c, 0], lanes) + T.Broadcast(a[c, 1], lanes)
            for j in range(ACCUMULATORS):
                a[c, T.Ramp(j * lanes, 1, lanes)] = acc[j]

    seconds = _seconds(fma, target, repeat, np.full((cores, ACCUMULATORS * lanes), 0.5, "float32"))
    return 2 * cores * ACCUMULATORS * lanes * iters / seconds / 1e9


def _dpbf16_gflops(target: Target, stand_in: StandIn, iters: int = LOOP_ITERS, repeat: int = REPEAT) -> float:
    """GFLOP/s of independent 512-bit vdpbf16ps on the target's cores: the FMA loop with each FMA a vdpbf16ps (16
    lanes, each a pair of products), called as the bf16 kernels call it."""
    lanes, cores = target.vector_bits // 32, target.num_cores  # an AVX-512 target: vdpbf16ps.512's 16 lanes
    vector = f"float32x{lanes}"

    @T.prim_func
    def dot(a: T.Buffer((cores, ACCUMULATORS * lanes), "float32"), b: T.Buffer((cores, 2), "uint32")):  # type: ignore[valid-type]
        for c in T.parallel(cores):
            acc = T.alloc_buffer((ACCUMULATORS,), vector)
            for j in range(ACCUMULATORS):
                acc[j] = T.Broadcast(a[c, 0], lanes)
            for _ in range(iters):
                for r in T.unroll(ACCUMULATORS):
                    acc[r] = T.reinterpret(T.call_llvm_pure_intrin(
                        T.llvm_lookup_intrinsic_id(stand_in.name), T.reinterpret(acc[r], dtype=f"int32x{lanes}"),
                        T.reinterpret(T.Broadcast(b[c, 0], lanes), dtype=f"int16x{2 * lanes}"),
                        T.reinterpret(T.Broadcast(b[c, 1], lanes), dtype=f"int16x{2 * lanes}"),
                        dtype=f"int32x{lanes}"), dtype=vector)
            for j in range(ACCUMULATORS):
                a[c, T.Ramp(j * lanes, 1, lanes)] = acc[j]

    pairs = np.full((cores, 2), BF16_HALVES, "uint32")  # tiny bf16 pairs: the sums stay finite and normal
    seconds = _seconds(dot, target, repeat, np.zeros((cores, ACCUMULATORS * lanes), "float32"), pairs,
                       stand_in=stand_in)
    return 2 * 2 * cores * ACCUMULATORS * lanes * iters / seconds / 1e9


def _copy_gbps(target: Target, floats: int = COPY_FLOATS, repeat: int = REPEAT) -> float:
    """GB/s (read plus written) of a parallel copy of `floats` float32 on the target's cores."""
    lanes = target.vector_bits // 32
    rows = floats // lanes

    @T.prim_func
    def copy(a: T.Buffer((rows, lanes), "float32"), b: T.Buffer((rows, lanes), "float32")):  # type: ignore[valid-type]
        for i in T.parallel(rows):
            for j in T.vectorized(lanes):
                b[i, j] = a[i, j]

    data = np.ones((rows, lanes), "float32")
    return 2 * data.nbytes / _seconds(copy, target, repeat, data, np.empty_like(data)) / 1e9
