"""cinn-run: compile a model, run it on random inputs, print its outputs and median latency."""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Mapping, Sequence

import numpy as np

from cinn.ir import Program

PADDLE_SUFFIXES = (".pdmodel", ".json")
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
    return p


def parse_input_shapes(specs: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """NAME=2,3,4 specs as {name: shape}; malformed ones raise ValueError naming the spec."""
    shapes = {}
    for spec in specs:
        name, sep, dims = spec.rpartition("=")
        try:
            if not sep or not name:
                raise ValueError
            shapes[name] = tuple(int(d) for d in dims.split(",")) if dims else ()
        except ValueError:
            raise ValueError(f"--input-shape {spec!r}: expected NAME=D0,D1,... with integer dims") from None
    return shapes


def load_model(path: str, input_shapes: Mapping[str, Sequence[int]]) -> Program:
    """A Program from a model file, chosen by its extension."""
    if path.endswith(PADDLE_SUFFIXES) or os.path.isdir(path):
        from cinn.frontend.paddle import load_paddle

        return load_paddle(path, input_shapes)
    if not path.endswith(".onnx"):
        raise _Unsupported(f"{path}: unknown model format (expected .onnx, .json, .pdmodel or a Paddle model directory)")
    from cinn.frontend.onnx import load_onnx

    return load_onnx(path, input_shapes)


class _Unsupported(Exception):
    """A model format this command cannot read (exit status 2)."""


def random_inputs(program: Program, seed: int) -> dict[str, np.ndarray]:
    """Random feeds: floats in [-1, 1), integers in {0, 1} (safe as indices), random bools."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for v in program.inputs:
        kind = np.dtype(v.dtype).kind
        if kind == "f":
            feeds[v.name] = rng.uniform(-1, 1, v.shape).astype(v.dtype)
        elif kind == "b":
            feeds[v.name] = rng.integers(0, 2, v.shape).astype(bool)
        else:
            feeds[v.name] = rng.integers(0, 2, v.shape).astype(v.dtype)
    return feeds


def _progress(done: int, total: int) -> None:
    end = "\n" if done == total else ""
    print(f"\rcompiling: {done}/{total} kernels", end=end, file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    import cinn

    program = load_model(args.model, parse_input_shapes(args.input_shape))
    start = time.perf_counter()
    exe = cinn.compile(program, target=args.target, fuse=not args.no_fuse, tuning_log=args.log, progress=_progress)
    compile_s = time.perf_counter() - start
    feeds = random_inputs(program, args.seed)
    outputs = exe.run(feeds)  # warm-up
    times = []
    for _ in range(args.repeat):
        start = time.perf_counter()
        exe.run(feeds)
        times.append(time.perf_counter() - start)
    print(f"model: {args.model} ({len(program.nodes)} ops, {exe.num_kernels} kernels, compiled in {compile_s:.2f} s)")
    for v, out in zip(program.outputs, outputs):
        print(f"output {v.name}: shape {tuple(out.shape)} {out.dtype}")
    print(f"median latency: {statistics.median(times) * 1e3:.3f} ms over {args.repeat} runs")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Exit status: 0 success, 1 the model failed to load, compile or run, 2 bad usage or unsupported format."""
    p = _parser()
    args = p.parse_args(argv)
    if args.repeat < 1:
        p.error("--repeat must be >= 1")
    try:
        return run(args)
    except _Unsupported as e:
        print(f"cinn-run: error: {e}", file=sys.stderr)
        return 2
    except USER_ERRORS as e:
        print(f"cinn-run: error: {e}", file=sys.stderr)
        return 1
