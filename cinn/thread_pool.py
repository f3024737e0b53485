"""cinn's thread pool for the parallel loops of its CPU kernels, in place of TVM's (thread_pool.c says how and why).

The pool is built from thread_pool.c with the system's C compiler (`$CC`, else `cc`) the first time a process loads
a kernel, into the kernel cache, once per version of the source. Each loaded kernel library's parallel-launch pointer
is then pointed at it. Where it cannot be built or loaded (no C compiler, not Linux), kernels keep TVM's pool, with one
warning; `CINN_THREAD_POOL=tvm` keeps TVM's pool on purpose.
"""
from __future__ import annotations

import _ctypes
import ctypes
import enum
import os
import pathlib
import shutil
import subprocess
import tempfile
import threading
import warnings

from cinn.utils import atomic_write, digest_path, file_digest

SOURCE = pathlib.Path(__file__).with_name("thread_pool.c")
LAUNCH_POINTER = "__TVMBackendParallelLaunch"  # the variable a TVM kernel library calls its parallel loops through


class Pool(enum.Enum):
    """Which pool runs the kernels' parallel loops (`CINN_THREAD_POOL`)."""

    CINN = "cinn"
    TVM = "tvm"


def chosen() -> Pool:
    """The pool `CINN_THREAD_POOL` names (default cinn's)."""
    value = os.environ.get("CINN_THREAD_POOL") or Pool.CINN.value
    try:
        return Pool(value)
    except ValueError:
        raise ValueError(f"CINN_THREAD_POOL={value!r}: expected one of {', '.join(p.value for p in Pool)}") from None


class _State:
    """The process's pool library (loaded at most once) and the thread count asked for before it loaded."""

    lock = threading.Lock()
    library: ctypes.CDLL | None = None
    tried = False
    threads: int | None = None


def set_threads(n: int) -> None:
    """Run the calling thread's parallel loops (and those of threads that never set theirs) on n threads."""
    with _State.lock:
        _State.threads = n
        if _State.library is not None:
            _State.library.cinn_pool_set_threads(n)


def install(lib_path: str) -> bool:
    """Point a loaded kernel library's parallel loops at cinn's pool; False where they stay on TVM's."""
    library = _library(pathlib.Path(lib_path).parent)
    if library is None:
        return False
    handle = ctypes.CDLL(lib_path)  # the library TVM loaded: dlopen hands out the same one
    try:
        pointer = ctypes.c_void_p.in_dll(handle, LAUNCH_POINTER)
    except ValueError:  # no parallel loop in this kernel
        return False
    finally:
        _ctypes.dlclose(handle._handle)  # TVM's reference keeps it loaded
    pointer.value = ctypes.cast(library.cinn_pool_launch, ctypes.c_void_p).value
    return True


def _library(directory: pathlib.Path) -> ctypes.CDLL | None:
    """The pool, built into directory (or a temporary one) on the first call of the process; None: TVM's pool."""
    with _State.lock:
        if not _State.tried:
            _State.tried = True
            if chosen() is Pool.CINN:
                try:
                    _State.library = _load(directory)
                except (OSError, subprocess.SubprocessError) as err:
                    warnings.warn(f"cinn: kernels run on TVM's thread pool: cinn's could not be built ({err})", stacklevel=3)
        return _State.library


def _load(directory: pathlib.Path) -> ctypes.CDLL:
    name = f"thread-pool-{file_digest(SOURCE)[:16]}.so"
    path = directory / name
    if not _intact(path):
        try:
            _compile(path)
        except OSError:  # a read-only cache
            path = pathlib.Path(tempfile.mkdtemp(prefix="cinn-pool-")) / name
            _compile(path)
    library = ctypes.CDLL(str(path))
    library.cinn_pool_set_threads.argtypes = [ctypes.c_int]
    library.cinn_pool_set_threads(_State.threads or _default_threads())
    return library


def _intact(path: pathlib.Path) -> bool:
    """Whether the built pool is there and whole (a library cut short kills dlopen with SIGBUS)."""
    try:
        return file_digest(path) == pathlib.Path(digest_path(path)).read_text()
    except OSError:
        return False


def _compile(path: pathlib.Path) -> None:
    """Compile the pool to path, with its digest beside it, atomically (processes may race to build it)."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise OSError("no C compiler: set CC")

    def build(tmp: str) -> None:
        done = subprocess.run([cc, "-O2", "-std=c11", "-shared", "-fPIC", "-pthread", "-o", tmp, str(SOURCE)],
                              capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise subprocess.SubprocessError(f"{cc} failed: {done.stderr.strip()[-400:]}")
        pathlib.Path(digest_path(path)).write_text(file_digest(tmp))

    atomic_write(str(path), build)


def _default_threads() -> int:
    """TVM's default: $TVM_NUM_THREADS, else the CPUs this process may run on."""
    return int(os.environ.get("TVM_NUM_THREADS") or len(os.sched_getaffinity(0)))
