"""What cinn-run, cinn-tune and cinn-bench share: exit statuses, user errors in one line, Ctrl-C."""
from __future__ import annotations

import contextlib
import enum
import functools
import os
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

from cinn.worker_pool import stop_all

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
                    return main(argv)
                except BaseException:
                    stop_all()  # else the interpreter's exit waits for the builds in flight (minutes for a big kernel)
                    raise
            except KeyboardInterrupt:
                print(f"{prog}: {interrupted}", file=sys.stderr)
                return ExitStatus.INTERRUPTED
            except UsageError as err:
                return _report(prog, err, ExitStatus.USAGE)
            except USER_ERRORS as err:
                return _report(prog, err, ExitStatus.FAILED)

        return run

    return decorate


def _report(prog: str, err: BaseException, status: ExitStatus) -> ExitStatus:
    """Print a user error as one line (with its traceback under CINN_DEBUG=1)."""
    if os.environ.get(DEBUG_ENV, "") not in ("", "0"):
        traceback.print_exception(err)
    print(f"{prog}: error: {err}", file=sys.stderr)
    return status
