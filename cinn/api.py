"""cinn.compile: Program -> passes -> fusion -> lowering -> build -> Executable."""
from __future__ import annotations

import os
import pathlib
from typing import Callable

import tvm

from cinn.build import KernelSpec, build_all, default_cache_dir, workload_key
from cinn.ir import Program
from cinn.lower import lower_group
from cinn.passes.fusion import fuse as fuse_groups
from cinn.passes.fusion import unfused
from cinn.passes.pipeline import optimize
from cinn.passes.verify import verify
from cinn.runtime import Executable, Kernel
from cinn.target import Target, parse_target


def compile(  # noqa: A001 - the public name of the contract
    program: Program,
    target: "str | Target" = "llvm",
    fuse: bool = True,
    tuning_log: "str | os.PathLike | None" = None,
    *,
    cache_dir: "str | os.PathLike | None" = None,
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    passes: bool = True,
) -> Executable:
    """Compile a Program for a target; fuse=False runs one kernel per op (the baseline).

    cache_dir defaults to $CINN_CACHE_DIR or ~/.cache/cinn; workers (default: all cores) build uncached
    kernels in parallel; progress(done, total) is called as kernels are built; passes=False skips the
    graph simplifications (composite ops are still decomposed), so every op reaches a kernel as written.
    """
    tgt = parse_target(target)
    verify(program)
    program = optimize(program, passes)
    groups = fuse_groups(program) if fuse else unfused(program)
    lowered = [lower_group(g, program.constants) for g in groups]
    records = _tuning_records(tuning_log, tgt)
    specs = []
    for lg in lowered:
        key = workload_key(lg.func)
        specs.append(KernelSpec(key, tvm.ir.save_json(lg.func), lg.group.kind, records.get(key)))
    cache = pathlib.Path(cache_dir) if cache_dir is not None else default_cache_dir()
    modules = build_all(specs, tgt, cache, workers if workers is not None else (os.cpu_count() or 1), progress)
    _configure_threads(tgt)
    kernels = [Kernel(lg.group.name, _entry(b.module), b.module, lg.params, b.source) for lg, b in zip(lowered, modules)]
    device = tvm.cuda(0) if tgt.is_cuda else tvm.cpu(0)
    return Executable(program, kernels, device)


def _entry(module):
    """A kernel library's entry function (None for a CUDA library built on a machine without a GPU)."""
    return module["main"] if module is not None else None


def _tuning_records(log, target: Target) -> dict[str, str]:
    """Best tuned trace per workload from a schedule log (applied by the auto-tuner issue)."""
    if log is None:
        return {}
    from autotune.database import best_traces

    return best_traces(log, target)


def _configure_threads(target: Target) -> None:
    """TVM's CPU pool defaults to one thread on some machines: use the target's cores."""
    if not target.is_cuda:
        tvm.get_global_func("runtime.config_threadpool")(0, target.num_cores)
