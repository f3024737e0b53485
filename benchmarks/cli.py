"""cinn-bench: fused vs unfused (vs tuned) cinn vs onnxruntime, OpenVINO and Paddle Inference on the built-in models,
model files or a Paddle model set."""
from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence

from benchmarks import paddle_models, zoo_manifest
from benchmarks.harness import BenchConfig, Engine, ModelRef, PaddlePeer, find_baseline, find_paddle, run_benchmarks
from benchmarks.paddle_export import PaddleFormat
from benchmarks.paddle_models import Manifest
from benchmarks.report import format_table, write_csv, write_plot
from cinn import __version__
from cinn.core.target import parse_target
from cinn.facade.command import ExitStatus, command, reading_arguments, seconds
from frontend.loading import load_model, parse_input_shapes
from frontend.zoo import MODELS, is_model_name


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="cinn-bench",
        description="Median latency of cinn (fused, unfused, tuned), onnxruntime, OpenVINO and, on Paddle models, Paddle "
        "Inference on built-in models, model files or a Paddle model set; each engine runs in its own process and the "
        "outputs are cross-checked.",
    )
    p.add_argument("model", nargs="*", help=f"models to run (default: all built-in ones, or the --paddle-set's): "
                   f"{', '.join(MODELS)}, model files (.onnx, which onnxruntime runs as it is; Paddle .pdmodel/.json or a "
                   "directory) fed seeded random inputs, or the names of --paddle-set models")
    p.add_argument("--models", default="", help="comma-separated models (added to the positional ones)")
    p.add_argument("--zoo", default=None, metavar="DIR",
                   help="also run every model of a zoo directory (python -m benchmarks.zoo export DIR), each at the "
                        "input shapes of its manifest")
    p.add_argument("--target", default="llvm", help="cinn target (default: llvm, the host CPU)")
    p.add_argument("--log", default=None, metavar="tuning.jsonl", help="schedule log: adds a tuned cinn build")
    p.add_argument("--repeat", type=int, default=20, help="timed runs per engine; the median is reported (default: 20)")
    p.add_argument("--rounds", type=int, default=1,
                   help="interleaved rounds: every engine (each in its own process, kept over the rounds) times one "
                        "round in turn; the median over rounds is reported, and the median of the ratios within rounds "
                        "(default: 1)")
    p.add_argument("--warmup", type=int, default=3, help="untimed runs before timing (default: 3)")
    p.add_argument("--csv", default=None, metavar="PATH", help="also write the table as CSV")
    p.add_argument("--plot", default=None, metavar="PATH", help="also write a latency bar chart (PNG)")
    p.add_argument("--small", action="store_true", help="small built-in model sizes (a quick smoke test)")
    p.add_argument("--input-shape", action="append", default=[], metavar="NAME=D0,D1,...",
                   help="shape of a model file's input with symbolic dims (repeatable)")
    p.add_argument("--baseline", default=None, metavar="PYTHON",
                   help="also time the fused build of the cinn installed for this Python interpreter (engine "
                        "cinn@baseline; e.g. an older checkout's .venv/bin/python), and this cinn's paired ratio to it")
    p.add_argument("--paddle-set", default=None, metavar="DIR",
                   help="a Paddle model set (written by python -m benchmarks.paddle_models export DIR): its models, fed "
                        "their saved inputs, checked against Paddle Inference; onnxruntime and OpenVINO run their "
                        "paddle2onnx files")
    p.add_argument("--paddle-format", default=PaddleFormat.PIR.value, choices=[f.value for f in PaddleFormat],
                   help="which saved format of the set's models cinn and Paddle Inference run (default: pir)")
    p.add_argument("--paddle-python", default=None, metavar="PYTHON",
                   help="the Python that runs Paddle Inference on Paddle models: one with paddlepaddle (default: this one)")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "auto"],
                   help="cinn's precision (cinn.compile); other than fp32 adds OpenVINO at its default precision")
    p.add_argument("--no-unfused", dest="unfused", action="store_false",
                   help="leave out the unfused cinn build (one compile less per model)")
    p.add_argument("--timeout", type=seconds, default=1800.0,
                   help="seconds an engine's worker may take to get ready (import, compile) or to time one round "
                        "(default: 1800)")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return p


def _zoo_models(directory: str) -> dict[str, dict[str, tuple[int, ...]]]:
    """A zoo directory's model files, each with its inputs' shapes (a dynamic model's at its export's sizes)."""
    with reading_arguments():
        manifest = zoo_manifest.read_manifest(directory)
    return {os.path.join(directory, e.file): e.shapes() for e in manifest.models}


def _model_names(names: list[str], p: argparse.ArgumentParser) -> list[str]:
    unknown = [m for m in names if m not in MODELS and not is_model_name(m)]
    if unknown:
        p.error(f"unknown model(s) {', '.join(unknown)}: neither a model file nor a built-in model ({', '.join(MODELS)})")
    missing = [m for m in names if is_model_name(m) and not os.path.exists(m)]
    if missing:
        p.error(f"no such model file: {', '.join(missing)}")
    return list(dict.fromkeys(names))


def _set_models(manifest: Manifest, names: Sequence[str], fmt: PaddleFormat) -> list[ModelRef]:
    """The named models of a set (all of them if none is named) saved in `fmt`, each fed its saved inputs, its ONNX
    peers on its paddle2onnx file; one line for each left out or without an ONNX file."""
    refs = []
    for entry in [e for e in manifest.models if e.name in names] or manifest.models:
        if fmt not in entry.models or entry.inputs_file is None:
            why = entry.errors.get(fmt.value, "not exported")
            print(f"[cinn-bench] {entry.name}: left out, not saved in the {fmt.value} format ({why})", file=sys.stderr)
            continue
        if entry.onnx is None:
            why = entry.errors.get("onnx", "not exported")
            print(f"[cinn-bench] {entry.name}: no onnxruntime or OpenVINO, paddle2onnx failed ({why})", file=sys.stderr)
        refs.append(ModelRef(str(manifest.path(entry.models[fmt])), entry.name, str(manifest.path(entry.inputs_file)),
                             str(manifest.path(entry.onnx)) if entry.onnx else None, paddle_set=True))
    return refs


def _paddle(refs: Sequence[ModelRef], args: argparse.Namespace, p: argparse.ArgumentParser) -> PaddlePeer | None:
    """The Python that runs Paddle Inference, where a model is a Paddle one: required with --paddle-set or
    --paddle-python (else a usage error naming the extra), else left out with a line saying why."""
    if not any(r.is_paddle for r in refs):
        return None
    try:
        peer = find_paddle(args.paddle_python or sys.executable, args.timeout)
    except ValueError as err:
        if args.paddle_set is not None or args.paddle_python is not None:
            p.error(f"--paddle-python {err}")
        print(f"[cinn-bench] no Paddle Inference: {err}", file=sys.stderr)
        return None
    print(f"[cinn-bench] {Engine.PADDLE.value}: paddle {peer.version} ({peer.python})", file=sys.stderr)
    return peer


def _check_model_files(names: Sequence[str], shapes: Mapping[str, Mapping[str, tuple[int, ...]]]) -> None:
    """Import each model file once here: one that cannot be read is a usage error, not a failure of every engine."""
    with reading_arguments():
        for name in names:
            if is_model_name(name):
                load_model(name, shapes[name])


@command("cinn-bench")
def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; exit status: see cinn.facade.command.ExitStatus (1: an engine failed or outputs disagree)."""
    p = _parser()
    args = p.parse_args(argv)
    if args.repeat < 1 or args.warmup < 0 or args.rounds < 1:
        p.error("--repeat and --rounds must be >= 1 and --warmup >= 0")
    if args.log is not None and not os.path.isfile(args.log):
        p.error(f"--log {args.log}: no such schedule log (create one with cinn-tune)")
    try:
        parse_target(args.target)
    except ValueError as err:
        p.error(f"--target: {err}")
    try:
        given = parse_input_shapes(args.input_shape)
    except ValueError as err:
        p.error(str(err))
    names = [m.strip() for m in list(args.model) + args.models.split(",") if m.strip()]
    refs: list[ModelRef] = []
    if args.paddle_set is not None:
        try:
            manifest = paddle_models.read_manifest(args.paddle_set)
        except ValueError as err:
            p.error(f"--paddle-set {err}")
        refs = _set_models(manifest, names, PaddleFormat(args.paddle_format))
        if not refs:
            p.error(f"--paddle-set {args.paddle_set}: no model saved in the {args.paddle_format} format")
        names = [n for n in names if manifest.entry(n) is None]
    zoo = _zoo_models(args.zoo) if args.zoo is not None else {}
    if not names and not refs and not zoo:
        names = list(MODELS)
    names = _model_names(names + list(zoo), p)
    # a zoo model's shapes are its manifest's, unless --input-shape names one of its inputs
    shapes = {n: {**zoo[n], **{k: v for k, v in given.items() if k in zoo[n]}} if n in zoo else given for n in names}
    # not a zoo's: each is a valid ONNX file that onnxruntime ran, and one that cinn cannot import is a finding of the
    # benchmark (its cinn engines fail), not a reason to run none
    _check_model_files([n for n in names if n not in zoo], shapes)
    refs += [ModelRef(n, input_shapes=tuple(shapes[n].items()) if n in zoo else None) for n in names]
    baseline = None
    if args.baseline is not None:
        try:
            baseline = find_baseline(args.baseline, args.timeout)
        except ValueError as err:
            p.error(f"--baseline {err}")
        print(f"[cinn-bench] cinn@baseline: the cinn in {baseline.cinn_dir} ({baseline.python})", file=sys.stderr)
    config = BenchConfig(target=args.target, repeat=args.repeat, warmup=args.warmup, rounds=args.rounds, tuning_log=args.log,
                         small=args.small, timeout=args.timeout, input_shapes=tuple(given.items()), baseline=baseline,
                         unfused=args.unfused, paddle=_paddle(refs, args, p), precision=args.precision)
    results = run_benchmarks(refs, config)
    tuned = args.log is not None
    print(format_table(results, tuned, baseline is not None))
    if args.csv:
        write_csv(results, tuned, args.csv, baseline is not None)
    if args.plot:
        write_plot(results, config.engines() + ((Engine.PADDLE,) if config.paddle else ()), args.plot)
    failed = [r.model for r in results if r.failed]
    if failed:
        print(f"cinn-bench: FAILED for {', '.join(failed)} (see messages above)", file=sys.stderr)
        return ExitStatus.FAILED
    return ExitStatus.OK
