"""cinn-quantize: post-training static int8 quantization of a model (cinn.quantize) from calibration data in an .npz,
written as a cinn program file (.cinn) that cinn-run, cinn.load_model and cinn.compile read.

Why a .cinn file and not an ONNX QDQ model: cinn's only Program-to-ONNX exporter (benchmarks.onnx_export) covers a
handful of ops and sits in the layer above this one, and a model imported from ONNX or Paddle holds ops it has no
converter for (pooling, concat, resize, ...); cinn's JSON IR (cinn.core.ir_json) holds every op exactly, and there
is no compiled-model file yet. The .cinn file is that IR and its constants in one .npz.

The calibration .npz holds an array per model input: the samples stacked on a new leading axis ([samples, *input
shape]), or one sample of the input's own shape.
"""
from __future__ import annotations

import argparse
import os
import sys
import zipfile
from collections.abc import Sequence

import numpy as np

from cinn import __version__
from cinn.core.ir import Program
from cinn.core.ir_json import save_program
from cinn.core.symbolic import require_static
from cinn.core.target import parse_target
from cinn.facade.command import ExitStatus, UsageError, command, reading_arguments
from cinn.facade.quant_calibration import CalibrationMethod
from cinn.facade.quantize import DEFAULT_MAX_ERROR, DEFAULT_PERCENTILE, Feed, OpKind, QuantizePolicy, check_feed, quantize
from frontend.loading import PROGRAM_SUFFIX, load_model, parse_input_shapes


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cinn-quantize", description="Quantize a model's convs and matmuls to int8 "
                                "(uint8 activations per tensor, int8 weights per output channel) from calibration "
                                "data; write the quantized program and print its error against float32.")
    p.add_argument("model", help="an ONNX model (.onnx), a Paddle inference model, or a cinn program (.cinn)")
    p.add_argument("--calibration", required=True, metavar="DATA.npz",
                   help="an array per model input, the samples stacked on a leading axis")
    p.add_argument("--held-back", default=None, metavar="DATA.npz",
                   help="samples for the accuracy report only (default: a quarter of the calibration samples)")
    p.add_argument("-o", "--output", required=True, metavar=f"OUT{PROGRAM_SUFFIX}",
                   help="where to write the quantized program (cinn's program file; cinn-run reads it)")
    p.add_argument("--method", choices=[m.value for m in CalibrationMethod], default=CalibrationMethod.MINMAX.value,
                   help="how each activation's range is picked (default: minmax)")
    p.add_argument("--percentile", type=float, default=DEFAULT_PERCENTILE,
                   help=f"the per cent of the values --method percentile keeps (default: {DEFAULT_PERCENTILE})")
    p.add_argument("--no-bias-correction", action="store_true",
                   help="leave out the per-channel correction of the mean error the weights' rounding causes")
    p.add_argument("--max-error", type=float, default=DEFAULT_MAX_ERROR, metavar="E",
                   help="the error budget: relative L2 error against float32 on the held-back samples; over it, the "
                   "layers that cost most stay in float, the fewest that meet it; 'inf': no budget (default: "
                   f"{DEFAULT_MAX_ERROR})")
    p.add_argument("--exclude-op", action="append", default=[], choices=[k.value for k in OpKind],
                   help="leave every op of this kind in float (repeatable)")
    p.add_argument("--exclude-node", action="append", default=[], metavar="NAME",
                   help="leave the node of this name (or output value name) in float (repeatable)")
    p.add_argument("--input-shape", action="append", default=[], metavar="NAME=D0,D1,...",
                   help="shape of an input with symbolic dims (repeatable)")
    p.add_argument("--target", default="llvm", help="the CPU target calibration and the report run on (default: llvm)")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return p


def read_feeds(path: str, program: Program, what: str) -> list[Feed]:
    """The samples of an .npz (see the module); ValueError naming what is missing or of the wrong shape."""
    if not os.path.isfile(path):
        raise UsageError(f"{what} {path}: no such file")
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (zipfile.BadZipFile, AttributeError, ValueError, OSError):  # AttributeError: an .npy, not an .npz
        raise UsageError(f"{what} {path}: not an .npz of arrays (numpy.savez writes one)") from None
    counts = {}
    for v in program.inputs:
        if v.name not in arrays:
            raise UsageError(f"{what} {path}: no array for the model's input {v.name!r} (it has {sorted(arrays) or 'none'})")
        a = arrays[v.name]
        if a.shape == v.shape:
            arrays[v.name] = a[None]
        elif a.shape[1:] != v.shape:
            raise UsageError(f"{what} {path}: array {v.name!r} has shape {a.shape}; the input takes {v.shape}, so the "
                             f"array should be [samples, {', '.join(map(str, v.shape))}]")
        counts[v.name] = arrays[v.name].shape[0]
    if len(set(counts.values())) > 1:
        raise UsageError(f"{what} {path}: the inputs have different numbers of samples: {counts}")
    samples = next(iter(counts.values()), 1)
    if samples == 0:
        raise UsageError(f"{what} {path}: no samples")
    return [check_feed(program, {v.name: arrays[v.name][i] for v in program.inputs}, f"{what} {path}")
            for i in range(samples)]


def _progress(stage: str, done: int, total: int) -> None:
    tty = sys.stderr.isatty()  # redrawn in place on a terminal, a line each in a log
    print(("\r" if tty else "") + f"{stage}: {done}/{total}", end="" if tty and done < total else "\n",
          file=sys.stderr, flush=True)


@command("cinn-quantize")
def main(argv: Sequence[str] | None = None) -> int:
    """Exit status: see cinn.facade.command.ExitStatus; FAILED when the error is over --max-error even with layers
    kept in float (the program is written all the same, the report says by how much)."""
    p = _parser()
    args = p.parse_args(argv)
    if not 0 < args.percentile <= 100:
        p.error("--percentile must be in (0, 100]")
    if not args.max_error >= 0:
        p.error("--max-error must be 0 or more")
    with reading_arguments():
        if not args.output.endswith(PROGRAM_SUFFIX):
            raise UsageError(f"-o {args.output}: cinn-quantize writes a cinn program file: name it *{PROGRAM_SUFFIX}")
        parse_target(args.target)
        program = require_static(load_model(args.model, parse_input_shapes(args.input_shape)),
                                 "pass --input-shape NAME=D0,D1,... for each")
        calibration = read_feeds(args.calibration, program, "--calibration")
        held_back = None if args.held_back is None else read_feeds(args.held_back, program, "--held-back")
    policy = QuantizePolicy(frozenset(OpKind) - {OpKind(k) for k in args.exclude_op}, frozenset(args.exclude_node))
    result = quantize(program, calibration, CalibrationMethod(args.method), held_back_feeds=held_back, policy=policy,
                      percentile=args.percentile, bias_correction=not args.no_bias_correction,
                      max_error=args.max_error, target=args.target, progress=_progress)
    save_program(result.program, args.output)
    print(result.report)
    print(f"wrote {args.output}")
    return ExitStatus.OK if result.report.within_budget else ExitStatus.FAILED


if __name__ == "__main__":
    sys.exit(main())
