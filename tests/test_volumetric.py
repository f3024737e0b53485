"""3-D Conv, ConvTranspose and pooling (decomposed onto the 2-D ops) against onnxruntime."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper  # noqa: E402

import cinn  # noqa: E402
from tests.test_onnx_import import assert_matches_ort, make_model, rand  # noqa: E402

F32 = TensorProto.FLOAT
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
