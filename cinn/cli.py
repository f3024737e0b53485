"""cinn-run: compile a model, run it on random inputs, print its outputs and median latency."""
from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from cinn import __version__, api
from cinn.build import default_cache_dir
from cinn.frontend.loading import UnsupportedModelFormat, load_model, parse_input_shapes
from cinn.machine import machine_peaks
from cinn.symbolic import require_static
from cinn.target import parse_target
from cinn.utils import SETTLE_S, median_seconds, random_feeds

USER_ERRORS = (ValueError, TypeError, NotImplementedError, OSError)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cinn-run", description="Compile a model with cinn, run it on random inputs, "
                                "print output names, shapes and the median latency.")
    p.add_argument("model", help="an ONNX model (.onnx), or a Paddle inference model (a directory, .json or .pdmodel)")
    p.add_argument("--target", default="llvm", help="llvm (host CPU, default) or cuda")
    p.add_argument("--input-shape", action="append", default=[], metavar="NAME=D0,D1,...",
                   help="shape of an input with symbolic dims (repeatable)")
    p.add_argument("--log", default=None, metavar="tuning.jsonl", help="schedule log with tuned schedules")
    p.add_argument("--repeat", type=int, default=10, help="timed runs; the median is printed (default: 10)")
    p.add_argument("--no-fuse", action="store_true", help="one kernel per op (the unfused baseline)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    p.add_argument("--profile", action="store_true",
                   help="also time each kernel inside a run and alone, with its GFLOP/s, GB/s and percent of the "
                        "machine's peak (CPU: measured once, cached), and the time outside the kernels")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return p


def _progress(done: int, total: int) -> None:
    end = "\n" if done == total else ""
    print(f"\rcompiling: {done}/{total} kernels", end=end, file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    program = require_static(load_model(args.model, parse_input_shapes(args.input_shape)),
                             "pass --input-shape NAME=D0,D1,... for each")
    start = time.perf_counter()
    exe = api.compile(program, target=args.target, fuse=not args.no_fuse, tuning_log=args.log, progress=_progress)
    compile_s = time.perf_counter() - start
    feeds = random_feeds(program.inputs, args.seed)
    outputs = exe.run(feeds)  # also the warm-up run
    seconds = median_seconds(lambda: exe.run(feeds), args.repeat, 0, SETTLE_S)
    print(f"model: {args.model} ({len(program.nodes)} ops, {exe.num_kernels} kernels, compiled in {compile_s:.2f} s)")
    for v, out in zip(program.outputs, outputs, strict=True):
        print(f"output {v.name}: shape {tuple(out.shape)} {out.dtype}")
    print(f"median latency: {seconds * 1e3:.3f} ms over {args.repeat} runs")
    print(f"memory: {exe.workspace_bytes / 2**20:.1f} MiB workspace per run + {exe.constant_bytes / 2**20:.1f} MiB constants")
    if args.profile:
        target = parse_target(args.target)
        peaks = None if target.is_cuda else machine_peaks(target, default_cache_dir())
        print(exe.profile(feeds, args.repeat, peaks).table())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Exit status: 0 success, 1 the model failed to load, compile or run, 2 bad usage or unsupported format."""
    p = _parser()
    args = p.parse_args(argv)
    if args.repeat < 1:
        p.error("--repeat must be >= 1")
    try:
        return run(args)
    except UnsupportedModelFormat as e:
        print(f"cinn-run: error: {e}", file=sys.stderr)
        return 2
    except USER_ERRORS as e:
        print(f"cinn-run: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
