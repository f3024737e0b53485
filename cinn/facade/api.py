"""cinn.compile: Program -> passes -> fusion -> lowering -> build -> Executable."""
from __future__ import annotations

import os
import pathlib
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import overload

import tvm
from tvm.s_tir import Schedule

from autotune.algorithms import winograd_choices
from autotune.database import Record, fastest_traces, noted_baselines, read_records
from cinn.compiler import compiled_cache, symbolic_kernels
from cinn.compiler.build import (
    BuiltKernel,
    KernelSpec,
    build_all,
    check_in_bounds,
    default_cache_dir,
    default_fingerprint,
    load_cached,
    workload_key,
)
from cinn.compiler.lower import LoweredGroup, lower_program
from cinn.compiler.passes import manager, pipeline
from cinn.compiler.passes.manager import PassName
from cinn.compiler.symbolic_kernels import NotSymbolic
from cinn.core.ir import Program
from cinn.core.precision import FP32, Precision, PrecisionPolicy, cuda_target, resolve
from cinn.core.symbolic import Binding, StagedProgram, SymbolicProgram, bindings_of
from cinn.core.target import Target, parse_target
from cinn.core.views import find_views
from cinn.runtime.dynamic import DynamicExecutable, StagedExecutable
from cinn.runtime.executable import ConstantPool, Executable, Kernel
from schedules.analysis import PLAIN_SCHEDULE
from schedules.replay import replay


@overload
def compile(program: Program, target: str | Target = ..., fuse: bool = ...,
            tuning_log: str | os.PathLike | Sequence[Record] | None = ..., *, cache_dir: str | os.PathLike | None = ...,
            workers: int | None = ..., progress: Callable[[int, int], None] | None = ..., passes: bool = ...,
            shape_hints: None = ..., on_demand: bool = ..., symbolic_kernels: bool = ...,
            disabled_passes: Iterable[str] = ..., precision: Precision | str | PrecisionPolicy = ...) -> Executable: ...


@overload
def compile(program: SymbolicProgram, target: str | Target = ..., fuse: bool = ...,
            tuning_log: str | os.PathLike | Sequence[Record] | None = ..., *, cache_dir: str | os.PathLike | None = ...,
            workers: int | None = ..., progress: Callable[[int, int], None] | None = ..., passes: bool = ...,
            shape_hints: Mapping[str, Iterable[int]] | None = ..., on_demand: bool = ...,
            symbolic_kernels: bool = ..., disabled_passes: Iterable[str] = ...,
            precision: Precision | str | PrecisionPolicy = ...) -> DynamicExecutable: ...


@overload
def compile(program: StagedProgram, target: str | Target = ..., fuse: bool = ...,
            tuning_log: str | os.PathLike | Sequence[Record] | None = ..., *, cache_dir: str | os.PathLike | None = ...,
            workers: int | None = ..., progress: Callable[[int, int], None] | None = ..., passes: bool = ...,
            shape_hints: None = ..., on_demand: bool = ..., symbolic_kernels: bool = ...,
            disabled_passes: Iterable[str] = ..., precision: Precision | str | PrecisionPolicy = ...) -> StagedExecutable: ...


def compile(
    program: Program | SymbolicProgram | StagedProgram,
    target: str | Target = "llvm",
    fuse: bool = True,
    tuning_log: str | os.PathLike | Sequence[Record] | None = None,
    *,
    cache_dir: str | os.PathLike | None = None,
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    passes: bool = True,
    shape_hints: Mapping[str, Iterable[int]] | None = None,
    on_demand: bool = True,
    symbolic_kernels: bool = True,
    disabled_passes: Iterable[str] = (),
    precision: Precision | str | PrecisionPolicy = Precision.FP32,
) -> Executable | DynamicExecutable | StagedExecutable:
    """Compile a Program for a target; fuse=False runs one kernel per op (the baseline).

    cache_dir defaults to $CINN_CACHE_DIR or ~/.cache/cinn; workers (default: all cores) build uncached
    kernels in parallel; progress(done, total) is called as kernels are built; passes=False skips the
    graph simplifications (composite ops are still decomposed), so every op reaches a kernel as written;
    disabled_passes skips the passes named (cinn.compiler.passes.manager.PassName: "cse", "winograd", ...; ValueError
    for an unknown name or one that lowering needs). Executable.pass_times has each pass's time.
    tuning_log is a schedule log (cinn-tune writes one) or records already read from one.
    precision is "fp32", "bf16" (matmuls with constant weights and dense convs in bf16 on a CPU with AVX512_BF16;
    ValueError on another target, a warning where the CPU's bf16 dot products are slower than its FMAs), "auto" (bf16
    where the target's CPU runs them clearly faster: CpuModel.bf16_pays) or a cinn.PrecisionPolicy (which op kinds
    compute in bf16, e.g. PrecisionPolicy.bf16_except(["stem_conv"])). On a CUDA target the graph stays fp32 and the
    precision picks tensor cores for the matmuls that fit them: "bf16", "fp16", "tf32", "auto" (tf32); "fp32" none;
    "fp16" and "tf32" are refused on a CPU. See docs/api.md.

    A SymbolicProgram gives a DynamicExecutable: specialized kernels built now for every combination of the sizes in
    shape_hints ({"batch": [1, 8], "seq": [128, 384]}), and, with symbolic_kernels, kernels built now for every size
    (their schedules chosen at the largest hinted sizes) that run any other binding; where the program cannot have
    those (see DynamicExecutable.symbolic_reason), another binding is built at its first run when on_demand.

    A StagedProgram (a model with NonZero or NonMaxSuppression) gives a StagedExecutable: its head compiled now, and
    its tail, symbolic in the run-time sizes, on symbolic kernels built now where it can have them, else built for
    each run's sizes at their first run (on_demand is implied: the sizes come from the data).
    """
    if not isinstance(program, (Program, SymbolicProgram, StagedProgram)):
        raise TypeError(f"compile: expected a cinn Program (NetBuilder.build(), cinn.load_onnx, cinn.load_model), "
                        f"got {type(program).__module__}.{type(program).__name__}")
    tgt = cuda_target(precision, parse_target(target))
    options = _Options(tgt, fuse, tuning_log, cache_dir, workers, progress, passes,
                       pipeline.disabled_passes(disabled_passes), resolve(precision, None if tgt.is_cuda else tgt.model))
    if isinstance(program, SymbolicProgram):
        pool = ConstantPool()  # the bindings' weights are the same arrays: one device copy each
        bindings = bindings_of(program, shape_hints) if shape_hints is not None else []
        symbolic, reason = None, ""
        if symbolic_kernels:
            try:
                symbolic = _symbolic_kernels(program, options, pool, shape_hints or {})
            except NotSymbolic as e:
                reason = str(e)
        return DynamicExecutable(program, lambda p: _compile_any(p, options, pool, symbolic_kernels), bindings,
                                 on_demand, symbolic, reason)
    if shape_hints is not None:
        raise TypeError(f"compile: shape_hints are for symbolic programs; {program.name!r} has static shapes")
    return _compile_any(program, options, None, symbolic_kernels)


@dataclass(frozen=True)
class _Options:
    """compile's arguments for a static program."""

    target: str | Target
    fuse: bool
    tuning_log: str | os.PathLike | Sequence[Record] | None
    cache_dir: str | os.PathLike | None
    workers: int | None
    progress: Callable[[int, int], None] | None
    passes: bool
    disabled: frozenset[PassName]
    precision: PrecisionPolicy = FP32


def _compile_any(program: Program | StagedProgram, o: _Options, constants: ConstantPool | None,
                 symbolic_kernels: bool) -> Executable | StagedExecutable:
    """Compile a static program, or a staged one (see _compile_staged)."""
    if isinstance(program, StagedProgram):
        return _compile_staged(program, o, constants, symbolic_kernels)
    return _compile(program, o, constants)


def _compile_staged(program: StagedProgram, o: _Options, constants: ConstantPool | None,
                    symbolic_kernels: bool) -> StagedExecutable:
    """The head compiled now; the tail's symbolic kernels built now where it can have them (its run-time sizes are
    its symbols), and its other bindings built at their first run."""
    head = _compile(program.head, o, constants)
    pool = constants if constants is not None else ConstantPool()  # the tail's bindings share one copy of a weight
    symbolic, reason = None, ""
    if symbolic_kernels:
        try:
            symbolic = _symbolic_kernels(program.tail, o, pool, {})
        except NotSymbolic as e:
            reason = str(e)
    tail = DynamicExecutable(program.tail, lambda p: _compile_any(p, o, pool, symbolic_kernels), (), True, symbolic,
                             reason, run_time_sizes=True)
    return StagedExecutable(program, head, tail)


def _compile(program: Program, o: _Options, constants: ConstantPool | None) -> Executable:
    """Compile a static program (or take it from the compile cache); its constants go to the pool when one is
    given."""
    tgt = parse_target(o.target)
    # CUDA kernels may load vectors that an offset into another value's buffer would misalign: their concats copy
    in_place = o.fuse and not tgt.is_cuda
    records = _tuning_records(o.tuning_log)  # read once: its conv algorithms and its kernels' schedules
    # a per-binding compile (with a pool) is not cached whole: see cinn.compiler.compiled_cache
    disabled = tuple(sorted(p.value for p in o.disabled))
    entry = compiled_cache.entry_path(_cache_dir(o), program, (repr(tgt), o.fuse, o.passes, disabled, records,
                                                               o.precision.key)) \
        if constants is None else None
    # a compile from the cache runs no pass: none to print after
    hit = _from_cache(compiled_cache.load(entry), tgt) if entry is not None and manager.ir_printer() is None else None
    timer = manager.PassTimer()
    if hit is not None:
        program, kernels = hit
    else:
        program, kernels, libraries = _compile_kernels(program, o, tgt, in_place, records, timer)
        if entry is not None:
            compiled_cache.store(entry, compiled_cache.CachedCompile(program, tuple(
                compiled_cache.CachedKernel(k.name, lib, k.params, k.flops, k.workload, k.nbytes)
                for k, lib in zip(kernels, libraries, strict=True))))
    device = tvm.cuda(0) if tgt.is_cuda else tvm.cpu(0)
    views = find_views(program) if in_place else {}
    return Executable(program, kernels, device, threads=None if tgt.is_cuda else tgt.num_cores, views=views,
                      constants=constants, pass_times=timer.times)


def _from_cache(cached: compiled_cache.CachedCompile | None, tgt: Target) -> tuple[Program, list[Kernel]] | None:
    """A cached compile's program and kernels; None without one, or when a kernel library cannot be loaded."""
    if cached is None:
        return None
    kernels = []
    for k in cached.kernels:
        built = load_cached(k.library, tgt)
        if built is None:
            return None
        kernels.append(Kernel(k.name, _entry(built.module), built.module, k.params, built.source, k.flops, k.workload,
                              nbytes=k.nbytes))
    return cached.program, kernels


def _compile_kernels(program: Program, o: _Options, tgt: Target, in_place: bool, records: Sequence[Record],
                     timer: manager.PassTimer) -> tuple[Program, list[Kernel], list[str]]:
    """Optimize (each pass timed by `timer`), fuse, lower and build a static program: the optimized program, its
    kernels and their libraries' paths."""
    program, lowered = lower_program(program, o.fuse, o.passes, in_place, tgt, winograd_choices(records, tgt),
                                     o.disabled, (timer,), o.precision)
    keyed = [(workload_key(lg.func), lg) for lg in lowered]
    traces = _current_traces(records, tgt, keyed)
    specs = [KernelSpec(key, lg.func, lg.group.kind, _applicable(traces.get(key), lg)) for key, lg in keyed]
    modules = _build(specs, tgt, o)
    kernels = [Kernel(lg.group.name, _entry(b.module), b.module, lg.params, b.source, lg.group.flops, s.workload,
                      nbytes=lg.group.traffic(lg.params)) for lg, b, s in zip(lowered, modules, specs, strict=True)]
    return program, kernels, [b.path for b in modules]


def _current_traces(records: Sequence[Record], tgt: Target, keyed: Sequence[tuple[str, LoweredGroup]]) -> dict[str, str]:
    """The log's fastest traces of these kernels, a verdict inside the model counting only if it was judged against
    today's default schedule; kernels whose every verdict was judged against another keep the default, with a
    warning."""
    noted = noted_baselines(records, tgt)
    current = _fingerprints(keyed, tgt, [w for w, seen in noted.items() if seen - {""}])
    # a verdict from before the fingerprints still decides (fastest_traces): its kernel is not stale
    stale = sorted({lg.group.name for key, lg in keyed if key in current and not noted[key] & {current[key], ""}})
    if stale:
        warnings.warn(f"cinn: the tuning log's schedules for {len(stale)} kernels ({', '.join(stale[:3])}"
                      f"{', ...' if len(stale) > 3 else ''}) were judged inside the model against default schedules "
                      "that have changed since (the log is older than this cinn): they keep the default; "
                      "`cinn-tune MODEL --resume --log LOG` judges them again", stacklevel=4)
    return fastest_traces(records, tgt, current)


def default_fingerprints(program: Program, target: Target, workloads: Iterable[str],
                         records: Sequence[Record] = ()) -> dict[str, str]:
    """The default-schedule fingerprints (cinn.compiler.build.default_fingerprint) of the program's kernels among
    `workloads`, lowered as compile lowers it with the conv algorithms of `records`."""
    _, lowered = lower_program(program, True, True, not target.is_cuda, target, winograd_choices(records, target))
    return _fingerprints([(workload_key(lg.func), lg) for lg in lowered], target, workloads)


def _fingerprints(keyed: Iterable[tuple[str, LoweredGroup]], tgt: Target, wanted: Iterable[str]) -> dict[str, str]:
    """default_fingerprint of each wanted workload among the kernels (scheduled once each)."""
    wanted, out = set(wanted), {}
    for key, lg in keyed:
        if key in wanted and key not in out:
            out[key] = default_fingerprint(lg.func, lg.group.kind, tgt)
    return out


def _symbolic_kernels(program: SymbolicProgram, o: _Options, pool: ConstantPool,
                      hints: Mapping[str, Iterable[int]]) -> Callable[[Binding], Executable]:
    """Build the program's symbolic kernels; returns the executable of a binding on them (buffers only)."""
    tgt = parse_target(o.target)
    if o.precision.bf16:  # its bindings are compiled in bf16 on demand
        raise NotSymbolic("symbolic kernels are fp32 only; bf16 kernels are built per binding")
    nominal = {s: max(sizes) for s, sizes in hints.items() if sizes}
    try:
        plan = symbolic_kernels.plan(program, tgt, o.fuse, o.passes, nominal, o.disabled)
    except (ValueError, TypeError, NotImplementedError) as e:  # the program refuses a probe's sizes
        raise NotSymbolic(str(e)) from None
    variants = [*plan.lowered, *(lg for lg in plan.unpadded if lg is not None)]
    specs = [KernelSpec(workload_key(lg.func), lg.func, lg.group.kind) for lg in variants]
    built = list(zip(_build(specs, tgt, o), specs, strict=True))
    plain = [lg.group.name for lg, (b, _) in zip(variants, built, strict=True) if PLAIN_SCHEDULE in b.source]
    if plain:  # many times slower than its default schedule (a conv: 30x): sizes are better built on demand
        raise NotSymbolic(f"kernels {sorted(set(plain))} have no fast schedule at symbolic sizes")
    padded, rest = built[: len(plan.lowered)], iter(built[len(plan.lowered) :])
    unpadded = [None if lg is None else next(rest) for lg in plan.unpadded]

    def executable(binding: Binding) -> Executable:
        static = plan.program_at(binding)
        sizes = plan.sizes(binding)
        chosen = [u if use and u is not None else p
                  for p, u, use in zip(padded, unpadded, plan.unpadded_at(binding), strict=True)]
        kernels = [Kernel(g.name, _entry(b.module), b.module, params, b.source, g.flops, s.workload, sizes,
                          nbytes=g.traffic(params))
                   for (g, params), (b, s) in zip(plan.kernels_at(static), chosen, strict=True)]
        return Executable(static, kernels, tvm.cpu(0), threads=tgt.num_cores, constants=pool)

    return executable


def _cache_dir(o: _Options) -> pathlib.Path:
    """The cache directory compile's options name, else the default one."""
    return pathlib.Path(o.cache_dir) if o.cache_dir is not None else default_cache_dir()


def _build(specs: Sequence[KernelSpec], tgt: Target, o: _Options) -> list[BuiltKernel]:
    """Build (or load from the cache) the kernels of specs, as compile's options say."""
    return build_all(specs, tgt, _cache_dir(o), o.workers if o.workers is not None else (os.cpu_count() or 1),
                     o.progress)


def _entry(module):
    """A kernel library's entry function (None for a CUDA library built on a machine without a GPU)."""
    return module["main"] if module is not None else None


def _applicable(trace: str | None, lg: LoweredGroup) -> str | None:
    """A tuned trace if it still applies to the group's PrimFunc; else None (the default) with a warning, e.g. for a
    log made by an older cinn whose schedules took other decisions."""
    if trace is None:
        return None
    try:
        sch = Schedule(tvm.IRModule({"main": lg.func}))
        replay(sch, trace)
        check_in_bounds(sch, lg.group.name)
    except (RuntimeError, ValueError, TypeError, KeyError, IndexError) as err:  # TVM raises RuntimeError subclasses
        warnings.warn(f"cinn: the tuned schedule of kernel {lg.group.name} does not apply ({type(err).__name__}); "
                      "using the default schedule", stacklevel=3)
        return None
    return trace


def _tuning_records(log) -> Sequence[Record]:
    """The records of a schedule log (none without one)."""
    if log is None:
        return []
    if not isinstance(log, str | os.PathLike):
        return log
    if not os.path.isfile(log):
        raise FileNotFoundError(f"tuning_log {os.fspath(log)!r}: no such schedule log (cinn-tune writes one)")
    return list(read_records(log))
