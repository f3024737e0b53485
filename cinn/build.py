"""Build: schedule and compile each lowered group, in parallel workers, through an on-disk cache."""
from __future__ import annotations

import concurrent.futures as cf
import functools
import hashlib
import json
import os
import pathlib
import tempfile
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm.s_tir import Schedule, Trace
from tvm.support.popen_pool import PopenPoolExecutor

from cinn import cuda_module, schedules
from cinn.ops import PatternKind
from cinn.schedules import apply_default
from cinn.schedules.cuda_common import unbound_blocks
from cinn.target import Target


@dataclass(frozen=True)
class KernelSpec:
    """What to build: a PrimFunc (as TVM JSON), its group kind, and an optional tuned trace (JSON)."""

    workload: str
    func_json: str
    kind: PatternKind
    trace: str | None = None


@dataclass(frozen=True)
class BuiltKernel:
    """A loaded kernel library and its source text."""

    module: object  # tvm.runtime.Module; None for CUDA kernels where no GPU can load them
    source: str


def workload_key(func) -> str:
    """The workload key of a PrimFunc: its structural hash (names do not matter)."""
    return f"{tvm_ffi.structural_hash(func) & 0xFFFFFFFFFFFFFFFF:016x}"


def default_cache_dir() -> pathlib.Path:
    """$CINN_CACHE_DIR, else ~/.cache/cinn."""
    return pathlib.Path(os.environ.get("CINN_CACHE_DIR") or pathlib.Path.home() / ".cache" / "cinn")


@functools.cache
def code_version() -> str:
    """A hash of the code that decides what a kernel becomes, so schedule changes invalidate the cache."""
    h = hashlib.sha256(tvm.__version__.encode())
    for root in (pathlib.Path(schedules.__file__).parent, pathlib.Path(__file__).parent):
        for f in sorted(root.rglob("*.py")):
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


def cache_key(spec: KernelSpec, target: Target) -> str:
    """Cache file stem: workload, schedule, target, TVM and compiler code versions."""
    # repr, not str: the cache sizes that shape the default schedules are part of the key
    text = "|".join([spec.workload, spec.trace or "default", repr(target), code_version()])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def build_kernel(spec: KernelSpec, target: Target, path: str) -> str:
    """Schedule and compile one kernel to a shared library at `path` (atomically); returns `path`."""
    func = tvm.ir.load_json(spec.func_json)
    sch = Schedule(tvm.IRModule({"main": func}))
    if spec.trace is None:
        apply_default(sch, spec.kind, target)
    else:
        Trace.apply_json_to_schedule(json.loads(spec.trace), sch)
    if target.is_cuda:
        _check_bound(sch, spec)
        if cuda_module.runtime_loaded():
            cuda_module.use_nvcc(target)
    tvm_target = target.tvm()
    with tvm_target:  # CUDA compilation reads the architecture from the current target
        ex = tvm.compile(sch.mod, target=tvm_target)
    _atomic_write(source_path(path), lambda tmp: pathlib.Path(tmp).write_text(kernel_source(sch.mod, ex)))
    _atomic_write(path, lambda tmp: _export(ex, tmp, target))
    return path


def _check_bound(sch, spec: KernelSpec) -> None:
    """Fail loudly on a CUDA kernel with unbound blocks: TVM would silently compile them as host code."""
    unbound = unbound_blocks(sch)
    if unbound:
        raise RuntimeError(f"cinn: CUDA kernel {spec.workload} has blocks not bound to blockIdx/threadIdx: {unbound}")


def _export(ex, path: str, target: Target) -> None:
    """Write the kernel library; without TVM's CUDA runtime, nvcc compiles the kernels to PTX for it."""
    if target.is_cuda and not cuda_module.runtime_loaded():
        source = cuda_module.cuda_source(ex)
        cuda_module.export(ex, path, source, cuda_module.compile_ptx(source, target))
    else:
        ex.export_library(path)


def kernel_source(scheduled: tvm.IRModule, ex) -> str:
    """What kernel_sources() shows: CUDA C for GPU kernels, the scheduled TIR for CPU kernels."""
    return cuda_module.cuda_source(ex) or scheduled.script()


def source_path(lib_path: str) -> str:
    """The source file stored beside a cached library."""
    return lib_path[: -len(".so")] + ".src"


def _atomic_write(path: str, write: Callable[[str], object]) -> None:
    """Write through a temporary file and rename, so readers never see a torn file."""
    fd, tmp = tempfile.mkstemp(suffix=os.path.splitext(path)[1], dir=os.path.dirname(path))
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def build_all(
    specs: Sequence[KernelSpec],
    target: Target,
    cache_dir: pathlib.Path,
    workers: int,
    progress: Callable[[int, int], None] | None = None,
) -> list[BuiltKernel]:
    """Build (or load from cache) one kernel per spec; identical specs are built once."""
    if cache_dir.exists() and not cache_dir.is_dir():
        raise NotADirectoryError(f"cinn: the kernel cache {cache_dir} is not a directory (it comes from cache_dir= or "
                                 "$CINN_CACHE_DIR; point it at a directory)")
    cache_dir.mkdir(parents=True, exist_ok=True)
    paths = {s: str(cache_dir / f"{cache_key(s, target)}.so") for s in dict.fromkeys(specs)}
    modules: dict[KernelSpec, BuiltKernel] = {}
    missing = []
    for spec, path in paths.items():
        mod = _load_cached(path, target)
        if mod is None:
            missing.append(spec)
        else:
            modules[spec] = mod
    done = len(modules)
    for spec in _build_missing(missing, target, paths, workers):
        modules[spec] = _read(paths[spec], target)
        done += 1
        if progress:
            progress(done, len(paths))
    return [modules[s] for s in specs]


def _read(path: str, target: Target) -> BuiltKernel:
    """Load a kernel library and its source from the cache (CUDA libraries only where a GPU can run them)."""
    loadable = not target.is_cuda or cuda_module.device_present()
    return BuiltKernel(tvm.runtime.load_module(path) if loadable else None, pathlib.Path(source_path(path)).read_text())


def _load_cached(path: str, target: Target) -> BuiltKernel | None:
    """A cached kernel, or None when absent; a corrupt entry is deleted (and rebuilt by the caller)."""
    if not (os.path.exists(path) and os.path.exists(source_path(path))):
        return None
    try:
        return _read(path, target)
    except Exception as err:
        warnings.warn(f"cinn: corrupt cache entry {path} ({type(err).__name__}: {err}); rebuilding", stacklevel=3)
        os.unlink(path)
        return None


def _build_missing(missing: list[KernelSpec], target: Target, paths: dict, workers: int):
    """Yield specs as their libraries are written, using worker processes when it pays."""
    if workers <= 1 or len(missing) <= 1:
        for spec in missing:
            build_kernel(spec, target, paths[spec])
            yield spec
        return
    pool = _pool(workers)
    futures = {pool.submit(build_kernel, s, target, paths[s]): s for s in missing}
    for fut in cf.as_completed(futures):
        fut.result()
        yield futures[fut]


@functools.cache
def _pool(workers: int):
    """Worker processes kept for the life of the process (fresh interpreters: no fork of TVM's threads,
    and no re-import of the user's __main__)."""
    return PopenPoolExecutor(max_workers=workers)
