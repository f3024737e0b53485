"""integer_kernels: quantized matmuls and convs (a dequantized uint8 tensor times int8-valued weights) in integers."""
from __future__ import annotations

import numpy as np
import pytest

import cinn
from cinn.compiler.lower import lower_program
from cinn.compiler.passes.integer_kernels import int8_weights, integer_kernels
from cinn.core.target import parse_target
from tests.test_passes import evaluate

VNNI = parse_target("llvm -mcpu=znver4 -num-cores=2").model  # AVX-512 VNNI: weight groups of 16 int32 lanes

RNG = np.random.default_rng(5)


def _weights(k: int, n: int, per_column: bool) -> np.ndarray:
    """Dequantized symmetric int8 weights, as onnxruntime's quantizer writes them."""
    values = RNG.integers(-127, 128, (k, n)).astype(np.int8)
    values[0] = 127  # the largest magnitude of every column (and the tensor) is 127 steps
    scale = RNG.uniform(1e-3, 1e-2, n if per_column else 1).astype(np.float32)
    return (values.astype(np.float32) * scale).astype(np.float32)


def _quantized_matmul(w: np.ndarray, zero: int, trans_y: bool = False, rows: tuple[int, ...] = (6, 32)):
    """x -> quantize (uint8, scale 0.05, zero point `zero`) -> dequantize -> matmul w (+ bias)."""
    b = cinn.NetBuilder("qmm")
    x = b.create_input("float32", rows, "x")
    s, z = b.create_constant(np.float32(0.05), "s"), b.create_constant(np.float32(zero), "z")
    q = b.cast(b.clip(b.add(b.round(b.divide(x, s)), z), 0.0, 255.0), "uint8")
    deq = b.multiply(b.subtract(b.cast(q, "float32"), z), s)
    wt = b.create_constant(np.ascontiguousarray(w.T) if trans_y else w, "w")
    y = b.add(b.matmul(deq, wt, trans_y=trans_y), b.create_constant(RNG.standard_normal(w.shape[1]).astype(np.float32), "bias"))
    return b.build([y])


@pytest.mark.parametrize("per_column", [False, True])
def test_int8_weights_are_recovered_exactly(per_column):
    """Also where the largest magnitude over 127 is a unit in the last place off the scale (a neighbour is tried)."""
    for _ in range(50):
        w = _weights(64, 48, per_column)
        values, scale = int8_weights(w)
        assert values.dtype == np.int8 and scale.shape == (48,)
        np.testing.assert_array_equal((values.astype(np.float32) * scale).astype(np.float32), w)
    assert int8_weights(w + np.float32(1e-4)) is None  # not a product of int8 values and a scale: left in float
    integers = RNG.integers(-128, 128, (8, 16)).astype(np.float32)  # MatMulInteger's weights: their own values
    values, scale = int8_weights(integers)
    assert (scale == 1).all() and np.array_equal(values, integers)


@pytest.mark.parametrize(("zero", "trans_y", "per_column"), [(0, False, False), (128, False, True), (7, True, True)])
def test_quantized_matmul_runs_in_integers_and_equals_the_float_graph(zero, trans_y, per_column, tmp_cache):
    program = _quantized_matmul(_weights(32, 48, per_column), zero, trans_y, rows=(2, 3, 32))
    rewritten = integer_kernels(program, VNNI)
    assert [n.op for n in rewritten.nodes].count("matmul_u8i8") == 1
    assert "matmul" not in [n.op for n in rewritten.nodes]
    x = RNG.uniform(-6, 6, (2, 3, 32)).astype(np.float32)
    want = evaluate(program, {"x": x})[0]
    np.testing.assert_allclose(evaluate(rewritten, {"x": x})[0], want, rtol=1e-5, atol=1e-4)
    (got,) = cinn.compile(program, cache_dir=tmp_cache).run({"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_only_vnni_targets_and_exact_weights_take_the_integer_path(tmp_cache):
    program = _quantized_matmul(_weights(32, 48, False), 3)
    assert "matmul_u8i8" not in [n.op for n in lower_program(program)[0].nodes]
    floats = _quantized_matmul(RNG.standard_normal((32, 48)).astype(np.float32), 3)  # a float weight
    assert "matmul_u8i8" not in [n.op for n in integer_kernels(floats, VNNI).nodes]
    odd = _quantized_matmul(_weights(32, 40, False), 3)  # 40 columns: padded to 48 with zero weights, sliced back
    assert [n.op for n in integer_kernels(odd, VNNI).nodes].count("slice") == 1
    xo = RNG.uniform(-6, 6, (6, 32)).astype(np.float32)
    (got,) = cinn.compile(odd, cache_dir=tmp_cache).run({"x": xo})
    np.testing.assert_allclose(got, evaluate(odd, {"x": xo})[0], rtol=1e-5, atol=1e-4)
    x = RNG.uniform(-6, 6, (6, 32)).astype(np.float32)
    (vnni,) = cinn.compile(program, cache_dir=tmp_cache).run({"x": x})
    (avx2,) = cinn.compile(program, target="llvm -mcpu=znver3", cache_dir=tmp_cache).run({"x": x})
    np.testing.assert_allclose(vnni, avx2, rtol=1e-5, atol=1e-4)


def test_the_vnni_kernel_uses_vpdpbusd(tmp_cache):
    from cinn.core.target import parse_target

    if not parse_target("llvm").has_vnni:
        pytest.skip("this CPU has no AVX-512 VNNI")
    exe = cinn.compile(_quantized_matmul(_weights(64, 64, True), 0, rows=(16, 64)), cache_dir=tmp_cache)
    assert any("vpdpbusd" in s for s in exe.kernel_sources())


def _quantized_conv(w: np.ndarray, zero: int, x_shape: tuple[int, ...], **attrs):
    """x -> quantize (uint8) -> dequantize -> conv2d w -> + bias."""
    b = cinn.NetBuilder("qconv")
    x = b.create_input("float32", x_shape, "x")
    s, z = b.create_constant(np.float32(0.05), "s"), b.create_constant(np.float32(zero), "z")
    q = b.cast(b.clip(b.add(b.round(b.divide(x, s)), z), 0.0, 255.0), "uint8")
    deq = b.multiply(b.subtract(b.cast(q, "float32"), z), s)
    bias = b.create_constant(RNG.standard_normal((w.shape[0], 1, 1)).astype(np.float32), "bias")
    return b.build([b.add(b.conv2d(deq, b.create_constant(w, "w"), **attrs), bias)])


@pytest.mark.parametrize(("x_shape", "oc", "k", "zero", "attrs"), [
    ((1, 8, 9, 9), 32, 3, 0, {"paddings": [1, 1]}),
    ((2, 3, 12, 11), 16, 7, 128, {"strides": [2, 2], "paddings": [3, 2, 3, 2]}),  # an RGB stem: channels padded
    ((1, 16, 7, 7), 48, 1, 7, {}),
    ((1, 4, 10, 10), 16, 3, 3, {"dilations": [2, 2], "paddings": [0, 1, 2, 0]}),
])
def test_quantized_conv_runs_in_integers_and_equals_the_float_graph(x_shape, oc, k, zero, attrs, tmp_cache):
    w = _weights(x_shape[1] * k * k, oc, per_column=True).T.reshape(oc, x_shape[1], k, k).copy()
    program = _quantized_conv(w, zero, x_shape, **attrs)
    rewritten = integer_kernels(program, VNNI)
    ops = [n.op for n in rewritten.nodes]
    assert ops.count("conv2d_u8i8") == 1 and "conv2d" not in ops
    x = RNG.uniform(-6, 6, x_shape).astype(np.float32)
    want = evaluate(program, {"x": x})[0]
    np.testing.assert_allclose(evaluate(rewritten, {"x": x})[0], want, rtol=1e-5, atol=1e-4)
    (got,) = cinn.compile(program, cache_dir=tmp_cache).run({"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_narrow_convs_are_padded_and_grouped_ones_stay_in_float(tmp_cache):
    w = _weights(8 * 9, 8, per_column=True).T.reshape(8, 8, 3, 3).copy()  # 8 output channels: padded to 16, sliced
    narrow = _quantized_conv(w, 0, (1, 8, 6, 6))
    assert [n.op for n in integer_kernels(narrow, VNNI).nodes].count("slice") == 1
    x = RNG.uniform(-6, 6, (1, 8, 6, 6)).astype(np.float32)
    (got,) = cinn.compile(narrow, cache_dir=tmp_cache).run({"x": x})
    np.testing.assert_allclose(got, evaluate(narrow, {"x": x})[0], rtol=1e-5, atol=1e-4)
    g = _weights(4 * 9, 32, per_column=True).T.reshape(32, 4, 3, 3).copy()
    grouped = _quantized_conv(g, 0, (1, 8, 6, 6), groups=2)
    assert "conv2d_u8i8" not in [n.op for n in integer_kernels(grouped, VNNI).nodes]


def test_opposite_transposes_meet_through_elementwise_ops_and_cancel():
    from cinn.compiler.passes.sink_transposes import sink_transposes

    b = cinn.NetBuilder("sink")
    x, r = b.create_input("float32", (1, 5, 6, 16), "x"), b.create_input("float32", (1, 5, 6, 16), "r")
    nchw = b.transpose(x, [0, 3, 1, 2])
    y = b.relu(b.add(b.multiply(nchw, b.create_constant(rand_c(16), "scale")), b.transpose(r, [0, 3, 1, 2])))
    y = b.clip(b.add(y, b.create_constant(np.float32(0.5), "half")), 0.0, 6.0)
    program = b.build([b.transpose(y, [0, 2, 3, 1]), b.batchnorm(nchw, *(b.create_constant(rand_c(16).reshape(-1) + 2, k)
                                                                             for k in "sbmv"))])
    sunk = sink_transposes(program)
    ops = [n.op for n in sunk.nodes]
    assert ops.count("transpose") == 1  # the batch norm (its channels follow an axis) keeps its own
    feeds = {"x": RNG.standard_normal((1, 5, 6, 16)).astype(np.float32), "r": RNG.standard_normal((1, 5, 6, 16)).astype(np.float32)}
    for got, want in zip(evaluate(sunk, feeds), evaluate(program, feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_a_concat_of_transposes_becomes_a_transposed_concat():
    """squeezenet's fire modules: the two expand convs' channels-last outputs concatenated over channels."""
    from cinn.compiler.passes.sink_transposes import sink_transposes

    b = cinn.NetBuilder("cat")
    x, y = b.create_input("float32", (1, 5, 6, 16), "x"), b.create_input("float32", (1, 5, 6, 8), "y")
    cat = b.concat([b.transpose(x, [0, 3, 1, 2]), b.transpose(y, [0, 3, 1, 2])], axis=1)
    program = b.build([b.transpose(b.relu(cat), [0, 2, 3, 1])])
    sunk = sink_transposes(program)
    assert [n.op for n in sunk.nodes] == ["concat", "relu"] and sunk.nodes[0].attrs.axis == 3
    feeds = {"x": RNG.standard_normal((1, 5, 6, 16)).astype(np.float32), "y": RNG.standard_normal((1, 5, 6, 8)).astype(np.float32)}
    np.testing.assert_array_equal(evaluate(sunk, feeds)[0], evaluate(program, feeds)[0])


def rand_c(c: int) -> np.ndarray:
    return RNG.uniform(0.5, 1.5, (c, 1, 1)).astype(np.float32)


def test_consecutive_quantized_convs_keep_channels_last(tmp_cache):
    """Two quantized convs with a residual add between them: the quantized tensors stay NHWC from one integer conv
    to the next (one transpose into the first, one back out of the graph), and the result equals the float graph."""
    b = cinn.NetBuilder("qres")
    x = b.create_input("float32", (1, 16, 8, 8), "x")

    def fake_quant(v, scale, zero):
        s, z = b.create_constant(np.float32(scale)), b.create_constant(np.float32(zero))
        q = b.cast(b.clip(b.add(b.round(b.divide(v, s)), z), 0.0, 255.0), "uint8")
        return b.multiply(b.subtract(b.cast(q, "float32"), z), s)

    w1 = _weights(16 * 9, 32, True).T.reshape(32, 16, 3, 3).copy()
    w2 = _weights(32, 16, True).T.reshape(16, 32, 1, 1).copy()
    h = b.relu(b.conv2d(fake_quant(x, 0.05, 100), b.create_constant(w1, "w1"), paddings=[1, 1]))
    y = b.add(b.conv2d(fake_quant(h, 0.02, 0), b.create_constant(w2, "w2")), x)
    program = b.build([fake_quant(y, 0.04, 128)])
    lowered, _ = lower_program(program, target=parse_target("llvm -mcpu=znver5"))
    ops = [n.op for n in lowered.nodes]
    assert ops.count("conv2d_u8i8") == 2 and ops.count("transpose") == 2
    xs = RNG.uniform(-3, 3, (1, 16, 8, 8)).astype(np.float32)
    (got,) = cinn.compile(program, cache_dir=tmp_cache).run({"x": xs})
    np.testing.assert_allclose(got, evaluate(program, {"x": xs})[0], rtol=1e-5, atol=0.04 + 1e-5)  # a step at most


def test_a_quantized_vector_times_a_matrix_stays_float(tmp_cache):
    program = _quantized_matmul(_weights(32, 48, False), 3, rows=(32,))
    assert "matmul_u8i8" not in [n.op for n in integer_kernels(program, VNNI).nodes]
    x = RNG.uniform(-6, 6, (32,)).astype(np.float32)
    (got,) = cinn.compile(program, cache_dir=tmp_cache).run({"x": x})
    np.testing.assert_allclose(got, evaluate(program, {"x": x})[0], rtol=1e-5, atol=1e-4)


def test_a_depthwise_conv_between_quantized_convs_goes_channels_last(tmp_cache):
    """An inverted residual block quantized as cinn.quantize does (the depthwise conv stays float): the depthwise conv
    computes channels last between the integer convs, so no transpose remains between them (one into the first conv,
    one out of the graph), and the result equals the float graph."""
    b = cinn.NetBuilder("qdw")
    x = b.create_input("float32", (1, 16, 9, 9), "x")

    def fake_quant(v, scale, zero):
        s, z = b.create_constant(np.float32(scale)), b.create_constant(np.float32(zero))
        q = b.cast(b.clip(b.add(b.round(b.divide(v, s)), z), 0.0, 255.0), "uint8")
        return b.multiply(b.subtract(b.cast(q, "float32"), z), s)

    w1 = _weights(16, 64, True).T.reshape(64, 16, 1, 1).copy()
    dw = RNG.standard_normal((64, 1, 3, 3)).astype(np.float32)
    w2 = _weights(64, 16, True).T.reshape(16, 64, 1, 1).copy()
    h = b.clip(b.conv2d(fake_quant(x, 0.05, 100), b.create_constant(w1, "w1")), 0.0, 6.0)
    h = b.clip(b.add(b.conv2d(h, b.create_constant(dw, "dw"), paddings=[1, 1], groups=64), rand_c(64)), 0.0, 6.0)
    program = b.build([b.conv2d(fake_quant(h, 0.03, 0), b.create_constant(w2, "w2"))])
    lowered, groups = lower_program(program, target=parse_target("llvm -mcpu=znver5"))
    ops = [n.op for n in lowered.nodes]
    assert ops.count("conv2d_u8i8") == 2 and ops.count("transpose") == 2
    assert len(groups) == 5  # the input's quantize, three convs with their epilogues, the output's transpose
    xs = RNG.uniform(-3, 3, (1, 16, 9, 9)).astype(np.float32)
    (got,) = cinn.compile(program, cache_dir=tmp_cache).run({"x": xs})
    np.testing.assert_allclose(got, evaluate(program, {"x": xs})[0], rtol=1e-4, atol=1e-3)


def test_a_quantized_conv_reads_the_padded_channels_of_the_one_before(tmp_cache):
    """24 output channels are computed as 32 (whole vectors) and sliced back; the next integer conv reads the 32,
    the padding's weights zero, and no slice kernel remains."""
    b = cinn.NetBuilder("qpad")
    x = b.create_input("float32", (1, 16, 6, 6), "x")

    def fake_quant(v, scale, zero):
        s, z = b.create_constant(np.float32(scale)), b.create_constant(np.float32(zero))
        q = b.cast(b.clip(b.add(b.round(b.divide(v, s)), z), 0.0, 255.0), "uint8")
        return b.multiply(b.subtract(b.cast(q, "float32"), z), s)

    w1 = _weights(16, 24, True).T.reshape(24, 16, 1, 1).copy()
    w2 = _weights(24, 32, True).T.reshape(32, 24, 1, 1).copy()
    h = b.add(b.conv2d(fake_quant(x, 0.05, 100), b.create_constant(w1, "w1")), rand_c(24))
    program = b.build([b.conv2d(fake_quant(h, 0.03, 120), b.create_constant(w2, "w2"))])
    lowered, groups = lower_program(program, target=parse_target("llvm -mcpu=znver5"))
    ops = [n.op for n in lowered.nodes]
    assert ops.count("conv2d_u8i8") == 2 and "slice" not in ops and len(groups) == 4
    xs = RNG.uniform(-3, 3, (1, 16, 6, 6)).astype(np.float32)
    (got,) = cinn.compile(program, cache_dir=tmp_cache).run({"x": xs})
    np.testing.assert_allclose(got, evaluate(program, {"x": xs})[0], rtol=1e-4, atol=1e-3)
