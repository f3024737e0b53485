"""CUDA target: every op case and built-in model builds for CUDA without a GPU (nvcc -> PTX); kernels run and match
numpy where a GPU is present (tests marked gpu)."""
from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest
import tvm
from tvm.s_tir import Schedule

import cinn
from cinn.build import KernelSpec, build_kernel, workload_key
from cinn.cuda_module import device_present
from cinn.frontend.zoo import MODELS, get_model
from cinn.lower import lower_group
from cinn.ops import OPS
from cinn.passes.fusion import fuse
from cinn.passes.pipeline import optimize
from cinn.schedules import apply_default
from cinn.schedules.cuda_common import unbound_blocks
from cinn.target import parse_target
from tests.test_ops import CASES, _build, _case_id

TARGET = parse_target("cuda")
# one case per kind of schedule (injective, gather, reductions, row reductions, matmul, conv, pooling) goes through
# nvcc; every case is scheduled and code-generated below (nvcc costs ~0.5 s a kernel)
NVCC_OPS = ("add", "cast", "transpose", "gather", "concat", "split", "reduce_sum", "reduce_all", "argmax", "softmax",
            "layer_norm", "batchnorm", "matmul", "conv2d", "pool2d")
NVCC_CASES = [next(c for c in CASES if c.op == op) for op in NVCC_OPS]
FULL_SIZE = ("encoder", "conv_bn_relu")


def _program(case):
    arrays = case.arrays(np.random.default_rng(0))
    program, feeds = _build(case, arrays)
    return program, feeds, arrays


def test_nvcc_ops_exist():
    assert set(NVCC_OPS) <= set(OPS)


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_every_case_schedules_for_cuda(case):
    """The default CUDA schedule binds every block and TVM generates a CUDA kernel (no nvcc: fast)."""
    program, _, _ = _program(case)
    program = optimize(program, False)
    for group in fuse(program):
        sch = Schedule(tvm.IRModule({"main": lower_group(group, program.constants).func}))
        apply_default(sch, group.kind, TARGET)
        assert unbound_blocks(sch) == []
        ex = tvm.compile(sch.mod, target=TARGET.tvm())
        assert "__global__" in ex.mod.imports[0].inspect_source("cuda")


@pytest.mark.parametrize("case", NVCC_CASES, ids=_case_id)
def test_op_builds_with_nvcc(case, tmp_cache):
    program, _, _ = _program(case)
    exe = cinn.compile(program, target="cuda", cache_dir=tmp_cache, passes=False)
    assert exe.num_kernels >= 1
    assert all("__global__" in src for src in exe.kernel_sources())


@pytest.mark.parametrize("name, small", [(n, True) for n in MODELS] + [(n, False) for n in FULL_SIZE])
def test_model_builds(name, small, tmp_cache):
    exe = cinn.compile(get_model(name, small=small).program, target="cuda", cache_dir=tmp_cache)
    sources = exe.kernel_sources()
    assert len(sources) == exe.num_kernels and all("__global__" in s for s in sources)


def test_long_reductions_take_two_stages(tmp_cache):
    """A full reduction and few long rows reduce in chunks across blocks, then the chunks: two kernels each."""
    b = cinn.NetBuilder("long")
    x = b.create_input("float32", (64, 4096), "x")
    rows = b.create_input("float32", (2, 20000), "rows")
    program = b.build([b.reduce_sum(x, []), b.reduce_sum(rows, [1])])
    sources = cinn.compile(program, target="cuda", cache_dir=tmp_cache).kernel_sources()
    assert len(sources) == 2 and all("main_kernel_1" in s for s in sources)


@pytest.mark.parametrize("spec", ["cuda -arch=sm_80", "cuda arch=sm_80"])
def test_library_embeds_ptx_for_the_arch(spec, tmp_path):
    cinn.compile(get_model("mlp", small=True).program, target=spec, cache_dir=tmp_path)
    libs = list(tmp_path.glob("*.so"))
    assert libs and all(b".target sm_80" in lib.read_bytes() for lib in libs)


def test_no_gpu_error_is_clear(tmp_cache):
    if device_present():
        pytest.skip("a CUDA device is present")
    model = get_model("mlp", small=True)
    exe = cinn.compile(model.program, target="cuda", cache_dir=tmp_cache)
    with pytest.raises(RuntimeError, match="no CUDA device present"):
        exe.run(dict(model.feeds))


def test_unbound_kernel_fails_loudly(tmp_path):
    """A schedule that leaves blocks unbound (here: an empty tuned trace) must not build as host code."""
    program, _, _ = _program(NVCC_CASES[0])
    group = fuse(optimize(program, False))[0]
    func = lower_group(group, program.constants).func
    trace = json.dumps(Schedule(tvm.IRModule({"main": func})).trace.as_json(), default=lambda o: o.value)
    spec = KernelSpec(workload_key(func), tvm.ir.save_json(func), group.kind, trace)
    with pytest.raises(RuntimeError, match="not bound to blockIdx/threadIdx"):
        build_kernel(spec, TARGET, str(pathlib.Path(tmp_path) / "k.so"))


@pytest.mark.gpu
@pytest.mark.parametrize("case", NVCC_CASES, ids=_case_id)
def test_op_runs_on_gpu(case, tmp_cache):
    program, feeds, arrays = _program(case)
    expected = OPS[case.op].reference(arrays, program.nodes[0].attrs)
    got = cinn.compile(program, target="cuda", cache_dir=tmp_cache, passes=False).run(feeds)
    for g, e, v in zip(got, expected, program.outputs, strict=True):
        rtol, atol = case.tolerance(v.dtype)
        np.testing.assert_allclose(g, e, rtol=rtol, atol=atol)


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(MODELS))
def test_model_runs_on_gpu(name, tmp_cache):
    model = get_model(name, small=True)
    want = cinn.compile(model.program, target="llvm", cache_dir=tmp_cache).run(dict(model.feeds))
    got = cinn.compile(model.program, target="cuda", cache_dir=tmp_cache).run(dict(model.feeds))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["squeezenet", pytest.param("resnet50", marks=pytest.mark.slow),
                                  pytest.param("vgg19", marks=pytest.mark.slow)])
def test_light_cnn_builds_for_cuda(name, tmp_cache):
    """The CNNs the onnx package ships build for CUDA without a GPU."""
    from tests.test_onnx_import import _light_model

    exe = cinn.compile(cinn.load_onnx(_light_model(name)), target="cuda", cache_dir=tmp_cache)
    assert all("__global__" in s for s in exe.kernel_sources())


def test_tuning_candidates_build_for_cuda(tmp_path):
    """The tuner's CUDA space: sampled thread/register/shared-memory decisions bind every block and compile to PTX."""
    import random

    from cinn.autotune import space
    from cinn.autotune.task import extract_tasks

    b = cinn.NetBuilder("mm")
    x = b.create_input("float32", (64, 128), "x")
    y = b.create_input("float32", (128, 64), "y")
    program = b.build([b.softmax(b.relu(b.matmul(x, y)), axes=[-1])])
    rng = random.Random(0)
    for task in extract_tasks(program):
        cands = [c for c in (space.sample(task, TARGET, rng) for _ in range(3)) if c is not None]
        assert cands, task.name
        for i, cand in enumerate(cands):
            spec = KernelSpec(task.workload, task.func_json, task.kind, cand.trace_json())
            build_kernel(spec, TARGET, str(tmp_path / f"{task.workload}_{i}.so"))
            assert "__global__" in pathlib.Path(str(tmp_path / f"{task.workload}_{i}.src")).read_text()
