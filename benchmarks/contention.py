"""numpy's BLAS and cinn in one process: a cinn run right after a numpy matmul and a numpy matmul right after a cinn
run, against each alone, with OpenBLAS's idle threads spinning (its default) and with cinn's setting.

``python -m benchmarks.contention [MODEL]``: each setting runs in its own interpreter.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

import numpy as np

import cinn
from benchmarks.harness import spawn_module
from cinn.core.utils import interleaved_medians, median_seconds, wall_seconds
from cinn.runtime.worker_pool import die_with_spawner
from frontend.zoo import get_model

MATMUL = 512
SETTINGS = {"OpenBLAS default (threads spin ~0.1 s)": ("OPENBLAS_THREAD_TIMEOUT", "28"),
            "cinn's OPENBLAS_THREAD_TIMEOUT=4": ("OPENBLAS_THREAD_TIMEOUT", "4")}


def _worker(model_name: str, repeat: int) -> dict[str, float]:
    """The four medians in ms, in this process (whose environment the parent set before numpy loaded OpenBLAS)."""
    model = get_model(model_name)
    exe = cinn.compile(model.program)
    feeds = dict(model.feeds)
    a = np.random.default_rng(0).standard_normal((MATMUL, MATMUL)).astype(np.float32)

    def run() -> object:
        return exe.run(feeds)

    def matmul() -> object:
        return a @ a

    def run_after_matmul() -> float:
        matmul()
        return wall_seconds(run)()

    def matmul_after_run() -> float:
        run()
        return wall_seconds(matmul)()

    # alone first, before any BLAS call has started OpenBLAS's threads
    alone = {"cinn alone": median_seconds(run, repeat, 3), "matmul alone": median_seconds(matmul, repeat, 3)}
    mixed = interleaved_medians({"cinn after matmul": run_after_matmul, "matmul after cinn": matmul_after_run}, repeat, 3)
    return {k: v * 1e3 for k, v in (alone | mixed).items()}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.contention", description=__doc__.splitlines()[0])
    p.add_argument("model", nargs="?", default="encoder", help="built-in model (default: encoder)")
    p.add_argument("--repeat", type=int, default=30, help="timed rounds; medians are reported (default: 30)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        print(json.dumps(_worker(a.model, a.repeat)), flush=True)
        return 0
    print(f"{'setting':<40} {'cinn alone':>11} {'after matmul':>13} {'matmul alone':>13} {'after cinn':>11}  (ms)")
    for label, (var, value) in SETTINGS.items():
        args = ["--worker", a.model, "--repeat", str(a.repeat)]
        r = json.loads(spawn_module("benchmarks.contention", args, 1800, env={var: value}))
        print(f"{label:<40} {r['cinn alone']:>11.3f} {r['cinn after matmul']:>13.3f} {r['matmul alone']:>13.3f} "
              f"{r['matmul after cinn']:>11.3f}")
    return 0


if __name__ == "__main__":
    die_with_spawner()
    sys.exit(main())
