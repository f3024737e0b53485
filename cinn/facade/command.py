"""What cinn-run, cinn-tune and cinn-bench share: exit statuses, user errors in one line, Ctrl-C."""
from __future__ import annotations

import argparse
import contextlib
import enum
import functools
import math
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterator, Sequence
from types import FrameType
from typing import Protocol

import psutil

from cinn.runtime.worker_pool import stop_all

# what a user can cause (bad files, arguments or models), as opposed to a bug in cinn, which keeps its traceback
USER_ERRORS = (ValueError, TypeError, NotImplementedError, OSError)
DEBUG_ENV = "CINN_DEBUG"  # set to 1: user errors print their traceback too



class Main(Protocol):
    """A command's entry point: the arguments (default: sys.argv[1:]) to an exit status."""

    def __call__(self, argv: Sequence[str] | None = None) -> int: ...


class ExitStatus(enum.IntEnum):
    """A command's exit status."""

    OK = 0
    FAILED = 1  # the model failed to compile or run, an engine failed, a tuned task has no working schedule
    USAGE = 2  # bad arguments, or a file they name that is missing or cannot be read (argparse's status too)
    INTERRUPTED = 130  # Ctrl-C: 128 + SIGINT, as a shell reports a process that SIGINT ended


class UsageError(ValueError):
    """A bad argument, or a file named on the command line that is missing or cannot be read."""


def seconds(text: str) -> float:
    """An argparse type: a positive, finite number of seconds (float() also reads nan and inf, which no limit is)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive, finite number of seconds")
    return value


@contextlib.contextmanager
def reading_arguments() -> Iterator[None]:
    """User errors raised inside (parsing the arguments, reading the files they name) are usage errors."""
    try:
        yield
    except UsageError:
        raise
    except USER_ERRORS as err:
        raise UsageError(str(err)) from err


def command(prog: str, interrupted: str = "interrupted") -> Callable[[Main], Main]:
    """Decorate a command's main(argv) -> status: a user error ends it with one line and its status, Ctrl-C with
    `interrupted` and 130; the build workers of a command that ends early are stopped."""

    def decorate(main: Main) -> Main:
        @functools.wraps(main)
        def run(argv: Sequence[str] | None = None) -> int:
            try:
                try:
                    with _children_end_on_sigint():
                        return main(argv)
                except BaseException:
                    stop_all()  # else the interpreter's exit waits for the builds in flight (minutes for a big kernel)
                    raise
            except KeyboardInterrupt:
                newline = "\n" if sys.stderr.isatty() else ""  # after a progress line redrawn in place
                print(f"{newline}{prog}: {interrupted}", file=sys.stderr)
                return ExitStatus.INTERRUPTED
            except UsageError as err:
                return _report(prog, err, ExitStatus.USAGE)
            except USER_ERRORS as err:
                return _report(prog, err, ExitStatus.FAILED)

        return run

    return decorate


@contextlib.contextmanager
def _children_end_on_sigint() -> Iterator[None]:
    """SIGINT kills this process's children (build and engine workers, a compiler) before KeyboardInterrupt unwinds
    the command: none outlives it, or reports on the run given up. Only the main thread can handle signals."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, _kill_children_and_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _kill_children_and_interrupt(signum: int, frame: FrameType | None) -> None:
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            child.kill()
    raise KeyboardInterrupt


def _report(prog: str, err: BaseException, status: ExitStatus) -> ExitStatus:
    """Print a user error as one line (with its traceback under CINN_DEBUG=1)."""
    if os.environ.get(DEBUG_ENV, "") not in ("", "0"):
        traceback.print_exception(err)
    print(f"{prog}: error: {err}", file=sys.stderr)
    return status
