"""3-D Conv, ConvTranspose and pooling (decomposed onto the 2-D ops) against onnxruntime."""
from __future__ import annotations

import os
import pathlib
import re
import signal
import subprocess
import sys

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper  # noqa: E402

import cinn  # noqa: E402
from cinn.core.target import parse_target  # noqa: E402
from tests.guarded import guarded  # noqa: E402
from tests.test_onnx_import import assert_matches_ort, make_model, ort_run, rand  # noqa: E402

F32 = TensorProto.FLOAT
ROOT = pathlib.Path(__file__).parent.parent
CONVS = [  # (input, weights, attributes)
    ((1, 3, 5, 6, 7), (4, 3, 3, 3, 3), {"pads": [1, 1, 1, 1, 1, 1]}),
    ((2, 4, 7, 5, 6), (6, 2, 3, 1, 2), {"group": 2, "strides": [2, 1, 2], "pads": [0, 1, 1, 2, 0, 1]}),
    ((1, 2, 9, 8, 8), (3, 2, 2, 3, 3), {"dilations": [3, 2, 1], "pads": [2, 0, 1, 1, 2, 1]}),
    ((1, 2, 6, 5, 7), (3, 2, 2, 3, 2), {"strides": [2, 2, 3], "auto_pad": "SAME_LOWER"}),
    ((1, 16, 4, 7, 7), (16, 1, 3, 3, 3), {"group": 16, "pads": [1, 1, 1, 1, 1, 1], "strides": [1, 2, 2]}),
    ((1, 17, 3, 13, 13), (20, 17, 1, 1, 1), {}),
]
POOLS = [  # (op, input, attributes)
    ("MaxPool", (1, 3, 6, 7, 8), {"kernel_shape": [2, 3, 3], "strides": [2, 2, 1], "pads": [1, 0, 1, 0, 1, 1]}),
    ("MaxPool", (2, 2, 9, 9, 9), {"kernel_shape": [3, 3, 3], "dilations": [2, 1, 2], "ceil_mode": 1, "strides": [2, 2, 2]}),
    ("AveragePool", (1, 3, 7, 6, 5), {"kernel_shape": [3, 2, 2], "pads": [1, 1, 0, 1, 0, 1]}),
    ("AveragePool", (1, 3, 7, 6, 5), {"kernel_shape": [3, 2, 2], "pads": [1, 1, 0, 1, 0, 1], "count_include_pad": 1}),
    ("AveragePool", (1, 2, 8, 8, 8), {"kernel_shape": [3, 3, 3], "strides": [3, 3, 3], "ceil_mode": 1,
                                      "pads": [1, 1, 1, 1, 1, 1], "count_include_pad": 1}),
    ("AveragePool", (1, 2, 8, 8, 8), {"kernel_shape": [3, 3, 3], "strides": [3, 3, 3], "ceil_mode": 1,
                                      "pads": [1, 1, 1, 1, 1, 1]}),
    ("LpPool", (1, 2, 5, 5, 5), {"kernel_shape": [2, 2, 2], "p": 2}),
]


def _conv_model(x_shape, w_shape, attrs, op="Conv"):
    w = rand(*w_shape)
    node = helper.make_node(op, ["x", "w", "b"], ["y"], **attrs)
    bias = rand(w_shape[1] * attrs.get("group", 1) if op == "ConvTranspose" else w_shape[0])
    return make_model([node], [("x", F32, x_shape)], [("y", F32, None)], [("w", w), ("b", bias)], opset=17)


@pytest.mark.parametrize(("x_shape", "w_shape", "attrs"), CONVS)
def test_conv3d_matches_onnxruntime(x_shape, w_shape, attrs, tmp_cache):
    assert_matches_ort(_conv_model(x_shape, w_shape, attrs), {"x": rand(*x_shape)}, tmp_cache, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("x_shape", "w_shape", "attrs"), [
    ((1, 3, 3, 4, 5), (3, 2, 3, 3, 3), {}),
    ((1, 4, 3, 4, 4), (4, 3, 2, 3, 2), {"group": 2, "strides": [2, 2, 1], "pads": [0, 1, 0, 1, 1, 0]}),
    ((1, 2, 2, 3, 3), (2, 2, 3, 3, 3), {"strides": [2, 2, 2], "output_padding": [1, 0, 1], "dilations": [1, 2, 1]}),
])
def test_conv_transpose3d_matches_onnxruntime(x_shape, w_shape, attrs, tmp_cache):
    model = _conv_model(x_shape, w_shape, attrs, op="ConvTranspose")
    assert_matches_ort(model, {"x": rand(*x_shape)}, tmp_cache, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("op", "x_shape", "attrs"), POOLS)
def test_pool3d_matches_onnxruntime(op, x_shape, attrs, tmp_cache):
    model = make_model([helper.make_node(op, ["x"], ["y"], **attrs)], [("x", F32, x_shape)], [("y", F32, None)])
    assert_matches_ort(model, {"x": rand(*x_shape)}, tmp_cache, rtol=1e-5, atol=1e-6)


def test_include_pad_average_of_a_ceil_window_counts_only_the_padded_input(tmp_cache):
    """count_include_pad with ceil_mode: the last window runs past the end pads; ONNX divides by its taps inside the
    padded input (here 4 of 9), not the whole kernel (the 2-D path divided by 9 before)."""
    attrs = {"kernel_shape": [3, 3], "strides": [3, 3], "ceil_mode": 1, "pads": [1, 1, 1, 1], "count_include_pad": 1}
    model = make_model([helper.make_node("AveragePool", ["x"], ["y"], **attrs)], [("x", F32, (1, 2, 9, 9))],
                       [("y", F32, None)])
    assert_matches_ort(model, {"x": rand(1, 2, 9, 9)}, tmp_cache, rtol=1e-5, atol=1e-6)


def test_conv3d_is_one_conv2d_kernel(tmp_cache):
    """The decomposition folds the depth taps into one 2-D conv (plus the copies that stack and restore planes)."""
    x_shape, w_shape, attrs = CONVS[0]
    program = cinn.load_onnx(_conv_model(x_shape, w_shape, attrs))
    assert [n.op for n in program.nodes].count("conv2d") == 1


def test_conv3d_builds_for_cuda(tmp_cache):
    x_shape, w_shape, attrs = CONVS[1]
    exe = cinn.compile(cinn.load_onnx(_conv_model(x_shape, w_shape, attrs)), target="cuda", cache_dir=tmp_cache)
    assert all("__global__" in s for s in exe.kernel_sources())


@pytest.mark.gpu
@pytest.mark.parametrize(("x_shape", "w_shape", "attrs"), CONVS[:2])
def test_conv3d_runs_on_gpu(x_shape, w_shape, attrs, tmp_cache):
    from tests.test_onnx_import import ort_run

    model, x = _conv_model(x_shape, w_shape, attrs), rand(*x_shape)
    (got,) = cinn.compile(cinn.load_onnx(model), target="cuda", cache_dir=tmp_cache).run({"x": x})
    np.testing.assert_allclose(got, ort_run(model, {"x": x})[0], rtol=1e-4, atol=1e-4)


# -- real sizes: the convs of an 18-layer R3D video network (input 1x3x8x112x112) --------------------------------
R3D_CONVS = [  # (input, weights, strides, pads): the stem, then each stage's first conv; depth 8 -> 4 -> 2 -> 1
    ((1, 3, 8, 112, 112), (64, 3, 3, 7, 7), (1, 2, 2), (1, 3, 3)),
    ((1, 64, 8, 56, 56), (64, 64, 3, 3, 3), (1, 1, 1), (1, 1, 1)),
    ((1, 64, 8, 56, 56), (128, 64, 3, 3, 3), (2, 2, 2), (1, 1, 1)),
    ((1, 128, 4, 28, 28), (256, 128, 3, 3, 3), (2, 2, 2), (1, 1, 1)),
    ((1, 256, 2, 14, 14), (512, 256, 3, 3, 3), (2, 2, 2), (1, 1, 1)),
    ((1, 512, 1, 7, 7), (512, 512, 3, 3, 3), (1, 1, 1), (1, 1, 1)),
    ((1, 256, 2, 14, 14), (512, 256, 1, 1, 1), (2, 2, 2), (0, 0, 0)),
]


@pytest.mark.parametrize("at_end", [False, True])
@pytest.mark.parametrize(("shape", "pads"), [((1, 3, 4, 64, 64), [0, 0, 1, 0, 0, 0, 0, 1, 0, 0]),
                                             ((1, 3, 64, 64), [0, 0, 0, 2, 0, 0, 0, 3])])
def test_pad_reads_only_inside_its_input(shape, pads, at_end, tmp_cache):
    """A constant Pad loads its input only inside it: it read x[-1] and x[d] at the borders (a Select loads both
    sides, and TVM had simplified the clamp of the index away), one plane beyond either end for a depth pad: the
    SIGSEGV of an R3D video model."""
    model = make_model([helper.make_node("Pad", ["x", "p"], ["y"])], [("x", F32, shape)], [("y", F32, None)],
                       [("p", np.array(pads, np.int64))])
    x = guarded(rand(*shape), at_end)
    (got,) = cinn.compile(cinn.load_onnx(model), cache_dir=tmp_cache).run({"x": x})
    np.testing.assert_array_equal(got, ort_run(model, {"x": x})[0])


def test_depth_pad_vectorizes_along_whole_planes(tmp_cache):
    """A depth Pad reads its unpadded H and W by their bare iterators, so the schedule's vectors run along a plane,
    under one pad condition: clamped like the padded axis, they made it vectorize the flat index instead, whose
    conditions differ per lane (2.7x slower with an if_then_else that TVM then scalarized)."""
    model = make_model([helper.make_node("Pad", ["x", "p"], ["y"])], [("x", F32, (1, 3, 4, 64, 64))],
                       [("y", F32, None)], [("p", np.array([0, 0, 1, 0, 0, 0, 0, 1, 0, 0], np.int64))])
    (source,) = cinn.compile(cinn.load_onnx(model), cache_dir=tmp_cache).kernel_sources()
    assert re.search(r"T\.reads\(x\[[^\]]*, v_i3, v_i4\]\)", source), source


@pytest.mark.parametrize(("x_shape", "w_shape", "strides", "pads"), R3D_CONVS)
def test_r3d_convs_read_inside_their_input(x_shape, w_shape, strides, pads, tmp_cache):
    """Each conv shape of the R3D network, its input between inaccessible pages, against onnxruntime."""
    model = _conv_model(x_shape, w_shape, {"strides": list(strides), "pads": list(pads) * 2})
    x = guarded(rand(*x_shape))
    (got,) = cinn.compile(cinn.load_onnx(model), cache_dir=tmp_cache).run({"x": x})
    np.testing.assert_allclose(got, ort_run(model, {"x": x})[0], rtol=1e-4, atol=1e-4)


def _r3d18(x: np.ndarray) -> onnx.ModelProto:
    """An 18-layer R3D video classifier (400 classes) with He-initialized convs, each normalized as batch norm
    folded with the statistics its output really has on `x` (measured with onnxruntime, layer by layer), so
    activations stay O(1) through all 18 layers."""
    rng = np.random.default_rng(7)
    nodes: list = []
    inits: list = []

    def measured(name: str) -> np.ndarray:
        model = make_model(nodes, [("x", F32, x.shape)], [(name, F32, None)], inits)
        return ort_run(model, {"x": x})[0]

    def conv(src: str, cin: int, cout: int, kernel, stride, pad) -> str:
        name = f"conv{len(nodes)}"
        w = rng.standard_normal((cout, cin, *kernel)) * np.sqrt(2 / (cin * np.prod(kernel)))
        inits.extend([(f"{name}_w", w.astype(np.float32)), (f"{name}_b", np.zeros(cout, np.float32))])
        nodes.append(helper.make_node("Conv", [src, f"{name}_w", f"{name}_b"], [name], kernel_shape=list(kernel),
                                      strides=list(stride), pads=list(pad) * 2))
        y = measured(name)
        mean, std = y.mean(axis=(0, 2, 3, 4)), y.std(axis=(0, 2, 3, 4)) + 1e-5
        inits[-2:] = [(f"{name}_w", (w / std[:, None, None, None, None]).astype(np.float32)),
                      (f"{name}_b", (-mean / std).astype(np.float32))]
        return name

    def op(kind: str, *srcs: str) -> str:
        name = f"{kind.lower()}{len(nodes)}"
        nodes.append(helper.make_node(kind, list(srcs), [name]))
        return name

    h, cin = op("Relu", conv("x", 3, 64, (3, 7, 7), (1, 2, 2), (1, 3, 3))), 64
    for stage, cout in enumerate((64, 128, 256, 512)):
        for block in range(2):
            s = 2 if stage and not block else 1
            branch = conv(op("Relu", conv(h, cin, cout, (3, 3, 3), (s,) * 3, (1,) * 3)), cout, cout, (3, 3, 3),
                          (1,) * 3, (1,) * 3)
            skip = conv(h, cin, cout, (1, 1, 1), (s,) * 3, (0,) * 3) if s != 1 or cin != cout else h
            h, cin = op("Relu", op("Add", branch, skip)), cout
    features = op("Flatten", op("GlobalAveragePool", h))
    inits.extend([("fc_w", (rng.standard_normal((400, 512)) / np.sqrt(512)).astype(np.float32)),
                  ("fc_b", np.zeros(400, np.float32))])
    nodes.append(helper.make_node("Gemm", [features, "fc_w", "fc_b"], ["y"], transB=1))
    return make_model(nodes, [("x", F32, x.shape)], [("y", F32, None)], inits)


# The AVX2 schedules' vector loads ran far enough past the depth pads' inputs to fault (finding 15): the host's
# AVX-512 ones happened to stay in mapped memory
AVX2 = f"llvm -mcpu=haswell -num-cores={os.cpu_count() or 1}"
# compiles and runs a model on inputs each placed between inaccessible pages, in its own process: a crash fails the
# test with its signal instead of ending the test run
_RUN_GUARDED = """
import sys
import numpy as np, onnx, cinn
from tests.guarded import guarded
model, inputs, target, cache, outputs = sys.argv[1:]
exe = cinn.compile(cinn.load_onnx(onnx.load(model)), target=target, cache_dir=cache)
np.savez(outputs, **{name: exe.run({"x": guarded(x)})[0] for name, x in np.load(inputs).items()})
"""


def _run_guarded(model: onnx.ModelProto, inputs: dict[str, np.ndarray], target: str, cache, tmp_path) -> dict:
    """The model's output for each of `inputs`, compiled for `target` and run in a subprocess (see _RUN_GUARDED)."""
    onnx.save(model, tmp_path / "model.onnx")
    np.savez(tmp_path / "inputs.npz", **inputs)
    argv = [str(a) for a in (tmp_path / "model.onnx", tmp_path / "inputs.npz", target, cache, tmp_path / "out.npz")]
    proc = subprocess.run([sys.executable, "-c", _RUN_GUARDED, *argv], cwd=ROOT, capture_output=True, text=True)
    status = signal.Signals(-proc.returncode).name if proc.returncode < 0 else f"exit status {proc.returncode}"
    assert proc.returncode == 0, f"the run ended with {status}: {proc.stderr[-3000:]}"
    return dict(np.load(tmp_path / "out.npz"))


@pytest.mark.skipif(parse_target("llvm").vector_bits < 256, reason="the AVX2 schedules need a CPU with AVX2")
def test_r3d18_video_network_matches_onnxruntime(tmp_cache, tmp_path):
    """Finding 15: an R3D-18 network at video size ran its depth pads' Selects out of bounds (SIGSEGV with the AVX2
    schedules). It runs to completion, matches onnxruntime, and its output follows its input (random weights must
    not saturate)."""
    shape = (1, 3, 8, 112, 112)
    x, other = rand(*shape), rand(*shape)
    model = _r3d18(x)
    outs = _run_guarded(model, {"x": x, "other": other}, AVX2, tmp_cache, tmp_path)
    want = ort_run(model, {"x": x})[0]
    scale = np.abs(want).max()
    assert 0.1 < scale < 100  # O(1) logits: the normalization held through all 18 layers
    np.testing.assert_allclose(outs["x"], want, rtol=1e-4, atol=1e-4 * scale)
    assert np.abs(outs["other"] - outs["x"]).max() > 0.1 * scale
    np.testing.assert_allclose(outs["other"], ort_run(model, {"x": other})[0], rtol=1e-4, atol=1e-4 * scale)
