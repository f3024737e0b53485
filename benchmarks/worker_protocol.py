"""The cinn-bench worker's side of its protocol, in the standard library and numpy alone.

A worker prepares its engine, saves a first run's outputs (.npz), says it is ready with one JSON line of facts on
stdout, then times one round per line it reads on stdin, replying `{"ms": ...}` each time, until the end of its input.
A peer's worker that runs in another Python (Paddle Inference's, `benchmarks.paddle_worker`) imports this module and
nothing of cinn, so every engine is timed by the same code.
"""
from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TextIO, cast

import numpy as np

FIRST_ROUND_SETTLE_S = 1.0  # untimed runs before the first round: right after a compile the cores are slow
ROUND_SETTLE_S = 0.2  # before each later round: long enough for another engine's idle threads to stop spinning

Run = Callable[[], Sequence[np.ndarray]]


def round_ms(run: Run, repeat: int, warmup: int, first: bool) -> float:
    """One round: the median milliseconds of `repeat` timed runs, after untimed ones that last the settling time (from
    this call, not from the first run: a VM can stall between) and `warmup` more."""
    deadline = time.perf_counter() + (FIRST_ROUND_SETTLE_S if first else ROUND_SETTLE_S)
    while time.perf_counter() < deadline:
        run()
    for _ in range(warmup):
        run()
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        run()
        samples.append(time.perf_counter() - t0)
    return float(np.median(samples)) * 1e3


def serve(run: Run, repeat: int, warmup: int, commands: TextIO, replies: TextIO) -> None:
    """Time a round for every line read from `commands`, replying with one JSON line each, until end of input."""
    for k, _ in enumerate(commands):
        replies.write(json.dumps({"ms": round_ms(run, repeat, warmup, first=k == 0)}) + "\n")
        replies.flush()


def save_outputs(path: str, outputs: Sequence[np.ndarray]) -> None:
    """A run's outputs in order, as arr_0, arr_1, ... of an .npz file."""
    np.savez(path, *[np.asarray(o) for o in outputs])


def load_outputs(path: str) -> list[np.ndarray]:
    """The outputs save_outputs wrote, in order."""
    with np.load(path) as data:
        return [data[f"arr_{i}"] for i in range(len(data.files))]


def save_feeds(path: str, feeds: Mapping[str, np.ndarray]) -> None:
    """Named input arrays as an .npz file."""
    np.savez(path, **cast(dict[str, Any], feeds))  # names, not savez's own keywords


def load_feeds(path: str) -> dict[str, np.ndarray]:
    """Named input arrays from an .npz file."""
    with np.load(path) as data:
        return {name: data[name] for name in data.files}


def reply_channel() -> TextIO:
    """The parent's pipe, kept for the replies alone: from here on, whatever a library prints goes to stderr."""
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    return replies


def work(prepare: Callable[[], tuple[Run, Mapping[str, Any]]], repeat: int, warmup: int, outputs_path: str | None,
         errors: tuple[type[BaseException], ...], label: str) -> int:
    """A worker's life: prepare its engine (an error of the kinds `errors` is one line on stderr, exit status 1), save
    a first run's outputs, say it is ready with its facts, then serve rounds; the exit status."""
    replies = reply_channel()
    try:
        run, facts = prepare()
        outputs = run()
    except errors as err:
        print(f"[cinn-bench] {label}: {err}", file=sys.stderr, flush=True)
        return 1
    if outputs_path:
        save_outputs(outputs_path, outputs)
    replies.write(json.dumps(dict(facts)) + "\n")
    replies.flush()
    serve(run, repeat, warmup, sys.stdin, replies)
    return 0
