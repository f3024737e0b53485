"""The tiny model every cache, tuning-log, CLI and feed case reuses (MatMul + Relu: one kernel), so their compiles hit
a cache warmed once per run; and tuning records for its kernel."""
from __future__ import annotations

import functools
import pathlib

import numpy as np
import onnx
from onnx import numpy_helper

NAME = "tiny.onnx"
INPUT, SHAPE = "x", (2, 8)


def write(path: pathlib.Path) -> pathlib.Path:
    from tests.test_malformed_inputs import _valid_onnx  # (imports onnxruntime: not in the workers)

    return _valid_onnx(path)


def reference(path: pathlib.Path, x: np.ndarray) -> np.ndarray:
    """What the tiny model at `path` computes."""
    w = numpy_helper.to_array(onnx.load(path).graph.initializer[0])
    with np.errstate(all="ignore"):
        return np.maximum(np.asarray(x, np.float32) @ w, np.float32(0))


@functools.cache
def _kernel(model: pathlib.Path):
    """The tiny model's one kernel: its lowered group and the target, as compile sees them."""
    import cinn
    from cinn.compiler.lower import lower_program
    from cinn.core.target import parse_target

    target = parse_target("llvm")
    _, lowered = lower_program(cinn.load_model(str(model)), True, True, True, target, {})
    return lowered[0], target


def record(model: pathlib.Path, annotation: tuple[str, str] | None = None, workload: str | None = None) -> str:
    """A schedule-log line for the tiny model's kernel whose trace annotates its outer loop (key, value), timed fast
    enough that compile applies it."""
    import tvm
    from tvm.s_tir import Schedule

    from autotune.database import Record
    from autotune.space import trace_json
    from cinn.compiler.build import workload_key
    from schedules.analysis import blocks

    group, target = _kernel(model)
    sch = Schedule(tvm.IRModule({"main": group.func}))
    loop = sch.get_loops(blocks(sch)[-1])[0]  # l3 in the trace
    if annotation is not None:
        sch.annotate(loop, *annotation)
    return Record(workload or workload_key(group.func), str(target), trace_json(sch), (1e-9,) * 3).to_json()


def target_name(model: pathlib.Path) -> str:
    return str(_kernel(model)[1])
