"""The survey's vocabulary: categories, outcomes, what a case feeds cinn and what counts as a pass."""
from __future__ import annotations

import enum
import pathlib
from collections.abc import Callable
from dataclasses import dataclass, field

from tests.timeouts import scaled

# The time one case may take on an idle machine (tests.timeouts.scaled stretches it by the load): a compile of the tiny
# model, or a refusal, takes seconds; a case past it hangs.
CASE_TIMEOUT_S = 60.0
MARKER = "pwned"  # what every payload creates in its case's folder


def timeout_s() -> float:
    """The time one case may take."""
    return scaled(CASE_TIMEOUT_S)


class Unavailable(Exception):
    """A case's input cannot be made on this machine (no C compiler, not root, not x86-64): the case is skipped."""


class Category(enum.Enum):
    """What kind of bad input a case is."""

    MALFORMED = "malformed model files"
    INVALID = "invalid models"
    RESOURCES = "resource exhaustion"
    CACHE = "cache tampering"
    TUNING_LOG = "tuning logs"
    COST_MODEL = "cost-model files"
    CLI = "CLI usage"
    FEEDS = "feeds"
    VALID = "valid models at the edges"


class Outcome(enum.Enum):
    """How cinn answered a case; only OK passes."""

    OK = "ok"
    SKIPPED = "skipped"  # its input cannot be made here (Unavailable)
    CODE_EXECUTION = "code-execution"  # the payload's marker file appeared
    CRASH = "crash"  # the process was killed by a signal
    HANG = "hang"  # past the timeout
    TRACEBACK = "traceback"  # a CLI printed a Python traceback
    WRONG_STATUS = "wrong-status"  # a CLI's exit status is not the documented one
    BAD_MESSAGE = "bad-message"  # an error of an unexpected type, or a message that does not name what is at fault
    ACCEPTED = "accepted"  # a bad input taken without an error
    REFUSED = "refused"  # an input that should run was refused
    WRONG_RESULT = "wrong-result"


class Want(enum.Enum):
    """What a case should get."""

    ERROR = "a clear error"
    RESULT = "the right result"
    EITHER = "a clear error or the right result"


class Action(enum.Enum):
    """A Python API call, made in a worker process (tests.bad_inputs.worker)."""

    LOAD = "cinn.load_model(path)"
    LOAD_COMPILE = "cinn.load_model(path), compile and run"
    COMPILE_TINY = "compile the tiny model (tuning_log=path) and run it"
    FEED = "run the tiny model on a feed"
    COST_MODEL = "CostModel.load(path)"


class Entry(enum.Enum):
    """The CLIs, as `python -m MODULE`."""

    RUN = "cinn"
    TUNE = "autotune"
    BENCH = "benchmarks"


@dataclass(frozen=True)
class Api:
    """A Python API call on a file of the case's folder (or, for FEED, a named feed of tests.bad_inputs.feeds)."""

    action: Action
    path: str = ""
    arg: str = ""


@dataclass(frozen=True)
class Cli:
    """A command `python -m ENTRY ARGS`, run in the case's folder ({dir} in an argument: that folder)."""

    entry: Entry
    args: tuple[str, ...]


@dataclass(frozen=True)
class Expect:
    """What passes. names: text the error (a CLI's stderr) must contain; forbid: text it must not; warns: text a
    warning (a CLI's stderr) must contain; status: the exit statuses a CLI may end an error with. {dir} in names and
    warns is the case's folder."""

    want: Want = Want.ERROR
    names: str = ""
    forbid: str = ""
    warns: str = ""
    status: frozenset[int] = frozenset({2})


def _nothing(case_dir: pathlib.Path) -> None:
    """A case whose input needs no file."""


@dataclass(frozen=True)
class Case:
    """One bad input: `make` writes it into the case's folder (which holds the tiny model, tiny.onnx, and a warm
    cache, cache/), `call` feeds it to cinn. `alone`: in a process of its own: an API call in one that has run no
    other case (the thread pool loads once per process), a command line as `python -m ENTRY`, as a user runs it (what
    the interpreter prints; a case that may crash or run code). The others share worker processes, a batch per
    category or command: a crash or hang there is the case's, and a new worker takes the rest."""

    category: Category
    name: str
    call: Api | Cli
    make: Callable[[pathlib.Path], object] = field(default=_nothing, compare=False)
    expect: Expect = Expect()
    alone: bool = False
