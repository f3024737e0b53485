"""TVM's process pool, with workers that die with this process and can be stopped at once."""
from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import signal
import sys
import weakref
from collections.abc import Callable
from concurrent.futures import Future

from tvm.support.popen_pool import PopenPoolExecutor

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

# looked up before any fork: a preexec_fn runs between fork and exec, where little is safe
_libc = ctypes.CDLL(None, use_errno=True)
_pools: weakref.WeakSet[WorkerPool] = weakref.WeakSet()


class WorkerPool(PopenPoolExecutor):
    """A PopenPoolExecutor whose workers are killed when this process dies (a harness's SIGKILL would leave them
    building for minutes), and whose unstarted tasks and workers stop() drops at once."""

    def __init__(self, max_workers: int, timeout: float | None = None, initializer: Callable[[], None] | None = None):
        self._futures: weakref.WeakSet[Future] = weakref.WeakSet()
        super().__init__(max_workers=max_workers, timeout=timeout, initializer=_die_with_parent,
                         initargs=(os.getpid(), initializer))
        _pools.add(self)

    def submit(self, fn, *args, **kwargs) -> Future:
        future = super().submit(fn, *args, **kwargs)
        self._futures.add(future)
        return future

    def kill_workers(self) -> None:
        """Kill the worker processes; each is started again at its next task, and a task it was running fails."""
        for worker in list(self._worker_map.values()):  # TVM's pool has no public way to stop a busy worker
            process = worker._proc
            if process is not None:
                with contextlib.suppress(OSError):
                    process.kill()

    def stop(self) -> None:
        """Cancel the tasks not yet started, then kill the workers (the pool stays usable)."""
        for future in list(self._futures):
            future.cancel()
        self.kill_workers()

    def shutdown(self, wait: bool = True) -> None:
        # killed first: TVM's shutdown closes a busy worker's pipe, which waits for the worker's reply
        self.stop()
        super().shutdown(wait)


def stop_all() -> None:
    """Stop every pool's work: an interrupted or failed command does not wait for builds that nobody will read."""
    for pool in list(_pools):
        pool.stop()


def _die_with_parent(parent: int, initializer: Callable[[], None] | None) -> None:
    """Worker initializer: ask the kernel for SIGKILL when the parent ends. Linux sends it when the thread that
    started the worker ends; that is one of the pool's threads, which live as long as the pool."""
    _ask_death_signal(parent)
    if initializer is not None:
        initializer()


def child_dies_with_us() -> Callable[[], None]:
    """A subprocess preexec_fn: the child (through its exec) gets SIGKILL when the thread that starts it ends, so
    start it from a thread that lives as long as this process (the main thread)."""
    return functools.partial(_ask_death_signal, os.getpid())


def _ask_death_signal(parent: int) -> None:
    if sys.platform == "linux":
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the request: no signal will come
            os._exit(1)
