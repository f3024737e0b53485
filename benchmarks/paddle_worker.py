"""Paddle Inference's cinn-bench worker: ``python -m benchmarks.paddle_worker MODEL_FILE --feeds INPUTS.npz``.

cinn-bench starts it in a Python that has paddle (`--paddle-python`), which need not have cinn's dependencies: it
imports paddle, numpy and two modules of this package that import nothing else (`paddle_export`, `worker_protocol`),
and speaks the protocol of cinn's own workers (`benchmarks.harness`).
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from benchmarks.paddle_export import PaddleInference
from benchmarks.worker_protocol import load_feeds, work

Runner = Callable[[str, int], Any]  # (model file, threads) -> an object whose run(feeds) gives the outputs


def main(argv: Sequence[str] | None = None, runner: Runner = PaddleInference) -> int:
    """Prepare Paddle Inference on one model, then time a round per line read on stdin; the exit status."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.paddle_worker", description=__doc__.splitlines()[0])
    p.add_argument("model", help="a Paddle inference model file (.json or .pdmodel, its .pdiparams beside it)")
    p.add_argument("--feeds", required=True, help="the named inputs, an .npz file")
    p.add_argument("--outputs", default=None, help="save a first run's outputs to this .npz file")
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="math library threads (default: all cores)")
    a = p.parse_args(argv)

    def ready() -> tuple[Callable[[], list[np.ndarray]], dict[str, Any]]:
        feeds = load_feeds(a.feeds)
        engine = runner(a.model, a.threads)
        return (lambda: engine.run(feeds)), {}

    # paddle's errors come as many types (its C++ checks among them): any is one line, and the engine's failure
    return work(ready, a.repeat, a.warmup, a.outputs, (Exception,), f"{a.model}: paddle-inference")


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group: cinn-bench itself says so, once
        sys.exit(128 + signal.SIGINT)  # as a shell reports a process that SIGINT ended
