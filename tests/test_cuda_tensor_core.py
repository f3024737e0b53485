"""CUDA tensor cores (schedules.cuda_tensor_core): matmuls of whole fragments compile to WMMA instructions of the
target's precision (nvcc -> PTX, no GPU needed), everything else keeps the fp32 schedule; on a GPU the results
match numpy within each input type's rounding (tests marked gpu)."""
from __future__ import annotations

import pathlib

import numpy as np
import pytest
import tvm
from tvm.s_tir import Schedule

import cinn
from cinn.compiler.lower import lower_group
from cinn.compiler.passes.fusion import fuse
from cinn.compiler.passes.pipeline import optimize
from cinn.core.target import TensorCores, parse_target
from cinn.runtime.cuda_module import fixed_source
from frontend.zoo import get_model
from schedules.registry import pick

# the PTX instruction each precision's 16x16 multiply-accumulate compiles to (rows of A, B row- or column-major)
MMA = {TensorCores.FP16: "m16n16k16.f32.f32", TensorCores.BF16: "m16n16k16.f32.bf16.bf16.f32",
       TensorCores.TF32: "m16n16k8.f32.tf32.tf32.f32"}
# relative error each input type's rounding leaves in a dot product of 64 to 3072 values in [-1, 1] (of its largest)
TOLERANCE = {TensorCores.OFF: 1e-5, TensorCores.FP16: 1e-2, TensorCores.TF32: 1e-2, TensorCores.BF16: 4e-2}


def _dense(m: int, k: int, n: int, trans_y: bool = False):
    """relu(x @ w + bias) with constant weights ([n, k] when trans_y), and its feeds and numpy result."""
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (m, k)).astype(np.float32)
    w = rng.uniform(-1, 1, (n, k) if trans_y else (k, n)).astype(np.float32)
    bias = rng.uniform(-1, 1, (n,)).astype(np.float32)
    b = cinn.NetBuilder("dense")
    xv = b.create_input("float32", (m, k), "x")
    y = b.matmul(xv, b.create_constant(w), trans_y=trans_y)
    program = b.build([b.relu(b.add(y, b.create_constant(bias)))])
    return program, {"x": x}, np.maximum(x @ (w.T if trans_y else w) + bias, 0)


def _target(cores: TensorCores, arch: str = "sm_90") -> str:
    return f"cuda -arch={arch} -tensor-cores={cores.value}"


def _ptx(program, target: str, folder: pathlib.Path) -> bytes:
    """The kernel libraries (their embedded PTX) of a compile into a fresh cache."""
    cinn.compile(program, target=target, cache_dir=folder, passes=False)
    return b"".join(lib.read_bytes() for lib in sorted(folder.glob("*.so")))


def _rules(program, target: str, passes: bool = False) -> list[str]:
    """The rule that schedules each kernel (no code generation: fast)."""
    program = optimize(program, passes, parse_target(target))
    names = []
    for group in fuse(program):
        sch = Schedule(tvm.IRModule({"main": lower_group(group, program.constants).func}))
        names.append(pick(sch, group.kind, parse_target(target)).name)
    return names


@pytest.mark.parametrize("cores", [TensorCores.FP16, TensorCores.BF16, TensorCores.TF32], ids=lambda c: c.value)
@pytest.mark.parametrize("trans_y", [False, True], ids=["nn", "nt"])
def test_bert_dense_uses_tensor_cores(cores, trans_y, tmp_path):
    """BERT-base's 128x768x768 dense layer: the PTX multiplies on tensor cores in the precision asked for."""
    ptx = _ptx(_dense(128, 768, 768, trans_y)[0], _target(cores), tmp_path)
    layout = "row.col" if trans_y else "row.row"
    assert f"wmma.mma.sync.aligned.{layout}.{MMA[cores]}".encode() in ptx
    assert b".target sm_90" in ptx


def test_fp32_schedule_has_no_tensor_cores(tmp_path):
    ptx = _ptx(_dense(128, 768, 768)[0], "cuda -arch=sm_90", tmp_path)
    assert b".target sm_90" in ptx and b"mma.sync" not in ptx


def test_encoder_dense_layers_use_tensor_cores():
    """A BERT-base-sized encoder layer's six dense layers, their weights packed in column panels by the passes."""
    rules = _rules(get_model("encoder", small=False).program, _target(TensorCores.FP16), passes=True)
    assert rules.count("CudaTensorCore") == 6


def test_ffn_width_uses_tensor_cores():
    assert _rules(_dense(128, 768, 3072)[0], _target(TensorCores.FP16)) == ["CudaTensorCore"]


@pytest.mark.parametrize("shape", [(128, 100, 768), (128, 768, 200), (7, 768, 768)], ids=str)
def test_odd_shapes_keep_the_fp32_schedule(shape):
    """Reductions, columns or rows that are no whole number of 16x16 fragments: no tensor cores."""
    assert _rules(_dense(*shape)[0], _target(TensorCores.FP16)) == ["CudaMatmul"]


def test_odd_shape_builds_without_tensor_cores(tmp_path):
    ptx = _ptx(_dense(128, 100, 768)[0], _target(TensorCores.FP16), tmp_path)
    assert b".target sm_90" in ptx and b"mma.sync" not in ptx


@pytest.mark.parametrize("cores, arch", [(TensorCores.TF32, "sm_75"), (TensorCores.BF16, "sm_75"),
                                         (TensorCores.FP16, "sm_61")])
def test_architectures_without_the_precision_fall_back(cores, arch):
    assert _rules(_dense(128, 768, 768)[0], _target(cores, arch)) == ["CudaMatmul"]


def _pointwise(pixels: int):
    """A 1x1 conv of 64 to 256 channels (a resnet bottleneck's expansion) over pixels x pixels."""
    rng = np.random.default_rng(2)
    b = cinn.NetBuilder("pointwise")
    x = b.create_input("float32", (1, 64, pixels, pixels), "x")
    w = b.create_constant(rng.uniform(-1, 1, (256, 64, 1, 1)).astype(np.float32))
    program = b.build([b.relu(b.conv2d(x, w))])
    return program, {"x": rng.uniform(-1, 1, (1, 64, pixels, pixels)).astype(np.float32)}


def test_pointwise_conv_uses_tensor_cores(tmp_path):
    """A 1x1 conv is a GEMM of weights [O, C] and pixels [C, P] (the product names the pixels first)."""
    program, _ = _pointwise(56)
    assert _rules(program, _target(TensorCores.FP16), passes=True) == ["CudaTensorCore"]
    cinn.compile(program, target=_target(TensorCores.FP16), cache_dir=tmp_path)
    ptx = b"".join(lib.read_bytes() for lib in tmp_path.glob("*.so"))
    assert f"wmma.mma.sync.aligned.row.row.{MMA[TensorCores.FP16]}".encode() in ptx


def test_convs_keep_the_fp32_schedule():
    rng = np.random.default_rng(1)
    b = cinn.NetBuilder("conv")
    x = b.create_input("float32", (1, 64, 16, 16), "x")
    program = b.build([b.conv2d(x, b.create_constant(rng.standard_normal((64, 64, 3, 3)).astype(np.float32)),
                                paddings=[1, 1])])
    assert "CudaTensorCore" not in _rules(program, _target(TensorCores.FP16))


def test_target_names_its_tensor_cores():
    target = parse_target("cuda -arch=sm_80 -tensor-cores=tf32")
    assert target.tensor_cores is TensorCores.TF32 and str(target) == "cuda -arch=sm_80 -tensor-cores=tf32"
    assert parse_target(str(target)) == target
    assert parse_target("cuda").tensor_cores is TensorCores.OFF and str(parse_target("cuda")) == "cuda -arch=sm_90"
    with pytest.raises(ValueError, match="tf16"):
        parse_target("cuda -tensor-cores=tf16")


def test_tf32_fragments_declared_tf32():
    source = ("nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 8, half, nvcuda::wmma::row_major> a[2];\n"
              "nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 16, half, nvcuda::wmma::row_major> b[2];\n")
    fixed = fixed_source(source)
    assert "matrix_a, 16, 16, 8, nvcuda::wmma::precision::tf32, nvcuda::wmma::row_major" in fixed
    assert "matrix_b, 16, 16, 16, half," in fixed


@pytest.mark.gpu
@pytest.mark.parametrize("cores", list(TensorCores), ids=lambda c: c.value)
def test_pointwise_conv_matches_the_cpu_on_gpu(cores, tmp_cache):
    program, feeds = _pointwise(56)
    want = cinn.compile(program, target="llvm", cache_dir=tmp_cache).run(feeds)[0]
    got = cinn.compile(program, target=_target(cores), cache_dir=tmp_cache).run(feeds)[0]
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(got, want, rtol=TOLERANCE[cores], atol=TOLERANCE[cores] * scale)


@pytest.mark.gpu
@pytest.mark.parametrize("cores", list(TensorCores), ids=lambda c: c.value)
@pytest.mark.parametrize("shape", [(128, 768, 768, False), (128, 768, 3072, True), (128, 100, 768, False)], ids=str)
def test_dense_matches_numpy_on_gpu(cores, shape, tmp_cache):
    program, feeds, want = _dense(*shape)
    got = cinn.compile(program, target=_target(cores), cache_dir=tmp_cache, passes=False).run(feeds)[0]
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(got, want, rtol=TOLERANCE[cores], atol=TOLERANCE[cores] * scale)
