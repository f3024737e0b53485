"""Whole compiles cached on disk: a static program compiled before skips the passes and the lowering.

The kernel cache (cinn.build) keys each library by its PrimFunc, so even a compile whose kernels are all cached
optimized the program and lowered every group to find their keys (resnet50: 1.8 of its 1.9 s from cache on a
2-core znver3). This cache keys the whole compile by the input program (its nodes and the bytes of its constants),
the target, compile's options, the schedule log's records and the compiler's code, and keeps the optimized program
(its constants in the layouts the kernels read: about the model's size per entry) with its kernels' library paths.
An entry whose libraries have left the kernel cache, or that cannot be read, is compiled again. Only a compile of
its own is cached: the per-binding compiles of a symbolic program share one constant pool, and an entry per binding
would hash and store every weight again.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import pathlib
import pickle
import tempfile
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from cinn import disk_cache
from cinn.build import code_version
from cinn.ir import Program, Value

FOLDER = disk_cache.COMPILED_FOLDER


@dataclass(frozen=True)
class CachedKernel:
    """What compile keeps of one kernel: its group's name, its library in the kernel cache, its parameters, its
    arithmetic, its PrimFunc's structural hash and the bytes it moves."""

    name: str
    library: str
    params: tuple[Value, ...]
    flops: int
    workload: str
    nbytes: int


@dataclass(frozen=True)
class CachedCompile:
    """The optimized program and its kernels, in order."""

    program: Program
    kernels: tuple[CachedKernel, ...]


def entry_path(cache_dir: pathlib.Path, program: Program, options: Sequence[object]) -> pathlib.Path:
    """Where the compile of `program` with `options` (target, flags, schedule records) is kept."""
    h = hashlib.sha256()  # the fastest here: SHA extensions hash resnet50's 100 MB in ~0.07 s, blake2b in ~0.2
    h.update(f"{code_version()}|{options!r}|{program.name}|{program.inputs!r}|{program.nodes!r}|{program.outputs!r}".encode())
    for name in sorted(program.constants):
        array = np.ascontiguousarray(program.constants[name])
        h.update(f"|{name}|{array.dtype.str}|{array.shape}|".encode())
        h.update(array.data)
    return cache_dir / FOLDER / f"{h.hexdigest()[:32]}{disk_cache.COMPILED_SUFFIX}"


def load(path: pathlib.Path) -> CachedCompile | None:
    """The cached compile at `path`, or None when there is none or it cannot be read (with a warning)."""
    try:
        with open(path, "rb") as f:
            entry = pickle.load(f)
    except (FileNotFoundError, NotADirectoryError):  # (a cache_dir that is a file: the kernel cache refuses it)
        return None
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError, TypeError, ValueError) as err:
        warnings.warn(f"cinn: unreadable compile cache entry {path} ({type(err).__name__}); compiling again",
                      stacklevel=3)
        return None
    if not isinstance(entry, CachedCompile):
        return None
    disk_cache.touch(path)
    return entry


def store(path: pathlib.Path, entry: CachedCompile) -> None:
    """Write an entry atomically (a reader sees the whole file or none), then keep the cache within its limit; an
    unwritable cache is passed by quietly (the kernel cache has warned of it)."""
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                pickle.dump(entry, f, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, path)
        finally:
            pathlib.Path(tmp).unlink(missing_ok=True)
    disk_cache.prune(path.parent.parent)
