"""cinn-tune: tune every kernel of a model, append the measured schedules to a log, print a per-task summary."""
from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Sequence

from autotune.algorithms import select_winograd
from autotune.cost_model import CostModel
from autotune.measure import BUILD_LIMIT_S, MAX_LOAD_SCALE, LocalRunner, MeasureConfig, RpcRunner
from autotune.task import extract_tasks
from autotune.tuner import Progress, TaskSummary, TuneConfig, tune
from cinn import __version__
from cinn.compiler.passes.winograd import ALGORITHM_PREFIX, DIRECT, ConvShape
from cinn.core.ir import Program
from cinn.core.symbolic import SymbolicProgram, bindings_of, require_static
from cinn.core.target import parse_target
from cinn.facade.command import ExitStatus, UsageError, command, reading_arguments, seconds
from cinn.facade.in_model import Verdict, judge_in_model
from cinn.runtime.cuda_module import device_present
from frontend.loading import load_model, parse_input_shapes
from frontend.zoo import MODELS, get_model, is_model_name

INTERRUPTED = "interrupted; the log is consistent; continue with --resume"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cinn-tune", description="Tune the fused kernels of a model and append every "
                                "measured schedule to a JSON-lines log that cinn.compile(..., tuning_log=LOG) applies.")
    p.add_argument("model", help=f"a model file (.onnx, Paddle .pdmodel/.json or its directory) or a built-in model: "
                   f"{', '.join(MODELS)}")
    p.add_argument("--target", default="llvm", help="llvm (host CPU, default) or cuda")
    p.add_argument("--trials", type=int, default=64, help="measured candidates over all tasks (default: 64)")
    p.add_argument("--log", required=True, metavar="tuning.jsonl", help="schedule log to append to")
    p.add_argument("--resume", action="store_true", help="continue from the log: its records count towards --trials")
    p.add_argument("--timeout", type=seconds, default=10.0, metavar="S", help="seconds allowed per candidate run")
    p.add_argument("--build-timeout", type=seconds, default=None, metavar="S",
                   help="seconds allowed per candidate build; a longer one is cut off and logged as a failed candidate "
                   f"(default: {BUILD_LIMIT_S:g}, stretched by the machine's load up to {MAX_LOAD_SCALE:g} times)")
    p.add_argument("--repeat", type=int, default=None, help="timed repeats per candidate (default: 10 with the cache "
                   "flush, each one call; 3 without, each at least 20 ms of calls)")
    p.add_argument("--cache-flush", action=argparse.BooleanOptionalAction, default=True,
                   help="time each candidate (CPU) with the caches of its weights and outputs flushed, as a kernel finds "
                   "them inside a model: schedules that win only on hot caches made a tuned encoder 16%% slower than "
                   "untuned (default: on)")
    p.add_argument("--batch", type=int, default=16, help="candidates measured per round (default: 16)")
    p.add_argument("--verify", type=int, default=3, metavar="K", help="re-measure each task's K best schedules with "
                   "its default at the end, so a lucky measurement does not pick the schedule (default: 3; 0: off)")
    p.add_argument("--model-check", action=argparse.BooleanOptionalAction, default=True,
                   help="at the end, time the tuned kernels inside runs of the model against the default schedules "
                   "and log those times, which compile prefers: a schedule that wins alone with flushed caches can "
                   "lose among its neighbours (default: on; not with --rpc-tracker)")
    p.add_argument("--seed", type=int, default=0, help="search seed")
    p.add_argument("--cost-model", metavar="PATH", help="start from this saved cost model (if it exists) and save the "
                   "trained one there")
    p.add_argument("--input-shape", action="append", default=[], metavar="NAME=D0,D1,...",
                   help="shape of a model input with symbolic dims (repeatable)")
    p.add_argument("--shape-hint", action="append", default=[], metavar="SYMBOL=N1,N2,...",
                   help="sizes of a symbolic model's symbol to tune for, e.g. seq=128,384 (repeatable; every "
                        "combination is tuned, its kernels' schedules apply at those sizes)")
    p.add_argument("--rpc-tracker", metavar="HOST:PORT", help="measure on devices from this TVM RPC tracker")
    p.add_argument("--rpc-key", metavar="KEY", help="device key at the RPC tracker")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return p


@command("cinn-tune", INTERRUPTED)
def main(argv: Sequence[str] | None = None) -> int:
    """Exit status: see cinn.facade.command.ExitStatus (1: a task that was measured has no working schedule)."""
    args = _parser().parse_args(argv)
    _check(args)
    summaries, verdicts = _tune(args)
    print(format_summary(summaries))
    if verdicts:
        print(format_verdicts(verdicts))
    untuned = [s.task.name for s in summaries if not s.trials]
    if untuned:
        print(f"cinn-tune: the budget ran out before {len(untuned)} of {len(summaries)} tasks got a trial (they keep "
              f"the default schedule): {', '.join(untuned)}; give --trials at least {len(summaries)}", file=sys.stderr)
    failed = [s.task.name for s in summaries if s.trials and not math.isfinite(s.best_cost)]
    if failed:
        print(f"cinn-tune: no working schedule measured for {', '.join(failed)}", file=sys.stderr)
        return ExitStatus.FAILED
    return ExitStatus.OK


def _check(args: argparse.Namespace) -> None:
    """Raise UsageError for arguments that do not go together or are out of range (sets the default --repeat)."""
    if bool(args.rpc_tracker) != bool(args.rpc_key):
        raise UsageError("--rpc-tracker and --rpc-key go together")
    log_dir = os.path.dirname(os.path.abspath(args.log))
    if not os.path.isdir(log_dir):  # checked now, not after the first round's measurements are lost
        raise UsageError(f"--log {args.log}: no such directory {log_dir}")
    if args.repeat is None:
        args.repeat = 10 if args.cache_flush else 3
    if min(args.trials, args.batch, args.repeat) < 1 or args.verify < 0:
        raise UsageError("--trials, --batch and --repeat must be positive, --verify not negative")
    try:
        open(args.log, "a").close()
    except OSError as err:
        raise UsageError(f"--log {args.log}: cannot be written ({err.strerror})") from None


def _tune(args) -> tuple[list[TaskSummary], list[Verdict]]:
    """Load the model, extract its tasks and tune them; then judge the tuned kernels inside the model."""
    with reading_arguments():
        target = parse_target(args.target)
        if target.is_cuda and not args.rpc_tracker and not device_present():  # found now, not after the builds
            raise UsageError("--target cuda: no CUDA device present on this machine (or measure on one with --rpc-tracker)")
        programs = _load(args.model, args.input_shape, args.shape_hint)
        # a bad --cost-model file is a usage error (NotACostModel, a ValueError): before any worker starts
        model = CostModel.load(args.cost_model) if args.cost_model and os.path.exists(args.cost_model) else CostModel(seed=args.seed)
        measure = MeasureConfig(build_timeout=args.build_timeout, run_timeout=args.timeout, repeat=args.repeat,
                                cache_flush=args.cache_flush)
        runner = RpcRunner(args.rpc_tracker, args.rpc_key, measure) if args.rpc_tracker else LocalRunner(measure)
    config = TuneConfig(trials=args.trials, batch=args.batch, seed=args.seed, verify=args.verify)
    try:
        # the conv algorithms first: they decide which kernels there are to tune
        choices = select_winograd(programs, target, args.log, runner, args.resume, _algorithm_progress)
        tasks = extract_tasks(programs, target=target, winograd_choices=choices)
        print(f"cinn-tune: {len(tasks)} tasks, {args.trials} trials, target {target}, log {args.log}", file=sys.stderr)
        summaries = tune(tasks, target, args.log, config, runner=runner, model=model, resume=args.resume,
                         progress=_ProgressBar(len(tasks)))
    finally:
        runner.close()
    if args.cost_model:
        model.save(args.cost_model)
    # the model runs here: a device behind an RPC tracker has no in-model check
    in_model = args.model_check and not args.rpc_tracker
    verdicts = judge_in_model(programs, target, args.log, progress=_check_progress) if in_model else []
    return summaries, verdicts


def _load(model: str, input_shapes: Sequence[str], shape_hints: Sequence[str]) -> list[Program]:
    """A built-in benchmark model by name, else a model file; a symbolic one at each combination of the hinted
    sizes."""
    if not is_model_name(model) or not shape_hints:
        return [get_model(model, input_shapes=parse_input_shapes(input_shapes)).program]
    program = load_model(model, parse_input_shapes(input_shapes))
    if not isinstance(program, SymbolicProgram):
        raise ValueError(f"--shape-hint: {model} has static shapes")
    return [require_static(program.specialize(b), "cinn-tune tunes each binding's static program")
            for b in bindings_of(program, parse_input_shapes(shape_hints))]


def _algorithm_progress(done: int, total: int, shape: ConvShape, tile: int | None) -> None:
    chosen = ("every algorithm failed: the estimate decides" if tile is None else f"Winograd F({tile}x{tile}, 3x3)"
              if tile != DIRECT else "direct")
    print(f"cinn-tune: conv algorithm {done}/{total} {shape.key.removeprefix(ALGORITHM_PREFIX)}: {chosen}",
          file=sys.stderr, flush=True)


def _check_progress(done: int, total: int) -> None:
    print(f"cinn-tune: in-model check, round {done}/{total}", file=sys.stderr, flush=True)


class _ProgressBar:
    """One status line per round (redrawn in place on a terminal)."""

    def __init__(self, num_tasks: int):
        self.num_tasks = num_tasks
        self.tty = sys.stderr.isatty()

    def __call__(self, p: Progress) -> None:
        done = int(20 * p.trials / max(1, p.total))
        s = p.summary
        line = (f"[{'#' * done}{'.' * (20 - done)}] {p.trials}/{p.total} trials | task {p.task_index + 1}/"
                f"{self.num_tasks} {s.task.name}: default {_ms(s.default_cost)} best {_ms(s.best_cost)} ms")
        print(("\r" + line) if self.tty else line, end="" if self.tty else "\n", file=sys.stderr, flush=True)
        if self.tty and p.trials >= p.total:
            print(file=sys.stderr)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.4f}" if math.isfinite(seconds) else "failed"


def format_summary(summaries: Sequence[TaskSummary]) -> str:
    """The per-task table: weight, trials, default and best latency, speed-up; then the weighted total."""
    rows = [("#", "task", "weight", "trials", "default ms", "best ms", "speed-up")]
    for i, s in enumerate(summaries, 1):
        costs = (_ms(s.default_cost), _ms(s.best_cost)) if s.trials else ("not tuned", "not tuned")
        rows.append((str(i), s.task.name[:48], str(s.task.weight), str(s.trials), *costs,
                     f"{s.speedup:.2f}x" if math.isfinite(s.speedup) else "-"))
    tuned = [s for s in summaries if s.trials]
    total_default = sum(s.task.weight * s.default_cost for s in tuned)
    total_best = sum(s.task.weight * min(s.best_cost, s.default_cost) for s in tuned)
    label = "total (weighted)" if len(tuned) == len(summaries) else "total (weighted, tuned tasks)"
    rows.append(("", label, "", str(sum(s.trials for s in summaries)), _ms(total_default),
                 _ms(total_best), f"{total_default / total_best:.2f}x" if total_best and math.isfinite(total_best) else "-"))
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    return "\n".join("  ".join(v.ljust(w) if c == 1 else v.rjust(w) for c, (v, w) in enumerate(zip(r, widths, strict=True))) for r in rows)


def format_verdicts(verdicts: Sequence[Verdict]) -> str:
    """The in-model check: how many tuned kernels stay, and the ones the default schedule beats inside runs."""
    reverted = [v for v in verdicts if not v.kept]
    tuned = sum(v.tuned_s for v in verdicts)
    best = sum(min(v.tuned_s, v.default_s) for v in verdicts)
    default = sum(v.default_s for v in verdicts)
    lines = [f"in-model check: {len(verdicts) - len(reverted)} of {len(verdicts)} tuned workloads keep their schedule; "
             f"their kernels inside runs: default {_ms(default)} ms, tuned {_ms(tuned)} ms, kept {_ms(best)} ms"]
    lines += [f"  default kept for {v.name} (x{v.kernels}): tuned {_ms(v.tuned_s)} ms, default {_ms(v.default_s)} ms"
              for v in sorted(reverted, key=lambda v: v.default_s - v.tuned_s)]
    return "\n".join(lines)
