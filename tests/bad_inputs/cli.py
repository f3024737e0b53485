"""The three CLIs (cinn-run, cinn-tune, cinn-bench as `python -m`) given bad files and bad arguments: no traceback,
exit 2 for a usage error (1 or 2 where a model file is at fault), and a message naming what is wrong."""
from __future__ import annotations

import pathlib
from collections.abc import Callable

from tests.bad_inputs import tiny
from tests.bad_inputs.core import Case, Category, Cli, Entry, Expect, Want, _nothing
from tests.bad_inputs.tuning import SHORT_TUNE

USAGE = Expect(Want.ERROR)
MODEL_AT_FAULT = frozenset({1, 2})
# what each CLI needs besides its model to get past its own argument checks
_REQUIRED = {Entry.RUN: ("--repeat", "1"), Entry.TUNE: ("--log", "t.jsonl", *SHORT_TUNE), Entry.BENCH: ("--repeat", "1", "--warmup", "0")}


def _file(name: str, content: bytes) -> Callable[[pathlib.Path], None]:
    return lambda d: (d / name).write_bytes(content)


def _model_files() -> list[tuple[str, str, Callable[[pathlib.Path], object]]]:
    """(case, model argument, make)."""
    return [
        ("a missing model file", "missing.onnx", _nothing),
        ("a folder", "folder", lambda d: (d / "folder").mkdir()),
        ("a text file named .onnx", "notmodel.onnx", _file("notmodel.onnx", b"hello, I am not a model\n")),
        ("an empty .onnx", "empty.onnx", _file("empty.onnx", b"")),
        ("a model of unknown format", "model.txt", _file("model.txt", b"hello\n")),
    ]


def _shape_args() -> list[tuple[str, tuple[str, ...], frozenset[int]]]:
    usage = frozenset({2})
    return [
        ("--input-shape x=8,,16", ("--input-shape", "x=8,,16"), usage),
        ("--input-shape x=-1", ("--input-shape", "x=-1"), usage),
        ("--input-shape x=abc", ("--input-shape", "x=abc"), usage),
        ("--input-shape =8", ("--input-shape", "=8"), usage),
        ("--input-shape of an unknown input", ("--input-shape", "nosuch=2,8"), MODEL_AT_FAULT),
    ]


def _common(entry: Entry) -> list[tuple[str, tuple[str, ...], Expect]]:
    """Arguments every CLI takes, each given a bad value."""
    model = (tiny.NAME, *_REQUIRED[entry])
    return [
        ("an unknown flag", (*model, "--bogus"), USAGE),
        ("--target nonsense", (*model, "--target", "nonsense"), USAGE),
        ("--target cuda (no GPU: an error; a GPU: it runs)", (*model, "--target", "cuda"), Expect(Want.EITHER, names="cuda")),
        ("--repeat 0", (tiny.NAME, *_REQUIRED[entry], "--repeat", "0"), USAGE),
        ("--repeat -1", (tiny.NAME, *_REQUIRED[entry], "--repeat", "-1"), USAGE),
        ("--repeat abc", (tiny.NAME, *_REQUIRED[entry], "--repeat", "abc"), USAGE),
    ] + [(name, (*model, *args), Expect(Want.ERROR, status=status)) for name, args, status in _shape_args()]


# what a float argument (seconds) must refuse: float() reads all of them
_BAD_SECONDS = ("nan", "inf", "-1", "0")


def _specific() -> list[tuple[Entry, str, tuple[str, ...], Expect, Callable[[pathlib.Path], object]]]:
    run, tune, bench = Entry.RUN, Entry.TUNE, Entry.BENCH
    at_fault = Expect(Want.ERROR, status=MODEL_AT_FAULT)
    short = (tiny.NAME, *SHORT_TUNE)
    return [
        (run, "no arguments", (), USAGE, _nothing),
        (run, "--log of a missing file", (tiny.NAME, "--log", "missing.jsonl"), Expect(Want.ERROR, names="missing.jsonl",
                                                                                       status=MODEL_AT_FAULT), _nothing),
        (run, "--seed -1", (tiny.NAME, "--seed", "-1"), at_fault, _nothing),
        (tune, "no --log", (tiny.NAME,), USAGE, _nothing),
        (tune, "--log in a missing folder", (*short, "--log", "nodir/t.jsonl"), USAGE, _nothing),
        (tune, "--log in an unwritable folder", (*short, "--log", "/sys/kernel/t.jsonl"),
         Expect(Want.ERROR, names="/sys/kernel"), _nothing),
        (tune, "--trials 0", (tiny.NAME, "--log", "t.jsonl", "--trials", "0"), USAGE, _nothing),
        *((tune, f"--timeout {t}", (*short, "--log", "t.jsonl", "--timeout", t), USAGE, _nothing) for t in _BAD_SECONDS),
        (tune, "--rpc-tracker without --rpc-key", (tiny.NAME, "--log", "t.jsonl", "--rpc-tracker", "localhost:9"), USAGE, _nothing),
        (tune, "--shape-hint seq=a", (*short, "--log", "t.jsonl", "--shape-hint", "seq=a"), USAGE, _nothing),
        (tune, "an unknown built-in model", ("nosuchmodel", "--log", "t.jsonl"), at_fault, _nothing),
        (bench, "--rounds 0", (tiny.NAME, "--rounds", "0"), USAGE, _nothing),
        *((bench, f"--timeout {t}", (tiny.NAME, *_REQUIRED[bench], "--timeout", t), USAGE, _nothing) for t in _BAD_SECONDS),
        (bench, "--log of a missing file", (tiny.NAME, "--log", "missing.jsonl"), USAGE, _nothing),
        (bench, "an unknown built-in model", ("nosuchmodel",), USAGE, _nothing),
    ]


# The cases each CLI gets besides cinn-run's full set: cinn-tune and cinn-bench share its argument parsing code, and each
# case costs a process; cinn-bench runs the whole benchmark when its arguments pass, so it gets only what it must refuse.
_SUBSET = {
    Entry.TUNE: {"a missing model file", "a folder", "a text file named .onnx", "an unknown flag", "--target nonsense",
                 "--target cuda (no GPU: an error; a GPU: it runs)", "--repeat 0", "--input-shape x=8,,16", "--input-shape x=abc"},
    Entry.BENCH: {"a missing model file", "a text file named .onnx", "a folder", "an unknown flag", "--target nonsense", "--repeat 0",
                  "--input-shape x=8,,16"},
}


def _prog(entry: Entry) -> str:
    return {Entry.RUN: "cinn-run", Entry.TUNE: "cinn-tune", Entry.BENCH: "cinn-bench"}[entry]


# Run as `python -m` (the others call the command's main in a worker): what a user sees, the interpreter's traceback
# included, for the errors found deepest (the model file's import, the shapes' parsing).
_AS_A_USER = {"a text file named .onnx", "--input-shape x=8,,16"}


def cases() -> list[Case]:
    out = []
    for entry in Entry:
        chosen = _SUBSET.get(entry)
        for name, model, make in _model_files():
            if chosen is not None and name not in chosen:
                continue
            out.append(Case(Category.CLI, f"{_prog(entry)}: {name}", Cli(entry, (model, *_REQUIRED[entry])), make,
                            Expect(Want.ERROR, names=model, status=MODEL_AT_FAULT), name in _AS_A_USER))
        common = [c for c in _common(entry) if chosen is None or c[0] in chosen]
        out += [Case(Category.CLI, f"{_prog(entry)}: {name}", Cli(entry, args), expect=expect, alone=name in _AS_A_USER)
                for name, args, expect in common]
    out += [Case(Category.CLI, f"{_prog(entry)}: {name}", Cli(entry, args), make, expect)
            for entry, name, args, expect, make in _specific()]
    return out
