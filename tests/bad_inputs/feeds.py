"""Feeds (and out arrays) given to the tiny model's Executable.run: a bad one gets a TypeError or ValueError naming
the input (or output) at fault; an unusual but valid one (a strided view, NaN, another byte order) the right result.
The values of tests/test_fuzz.py's FLOAT_SPECIALS are among them."""
from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np

from tests.bad_inputs.core import Action, Api, Case, Category, Expect, Want
from tests.bad_inputs.tiny import INPUT, SHAPE
from tests.test_fuzz import FLOAT_SPECIALS

# (feeds, out): out is None for run(feeds)
Feed = Callable[[], tuple[object, object]]
NAMES_INPUT = Expect(Want.ERROR, names=f"'{INPUT}'")
NAMES_OUTPUT = Expect(Want.ERROR, names="'y'")
RUNS = Expect(Want.RESULT)


def _x(value: object) -> Feed:
    return lambda: ({INPUT: value() if callable(value) else value}, None)


def _ones(dtype="float32", shape=SHAPE) -> Callable[[], np.ndarray]:
    return lambda: np.ones(shape, dtype)


def _data() -> np.ndarray:
    return np.linspace(-2, 2, 16, dtype=np.float32).reshape(SHAPE)


def _specials() -> np.ndarray:
    return np.array(list(itertools.islice(itertools.cycle(FLOAT_SPECIALS), 16)), np.float32).reshape(SHAPE)


def _misaligned() -> np.ndarray:
    raw = np.zeros(16 * 4 + 1, np.uint8)
    a = np.ndarray(SHAPE, np.float32, raw, 1)
    a[...] = _data()
    return a


def _read_only() -> np.ndarray:
    a = _data()
    a.flags.writeable = False
    return a


def _out(make: Callable[[], object]) -> Feed:
    return lambda: ({INPUT: _data()}, make())


def _aliasing() -> tuple[object, object]:
    x = _data()
    return {INPUT: x}, [x.reshape(-1)[:8].reshape(2, 4)]


FEEDS: dict[str, tuple[Feed, Expect]] = {
    "a ragged list": (_x([[1.0] * 8, [1.0] * 7]), NAMES_INPUT),
    "None": (_x(None), Expect(Want.ERROR, names=f"'{INPUT}'", forbid="has shape ()")),
    "2**70": (_x([[2**70] * 8] * 2), Expect(Want.ERROR, names=f"'{INPUT}'", forbid="dtype object")),
    "a string": (_x("abc"), NAMES_INPUT),
    "bytes": (_x(b"\0" * 64), NAMES_INPUT),
    "a dict": (_x({"a": 1}), NAMES_INPUT),
    "int32 for float32": (_x(_ones("int32")), NAMES_INPUT),
    "complex128": (_x(_ones("complex128")), NAMES_INPUT),
    "bool": (_x(_ones("bool")), NAMES_INPUT),
    "float16": (_x(_ones("float16")), Expect(Want.EITHER, names=f"'{INPUT}'")),
    "float64": (_x(lambda: _data().astype(np.float64)), RUNS),
    "rank 3": (_x(_ones(shape=(2, 8, 1))), NAMES_INPUT),
    "rank 1": (_x(_ones(shape=(16,))), NAMES_INPUT),
    "shape (8, 2)": (_x(_ones(shape=(8, 2))), NAMES_INPUT),
    "a scalar": (_x(1.0), NAMES_INPUT),
    "an empty array": (_x(_ones(shape=(0, 8))), NAMES_INPUT),
    "an object array of floats": (_x(lambda: _data().astype(object)), Expect(Want.EITHER, names=f"'{INPUT}'")),
    "an object array holding None": (_x(lambda: np.full(SHAPE, None)), NAMES_INPUT),
    "a missing input": (lambda: ({}, None), NAMES_INPUT),
    "an extra input": (lambda: ({INPUT: _data(), "extra": _data()}, None), Expect(Want.ERROR, names="'extra'")),
    "a misspelt input": (lambda: ({"X": _data()}, None), NAMES_INPUT),
    "a key that is not a string": (lambda: ({0: _data()}, None), NAMES_INPUT),
    "feeds that are a list": (lambda: ([_data()], None), NAMES_INPUT),
    "feeds that are None": (lambda: (None, None), NAMES_INPUT),
    "feeds that are a string": (lambda: (INPUT, None), NAMES_INPUT),
    "feeds that are an array": (lambda: (_data(), None), NAMES_INPUT),
    "NaN values": (_x(lambda: np.full(SHAPE, np.nan, np.float32)), RUNS),
    "inf values": (_x(lambda: np.full(SHAPE, np.inf, np.float32)), RUNS),
    "the fuzz test's special values": (_x(_specials), RUNS),
    "a strided view": (_x(lambda: np.linspace(-2, 2, 32, dtype=np.float32).reshape(2, 16)[:, ::2]), RUNS),
    "a Fortran-order array": (_x(lambda: np.asfortranarray(_data())), RUNS),
    "a read-only array": (_x(_read_only), RUNS),
    "a misaligned array": (_x(_misaligned), RUNS),
    "a big-endian array": (_x(lambda: _data().astype(">f4")), RUNS),
    "a broadcast view (stride 0)": (_x(lambda: np.broadcast_to(np.arange(8, dtype=np.float32), SHAPE)), RUNS),
    "a list of lists": (_x(lambda: _data().tolist()), RUNS),
    "a memoryview": (_x(lambda: memoryview(_data())), RUNS),
    "a masked array": (_x(lambda: np.ma.masked_array(_data(), mask=_data() > 0)), Expect(Want.EITHER, names=f"'{INPUT}'")),
    "out of the wrong shape": (_out(lambda: [np.empty((4, 2), np.float32)]), NAMES_OUTPUT),
    "out of the wrong dtype": (_out(lambda: [np.empty((2, 4), np.float64)]), NAMES_OUTPUT),
    "out that is one array, not a list": (_out(lambda: np.empty((2, 4), np.float32)), NAMES_OUTPUT),
    "out that is a strided view": (_out(lambda: [np.empty((2, 8), np.float32)[:, ::2]]), NAMES_OUTPUT),
    "out that is read-only": (_out(lambda: [np.broadcast_to(np.float32(0), (2, 4))]), NAMES_OUTPUT),
    "out sharing memory with the feed": (_aliasing, NAMES_OUTPUT),
}


def cases() -> list[Case]:
    return [Case(Category.FEEDS, name, Api(Action.FEED, arg=name), expect=expect) for name, (_, expect) in FEEDS.items()]
