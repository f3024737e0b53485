"""TVM's process pool, with workers that die with this process and can be stopped at once."""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import weakref
from collections.abc import Callable, Mapping
from concurrent.futures import Future

from tvm.support.popen_pool import PopenPoolExecutor

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

_SPAWNER = "CINN_SPAWNER_PID"  # set by spawner_env: the process whose end ends the worker
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
                    process.wait()  # dead before the next task asks (_worker_run)

    def _worker_run(self, fn, args, kwargs):
        # TVM restarts a worker only once it has failed a task: one killed while idle starts again here instead
        worker = self._worker_map.get(threading.get_ident())
        if worker is not None and worker._proc is not None and not worker.is_alive():
            worker.kill()
        return super()._worker_run(fn, args, kwargs)

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


def spawner_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a worker process that calls die_with_spawner (env, else this one's): it names us."""
    return {**(os.environ if env is None else env), _SPAWNER: str(os.getpid())}


def die_with_spawner() -> None:
    """In a worker started with spawner_env: get SIGKILL when the process that started it ends (a SIGKILLed
    cinn-bench left its engine workers compiling or timing). Linux sends it when the spawning thread ends: spawn
    from a thread that lives as long as the process. (Not a preexec_fn: one ran Python between fork and exec, where a
    Ctrl-C landing then was lost.)"""
    spawner = os.environ.pop(_SPAWNER, None)
    if spawner is not None:
        _ask_death_signal(int(spawner))


def _ask_death_signal(parent: int) -> None:
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the request: no signal will come
            os._exit(1)
