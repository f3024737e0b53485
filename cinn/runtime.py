"""The runtime: an Executable runs a sequence of kernels over buffers planned by liveness."""
from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tvm

from cinn.cuda_module import NO_DEVICE
from cinn.ir import Program, TensorType, Value

SHARE_ALL_CORES = -3  # TVM's AffinityMode kSpecifyThreadShareAllCore: each worker may run on any listed CPU


def configure_threads(n: int, config: Callable | None = None) -> None:
    """Give TVM's CPU thread pool n workers. Asked for n threads alone, TVM keeps one worker on machines whose
    cores it cannot rank (these VMs), so this process's CPUs are listed explicitly. `config` is the
    runtime.config_threadpool function to call (default: this process's)."""
    config = config or tvm.get_global_func("runtime.config_threadpool")
    config(SHARE_ALL_CORES, n, [str(c) for c in sorted(os.sched_getaffinity(0))[:n]])


@dataclass(frozen=True)
class Kernel:
    """One compiled group: its entry function and the values bound to its parameters."""

    name: str
    func: Callable[..., Any]  # tvm PackedFunc
    module: object  # keeps the library loaded
    params: tuple[Value, ...]
    source: str


def plan_buffers(program: Program, kernels_params: Sequence[Sequence[Value]]) -> tuple[dict[str, int], list[TensorType]]:
    """Assign every value a storage slot; intermediates whose lifetimes do not overlap share one.

    Returns the value -> slot map and each slot's type. Slots are shared only between values of
    the same byte size, so a slot is a byte buffer viewed with each value's shape and dtype.
    """
    last_use: dict[str, int] = {}
    for i, params in enumerate(kernels_params):
        for v in params:
            last_use[v.name] = i
    pinned = {v.name for v in program.inputs} | set(program.constants) | {v.name for v in program.outputs}
    slot_of: dict[str, int] = {}
    slot_types: list[TensorType] = []
    free: dict[int, list[int]] = {}  # nbytes -> free slots
    for v in list(program.inputs) + list(program.const_values):
        slot_of[v.name] = len(slot_types)
        slot_types.append(v.type)
    for i, params in enumerate(kernels_params):
        for v in params:
            if v.name in slot_of:
                continue
            pool = free.get(v.type.nbytes) if v.name not in pinned else None
            if pool:
                slot_of[v.name] = pool.pop()
            else:
                slot_of[v.name] = len(slot_types)
                slot_types.append(v.type)
        for v in dict.fromkeys(params):
            if last_use[v.name] == i and v.name not in pinned:
                free.setdefault(v.type.nbytes, []).append(slot_of[v.name])
    return slot_of, slot_types


class Executable:
    """A compiled program: call run(feeds) to execute its kernels in order."""

    def __init__(self, program: Program, kernels: Sequence[Kernel], device):
        self.program = program
        self._kernels = list(kernels)
        slot_of, slot_types = plan_buffers(program, [k.params for k in kernels])
        self.peak_bytes = sum(t.nbytes for t in slot_types)
        self._device_missing = not device.exist
        if self._device_missing:  # CUDA kernels built without a GPU: sources and counts only, run() raises
            return
        storage = [tvm.runtime.empty((t.nbytes,), "uint8", device) for t in slot_types]
        values = list(program.inputs) + list(program.const_values) + [v for k in kernels for v in k.params]
        self._views = {v.name: storage[slot_of[v.name]]._create_view(v.shape, v.dtype) for v in values}
        for name, array in program.constants.items():
            self._views[name].copyfrom(np.asarray(array, order="C"))
        self._args = [[self._views[v.name] for v in k.params] for k in self._kernels]

    @property
    def num_kernels(self) -> int:
        """Kernels launched per run."""
        return len(self._kernels)

    def kernel_sources(self) -> list[str]:
        """Each kernel's source: the scheduled TIR on CPU, CUDA C on GPU."""
        return [k.source for k in self._kernels]

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """Execute with named input arrays; returns the outputs in program order."""
        if self._device_missing:
            raise RuntimeError(NO_DEVICE)
        self._check_feeds(feeds)
        for v in self.program.inputs:
            self._views[v.name].copyfrom(np.asarray(feeds[v.name], dtype=v.dtype, order="C"))
        for kernel, args in zip(self._kernels, self._args, strict=True):
            kernel.func(*args)
        return [self._views[v.name].numpy() for v in self.program.outputs]

    def _check_feeds(self, feeds: Mapping[str, np.ndarray]) -> None:
        if not isinstance(feeds, Mapping):
            raise TypeError(f"run: feeds must be a mapping of input name -> array, got a {type(feeds).__name__}; "
                            f"inputs are {[v.name for v in self.program.inputs]}")
        expected = {v.name: v for v in self.program.inputs}
        missing = [n for n in expected if n not in feeds]
        extra = [n for n in feeds if n not in expected]
        if missing or extra:
            raise ValueError(f"run: missing inputs {missing}, unexpected inputs {extra}; expected {list(expected)}")
        for name, v in expected.items():
            arr = np.asarray(feeds[name])
            if tuple(arr.shape) != v.shape:
                raise ValueError(f"run: input {name!r} has shape {tuple(arr.shape)}, expected {v.shape}")
            if arr.dtype.kind != np.dtype(v.dtype).kind:
                # float64 -> float32 is converted (numpy's default), a change of kind is a bug
                raise TypeError(f"run: input {name!r} has dtype {arr.dtype}, expected {v.dtype}")
            _check_narrowing(name, arr, v.dtype)


def _check_narrowing(name: str, arr: np.ndarray, dtype: str) -> None:
    """Integers converted to a narrower input type must fit: 2**40 fed as int32 would silently become 0."""
    if arr.dtype.kind not in "iu" or arr.dtype == np.dtype(dtype) or not arr.size:
        return
    info = np.iinfo(dtype)
    lo, hi = int(arr.min()), int(arr.max())
    if lo < info.min or hi > info.max:
        raise ValueError(f"run: input {name!r} holds {hi if hi > info.max else lo}, which does not fit its dtype "
                         f"{dtype} [{info.min}, {info.max}]")
