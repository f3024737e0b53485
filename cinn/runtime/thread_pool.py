"""cinn's thread pool for the parallel loops of its CPU kernels, in place of TVM's (thread_pool.c says how and why).

The pool is built from thread_pool.c with the system's C compiler (`$CC`, else `cc`) the first time a process loads
a kernel, into the kernel cache, once per version of the source, with its keyed digest (cinn.runtime.trust): a library there
that this user's cinn did not build is refused, with a warning, and built again. Each loaded kernel library's parallel-launch pointer
is then pointed at it. Where it cannot be built or loaded (no C compiler, not Linux), kernels keep TVM's pool, with one
warning; `CINN_THREAD_POOL=tvm` keeps TVM's pool on purpose.
"""
from __future__ import annotations

import _ctypes
import contextlib
import ctypes
import enum
import os
import pathlib
import shutil
import subprocess
import tempfile
import threading
import warnings

from cinn.core.utils import file_digest
from cinn.runtime import disk_cache, trust

SOURCE = pathlib.Path(__file__).with_name("thread_pool.c")
LAUNCH_POINTER = "__TVMBackendParallelLaunch"  # the variable a TVM kernel library calls its parallel loops through
# the pool's own lock: it is loaded while a kernel's load holds the cache's lock shared, and may have to be written
LOCK = ".thread-pool.lock"


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
    """Load the pool from directory (the kernel cache), built there first unless it is there, whole and this user's."""
    path = directory / f"thread-pool-{file_digest(SOURCE)[:16]}.so"
    secret = trust.key_or_none()
    if secret is None or not _intact(path, secret):
        path = _built(path, secret)
    library = ctypes.CDLL(str(path))
    library.cinn_pool_set_threads.argtypes = [ctypes.c_int]
    library.cinn_pool_set_threads(_State.threads or _default_threads())
    return library


def _built(path: pathlib.Path, secret: bytes | None) -> pathlib.Path:
    """Build the pool at path; where it cannot be built there (a read-only or full cache) or the user has no cache
    key, in a fresh folder. Returns where it was built."""
    if secret is not None:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            _compile(path, secret)
            return path
    elsewhere = pathlib.Path(tempfile.mkdtemp(prefix="cinn-pool-")) / path.name
    _compile(elsewhere, None)
    return elsewhere


def _intact(path: pathlib.Path, secret: bytes) -> bool:
    """Whether the built pool is there, whole (a library cut short kills dlopen with SIGBUS) and built by this user's
    cinn (loading another's runs their code); one there whose checks fail is refused with a warning."""
    try:
        with disk_cache.lock(path.parent, exclusive=False, name=LOCK):
            if not (path.exists() and os.path.exists(disk_cache.digest_path(path))):
                return False
            disk_cache.check_entry([str(path)], secret)
            return True
    except trust.Untrusted as err:
        warnings.warn(f"cinn: refused the thread pool library {path} ({err}); building it again", stacklevel=5)
    except OSError:  # a folder without the lock that cannot be written, or a library pruned meanwhile
        pass
    return False


def _compile(path: pathlib.Path, secret: bytes | None) -> None:
    """Compile the pool to path, with its digest keyed by `secret` beside it (none without one), put in place together
    under the cache's lock (processes may race to build it)."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise OSError("no C compiler: set CC")

    def build(made: list[str]) -> None:
        done = subprocess.run([cc, "-O2", "-std=c11", "-shared", "-fPIC", "-pthread", "-o", made[0], str(SOURCE)],
                              capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise subprocess.SubprocessError(f"{cc} failed: {done.stderr.strip()[-400:]}")

    disk_cache.write_entry([str(path)], build, secret, LOCK)


def _default_threads() -> int:
    """TVM's default: $TVM_NUM_THREADS, else the CPUs this process may run on."""
    return int(os.environ.get("TVM_NUM_THREADS") or len(os.sched_getaffinity(0)))
