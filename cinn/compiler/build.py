"""Build: schedule and compile each lowered group, in parallel workers, through an on-disk cache."""
from __future__ import annotations

import concurrent.futures as cf
import functools
import hashlib
import os
import pathlib
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import tvm
import tvm_ffi
from tvm.s_tir import Schedule

import schedules
from cinn.compiler import llvm_calls
from cinn.core import ops
from cinn.core.cpu_model import default_cache_dir as default_cache_dir
from cinn.core.ops import PatternKind
from cinn.core.target import NO_PARTIAL_UNROLL, Target
from cinn.runtime import cuda_module, disk_cache, thread_pool, trust
from cinn.runtime.worker_pool import WorkerPool
from schedules import apply_default, postprocess
from schedules.analysis import NOMINAL_SIZES, PLAIN_SCHEDULE, blocks
from schedules.cpu_common import parallel_outer
from schedules.cuda_common import unbound_blocks
from schedules.replay import replay


@dataclass(frozen=True)
class KernelSpec:
    """What to build: a PrimFunc, its group kind, and an optional tuned trace (JSON). Specs are equal when their
    workloads (the PrimFunc's structural hash), kinds and traces are."""

    workload: str
    # the PrimFunc itself, not its JSON: serializing every kernel cost a cached compile of resnet50 0.15 s
    func: object = field(compare=False)
    kind: PatternKind
    trace: str | None = None


@dataclass(frozen=True)
class BuiltKernel:
    """A loaded kernel library, its source text and its path in the cache."""

    module: object  # tvm.runtime.Module; None for CUDA kernels where no GPU can load them
    source: str
    path: str


def workload_key(func) -> str:
    """The workload key of a PrimFunc: its structural hash (names do not matter)."""
    return f"{tvm_ffi.structural_hash(func) & 0xFFFFFFFFFFFFFFFF:016x}"


@functools.cache
def code_version() -> str:
    """A hash of the code that decides what a kernel becomes, so schedule, pass and op changes invalidate the cache
    (an op's compute decides it as much as its schedule does)."""
    h = hashlib.sha256(tvm.__version__.encode())
    for root in (pathlib.Path(schedules.__file__).parent, pathlib.Path(__file__).parent, pathlib.Path(ops.__file__).parent):
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
    _store(path, *_built(spec, target), secret=None)
    return path


@dataclass(frozen=True)
class Stored:
    """Where a built kernel's library lies: its place in the cache, or, where the cache could not be written (a full
    disk), a temporary folder's, with what failed."""

    path: str
    failure: str = ""


def build_cached(spec: KernelSpec, target: Target, path: str, secret: bytes | None) -> Stored:
    """build_kernel into the cache, with the library's digest keyed by `secret` (none: a folder that is no cache).
    Where the library cannot be written there (a full disk fails as ENOSPC, or in the linker), it is written to a
    temporary folder instead; a failure there too is the kernel's own, and raised."""
    source, export = _built(spec, target)
    try:
        _store(path, source, export, secret)
        return Stored(path)
    except Exception as err:
        folder = tempfile.mkdtemp(prefix="cinn-uncached-")
        try:
            elsewhere = os.path.join(folder, os.path.basename(path))
            _store(elsewhere, source, export, secret=None)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        return Stored(elsewhere, f"{type(err).__name__}: {str(err).strip()[-300:]}")


def _built(spec: KernelSpec, target: Target) -> tuple[str, Callable[[str], object]]:
    """A kernel scheduled and compiled: its source and the function that writes its library to a path."""
    mod = _module(spec.func, target)
    try:
        sch, ex = _scheduled(mod, spec, target)
    except Exception:  # a symbolic kernel's schedule, chosen at its nominal sizes, may fail anywhere in TVM
        if NOMINAL_SIZES not in getattr(spec.func, "attrs", {}):
            raise
        # the plain loop nest, its outer loops parallel: valid at every size; marked so in the kernel's source
        sch = Schedule(tvm.IRModule({"main": mod["main"].with_attr(PLAIN_SCHEDULE, True)}))
        parallel_outer(sch)
        ex = _compiled(sch, target)
    return kernel_source(sch.mod, ex), lambda tmp: _export(ex, tmp, target)


def default_fingerprint(func, kind: PatternKind, target: Target) -> str:
    """The structural hash of a PrimFunc under its default schedule: what a tuned schedule judged against the
    default replaces, which changes when the default schedules do (records note it: autotune.database)."""
    sch = Schedule(_module(func, target))
    apply_default(sch, kind, target)
    return workload_key(sch.mod["main"])


def _module(func, target: Target) -> tvm.IRModule:
    """The module a kernel is scheduled in (a CPU kernel's buffers element-aligned)."""
    return tvm.IRModule({"main": func if target.is_cuda else element_aligned(func)})


def _scheduled(mod: tvm.IRModule, spec: KernelSpec, target: Target) -> tuple[Schedule, object]:
    """The kernel scheduled (by default or by its trace) and compiled."""
    sch = Schedule(mod)
    if spec.trace is None:
        apply_default(sch, spec.kind, target)
    else:
        replay(sch, spec.trace)  # only what cinn's schedules emit: a log's trace could link in code
        check_in_bounds(sch, spec.workload)
    if target.is_cuda:
        _check_bound(sch, spec)
        if cuda_module.runtime_loaded():
            cuda_module.use_nvcc(target)
    return sch, _compiled(sch, target)


def _compiled(sch: Schedule, target: Target):
    tvm_target = target.tvm(partial_unroll=not _annotated(sch, NO_PARTIAL_UNROLL))
    with tvm_target:  # CUDA compilation reads the architecture from the current target
        ex = tvm.compile(postprocess(sch.mod, target), target=tvm_target)
    return ex if target.is_cuda else llvm_calls.resolved(ex)


def _annotated(sch: Schedule, key: str) -> bool:
    """Whether a block of the schedule carries the annotation `key`."""
    return any(key in sch.get(b).annotations for b in blocks(sch))


def _store(path: str, source: str, export: Callable[[str], object], secret: bytes | None) -> None:
    """Write a cache entry: the library, its source and its digest keyed by `secret` (cinn.runtime.disk_cache.write_entry)."""

    def write(made: list[str]) -> None:
        export(made[0])
        pathlib.Path(made[1]).write_text(source)

    disk_cache.write_entry([path, source_path(path)], write, secret)


def _cache_lock(path: str, exclusive: bool):
    """The lock of the cache directory holding `path` (cinn.runtime.disk_cache.lock)."""
    return disk_cache.lock(pathlib.Path(path).parent, exclusive)


def element_aligned(func):
    """The PrimFunc with its parameters aligned to one element only, so a CPU kernel reads and writes any contiguous
    array in place (LLVM emits unaligned vector moves, as fast as aligned ones on aligned data). A symbolic kernel's
    scalar parameters (its symbols' sizes) stay as they are."""
    aligned = [(p, _with_alignment(p, tvm.runtime.DataType(p.dtype).itemsize)) for p in func.params
               if isinstance(p.ty, tvm.tirx.buffer.BufferType)]
    return tvm_ffi.structural_map(func, [(tvm.tirx.Buffer, lambda b: next((n for o, n in aligned if b.same_as(o)), b))])


def _with_alignment(buf, alignment: int):
    """A copy of a parameter buffer declared with another data alignment."""
    return tvm.tirx.decl_buffer(buf.shape, buf.dtype, buf.name, strides=buf.strides, elem_offset=buf.elem_offset,
                                scope=buf.scope(), data_alignment=alignment, offset_factor=buf.offset_factor,
                                layout=buf.layout)


class OutOfBounds(ValueError):
    """A scheduled kernel that would access a buffer outside its bounds."""


def check_in_bounds(sch: Schedule, kernel: str) -> None:
    """Refuse a (tuned) schedule with a block that writes outside its buffer over the block's iteration domain: a
    trace of the generic sketch over a channels-last conv's padded view wrote the rows past the view's end. (TVM's
    OOBChecker also flags the guarded reads of every padded window.)"""
    for rv in blocks(sch):
        block, analyzer = sch.get(rv), tvm.sym.Analyzer()
        for iv in block.iter_vars:
            analyzer.bind(iv.var, iv.dom)
        for written in block.writes:
            for r, extent in zip(written.region, written.source.shape, strict=True):
                low = analyzer.const_int_bound(r.min).min_value
                high = analyzer.const_int_bound(r.min + r.extent - 1).max_value
                if isinstance(extent, tvm.tirx.IntImm) and (low < 0 or high >= int(extent)):
                    raise OutOfBounds(f"cinn: the schedule of kernel {kernel} writes {written.source.name} out of "
                                      f"its bounds (block {block.name_hint})")


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


def build_all(
    specs: Sequence[KernelSpec],
    target: Target,
    cache_dir: pathlib.Path,
    workers: int,
    progress: Callable[[int, int], None] | None = None,
) -> list[BuiltKernel]:
    """Build (or load from cache) one kernel per spec; identical specs are built once. A cache directory that cannot
    be written (read-only) or may not be trusted (cinn.runtime.trust) is passed by: the kernels are built in a temporary one,
    with a warning; so are those whose libraries cannot be written to the cache (a full disk)."""
    if cache_dir.exists() and not cache_dir.is_dir():
        raise NotADirectoryError(f"cinn: the kernel cache {cache_dir} is not a directory (it comes from cache_dir= or "
                                 "$CINN_CACHE_DIR; point it at a directory)")
    if not _writable(cache_dir):
        warnings.warn(f"cinn: the kernel cache {cache_dir} cannot be written; building without it", stacklevel=3)
        secret = None
    else:
        secret = trust.usable(cache_dir, stacklevel=3)
    if secret is not None:
        return _build_all(specs, target, cache_dir, workers, progress, secret)
    with tempfile.TemporaryDirectory(prefix="cinn-uncached-") as tmp:  # loaded libraries outlive their files
        return _build_all(specs, target, pathlib.Path(tmp), workers, progress, None)


def _writable(cache_dir: pathlib.Path) -> bool:
    """Whether files can be made in the cache directory (made if missing, writable by none but its user)."""
    try:
        cache_dir.mkdir(parents=True, exist_ok=True, mode=0o755)
        fd, probe = tempfile.mkstemp(dir=cache_dir, prefix=".probe-")
    except OSError:
        return False
    os.close(fd)
    os.unlink(probe)
    return True


def _build_all(specs: Sequence[KernelSpec], target: Target, cache_dir: pathlib.Path, workers: int,
               progress: Callable[[int, int], None] | None, secret: bytes | None) -> list[BuiltKernel]:
    """build_all in cache_dir, a cache when there is a secret to key its digests with, else a temporary folder."""
    paths = {s: str(cache_dir / f"{cache_key(s, target)}.so") for s in dict.fromkeys(specs)}
    modules: dict[KernelSpec, BuiltKernel] = {}
    missing = []
    for spec, path in paths.items():
        mod = load_cached(path, target) if secret is not None else None
        if mod is None:
            missing.append(spec)
        else:
            modules[spec] = mod
    done = len(modules)
    elsewhere: list[Stored] = []
    try:
        for spec, stored in _build_missing(missing, target, paths, workers, secret):
            modules[spec] = _read(stored.path, target)
            if stored.failure:
                elsewhere.append(stored)
            done += 1
            if progress:
                progress(done, len(paths))
    finally:
        for stored in elsewhere:  # loaded libraries outlive their files
            shutil.rmtree(os.path.dirname(stored.path), ignore_errors=True)
    if elsewhere:
        warnings.warn(f"cinn: could not write the kernel cache {cache_dir} ({elsewhere[0].failure}); built "
                      f"{len(elsewhere)} kernels in a temporary folder instead", stacklevel=4)
    if missing:
        disk_cache.prune(cache_dir)
    return [modules[s] for s in specs]


def _read(path: str, target: Target) -> BuiltKernel:
    """Load a kernel library and its source from the cache (CUDA libraries only where a GPU can run them)."""
    loadable = not target.is_cuda or cuda_module.device_present()
    return BuiltKernel(load_library(path, target) if loadable else None, pathlib.Path(source_path(path)).read_text(),
                       path)


def load_library(path: str, target: Target) -> tvm.runtime.Module:
    """Load a kernel library; a CPU kernel's parallel loops run on cinn's thread pool."""
    module = tvm.runtime.load_module(path)
    if not target.is_cuda:
        thread_pool.install(path)
    return module


def load_cached(path: str, target: Target) -> BuiltKernel | None:
    """A cached kernel, or None when absent (or when the user's cache key cannot be had); an entry that is not whole
    or not this user's (cinn.runtime.trust) is deleted with a warning, never loaded (and rebuilt by the caller)."""
    files = (path, source_path(path), disk_cache.digest_path(path))
    secret = trust.key_or_none()
    if secret is None:
        return None
    with _cache_lock(path, exclusive=False):
        if not all(os.path.exists(f) for f in files):
            return None
        try:
            built = _verified(path, target, secret)
            disk_cache.touch(path)
            return built
        except Exception as err:
            warnings.warn(f"cinn: corrupt cache entry {path} ({type(err).__name__}: {err}); rebuilding", stacklevel=3)
    with _cache_lock(path, exclusive=True):
        try:  # another process may have put a whole entry in place since
            return _verified(path, target, secret)
        except Exception:
            for f in files:
                _discard(f)
    return None


def _discard(path: str) -> None:
    """Delete a file of a broken cache entry, or a folder in its place (the rebuild could not replace a folder)."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        pathlib.Path(path).unlink(missing_ok=True)


def _verified(path: str, target: Target, secret: bytes) -> BuiltKernel:
    """Load a cached library whose files are this user's alone and whose bytes match their keyed digest (loading a
    truncated library can kill the process; loading one that another wrote runs their code)."""
    disk_cache.check_entry([path, source_path(path)], secret)
    return _read(path, target)


def _build_missing(missing: list[KernelSpec], target: Target, paths: dict, workers: int, secret: bytes | None
                   ) -> Iterator[tuple[KernelSpec, Stored]]:
    """Yield specs with where their libraries were written, as they are, using worker processes when it pays (the
    key travels to them with each task: a worker started before $CINN_CACHE_KEY changed would read another)."""
    if workers <= 1 or len(missing) <= 1:
        for spec in missing:
            yield spec, build_cached(spec, target, paths[spec], secret)
        return
    pool = _pool(workers)
    futures = {pool.submit(build_cached, s, target, paths[s], secret): s for s in missing}
    for fut in cf.as_completed(futures):
        yield futures[fut], fut.result()


@functools.cache
def _pool(workers: int):
    """Worker processes kept for the life of the process (fresh interpreters: no fork of TVM's threads,
    and no re-import of the user's __main__); they die with it."""
    return WorkerPool(max_workers=workers)
