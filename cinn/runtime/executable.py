"""The runtime: an Executable runs a sequence of kernels over buffers planned by liveness."""
from __future__ import annotations

import enum
import functools
import hashlib
import math
import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np
import tvm
import tvm_ffi

from cinn.core.ir import Program, Value
from cinn.core.utils import median_seconds, wall_seconds
from cinn.core.views import View, resolve
from cinn.runtime.cuda_module import NO_DEVICE
from cinn.runtime.machine import Peaks, configure_threads

ALIGNMENT = 64  # of the arrays cinn allocates (outputs, workspace): a cache line, a full AVX-512 vector

@dataclass(frozen=True)
class Kernel:
    """One compiled group: its entry function and the values bound to its parameters."""

    name: str
    func: Callable[..., Any]  # tvm PackedFunc
    module: object  # keeps the library loaded
    params: tuple[Value, ...]
    source: str
    flops: int = 0  # its arithmetic, for the profiler's rates
    workload: str = ""  # its PrimFunc's structural hash, as the schedule log names it
    sizes: tuple[int, ...] = ()  # a symbolic kernel's trailing int arguments: its symbols' sizes in this executable
    nbytes: int = 0  # what it must read and write at least once (Group.traffic), for the profiler's rates


def plan_buffers(program: Program, kernels_params: Sequence[Sequence[Value]],
                 views: Mapping[str, View] = MappingProxyType({})) -> tuple[dict[str, int], list[int]]:
    """Assign every value a storage slot, a byte buffer viewed with the value's shape and dtype; intermediates whose
    lifetimes do not overlap share one. Returns the value -> slot map and each slot's size in bytes.

    A value takes the most recently freed slot that is large enough, else the most recently freed one (grown to fit):
    a kernel then writes into memory a kernel just read, still in cache, instead of a buffer of its own size that
    was last touched many kernels ago (mobilenet_v2's activations come in a dozen sizes). A value stored in another's
    buffer (`views`: an in-place concat's parts, an in-place slice) takes that buffer's slot, which lives from the first kernel that
    touches any value stored in it to the last.
    """
    root = {v.name: resolve(views, v.name).base for params in kernels_params for v in params}
    nbytes = {v.name: v.type.nbytes for n in program.nodes for v in n.outputs}
    last_use: dict[str, int] = {}
    for i, params in enumerate(kernels_params):
        for v in params:
            last_use[root[v.name]] = i
    pinned = {v.name for v in program.inputs} | set(program.constants) | {v.name for v in program.outputs}
    slot_of: dict[str, int] = {}
    slot_bytes: list[int] = []
    free: list[int] = []  # freed slots, the most recent last
    for v in list(program.inputs) + list(program.const_values):
        slot_of[v.name] = len(slot_bytes)
        slot_bytes.append(v.type.nbytes)
    for i, params in enumerate(kernels_params):
        for v in params:
            base = root[v.name]
            if base not in slot_of:
                size = nbytes.get(base, v.type.nbytes)
                if free and base not in pinned:
                    slot = next((s for s in reversed(free) if slot_bytes[s] >= size), free[-1])
                    free.remove(slot)
                    slot_bytes[slot] = max(slot_bytes[slot], size)
                    slot_of[base] = slot
                else:
                    slot_of[base] = len(slot_bytes)
                    slot_bytes.append(size)
            slot_of[v.name] = slot_of[base]
        for base in dict.fromkeys(root[v.name] for v in params):
            if last_use[base] == i and base not in pinned:
                free.append(slot_of[base])
    return slot_of, slot_bytes


class OutputKind(enum.Enum):
    """Where a program output comes from."""

    KERNEL = "kernel"  # written by a kernel, straight into the array run() returns
    INPUT = "input"  # an input passed through: a copy of the feed
    CONSTANT = "constant"  # a folded constant: a copy of it
    REPEAT = "repeat"  # listed before among the outputs: a copy of that one, so no two outputs alias


@dataclass(frozen=True)
class OutputSource:
    """One program output: its kind, and the index of the input or earlier output, or the constant's name."""

    kind: OutputKind
    index: int = -1
    constant: str = ""


@dataclass(frozen=True)
class Workspace:
    """One run's buffers: input slots (for feeds that must be copied) and each kernel's argument list, bound per run to
    that run's feeds and outputs. Used by one run at a time."""

    inputs: tuple[tvm.runtime.Tensor, ...]
    input_arrays: tuple[np.ndarray, ...]  # the same memory, for numpy to convert feeds into (CPU only)
    args: tuple[list[tvm.runtime.Tensor | int | None], ...]  # None: bound per run; ints: a symbolic kernel's sizes
    outputs: tuple[tvm.runtime.Tensor | None, ...]  # on a GPU, where kernels write the outputs (None: not a kernel's)


@dataclass(frozen=True)
class PassTime:
    """The compile's time in one run of a graph pass (cinn.compiler.passes.manager names the passes)."""

    name: str
    seconds: float


@dataclass(frozen=True)
class KernelTime:
    """One kernel's median time inside a run, and alone (repeated with warm caches)."""

    name: str
    in_run_ms: float
    alone_ms: float
    flops: int = 0
    nbytes: int = 0

    @property
    def gflops(self) -> float:
        """Its arithmetic rate inside a run."""
        return self.flops / max(self.in_run_ms, 1e-12) / 1e6

    @property
    def gbps(self) -> float:
        """The rate at which it moves its parameters' bytes inside a run."""
        return self.nbytes / max(self.in_run_ms, 1e-12) / 1e6


@dataclass(frozen=True)
class Profile:
    """Where a run's time goes: each kernel, and the whole run end to end; with the machine's peaks, each kernel's
    rates as a percent of them."""

    kernels: tuple[KernelTime, ...]
    run_ms: float
    peaks: Peaks | None = None

    @property
    def kernel_sum_ms(self) -> float:
        """The kernels' times inside a run, summed."""
        return sum(k.in_run_ms for k in self.kernels)

    @property
    def alone_sum_ms(self) -> float:
        """The kernels' times alone, summed (what TVM's time_evaluator reports)."""
        return sum(k.alone_ms for k in self.kernels)

    def table(self) -> str:
        """A text report, slowest kernel first: times, share of the run, GFLOP/s, GB/s and (with peaks) the percent
        of the FMA peak or of the memory bandwidth, whichever is nearer (the bound the kernel is closest to)."""
        rows = [] if self.peaks is None else [f"machine: FMA peak {self.peaks.gflops:.0f} GFLOP/s, memory "
                                              f"{self.peaks.gbps:.1f} GB/s (measured, all cores)"]
        rows.append(f"{'kernel':<48} {'in run ms':>10} {'alone ms':>10} {'share':>6} {'GFLOP/s':>8} {'GB/s':>7}"
                    + ("" if self.peaks is None else f" {'peak':>10}"))
        for k in sorted(self.kernels, key=lambda k: -k.in_run_ms):
            rows.append(f"{k.name[:48]:<48} {k.in_run_ms:>10.4f} {k.alone_ms:>10.4f} {k.in_run_ms / self.run_ms:>6.1%} "
                        f"{k.gflops:>8.1f} {k.gbps:>7.1f}" + ("" if self.peaks is None else f" {self._nearer_peak(k):>10}"))
        rows += self._by_name()
        rows.append(f"run {self.run_ms:.4f} ms = kernels {self.kernel_sum_ms:.4f} ms (alone {self.alone_sum_ms:.4f}) "
                    f"x {self.run_ms / max(self.kernel_sum_ms, 1e-12):.3f}; outside the kernels "
                    f"{self.run_ms - self.kernel_sum_ms:.4f} ms")
        return "\n".join(rows)

    def _by_name(self) -> list[str]:
        """The kernels grouped by name (a fused group's ops: "fused_conv2d_add_relu"), most time first: their count,
        time inside a run, share of it and (with peaks) their time-weighted percent of the FMA peak and of the memory
        bandwidth: where a model's time goes by kind of kernel."""
        groups: dict[str, list[KernelTime]] = {}
        for k in self.kernels:
            groups.setdefault(k.name, []).append(k)
        rows = ["by name: kernels, in run ms, share" + ("" if self.peaks is None else ", time-weighted % of peaks")]
        # each name's kernels as one: the rate of their summed work is their time-weighted mean rate
        summed = [KernelTime(name, sum(k.in_run_ms for k in ks), sum(k.alone_ms for k in ks),
                             sum(k.flops for k in ks), sum(k.nbytes for k in ks)) for name, ks in groups.items()]
        for s in sorted(summed, key=lambda s: -s.in_run_ms):
            row = f"  {s.name[:46]:<46} x{len(groups[s.name]):<4} {s.in_run_ms:>10.4f} {s.in_run_ms / self.run_ms:>6.1%}"
            if self.peaks is not None:
                row += f" {s.gflops / self.peaks.gflops:>5.0%} FMA {s.gbps / self.peaks.gbps:>5.0%} mem"
            rows.append(row)
        return rows

    def _nearer_peak(self, k: KernelTime) -> str:
        """The percent of the nearer peak and which one: '62% FMA' or '80% mem'."""
        assert self.peaks is not None
        fma, mem = k.gflops / self.peaks.gflops, k.gbps / self.peaks.gbps
        return f"{fma:.0%} FMA" if fma >= mem else f"{mem:.0%} mem"


class ConstantPool:
    """Device copies of constants shared by several executables (a symbolic program's bindings): arrays with the same
    bytes, dtype and shape are uploaded once."""

    def __init__(self):
        self._tensors: dict[tuple, tvm.runtime.Tensor] = {}
        # an array uploaded before, by identity (the array is held, so its id is not reused): the symbolic kernels'
        # executables upload the same arrays for every binding, and hashing a model's weights is slow
        # (see docs/notes/runtime-overheads.md)
        self._seen: dict[tuple, tuple[np.ndarray, tvm.runtime.Tensor]] = {}
        self._lock = threading.Lock()

    def upload(self, array: np.ndarray, nbytes: int, device) -> tvm.runtime.Tensor:
        """A byte buffer of `nbytes` on the device holding the array (an earlier one with the same content)."""
        seen = (id(array), str(device), nbytes)
        with self._lock:
            if seen in self._seen:
                return self._seen[seen][1]
        key = (str(device), array.dtype.str, array.shape, nbytes, hashlib.blake2b(array.data, digest_size=16).digest())
        with self._lock:
            if key not in self._tensors:
                self._tensors[key] = _uploaded(array, nbytes, device)
            self._seen[seen] = (array, self._tensors[key])
            return self._tensors[key]


def _uploaded(array: np.ndarray, nbytes: int, device) -> tvm.runtime.Tensor:
    slot = tvm.runtime.empty((nbytes,), "uint8", device)
    slot._create_view(array.shape, str(array.dtype)).copyfrom(array)
    return slot


class Executable:
    """A compiled program: call run(feeds) to execute its kernels in order, from any number of threads at once."""

    def __init__(self, program: Program, kernels: Sequence[Kernel], device, threads: int | None = None,
                 views: Mapping[str, View] = MappingProxyType({}), constants: ConstantPool | None = None,
                 pass_times: Sequence[PassTime] = ()):
        self.program = program
        self.pass_times = tuple(pass_times)  # the passes of its compile, in order (none: from the compile cache)
        self._kernels = list(kernels)
        self._funcs = [k.func for k in kernels]
        self._threads = threads
        self._slot_of, self._slot_bytes = plan_buffers(program, [k.params for k in kernels], views)
        self._offset = {name: resolve(views, name).offset for name in views}  # bytes into the slot
        self._outputs = _output_sources(program, kernels)
        produced = {v.name for v, o in zip(program.outputs, self._outputs, strict=True) if o.kind is OutputKind.KERNEL}
        # on the CPU, outputs are written into the arrays run() returns and feeds read in place: neither is workspace;
        # a GPU's kernels read and write device buffers of the workspace, copied from and to the host
        self._host = _is_host(device)
        self._per_run = {v.name for v in program.inputs} | produced if self._host else set()
        self._const_slots = {self._slot_of[name] for name in program.constants}
        # outputs are pinned: these slots hold nothing else
        self._output_slots = {self._slot_of[n] for n in produced} if self._host else set()
        self.constant_bytes = sum(self._slot_bytes[i] for i in self._const_slots)
        self.workspace_bytes = sum(n for i, n in enumerate(self._slot_bytes)
                                   if i not in self._const_slots and i not in self._output_slots)
        self.peak_bytes = self.workspace_bytes + self.constant_bytes  # one run's buffers and the shared constants
        self._inputs_at = _positions(kernels, [v.name for v in program.inputs])
        self._input_types = {v.name: (v.shape, np.dtype(v.dtype)) for v in program.inputs}
        self._output_types = [(v.shape, np.dtype(v.dtype)) for v in program.outputs]
        self._passed_through = any(o.kind is not OutputKind.KERNEL for o in self._outputs)
        # only the outputs kernels write are bound ("" is no value's name); the others are copied after the run
        self._outputs_at = _positions(kernels, [v.name if o.kind is OutputKind.KERNEL else ""
                                                for v, o in zip(program.outputs, self._outputs, strict=True)])
        self._device_missing = not device.exist
        if self._device_missing:  # CUDA kernels built without a GPU: sources and counts only, run() raises
            return
        self._device = device
        self._constants = {}
        for v in program.const_values:
            i, array = self._slot_of[v.name], np.asarray(program.constants[v.name], order="C")
            self._constants[i] = (constants.upload(array, self._slot_bytes[i], device) if constants is not None
                                  else _uploaded(array, self._slot_bytes[i], device))
        # the buffers hold the constants now: the host arrays go (BERT-base: 415 MB), but for outputs that are constants
        kept = {o.constant for o in self._outputs if o.kind is OutputKind.CONSTANT}
        self.program = program.replace(constants={k: a for k, a in program.constants.items() if k in kept})
        # workspaces are pooled, not locked: each concurrent run takes its own; the constants are shared by all
        self._pool: queue.SimpleQueue[Workspace] = queue.SimpleQueue()
        self._pool.put(self._new_workspace())

    def _view(self, storage: Mapping[int, tvm.runtime.Tensor], v: Value) -> tvm.runtime.Tensor:
        slot, at = storage[self._slot_of[v.name]], self._offset.get(v.name, 0)
        if not at:
            return slot._create_view(v.shape, v.dtype)
        # a view at an offset (host memory): its own data pointer, since kernels take no byte offset
        return _tensor(np.from_dlpack(slot)[at : at + v.type.nbytes].view(v.dtype).reshape(v.shape))

    def _new_workspace(self) -> Workspace:
        storage = dict(self._constants)
        for i, nbytes in enumerate(self._slot_bytes):
            if i not in storage and i not in self._output_slots:
                storage[i] = tvm.runtime.empty((nbytes,), "uint8", self._device)
        inputs = tuple(self._view(storage, v) for v in self.program.inputs)
        # the feeds' and outputs' positions start empty (None): each run binds its own arrays there
        args = tuple([*(self._view(storage, v) if v.name not in self._per_run else None for v in k.params), *k.sizes]
                     for k in self._kernels)
        if self._host:
            return Workspace(inputs, tuple(np.from_dlpack(t) for t in inputs), args, ())
        outputs = tuple(self._view(storage, v) if o.kind is OutputKind.KERNEL else None
                        for v, o in zip(self.program.outputs, self._outputs, strict=True))
        return Workspace(inputs, (), args, outputs)

    @property
    def num_kernels(self) -> int:
        """Kernels launched per run."""
        return len(self._kernels)

    @property
    def kernel_names(self) -> tuple[str, ...]:
        """Each kernel's name (its fused group's), in launch order."""
        return tuple(k.name for k in self._kernels)

    @property
    def kernel_workloads(self) -> tuple[str, ...]:
        """Each kernel's workload key (the schedule log's name for it), in launch order."""
        return tuple(k.workload for k in self._kernels)

    def kernel_sources(self) -> list[str]:
        """Each kernel's source: the scheduled TIR on CPU, CUDA C on GPU."""
        return [k.source for k in self._kernels]

    def run(self, feeds: Mapping[str, np.ndarray], out: Sequence[np.ndarray] | None = None) -> list[np.ndarray]:
        """Execute with named input arrays; returns the outputs in program order: fresh arrays, or the caller's `out`
        arrays written in place. Feeds that are C-contiguous and of the input's dtype are read in place, others
        converted once; kernels write straight into the result arrays."""
        if self._device_missing:
            raise RuntimeError(NO_DEVICE)
        arrays = self._check_feeds(feeds)
        results = self._fresh_outputs() if out is None else self._check_out(out, arrays)
        # `out` arrays kernels cannot write in place (not element-aligned) get an aligned stand-in, copied afterwards
        written = results if out is None else [
            r if o.kind is not OutputKind.KERNEL or _in_place(r) else aligned_empty(r.shape, r.dtype)
            for r, o in zip(results, self._outputs, strict=True)]
        ws = self._acquire(arrays, written)
        try:
            for func, args in zip(self._funcs, ws.args, strict=True):
                func(*args)
            if not self._host:
                _download(ws, written)
        finally:
            self._pool.put(ws)
        if written is not results:
            for r, w in zip(results, written, strict=True):
                if w is not r:
                    np.copyto(r, w)
        if self._passed_through:
            self._fill_passed_through(arrays, results)
        return results

    def profile(self, feeds: Mapping[str, np.ndarray], repeat: int = 20, peaks: Peaks | None = None) -> Profile:
        """Time whole runs and each kernel inside runs, in alternating rounds (a change of the machine's load then hits
        both alike: the time outside the kernels is their difference), then each kernel alone; medians of `repeat`
        each. With the machine's peaks (cinn.runtime.machine.machine_peaks), the report states each kernel's percent of them."""
        run = wall_seconds(lambda: self.run(feeds))
        run()  # untimed: the first run after compiling warms the caches and the thread pool
        samples = [(run(), self._kernel_samples(feeds)) for _ in range(repeat)]
        in_run = np.median([kernels for _, kernels in samples], axis=0).tolist()
        run_s = float(np.median([whole for whole, _ in samples]))
        alone = self._alone_seconds(feeds, repeat)
        kernels = tuple(KernelTime(k.name, t * 1e3, a * 1e3, k.flops, k.nbytes)
                        for k, t, a in zip(self._kernels, in_run, alone, strict=True))
        return Profile(kernels, run_s * 1e3, peaks)

    def kernel_times(self, feeds: Mapping[str, np.ndarray], repeat: int = 20) -> list[float]:
        """Each kernel's median seconds inside `repeat` runs (profile's "in run" times, without the rest)."""
        return np.median([self._kernel_samples(feeds) for _ in range(repeat)], axis=0).tolist()

    def _kernel_samples(self, feeds: Mapping[str, np.ndarray]) -> list[float]:
        """One run's kernels, each timed: their seconds."""
        return self._timed_calls(feeds, lambda calls: [wall_seconds(call)() for call in calls])

    def _alone_seconds(self, feeds: Mapping[str, np.ndarray], repeat: int) -> list[float]:
        """Each kernel's median seconds repeated alone (warm caches: what TVM's time_evaluator reports)."""
        return self._timed_calls(feeds, lambda calls: [median_seconds(call, repeat, 1) for call in calls])

    def _timed_calls(self, feeds: Mapping[str, np.ndarray], measure: Callable[[list[Callable[[], None]]], list]) -> list:
        """`measure` applied to the kernels' calls, bound to a workspace of the feeds for the time it takes."""
        if self._device_missing:
            raise RuntimeError(NO_DEVICE)
        ws = self._acquire(self._check_feeds(feeds), self._fresh_outputs())
        try:
            # a GPU runs kernels asynchronously: each timed call waits for its kernel
            sync = (lambda: None) if self._host else self._device.sync
            return measure([functools.partial(_call, f, a, sync) for f, a in zip(self._funcs, ws.args, strict=True)])
        finally:
            self._pool.put(ws)

    def _acquire(self, arrays: Sequence[np.ndarray], written: Sequence[np.ndarray]) -> Workspace:
        """A workspace for this thread's run, bound to its feeds and outputs; the caller puts it back in the pool."""
        self._ensure_threads()
        try:
            ws = self._pool.get_nowait()
        except queue.Empty:  # every workspace is in use by another run: this one gets its own, pooled afterwards
            ws = self._new_workspace()
        self._bind(ws, arrays, written)
        return ws

    def _ensure_threads(self) -> None:
        """TVM's CPU thread pool belongs to the calling thread: size this thread's on its first run."""
        if self._threads is not None and getattr(_THREAD_STATE, "threads", None) != self._threads:
            configure_threads(self._threads)
            _THREAD_STATE.threads = self._threads

    def _bind(self, ws: Workspace, arrays: Sequence[np.ndarray], written: Sequence[np.ndarray]) -> None:
        """Point each kernel's arguments at this run's feeds (in place, or copied into the workspace) and outputs."""
        if not self._host:  # a GPU's kernels read the workspace's device buffers
            for view, array, at in zip(ws.inputs, arrays, self._inputs_at, strict=True):
                if at:
                    view.copyfrom(np.asarray(array, dtype=str(view.dtype), order="C"))
            return
        for j, (array, at) in enumerate(zip(arrays, self._inputs_at, strict=True)):
            if at:
                in_place = _in_place(array) and array.dtype == ws.input_arrays[j].dtype
                bound = _tensor(array) if in_place else _copied(ws.inputs[j], ws.input_arrays[j], array)
                for k, pos in at:
                    ws.args[k][pos] = bound
        for array, at in zip(written, self._outputs_at, strict=True):
            if at:
                tensor = _tensor(array)
                for k, pos in at:
                    ws.args[k][pos] = tensor

    def _fresh_outputs(self) -> list[np.ndarray]:
        return [aligned_empty(shape, dtype) for shape, dtype in self._output_types]

    def _fill_passed_through(self, arrays: Sequence[np.ndarray], results: list[np.ndarray]) -> None:
        """The outputs no kernel writes: copies of feeds, constants and repeated outputs."""
        for result, o in zip(results, self._outputs, strict=True):
            if o.kind is OutputKind.INPUT:
                np.copyto(result, arrays[o.index], casting="unsafe")  # the feed's kind and range were checked
            elif o.kind is OutputKind.CONSTANT:
                np.copyto(result, self.program.constants[o.constant])
            elif o.kind is OutputKind.REPEAT:
                np.copyto(result, results[o.index])

    def _check_feeds(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """The feeds as arrays in program input order; clear errors for anything that does not fit its input."""
        if not isinstance(feeds, Mapping):
            raise TypeError(f"run: feeds must be a mapping of input name -> array, got a {type(feeds).__name__}; "
                            f"inputs are {[v.name for v in self.program.inputs]}")
        expected = self._input_types
        if len(feeds) != len(expected) or not all(n in feeds for n in expected):
            missing = [n for n in expected if n not in feeds]
            extra = [n for n in feeds if n not in expected]
            raise ValueError(f"run: missing inputs {missing}, unexpected inputs {extra}; expected {list(expected)}")
        return [_feed_array(name, feeds[name], *t) for name, t in expected.items()]

    def _check_out(self, out: Sequence[np.ndarray], arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The caller's output arrays, checked: one per output, exact shape and dtype, writable, C-contiguous, and not
        sharing memory with a feed or with each other (a kernel would read what another wrote)."""
        outputs = self.program.outputs
        if isinstance(out, np.ndarray) or not isinstance(out, Sequence) or len(out) != len(outputs):
            raise TypeError(f"run: out must be a list of {len(outputs)} arrays, one per output "
                            f"{[v.name for v in outputs]}")
        for i, (array, v) in enumerate(zip(out, outputs, strict=True)):
            if not isinstance(array, np.ndarray):
                raise TypeError(f"run: out[{i}] (output {v.name!r}) must be a numpy array, got a {type(array).__name__}")
            if array.shape != v.shape or array.dtype != np.dtype(v.dtype):
                raise ValueError(f"run: out[{i}] (output {v.name!r}) is {array.dtype}{list(array.shape)}, "
                                 f"expected {v.dtype}{list(v.shape)}")
            if not array.flags.c_contiguous or not array.flags.writeable:
                raise ValueError(f"run: out[{i}] (output {v.name!r}) must be C-contiguous and writable")
            others = [*arrays, *out[:i]]
            if any(np.may_share_memory(array, other) for other in others):
                raise ValueError(f"run: out[{i}] (output {v.name!r}) shares memory with a feed or another out array")
        return list(out)


_THREAD_STATE = threading.local()


def _call(func: Callable[..., Any], args: Sequence, sync: Callable[[], object]) -> None:
    func(*args)
    sync()


def _download(ws: Workspace, written: Sequence[np.ndarray]) -> None:
    """A GPU's outputs, from the workspace's device buffers into the arrays run() returns."""
    for array, device_output in zip(written, ws.outputs, strict=True):
        if device_output is not None:
            np.copyto(array, device_output.numpy())


def _is_host(device) -> bool:
    """Whether kernels on `device` read host memory (numpy arrays) directly."""
    return device.dlpack_device_type() == tvm.cpu(0).dlpack_device_type()


def aligned_empty(shape: Sequence[int], dtype) -> np.ndarray:
    """An uninitialized C-contiguous array whose data is 64-byte aligned (numpy aligns to 16 bytes only): vectors
    of a kernel's rows then never straddle cache lines."""
    dtype = np.dtype(dtype)
    raw = np.empty(math.prod(shape) * dtype.itemsize + ALIGNMENT, np.uint8)
    # the address through DLPack: numpy's own (.ctypes.data) is slow next to a small model's run
    # (see docs/notes/runtime-overheads.md)
    return np.ndarray(shape, dtype, raw, -_tensor(raw).data_ptr() % ALIGNMENT)


def _in_place(array: np.ndarray) -> bool:
    """Whether CPU kernels take the array as it is: C-contiguous, its data aligned to its element (build.py declares
    kernel parameters element-aligned), writable (numpy exports no read-only array through the DLPack version TVM
    asks for)."""
    flags = array.flags
    return flags.c_contiguous and flags.aligned and flags.writeable


def _tensor(array: np.ndarray) -> tvm.runtime.Tensor:
    """A TVM tensor over the array's memory, no copy (tvm.runtime.from_dlpack would insist on 64-byte alignment)."""
    return tvm_ffi.from_dlpack(array, require_contiguous=True)


def _copied(view: tvm.runtime.Tensor, view_array: np.ndarray, array: np.ndarray) -> tvm.runtime.Tensor:
    """The feed converted (dtype, layout, alignment) in one copy into the workspace's buffer for it."""
    np.copyto(view_array, array, casting="unsafe")  # the kind and the range were checked
    return view


def _positions(kernels: Sequence[Kernel], names: Sequence[str]) -> list[tuple[tuple[int, int], ...]]:
    """For each name, the (kernel, argument position) pairs where it is passed."""
    at: dict[str, list[tuple[int, int]]] = {n: [] for n in names}
    for k, kernel in enumerate(kernels):
        for pos, v in enumerate(kernel.params):
            if v.name in at:
                at[v.name].append((k, pos))
    return [tuple(at[n]) for n in names]


def _output_sources(program: Program, kernels: Sequence[Kernel]) -> tuple[OutputSource, ...]:
    """Where each output comes from; a value listed twice is written once and copied for the second listing."""
    inputs = {v.name: j for j, v in enumerate(program.inputs)}
    written = {v.name for k in kernels for v in k.params} - set(inputs) - set(program.constants)
    first: dict[str, int] = {}
    sources = []
    for i, v in enumerate(program.outputs):
        if v.name in first:
            sources.append(OutputSource(OutputKind.REPEAT, first[v.name]))
        elif v.name in inputs:
            sources.append(OutputSource(OutputKind.INPUT, inputs[v.name]))
        elif v.name in program.constants:
            sources.append(OutputSource(OutputKind.CONSTANT, constant=v.name))
        else:
            assert v.name in written, f"output {v.name} is written by no kernel"
            sources.append(OutputSource(OutputKind.KERNEL))
        first.setdefault(v.name, i)
    return tuple(sources)


def feed_as_array(name: str, feed, expected: str) -> np.ndarray:
    """A feed as an array of numbers (an array passes as it is); None, a ragged nested sequence and what numpy keeps
    only as Python objects (an integer over 64 bits) are refused naming the input. `expected`: what the input takes
    ("float32 of shape (2, 2)")."""
    if feed is None:
        raise TypeError(f"run: input {name!r} is None; expected {expected}")
    try:
        arr = np.asarray(feed)
    except ValueError as e:  # rows of different lengths
        raise ValueError(f"run: input {name!r} cannot be read as one array ({e}); expected {expected}") from None
    if arr.dtype == object:
        bad = [v for v in arr.flat if np.asarray(v).dtype == object][:1]
        if not bad:  # numbers in an array made with dtype=object
            raise TypeError(f"run: input {name!r} is an array of Python objects (dtype object); expected {expected}")
        why = "an integer that does not fit 64 bits" if isinstance(bad[0], int) else "which is not a number"
        raise TypeError(f"run: input {name!r} holds {bad[0]!r}, {why}; expected {expected}")
    return arr


def _feed_array(name: str, feed, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """One feed checked against its input: float64 for float32 is accepted (numpy's default), as are integers of any
    signedness that fit (a list fed to a uint8 input is int64); a change of kind and integers that do not fit are
    errors."""
    arr = feed_as_array(name, feed, f"{dtype} of shape {shape}")
    if arr.shape != shape:
        raise ValueError(f"run: input {name!r} has shape {tuple(arr.shape)}, expected {shape}")
    if arr.dtype != dtype:
        if arr.dtype.kind != dtype.kind and not (arr.dtype.kind in "iu" and dtype.kind in "iu"):
            raise TypeError(f"run: input {name!r} has dtype {arr.dtype}, expected {dtype}")
        _check_narrowing(name, arr, dtype)
    return arr  # converted, where it must be, by the one copy into the workspace


def _check_narrowing(name: str, arr: np.ndarray, dtype: np.dtype) -> None:
    """Integers converted to a narrower input type must fit: 2**40 fed as int32 would silently become 0."""
    if arr.dtype.kind not in "iu" or np.can_cast(arr.dtype, dtype) or not arr.size:
        return
    info = np.iinfo(dtype)
    lo, hi = int(arr.min()), int(arr.max())
    if lo < info.min or hi > info.max:
        raise ValueError(f"run: input {name!r} holds {hi if hi > info.max else lo}, which does not fit its dtype "
                         f"{dtype} [{info.min}, {info.max}]")
