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
from benchmarks.real_models import MODELS as REAL_MODELS
from cinn.compiler.build import KernelSpec, build_kernel, workload_key
from cinn.compiler.lower import lower_group
from cinn.compiler.passes.fusion import fuse
from cinn.compiler.passes.pipeline import optimize
from cinn.core.ops import OPS
from cinn.core.target import parse_target
from cinn.runtime.cuda_module import device_present
from frontend.zoo import MODELS, get_model, symbolic_encoder
from schedules import apply_default
from schedules.cuda_common import unbound_blocks
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
    spec = KernelSpec(workload_key(func), func, group.kind, trace)
    with pytest.raises(RuntimeError, match="not bound to blockIdx/threadIdx"):
        build_kernel(spec, TARGET, str(pathlib.Path(tmp_path) / "k.so"))


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=_case_id)
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

    from autotune import space
    from autotune.task import extract_tasks

    b = cinn.NetBuilder("mm")
    x = b.create_input("float32", (64, 128), "x")
    y = b.create_input("float32", (128, 64), "y")
    program = b.build([b.softmax(b.relu(b.matmul(x, y)), axes=[-1])])
    rng = random.Random(0)
    for task in extract_tasks(program):
        cands = [c for c in (space.sample(task, TARGET, rng) for _ in range(3)) if c is not None]
        assert cands, task.name
        for i, cand in enumerate(cands):
            spec = KernelSpec(task.workload, task.func(), task.kind, cand.trace_json())
            build_kernel(spec, TARGET, str(tmp_path / f"{task.workload}_{i}.so"))
            assert "__global__" in pathlib.Path(str(tmp_path / f"{task.workload}_{i}.src")).read_text()


@pytest.mark.gpu
def test_symbolic_encoder_runs_on_gpu(tmp_cache):
    """One symbolic compile for CUDA serves several (batch, seq), each equal to the CPU's."""
    program = symbolic_encoder(small=True)
    gpu = cinn.compile(program, target="cuda", cache_dir=tmp_cache, shape_hints={"batch": [1], "seq": [7]})
    cpu = cinn.compile(program, cache_dir=tmp_cache)
    for batch, seq in ((1, 7), (2, 13), (3, 20)):
        x = np.random.default_rng(seq).uniform(-1, 1, (batch, seq, 16)).astype("float32")
        np.testing.assert_allclose(gpu.run({"x": x})[0], cpu.run({"x": x})[0], rtol=1e-4, atol=1e-4)
    assert gpu.built_on_demand == 2


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["QDQ", "QOperator"])
def test_quantized_cnn_runs_on_gpu(fmt, tmp_path, tmp_cache):
    from onnxruntime import quantization

    from tests.test_onnx_quant import _assert_close_to_ort, _cnn, _quantized

    model = _quantized(_cnn(), getattr(quantization.QuantFormat, fmt), tmp_path)
    x = np.random.default_rng(3).standard_normal((1, 3, 16, 16)).astype(np.float32)
    _assert_close_to_ort(model, x, tmp_cache, target="cuda")


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(REAL_MODELS))
def test_real_cnn_runs_on_gpu(name, tmp_cache):
    """The ten CNNs of cinn-bench (random weights) on CUDA against onnxruntime on the CPU."""
    from tests.test_onnx_import import check_real_cnn

    check_real_cnn(name, tmp_cache, "cuda")


def _edge_model():
    """Kernels TVM's CUDA path once failed on: a packed-weight conv whose shared-memory tiles are clipped at the
    edge (inception's 112->224 3x3 on 13x13), and LRN's channel windows on 54x54 rows, whose vector selects have
    lane-invariant conditions (TVM declared them with the value's type: nvcc refused the kernel)."""
    from onnx import TensorProto, helper

    from tests.test_onnx_import import make_model

    w = np.random.default_rng(5).standard_normal((224, 112, 3, 3)).astype(np.float32) * 0.1
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1]),
             helper.make_node("LRN", ["z"], ["l"], size=5, alpha=1e-4, beta=0.75, bias=1.0)]
    f32 = TensorProto.FLOAT
    return make_model(nodes, [("x", f32, (1, 112, 13, 13)), ("z", f32, (1, 96, 54, 54))],
                      [("y", f32, (1, 224, 13, 13)), ("l", f32, (1, 96, 54, 54))], [("w", w)], opset=13)


def _grouped_program():
    """Grouped convs as their GIHWO kernels compute them: a pointwise one whose 13 channels per group are padded to
    16 and a 3x3 one."""
    rng = np.random.default_rng(7)
    b = cinn.NetBuilder("groups")
    x = b.create_input("float32", (1, 64, 14, 14), "x")
    y = b.relu(b.conv2d(x, b.create_constant(rng.standard_normal((52, 16, 1, 1)).astype(np.float32)), groups=4))
    z = b.conv2d(x, b.create_constant(rng.standard_normal((8, 16, 3, 3)).astype(np.float32)), paddings=[1, 1], groups=4)
    return b.build([y, z]), {"x": rng.standard_normal((1, 64, 14, 14)).astype(np.float32)}


def test_grouped_convs_build_for_cuda(tmp_cache):
    program, _ = _grouped_program()
    exe = cinn.compile(program, target="cuda", cache_dir=tmp_cache)
    assert all("__global__" in s for s in exe.kernel_sources())


@pytest.mark.gpu
def test_grouped_convs_run_on_gpu(tmp_cache):
    program, feeds = _grouped_program()
    want = cinn.compile(program, target="llvm", cache_dir=tmp_cache).run(feeds)
    got = cinn.compile(program, target="cuda", cache_dir=tmp_cache).run(feeds)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


def test_edge_kernels_build_for_cuda(tmp_cache):
    exe = cinn.compile(cinn.load_onnx(_edge_model()), target="cuda", cache_dir=tmp_cache)
    assert exe.num_kernels == 2 and all("__global__" in s for s in exe.kernel_sources())


@pytest.mark.gpu
def test_edge_kernels_run_on_gpu(tmp_cache):
    from tests.test_onnx_import import ort_run

    model, rng = _edge_model(), np.random.default_rng(6)
    feeds = {"x": rng.standard_normal((1, 112, 13, 13)).astype(np.float32),
             "z": rng.standard_normal((1, 96, 54, 54)).astype(np.float32)}
    got = cinn.compile(cinn.load_onnx(model), target="cuda", cache_dir=tmp_cache).run(feeds)
    for g, w in zip(got, ort_run(model, feeds), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
