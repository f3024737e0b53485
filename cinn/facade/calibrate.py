"""cinn-calibrate: measure the host CPU once (its FMA peak and memory bandwidth per core count, its FMA width, and
its bf16 dot products' rate against its FMAs') and cache the result, which the host's hardware model
(cinn.core.cpu_model) then decides by."""
from __future__ import annotations

import argparse
import os
import pathlib
import sys
from collections.abc import Sequence

from cinn import __version__
from cinn.compiler import llvm_calls
from cinn.core import cpu_model
from cinn.core.cpu_model import CpuModel, Peak
from cinn.core.target import parse_target
from cinn.facade.command import ExitStatus, UsageError, command, reading_arguments
from cinn.runtime import machine
from schedules import cpu_bf16

BUSY_SHARE = 0.5
DPBF16 = machine.StandIn(cpu_bf16.STAND_IN, llvm_calls.resolved)  # vdpbf16ps, as the bf16 kernels call it


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cinn-calibrate", description="Measure the host CPU's FMA peak and memory "
                                "bandwidth (on one core and on all of them) and cache them for cinn's hardware model; "
                                "prints the model.")
    p.add_argument("--cores", type=int, action="append", metavar="N",
                   help="core counts to measure (repeatable; default: 1 and all this process may use)")
    p.add_argument("--quick", action="store_true", help="shorter measurements (less exact; for tests)")
    p.add_argument("--cache-dir", type=pathlib.Path, default=None,
                   help="where to cache the result (default: $CINN_CACHE_DIR, else ~/.cache/cinn)")
    p.add_argument("--show", action="store_true", help="print the model as it is now, measuring nothing")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return p


def _progress(step: str) -> None:
    if sys.stderr.isatty():  # redrawn in place on a terminal; a log gets the result alone
        print(f"\r\033[Kmeasuring {step}...", end="", file=sys.stderr, flush=True)


def describe(model: CpuModel, path: pathlib.Path) -> str:
    """The model as a few lines of text."""
    c = model.caches
    caches = f"L1d {c.l1d // 1024} KiB, L2 {c.l2 // 1024} KiB" + (f", L3 {c.l3 // 1024} KiB" if c.l3 else "")
    extensions = ", ".join(n for n, has in (("VNNI", model.vnni), ("BF16", model.bf16), ("AMX", model.amx)) if has)
    source = f"measured ({path})" if model.calibrated else "estimated (run cinn-calibrate to measure)"
    lines = [f"cpu: {model.name}", f"vectors: {model.vector_bits} bits, {model.vector_registers} registers",
             f"FMA: {model.fma_ports} x {model.fma_width} bits per cycle", f"caches: {caches}",
             f"extensions: {extensions or 'none'}"]
    if model.bf16:
        pays = "precision='auto' computes in bf16" if model.bf16_pays else "precision='auto' keeps fp32"
        rate = f"{model.bf16_rate:.2f} times the FMAs' FLOP rate" if model.bf16_rate else "rate not known"
        lines.append(f"bf16 dot products: {rate} ({pays})")
    lines.append(f"peaks: {source}")
    lines += [f"  {p.cores} core{'s' if p.cores > 1 else ''}: {p.flops / 1e9:.1f} GFLOP/s FMA, "
              f"{p.bandwidth / 1e9:.1f} GB/s memory" for p in model.peaks]
    return "\n".join(lines)


def _warn_if_busy(peaks: Sequence[Peak]) -> None:
    """A note where all cores together did under BUSY_SHARE of one core's FMA rate each: others were running."""
    one = next((p for p in peaks if p.cores == 1), None)
    for p in peaks:
        if one is not None and p.cores > 1 and p.flops < BUSY_SHARE * p.cores * one.flops:
            print(f"cinn-calibrate: note: {p.cores} cores did {p.flops / (p.cores * one.flops):.0%} of {p.cores} "
                  "times one core's FMA rate: other processes may be running; measure again when the machine is idle",
                  file=sys.stderr)


def _cores(args: argparse.Namespace) -> list[int]:
    available = len(os.sched_getaffinity(0))
    cores = sorted(set(args.cores or (1, available)))
    bad = [n for n in cores if not 1 <= n <= available]
    if bad:
        raise UsageError(f"--cores {bad[0]}: this process may use 1 to {available} cores")
    return cores


@command("cinn-calibrate")
def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    with reading_arguments():
        cores = _cores(args)
        cache_dir = args.cache_dir or cpu_model.default_cache_dir()
    host = parse_target(f"llvm -num-cores={max(cores)}")
    path = cpu_model.calibration_path(host.mcpu, cache_dir)
    if not args.show:
        measured = machine.calibrate(host, cores, args.quick, _progress, DPBF16)
        if sys.stderr.isatty():
            print("\r\033[K", end="", file=sys.stderr, flush=True)
        _warn_if_busy(measured.peaks)
        old = cpu_model.read_calibration(path, host.mcpu)
        machine.save(path, cpu_model.merged(old, measured))
    print(describe(cpu_model.host_model(path), path))
    return ExitStatus.OK


if __name__ == "__main__":
    sys.exit(main())
