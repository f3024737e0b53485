"""cinn-run: compile a model, run it on random inputs, print its outputs and median latency."""
from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence

from cinn import __version__
from cinn.compiler.build import default_cache_dir
from cinn.compiler.passes.manager import ir_printer, timing_table
from cinn.compiler.passes.pipeline import PASSES, disabled_passes
from cinn.core.ir import Program
from cinn.core.symbolic import require_static
from cinn.core.target import Target, parse_target
from cinn.core.utils import SETTLE_S, median_seconds, random_feeds
from cinn.facade import api
from cinn.facade.command import ExitStatus, UsageError, command, reading_arguments
from cinn.runtime.cuda_module import device_present
from cinn.runtime.machine import machine_peaks
from frontend.loading import load_model, parse_input_shapes


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
    p.add_argument("--disable-pass", action="append", default=[], metavar="NAME",
                   help=f"skip a graph pass (repeatable): {', '.join(each.name for each in PASSES if not each.required)}")
    p.add_argument("--pass-timing", action="store_true", help="also print each graph pass's compile time")
    # cinn.Precision's values, written out: importing it loads TVM, which --help should not wait for
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16", "tf32", "auto"],
                   help="what matmuls compute in (cinn.compile's precision; bf16 on a CPU needs AVX512_BF16; fp16 "
                        "and tf32 are for CUDA targets' tensor cores)")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return p


def _progress(done: int, total: int) -> None:
    tty = sys.stderr.isatty()  # redrawn in place on a terminal, a line each in a log
    print(("\r" if tty else "") + f"compiling: {done}/{total} kernels", end="" if tty and done < total else "\n",
          file=sys.stderr, flush=True)


def _read_arguments(args: argparse.Namespace) -> tuple[Target, Program]:
    """The target and the model; UsageError for a bad argument or a file that is missing or cannot be read."""
    with reading_arguments():
        target = parse_target(args.target)
        if target.is_cuda and not device_present():  # found now, not after the kernels are built
            raise UsageError("--target cuda: no CUDA device present on this machine")
        if args.log is not None and not os.path.isfile(args.log):
            raise UsageError(f"--log {args.log}: no such schedule log")
        disabled_passes(args.disable_pass, "--disable-pass")
        ir_printer()  # a bad $CINN_PRINT_IR_AFTER is found now, not after the model is read
        return target, require_static(load_model(args.model, parse_input_shapes(args.input_shape)),
                                      "pass --input-shape NAME=D0,D1,... for each")


def run(args: argparse.Namespace) -> int:
    target, program = _read_arguments(args)
    start = time.perf_counter()
    exe = api.compile(program, target=args.target, fuse=not args.no_fuse, tuning_log=args.log, progress=_progress,
                      disabled_passes=args.disable_pass, precision=args.precision)
    compile_s = time.perf_counter() - start
    feeds = random_feeds(program.inputs, args.seed)
    outputs = exe.run(feeds)  # also the warm-up run
    seconds = median_seconds(lambda: exe.run(feeds), args.repeat, 0, SETTLE_S)
    print(f"model: {args.model} ({len(program.nodes)} ops, {exe.num_kernels} kernels, compiled in {compile_s:.2f} s)")
    for v, out in zip(program.outputs, outputs, strict=True):
        print(f"output {v.name}: shape {tuple(out.shape)} {out.dtype}")
    print(f"median latency: {seconds * 1e3:.3f} ms over {args.repeat} runs")
    print(f"memory: {exe.workspace_bytes / 2**20:.1f} MiB workspace per run + {exe.constant_bytes / 2**20:.1f} MiB constants")
    if args.pass_timing:
        print(timing_table(exe.pass_times) if exe.pass_times else
              "pass timing: no pass ran (the compile came from the compile cache)")
    if args.profile:
        peaks = None if target.is_cuda else machine_peaks(target, default_cache_dir())
        print(exe.profile(feeds, args.repeat, peaks).table())
    return ExitStatus.OK


@command("cinn-run")
def main(argv: Sequence[str] | None = None) -> int:
    """Exit status: see cinn.facade.command.ExitStatus."""
    p = _parser()
    args = p.parse_args(argv)
    if args.repeat < 1:
        p.error("--repeat must be >= 1")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
