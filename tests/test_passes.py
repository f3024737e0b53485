"""Graph passes: structure after each pass, and numerics of the optimized, compiled program vs numpy."""
from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Callable

import numpy as np
import pytest

import cinn
from cinn.compiler.passes import fold_constants as fold_module
from cinn.compiler.passes.conv_forms import conv_forms
from cinn.compiler.passes.cse import cse
from cinn.compiler.passes.dce import dce
from cinn.compiler.passes.fold_constants import fold_constants
from cinn.compiler.passes.index_map import IndexMap
from cinn.compiler.passes.pack_weights import pack_weights
from cinn.compiler.passes.pipeline import optimize
from cinn.compiler.passes.simplify import simplify
from cinn.compiler.passes.sink_transposes import sink_transposes
from cinn.compiler.passes.verify import verify
from cinn.core.ir import Program, TensorType
from cinn.core.ops import get_op, infer
from cinn.core.ops.nn import PackedMatmulAttrs, WeightLayout
from cinn.core.ops.te_util import thin_rows
from cinn.core.target import parse_target

RNG = np.random.default_rng(0)
# CPU models of the passes' tests: AVX-512 (16 fp32 lanes, 32 registers) and AVX2 (8 lanes, 16 registers)
AVX512 = parse_target("llvm -mcpu=znver5 -num-cores=2").model
AVX2 = parse_target("llvm -mcpu=znver3 -num-cores=2").model


def rand(*shape: int) -> np.ndarray:
    return (RNG.random(shape) * 2 - 1).astype("float32")


def evaluate(program: Program, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The program's outputs computed node by node with the op table's numpy references."""
    env = {**program.constants, **feeds}
    for node in program.nodes:
        outs = get_op(node.op).reference([env[v.name] for v in node.inputs], node.attrs)
        env.update((v.name, np.asarray(o)) for v, o in zip(node.outputs, outs, strict=True))
    return [env[v.name] for v in program.outputs]


def ops(program: Program) -> Counter:
    return Counter(n.op for n in program.nodes)


def check_pass(program: Program, feeds: dict, pass_fn: Callable[[Program], Program]) -> Program:
    """Run a pass, verify the result is well formed and computes what the original did (in numpy)."""
    result = pass_fn(program)
    verify(result)
    assert [v.type for v in result.outputs] == [v.type for v in program.outputs]
    for got, want in zip(evaluate(result, feeds), evaluate(program, feeds), strict=True):
        assert got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    return result


def check_compiled(program: Program, feeds: dict, cache, rtol: float = 1e-5) -> cinn.runtime.executable.Executable:
    """The program compiled through the default pipeline gives the unoptimized numpy reference."""
    exe = cinn.compile(program, cache_dir=cache)
    for got, want, v in zip(exe.run(feeds), evaluate(program, feeds), program.outputs, strict=True):
        assert got.shape == v.shape and str(got.dtype) == v.dtype
        np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol)
    return exe


# -- fold_constants -------------------------------------------------------------------------------
def _constant_subgraph() -> tuple[Program, dict]:
    b = cinn.NetBuilder("fold")
    x = b.create_input("float32", (4, 2), "x")
    a, c = b.create_constant(rand(2, 3), "a"), b.create_constant(rand(3), "c")
    w = b.relu(b.add(a, c))  # constant (2, 3)
    idx = b.cast(b.scale(b.create_constant(np.arange(3, dtype="int32"), "i"), scale=2), "float16")
    y = b.add(b.matmul(x, w), c)
    return b.build([y, w, idx]), {"x": rand(4, 2)}


def test_fold_constants_folds_constant_subgraph():
    program, feeds = _constant_subgraph()
    folded = check_pass(program, feeds, fold_constants)
    assert ops(folded) == Counter(matmul=1, add=1)
    w, idx = folded.outputs[1:]
    assert w.name in folded.constants and idx.name in folded.constants
    assert folded.constants[idx.name].dtype == np.float16  # the node's output type, not numpy's


def test_fold_constants_skips_broadcasts_and_huge_results(monkeypatch):
    b = cinn.NetBuilder("nofold")
    c = b.create_constant(rand(3), "c")
    wide = b.broadcast_to(c, out_shape=[4, 3])  # more elements than its input: left to the kernel
    doubled = b.scale(c, scale=2.0)
    program = b.build([wide, doubled])
    assert ops(fold_constants(program)) == Counter(broadcast_to=1)
    monkeypatch.setattr(fold_module, "MAX_FOLDED_BYTES", 8)
    assert ops(fold_constants(program)) == Counter(broadcast_to=1, scale=1)


def test_constant_outputs_are_returned_by_compiled_program(tmp_cache):
    program, feeds = _constant_subgraph()
    exe = check_compiled(program, feeds, tmp_cache)
    assert exe.num_kernels == 1


# -- dce -----------------------------------------------------------------------------------------
def test_dce_removes_dead_branches_and_unused_constants():
    b = cinn.NetBuilder("dce")
    x = b.create_input("float32", (2, 6), "x")
    unused_input = b.create_input("float32", (3,), "unused")
    dead_const = b.create_constant(rand(2, 6), "dead_const")
    b.exp(b.add(x, dead_const))  # dead branch
    first, _second = b.split(x, num_or_sections=2, axis=1)
    y = b.relu(first)
    program = b.build([y])
    result = check_pass(program, {"x": rand(2, 6), "unused": rand(3)}, dce)
    assert ops(result) == Counter(split=1, relu=1)  # a multi-output node stays when one output is live
    assert dict(result.constants) == {} and result.inputs == (x, unused_input)


# -- cse -----------------------------------------------------------------------------------------
def test_cse_merges_duplicated_subexpressions_and_constants(tmp_cache):
    b = cinn.NetBuilder("cse")
    x = b.create_input("float32", (3, 4), "x")
    data = rand(4)
    w1, w2 = b.create_constant(data, "w1"), b.create_constant(data, "w2")
    other = b.create_constant(data.astype("float16"), "w3")  # same values, other dtype: distinct
    y1 = b.relu(b.add(x, w1))
    y2 = b.relu(b.add(x, w2))
    s2, s3 = b.scale(x, scale=2.0), b.scale(x, scale=3.0)  # different attrs: distinct
    h = b.add(b.cast(x, "float16"), other)
    program = b.build([y1, y2, b.add(s2, s3), h])
    feeds = {"x": rand(3, 4)}
    result = dce(check_pass(program, feeds, cse))
    assert ops(result) == Counter(add=3, relu=1, scale=2, cast=1)
    assert result.outputs[0] == result.outputs[1]
    assert sorted(result.constants) == ["w1", "w3"]
    check_compiled(program, feeds, tmp_cache, rtol=1e-3)


# -- simplify: no-op ops -------------------------------------------------------------------------
def test_simplify_removes_identity_and_inference_dropout():
    b = cinn.NetBuilder("noops")
    x = b.create_input("float32", (2, 5), "x")
    y = b.dropout(b.identity(x), dropout_prob=0.3, dropout_implementation="upscale_in_train")
    z = b.dropout(b.relu(y), dropout_prob=0.25)  # downgrade_in_infer multiplies by 1 - p
    program = b.build([z, b.identity(x)])
    result = check_pass(program, {"x": rand(2, 5)}, simplify)
    assert ops(result) == Counter(relu=1, scale=1)
    assert result.nodes[1].attrs.scale == 0.75
    assert result.outputs[1] == x


# -- simplify: batch norm folding ----------------------------------------------------------------
def _bn_params(b, c: int) -> list:
    return [b.create_constant(a) for a in (rand(c) + 1.5, rand(c), rand(c), RNG.random(c).astype("float32") + 0.5)]


def _conv_bn(extra_user: bool = False) -> tuple[Program, dict]:
    b = cinn.NetBuilder("conv_bn")
    x = b.create_input("float32", (1, 4, 6, 6), "x")
    w = b.create_constant(rand(6, 2, 3, 3), "w")
    conv = b.conv2d(x, w, strides=[1, 1], paddings=[1, 1], groups=2)
    y = b.relu(b.batchnorm(conv, *_bn_params(b, 6), epsilon=1e-3))
    return b.build([y, conv] if extra_user else [y]), {"x": rand(1, 4, 6, 6)}


def test_batchnorm_folds_into_conv(tmp_cache):
    program, feeds = _conv_bn()
    result = check_pass(program, feeds, simplify)
    assert ops(result) == Counter(conv2d=1, add=1, relu=1)
    assert [v.shape for v in result.const_values] == [(6, 2, 3, 3), (6, 1, 1)]
    check_compiled(program, feeds, tmp_cache, rtol=1e-4)


def test_batchnorm_stays_when_conv_output_has_other_users():
    program, feeds = _conv_bn(extra_user=True)
    assert ops(check_pass(program, feeds, simplify))["batchnorm"] == 1


@pytest.mark.parametrize("channels", [6, 5], ids=["channels-equal-height", "channels-differ"])
def test_batchnorm_over_a_channels_last_conv_output_axis_1_stays(channels):
    # batchnorm's NCHW channel axis 1 is the height of an NHWC conv's output: scaling the conv's output channels
    # instead gave wrong numbers (or failed to broadcast)
    b = cinn.NetBuilder("nhwc_conv_bn")
    x = b.create_input("float32", (1, 6, 6, 4), "x")
    conv = b.conv2d(x, b.create_constant(rand(channels, 4, 3, 3), "w"), paddings=[1, 1], data_format="NHWC")
    program = b.build([b.batchnorm(conv, *_bn_params(b, 6))])
    assert ops(check_pass(program, {"x": rand(1, 6, 6, 4)}, simplify))["batchnorm"] == 1


@pytest.mark.parametrize("trans_y", [False, True])
def test_batchnorm_folds_into_matmul(trans_y, tmp_cache):
    b = cinn.NetBuilder("matmul_bn")
    x = b.create_input("float32", (5, 8), "x")
    w = b.create_constant(rand(3, 8) if trans_y else rand(8, 3), "w")
    y = b.batchnorm(b.matmul(x, w, trans_y=trans_y, alpha=0.5), *_bn_params(b, 3))
    program, feeds = b.build([y]), {"x": rand(5, 8)}
    assert ops(check_pass(program, feeds, simplify)) == Counter(matmul=1, add=1)
    check_compiled(program, feeds, tmp_cache, rtol=1e-4)


@pytest.mark.parametrize("exponent, want", [(0.5, {"sqrt": 1}), (0.75, {"sqrt": 2, "multiply": 1}), (2.0, {"multiply": 1}),
                                           (1.0, {}), (1.5, {"pow": 1})])
def test_pow_by_constant_becomes_roots_and_products(exponent, want, tmp_cache):
    b = cinn.NetBuilder("pow")
    x = b.create_input("float32", (3, 17), "x")
    y = b.pow(b.abs(x), b.fill_constant((), exponent, "float32"))
    program, feeds = b.build([b.add(y, x)]), {"x": rand(3, 17)}
    result = check_pass(program, feeds, simplify)
    assert ops(result) == Counter(abs=1, add=1, **want)
    check_compiled(program, feeds, tmp_cache)


@pytest.mark.parametrize(("low", "high", "dtype", "dropped"), [(0.0, 255.0, "uint8", True), (-128.0, 127.0, "int8", True),
                                                            (0.0, 256.0, "uint8", False), (0.5, 255.0, "uint8", False),
                                                            (0.0, 254.5, "uint8", False)])
def test_a_quantize_dequantize_round_trip_stays_in_float(low, high, dtype, dropped, tmp_cache):
    """cast(cast(clip(round(x / s) + zp, lo, hi), int), float) is the clip itself when [lo, hi] fits the int type."""
    b = cinn.NetBuilder("qdq")
    x = b.create_input("float32", (4, 9), "x")
    q = b.clip(b.add(b.round(b.scale(x, scale=10.0)), b.fill_constant((), 3.0, "float32")), low, high)
    y = b.multiply(b.cast(b.cast(q, dtype), "float32"), b.fill_constant((), 0.1, "float32"))
    program, feeds = b.build([y]), {"x": rand(4, 9) * 20}
    result = check_pass(program, feeds, simplify) if dropped else simplify(program)
    assert ops(result)["cast"] == (0 if dropped else 2)
    check_compiled(program, feeds, tmp_cache)


# -- pack_weights --------------------------------------------------------------------------------
def test_pack_weights_stores_conv_and_matmul_weights_as_the_kernels_read_them(tmp_cache):
    b = cinn.NetBuilder("pack")
    x = b.create_input("float32", (1, 4, 7, 7), "x")
    w, v = b.create_constant(rand(6, 2, 3, 3), "w"), b.create_input("float32", (6, 4, 1, 1), "v")
    y = b.conv2d(x, w, strides=[2, 1], paddings=[1, 1], groups=2)
    z = b.conv2d(x, v)  # a weight given at run time stays OIHW
    rows = b.matmul(b.reshape(y, [2, 84]), b.create_constant(rand(5, 84), "m"), trans_y=True)
    gemv = b.matmul(b.reshape(y, [1, 168]), b.create_constant(rand(168, 3), "g"))
    t = b.reshape(y, [2, 3, 28])
    panels = [b.matmul(t, b.create_constant(rand(28, 96), "p48")),  # batched x, one 2-D weight
              b.matmul(t, b.create_constant(rand(32, 28), "p32"), trans_y=True, alpha=0.5)]
    program = b.build([rows, gemv, z, *panels])
    feeds = {"x": rand(1, 4, 7, 7), "v": rand(6, 4, 1, 1)}
    result = check_pass(program, feeds, lambda p: dce(pack_weights(p, AVX512)))
    # a conv2d with constant weights becomes a conv2d_packed; one whose weights come at run time stays a conv2d
    assert [n.op for n in result.nodes if n.op.startswith("conv2d")] == ["conv2d_packed", "conv2d"]
    assert [str(n.attrs.weight_layout) for n in result.nodes if n.op == "conv2d_packed"] == ["GIHWO"]
    # a matmul's weights go to column panels [N / p, K, p], or [K, N] where no panel width divides N; a single row's
    # (a GEMV) [N, K], one dot product per output
    assert [v.shape for v in result.const_values] == [(2, 2, 3, 3, 3), (84, 5), (3, 168), (2, 28, 48), (1, 28, 32)]
    matmuls = [(n.op, n.attrs.trans_y) for n in result.nodes if n.op.startswith("matmul")]
    assert matmuls == [("matmul", False), ("matmul", True), ("matmul_packed", False), ("matmul_packed", False)]
    assert [n.attrs.y_panel for n in result.nodes if n.op == "matmul_packed"] == [48, 32]
    check_compiled(program, feeds, tmp_cache, rtol=1e-4)


def test_pack_weights_pads_odd_wide_weights_to_whole_panels(tmp_cache):
    b = cinn.NetBuilder("pad")
    x = b.create_input("float32", (2, 9, 28), "x")
    y = b.add(b.matmul(x, b.create_constant(rand(257, 28), "vocab"), trans_y=True), b.create_constant(rand(257), "c"))
    program = b.build([y])
    feeds = {"x": rand(2, 9, 28)}
    result = check_pass(program, feeds, lambda p: dce(pack_weights(p, AVX512)))
    # N = 257 has no 8-lane divisor: 6 zero-padded 48-column panels; the matmul keeps 257 of their 288 columns, so
    # no slice copies its output, and the bias fuses into its kernel, which writes [2, 9, 257]
    assert [v.shape for v in result.const_values if v.name != "c"] == [(6, 28, 48)]
    assert [n.op for n in result.nodes] == ["matmul_packed", "add"]
    assert result.nodes[0].attrs.columns == 257 and result.nodes[0].outputs[0].shape == (2, 9, 257)
    exe = check_compiled(program, feeds, tmp_cache, rtol=1e-4)
    assert exe.num_kernels == 1


@pytest.mark.parametrize(("rows", "padded"), [(197, True), (50, False), (17, False), (2 * 197, True), (192, False)])
def test_matmul_rows_without_a_fitting_tile_height_are_computed_in_whole_tiles(rows, padded, tmp_cache):
    """197 tokens (a prime) would take register tiles one row high: the kernel computes 200 rows, the last tile
    reading x's last row again, and writes back 197, bias and residual included; 50 rows take tiles of 5 and 17
    would gain too little for the rows it adds."""
    b = cinn.NetBuilder("rows")
    x = b.create_input("float32", (1, rows, 24), "x")
    y = b.add(b.add(b.matmul(x, b.create_constant(rand(24, 96), "w")), b.create_constant(rand(96), "c")),
              b.create_input("float32", (1, rows, 96), "r"))
    program = b.build([y])
    feeds = {"x": rand(1, rows, 24), "r": rand(1, rows, 96)}
    (node,) = [n for n in optimize(program, target=parse_target("llvm")).nodes if n.op == "matmul_packed"]
    assert node.attrs.row_pad == AVX512.padded_rows
    assert thin_rows(rows, node.attrs.row_pad) is padded
    exe = check_compiled(program, feeds, tmp_cache, rtol=1e-4)
    assert exe.num_kernels == 1
    # the last tile's rows read x's last row again
    assert bool(re.search(rf"x\[0, T\.min\(\w+, {rows - 1}\)", exe.kernel_sources()[0])) is padded


def test_matmul_columns_lie_in_the_last_panel():
    x, y = TensorType((3, 8), "float32"), TensorType((2, 8, 16), "float32")
    with pytest.raises(ValueError, match=r"matmul_packed: columns 12 is not within the last of the panels of y \(2, 8, 16\)"):
        infer(get_op("matmul_packed"), [x, y], PackedMatmulAttrs(y_panel=16, columns=12))
    with pytest.raises(ValueError, match="columns is only for y stored as panels"):
        infer(get_op("matmul_packed"), [x, TensorType((8, 5), "float32")], PackedMatmulAttrs(columns=4))


@pytest.mark.parametrize("out_channels, shape, sliced", [(1000, (32, 16, 1, 1, 32), True), (300, (10, 16, 1, 1, 32), True),
                                                    (1024, (32, 16, 1, 1, 32), False), (200, (16, 1, 1, 208), True),
                                                    (68, (16, 1, 1, 80), True), (36, (16, 1, 1, 36), False)])
def test_pack_weights_stores_dense_conv_weights_in_whole_panels(out_channels, shape, sliced, tmp_cache):
    b = cinn.NetBuilder("classes")
    x = b.create_input("float32", (1, 16, 5, 5), "x")
    w = b.create_constant(rand(out_channels, 16, 1, 1), "w")
    y = b.relu(b.add(b.conv2d(x, w), b.create_constant(rand(out_channels, 1, 1), "bias")))
    program = b.build([y])
    feeds = {"x": rand(1, 16, 5, 5)}
    result = check_pass(program, feeds, lambda p: dce(pack_weights(p, AVX512)))
    # IHWO32 panels of 32 output channels; 1000 classes are zero-padded to 1024 and the output sliced back; 200 and 68
    # on 5-column rows (too few for panels) are padded to whole 16-lane vectors (36 would take 33% more work: not)
    assert [v.shape for v in result.const_values if v.name.startswith("w_ihwo")] == [shape]
    assert [str(n.attrs.weight_layout) for n in result.nodes if n.op == "conv2d_packed"] == ["IHWO32" if len(shape) == 5 else "IHWO"]
    assert ops(result)["slice"] == int(sliced)
    check_compiled(program, feeds, tmp_cache, rtol=1e-4)


@pytest.mark.parametrize("out_channels, registers, tile", [(64, 16, 6), (64, 32, 0), (40, 16, 0), (28, 16, 0)])
def test_pack_weights_has_flat_1x1_convs_compute_whole_register_tiles_of_channels(out_channels, registers, tile,
                                                                                  tmp_cache):
    """With 16 registers an NCHW 1x1 conv over flat pixels (7x16) computes 64 output channels as 66, whole tiles of
    6 (channel_tile); with 32 registers, or channels with a divisor of 5 or 6, or where that adds over 1/16 (28 ->
    30), as they are. The residual add still fuses into the conv's kernel, which writes the 64 channels."""
    b = cinn.NetBuilder("tiles")
    x = b.create_input("float32", (1, 24, 7, 16), "x")
    skip = b.create_input("float32", (1, out_channels, 7, 16), "skip")
    y = b.relu(b.add(b.conv2d(x, b.create_constant(rand(out_channels, 24, 1, 1), "w")), skip))
    program = b.build([y])
    feeds = {"x": rand(1, 24, 7, 16), "skip": rand(1, out_channels, 7, 16)}
    result = check_pass(program, feeds, lambda p: dce(pack_weights(p, dataclasses.replace(AVX2, vector_registers=registers))))
    assert [n.attrs.channel_tile for n in result.nodes if n.op == "conv2d_packed"] == [tile]
    avx2 = parse_target("llvm -mcpu=znver3 -num-cores=2")
    exe = cinn.compile(result, avx2, cache_dir=tmp_cache, passes=False)
    (got,) = exe.run(feeds)
    np.testing.assert_allclose(got, evaluate(program, feeds)[0], rtol=1e-4, atol=1e-4)
    assert exe.num_kernels == 1
    if tile:
        assert "T.sblock_alloc_buffer((1, 66, 112))" in exe.kernel_sources()[0]


@pytest.mark.parametrize("strides, shape", [((2, 2), (1, 3, 3, 3, 32)), ((1, 1), (3, 3, 3, 24))])
def test_pack_weights_pads_a_strided_convs_channels_to_whole_vectors(strides, shape, tmp_cache):
    # a strided conv is vectorized over its output channels even on rows of whole vectors (16 here): 24 channels
    # become 32 (two 16-lane registers, not three 8-lane ones), the relu runs on them, then the slice back (so the
    # relu fuses into the conv's kernel); at stride 1 the 16 columns are the vector axis
    b = cinn.NetBuilder("stem")
    x = b.create_input("float32", (1, 3, 32, 32), "x")
    y = b.relu(b.conv2d(x, b.create_constant(rand(24, 3, 3, 3), "w"), strides=list(strides), paddings=[1, 1]))
    program = b.build([y])
    feeds = {"x": rand(1, 3, 32, 32)}
    result = check_pass(program, feeds, lambda p: dce(pack_weights(p, AVX512)))
    assert [v.shape for v in result.const_values if v.name.startswith("w_ihwo")] == [shape]
    assert [n.op for n in result.nodes] == ["conv2d_packed", "relu"] + ["slice"] * (shape[-1] == 32)
    check_compiled(program, feeds, tmp_cache, rtol=1e-4)


@pytest.mark.parametrize("channels, groups, out_channels, hw, kernel, strides, paddings, dilations, weights", [
    (136, 4, 136, (28, 28), 1, [1, 1], [0, 0], [1, 1], (4, 34, 1, 1, 34)),  # shufflenet's: flat pixels
    (64, 4, 52, (14, 14), 1, [1, 1], [0, 0], [1, 1], (4, 16, 1, 1, 16)),  # 13 per group padded to 16
    (8, 2, 64, (6, 5), 3, [1, 2], [1, 0, 1, 1], [1, 1], (2, 4, 3, 3, 32)),
    (12, 3, 9, (9, 9), 3, [1, 1], [2, 2], [2, 2], (3, 4, 3, 3, 3)),
])
def test_a_grouped_conv_is_one_kernel_over_gihwo_weights(channels, groups, out_channels, hw, kernel, strides, paddings,
                                                         dilations, weights, tmp_cache):
    """Every group in one kernel, its weights [G, I, H, W, O / G] with each group's output channels padded to whole
    vectors where that costs little, the padding dropped after the conv; the outputs as numpy's."""
    b = cinn.NetBuilder("groups")
    x = b.create_input("float32", (1, channels, *hw), "x")
    w = b.create_constant(rand(out_channels, channels // groups, kernel, kernel), "w")
    y = b.conv2d(x, w, strides=strides, paddings=paddings, dilations=dilations, groups=groups)
    program, feeds = b.build([b.relu(y)]), {"x": rand(1, channels, *hw)}
    result = check_pass(program, feeds, lambda p: dce(pack_weights(p, AVX512)))
    (conv,) = [n for n in result.nodes if n.op == "conv2d_packed"]
    assert conv.attrs.weight_layout is WeightLayout.GIHWO and conv.inputs[1].shape == weights
    padded = weights[-1] * groups != out_channels
    assert ops(result)["slice"] == int(padded) and ops(result)["reshape"] == 2 * int(padded)
    exe = check_compiled(program, feeds, tmp_cache, rtol=1e-4)
    assert exe.num_kernels == 1 + int(padded)  # the slice back fuses with the relu


@pytest.mark.parametrize("data_format", ["NCHW", "NHWC"])
def test_gihwo_weights_given_at_run_time(data_format, tmp_cache):
    """GIHWO weights as an input: the grouped kernel (NCHW) or the generic conv reading them (NHWC), as numpy's."""
    b = cinn.NetBuilder("gihwo")
    shape = (1, 6, 5, 7) if data_format == "NCHW" else (1, 5, 7, 6)
    x, w = b.create_input("float32", shape, "x"), b.create_input("float32", (3, 2, 3, 3, 4), "w")
    y = b.conv2d_packed(x, w, paddings=[1, 1], groups=3, data_format=data_format, weight_layout="GIHWO")
    assert y.shape == ((1, 12, 5, 7) if data_format == "NCHW" else (1, 5, 7, 12))
    check_compiled(b.build([y]), {"x": rand(*shape), "w": rand(3, 2, 3, 3, 4)}, tmp_cache, rtol=1e-4)


def test_gihwo_weights_of_another_group_count_are_refused():
    b = cinn.NetBuilder("gihwo")
    x, w = b.create_input("float32", (1, 8, 5, 5), "x"), b.create_input("float32", (2, 2, 1, 1, 4), "w")
    with pytest.raises(ValueError, match=r"conv2d: w of shape \(2, 2, 1, 1, 4\) is not 5-D GIHWO with 4 groups"):
        b.conv2d_packed(x, w, groups=4, weight_layout="GIHWO")


@pytest.mark.parametrize("shape, strides, paddings, sliced", [((9, 7), [2, 2], [0, 0], True), ((8, 8), [1, 3], [0, 0], True),
                                                            ((8, 8), [2, 2], [1, 1], False), ((8, 8), [1, 1], [0, 0], False)])
def test_strided_pointwise_conv_reads_a_slice(shape, strides, paddings, sliced, tmp_cache):
    b = cinn.NetBuilder("pointwise")
    x = b.create_input("float32", (1, 4, *shape), "x")
    y = b.conv2d(x, b.create_constant(rand(6, 4, 1, 1), "w"), strides=strides, paddings=paddings)
    program, feeds = b.build([b.relu(y)]), {"x": rand(1, 4, *shape)}
    result = check_pass(program, feeds, conv_forms)
    assert ops(result)["slice"] == int(sliced)
    assert [tuple(n.attrs.strides) for n in result.nodes if n.op == "conv2d"] == [(1, 1) if sliced else tuple(strides)]
    check_compiled(program, feeds, tmp_cache, rtol=1e-4)


def test_program_reduced_to_inputs_and_constants_runs_without_kernels(tmp_cache):
    b = cinn.NetBuilder("no_kernels")
    x = b.create_input("float32", (2, 3), "x")
    folded = b.scale(b.create_constant(np.arange(6, dtype="float32").reshape(2, 3)), scale=3.0)
    program, feeds = b.build([b.identity(x), folded, x]), {"x": rand(2, 3)}
    assert check_compiled(program, feeds, tmp_cache).num_kernels == 0


# -- simplify: layout ops ------------------------------------------------------------------------
def test_reshape_chains_collapse(tmp_cache):
    b = cinn.NetBuilder("reshapes")
    x = b.create_input("float32", (4, 6), "x")
    chain = b.reshape(b.reshape(b.reshape(x, [2, 12]), [6, -1]), [3, 8])
    back = b.reshape(b.reshape(x, [24]), [4, 6])  # to the input's own shape: nothing left
    same = b.reshape(x, [4, 6])
    flat = b.flatten(b.expand_dims(b.reshape(x, [2, 2, 6]), axes=[0]), start_axis=1, stop_axis=2)  # (1, 4, 6)
    program, feeds = b.build([b.relu(chain), back, same, flat]), {"x": rand(4, 6)}
    result = check_pass(program, feeds, simplify)
    assert ops(result) == Counter(reshape=2, relu=1)
    assert [(n.inputs, n.attrs.shape) for n in result.nodes if n.op == "reshape"] == [((x,), (3, 8)), ((x,), (1, 4, 6))]
    assert result.outputs[1:3] == (x, x)
    check_compiled(program, feeds, tmp_cache)


def test_transpose_chains_compose():
    b = cinn.NetBuilder("transposes")
    x = b.create_input("float32", (2, 3, 4), "x")
    cancel = b.transpose(b.transpose(x, [1, 2, 0]), [2, 0, 1])
    composed = b.transpose(b.transpose(x, [0, 2, 1]), [-2, 0, 2])
    program = b.build([b.relu(cancel), composed, b.transpose(x, [0, 1, 2])])
    result = check_pass(program, {"x": rand(2, 3, 4)}, simplify)
    assert ops(result) == Counter(relu=1, transpose=1)
    (transpose,) = [n for n in result.nodes if n.op == "transpose"]
    assert transpose.inputs == (x,) and transpose.attrs.axis == (2, 0, 1)
    assert result.outputs[2] == x


def test_transposes_fold_into_matmul(tmp_cache):
    b = cinn.NetBuilder("transpose_matmul")
    x = b.create_input("float32", (4, 3), "x")
    y = b.create_input("float32", (4, 5), "y")
    bx = b.create_input("float32", (2, 4, 3), "bx")
    m2 = b.matmul(b.transpose(x, [1, 0]), b.transpose(y, [-1, -2]), trans_y=True)
    m3 = b.matmul(b.transpose(bx, [0, 2, 1]), x)
    kept = b.matmul(b.transpose(bx, [1, 0, 2]), b.reshape(x, [3, 4]))  # not a last-two swap
    program = b.build([m2, m3, kept])
    feeds = {"x": rand(4, 3), "y": rand(4, 5), "bx": rand(2, 4, 3)}
    result = check_pass(program, feeds, simplify)
    assert ops(result) == Counter(matmul=3, transpose=1, reshape=1)
    flags = [(n.attrs.trans_x, n.attrs.trans_y) for n in result.nodes if n.op == "matmul"]
    assert flags[:2] == [(True, False), (True, False)]
    check_compiled(program, feeds, tmp_cache)


def test_a_transpose_of_unit_axes_is_a_reshape():
    b = cinn.NetBuilder("unit_transpose")
    x = b.create_input("float32", (1, 5, 1, 6), "x")
    moved = b.transpose(x, [1, 0, 3, 2])  # 5 and 6 keep their order: a reshape
    kept = b.transpose(x, [3, 1, 2, 0])  # 6 before 5: a transpose
    program = b.build([b.relu(moved), kept])
    result = check_pass(program, {"x": rand(1, 5, 1, 6)}, simplify)
    assert ops(result) == Counter(reshape=1, relu=1, transpose=1)


def test_reshapes_around_a_matmul_and_its_bias_cancel(tmp_cache):
    """torch's sequence-first projection at batch 1: [1, seq, k] -> [seq, 1, k] -> matmul -> + bias -> [1, seq, n].
    The matmul takes the rows as they are, the bias joins it, and the reshapes meet and cancel."""
    b = cinn.NetBuilder("sequence_first")
    x = b.create_input("float32", (1, 13, 8), "x")
    y = b.add(b.create_constant(rand(16), "bias"), b.matmul(b.reshape(x, [13, 1, 8]), b.create_constant(rand(8, 16), "w")))
    z = b.add(b.matmul(b.reshape(x, [13, 8]), b.create_constant(rand(8, 16), "w2")), b.create_constant(rand(1, 16), "c"))
    program = b.build([b.reshape(y, [1, 13, 16]), b.relu(b.reshape(z, [1, 13, 16]))])
    feeds = {"x": rand(1, 13, 8)}
    result = check_pass(program, feeds, simplify)
    assert ops(result) == Counter(matmul=2, add=2, relu=1)
    assert all(n.inputs[0] == x for n in result.nodes if n.op == "matmul")
    check_compiled(program, feeds, tmp_cache)


def test_a_reshape_before_a_full_operand_stays():
    b = cinn.NetBuilder("residual")
    x = b.create_input("float32", (1, 6, 4), "x")
    r = b.create_input("float32", (6, 4), "r")
    s = b.create_input("float32", (1, 1), "s")
    scalar = b.add(b.reshape(s, []), b.create_constant(np.float32(2), "two"))  # to rank 0: no axis it keeps
    program = b.build([b.add(b.reshape(x, [6, 4]), r), scalar])  # r varies along the rows: the reshape stays
    result = check_pass(program, {"x": rand(1, 6, 4), "r": rand(6, 4), "s": rand(1, 1)}, simplify)
    assert [n.op for n in result.nodes] == ["reshape", "add", "reshape", "add"]


def _positions(index: IndexMap) -> np.ndarray:
    """Each element's position in the base, from an index map's digits."""
    out = np.full(index.shape, index.offset)
    for axis, digits in enumerate(index.axes):
        values = np.zeros(index.shape[axis], dtype=np.int64)
        place = 1
        for d in reversed(digits):
            values += (np.arange(index.shape[axis]) // place % d.size) * d.stride
            place *= d.size
        out = out + values.reshape([-1 if k == axis else 1 for k in range(len(index.axes))])
    return out


def test_index_maps_follow_layout_ops_as_numpy_moves_elements():
    """Reshapes (also across axes whose strides do not line up), transposes, one-index takes and slices: each
    element's position in the base, as the map says, is where numpy finds it."""
    base = np.arange(2 * 6 * 12).reshape(2, 6, 12)
    steps = [
        (lambda a: a.reshape(2, 6, 3, 4), lambda m: m.reshape((2, 6, 3, 4))),
        (lambda a: a.transpose(2, 0, 3, 1), lambda m: m.transpose((2, 0, 3, 1))),
        (lambda a: a[1], lambda m: m.take(0, 1, 0)),  # [2, 4, 6]: the middle third of the columns
        (lambda a: a.reshape(8, 6), lambda m: m.reshape((8, 6))),  # merges axes 48 and 1 elements apart
        (lambda a: a[:, 1:5:2], lambda m: m.slice([range(8), range(1, 5, 2)])),
        (lambda a: a.reshape(4, 1, 4), lambda m: m.reshape((4, 1, 4))),  # splits a digit of 4 in two
        (lambda a: a[:, :, 1:2], lambda m: m.slice([range(4), range(1), range(1, 2)])),
    ]
    array, index = base, IndexMap.of(base.shape)
    for move, follow in steps:
        array, index = move(array), follow(index)
        assert index is not None and index.shape == array.shape
        np.testing.assert_array_equal(_positions(index), array)
    assert IndexMap.of((6, 4)).transpose((1, 0)).reshape((3, 8)) is None  # a digit of 6 read as axes of 4 and 8
    assert IndexMap.of((2, 6)).transpose((1, 0)).slice([range(1, 5), range(2)]) is not None
    assert IndexMap.of((2, 6)).reshape((12,)).transpose((0,)).reshape((3, 4)).transpose((1, 0)).reshape(
        (12,)).slice([range(2, 7)]) is None  # a partial range of an axis of several digits


# -- the default pipeline ------------------------------------------------------------------------
def test_optimize_pipeline_end_to_end(tmp_cache):
    b = cinn.NetBuilder("pipeline")
    x = b.create_input("float32", (2, 4, 5, 5), "x")
    w = b.create_constant(rand(4, 4, 1, 1), "w")
    h = b.relu(b.batchnorm(b.conv2d(x, w), *_bn_params(b, 4)))
    h = b.dropout(b.identity(h), dropout_prob=0.5)
    flat = b.reshape(b.reshape(h, [2, 100]), [2, 4, 25])
    t = b.transpose(flat, [0, 2, 1])
    g = b.matmul(b.transpose(t, [0, 2, 1]), t)  # (2, 4, 4)
    bias = rand(4)
    norm = b.softmax(b.add(g, b.scale(b.create_constant(bias), scale=2.0)))
    dup = b.softmax(b.add(g, b.scale(b.create_constant(bias), scale=2.0)))  # the same computation again
    program = b.build([norm, dup])
    result = optimize(program)
    verify(result)
    counts = ops(result)
    assert counts["batchnorm"] == counts["dropout"] == counts["identity"] == counts["softmax"] == 0
    assert counts["conv2d_packed"] == 1 and counts["matmul"] == 1 and counts["reshape"] == 1 and counts["scale"] == 1
    assert counts["transpose"] == 0  # the pair cancels; t feeding matmul became trans_y
    assert result.outputs[0] == result.outputs[1]
    check_compiled(program, {"x": rand(2, 4, 5, 5)}, tmp_cache, rtol=1e-4)


def test_rewriter_keeps_a_scalar_constant_scalar():
    """np.ascontiguousarray makes 0-d arrays 1-d: a folded scalar must keep shape () (a CUDA buffer of shape ()
    refused the (1,) array)."""
    from cinn.compiler.passes.rewrite import Rewriter

    b = cinn.NetBuilder("s")
    x = b.create_input("float32", (), "x")
    rw = Rewriter(b.build([b.relu(x)]))
    assert rw.new_constant(np.float32(2.0), "two").shape == ()
    rw.make_constant(x, np.float32(3.0))
    assert rw.constants["x"].shape == ()


def _conv(b: cinn.NetBuilder, v, o: int, c: int, k: int, **attrs):
    """conv2d of `v` with o x c x k x k random weights, plus a random bias."""
    rng = np.random.default_rng(o * 1000 + c)
    w = b.create_constant((rng.standard_normal((o, c, k, k)) / np.sqrt(c * k * k)).astype(np.float32))
    bias = b.create_constant(rng.standard_normal((o, 1, 1)).astype(np.float32))
    return b.add(b.conv2d(v, w, **attrs), bias)


def _inverted_residual(hw: int, stride: int) -> Program:
    """A MobileNetV2 block: 1x1 expand + relu6, 3x3 depthwise + relu6, 1x1 project (+ the input where stride 1)."""
    b = cinn.NetBuilder("block")
    x = b.create_input("float32", (1, 8, hw, hw), "x")
    e = b.clip(_conv(b, x, 48, 8, 1), 0.0, 6.0)
    d = b.clip(_conv(b, e, 48, 1, 3, strides=(stride, stride), paddings=(1, 1), groups=48), 0.0, 6.0)
    y = _conv(b, d, 8, 48, 1)
    return b.build([b.add(y, x) if stride == 1 else y])


@pytest.mark.parametrize(("hw", "stride"), [(7, 1), (14, 2)])
def test_channels_last_carries_from_conv_to_conv(hw, stride, tmp_cache):
    """A depthwise conv with narrow rows and the 1x1 convs around it compute NHWC: two transposes remain, at the
    block's ends; the compiled block equals the one compiled without the passes."""
    program = _inverted_residual(hw, stride)
    optimized = optimize(program, target=parse_target("llvm -mcpu=znver4"))
    convs = [n for n in optimized.nodes if n.op == "conv2d_packed"]
    assert [n.attrs.data_format for n in convs] == ["NHWC"] * 3
    assert Counter(n.op for n in optimized.nodes)["transpose"] == 2
    x = np.random.default_rng(1).standard_normal((1, 8, hw, hw)).astype(np.float32)
    (got,) = cinn.compile(program, cache_dir=tmp_cache).run({"x": x})
    (want,) = cinn.compile(program, cache_dir=tmp_cache, passes=False).run({"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _bottlenecks(hw: int, channels: int, inner: int) -> Program:
    """Two resnet bottlenecks: 1x1 reduce + relu, 3x3 + relu, 1x1 expand + the shortcut, relu; the first block's
    shortcut a 1x1 projection, as at the start of a resnet stage."""
    b = cinn.NetBuilder("bottlenecks")
    x = b.create_input("float32", (1, channels, hw, hw), "x")
    v = x
    for block in range(2):
        r = b.relu(_conv(b, v, inner, channels, 1))
        r = b.relu(_conv(b, r, inner, inner, 3, paddings=(1, 1)))
        shortcut = _conv(b, v, channels, channels, 1) if block == 0 else v
        v = b.relu(b.add(_conv(b, r, channels, inner, 1), shortcut))
    return b.build([v])


@pytest.mark.parametrize("hw", [14, 13, 7])
def test_pointwise_convs_over_ragged_pixels_go_channels_last_together(hw, tmp_cache):
    """resnet's 1x1 convs on 14x14, 13x13 and 7x7 compute NHWC, the residual chain between them too: transposes remain
    around each 3x3 conv and at the ends only; the result equals the one compiled without the passes."""
    program = _bottlenecks(hw, 512, 128)
    optimized = optimize(program, target=parse_target("llvm -mcpu=znver3"))
    formats = {(n.attrs.weight_layout.oihw(n.inputs[1].shape)[2:], n.attrs.data_format)
               for n in optimized.nodes if n.op == "conv2d_packed"}
    assert {f for k, f in formats if k == (1, 1)} == {"NHWC"} and {f for k, f in formats if k != (1, 1)} <= {"NCHW"}
    # the input's (shared by the first reduce and projection convs), the output's, a pair around each 3x3 (a
    # Winograd conv at 14x14, a direct one at 7x7)
    assert Counter(n.op for n in optimized.nodes)["transpose"] == 2 + 2 * 2
    x = np.random.default_rng(1).standard_normal((1, 512, hw, hw)).astype(np.float32)
    (got,) = cinn.compile(program, cache_dir=tmp_cache).run({"x": x})
    (want,) = cinn.compile(program, cache_dir=tmp_cache, passes=False).run({"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_strided_convs_go_channels_last_with_the_pointwise_ones(tmp_cache):
    """A resnet stage's first bottleneck after a stem: its 3x3/2 conv computes NHWC with the 1x1 convs around it, over
    flat pixels; the 3-channel 7x7/2 stem stays NCHW, and so does the small shortcut (a 1x1 over a slice, whose
    transposes would cost more than it gains). The result equals the one compiled without the passes."""
    b = cinn.NetBuilder("stage")
    x = b.create_input("float32", (1, 3, 28, 28), "x")
    stem = b.relu(_conv(b, x, 64, 3, 7, strides=(2, 2), paddings=(3, 3)))
    r = b.relu(_conv(b, stem, 128, 64, 1))
    r = b.relu(_conv(b, r, 128, 128, 3, strides=(2, 2), paddings=(1, 1)))
    program = b.build([b.relu(b.add(_conv(b, r, 256, 128, 1), _conv(b, stem, 256, 64, 1, strides=(2, 2))))])
    optimized = optimize(program, target=parse_target("llvm -mcpu=znver3"))
    formats = [(n.inputs[0].shape[-1 if n.attrs.data_format == "NHWC" else 1], n.attrs.data_format)
               for n in optimized.nodes if n.op == "conv2d_packed"]
    assert sorted(formats) == [(3, "NCHW"), (64, "NCHW"), (64, "NHWC"), (128, "NHWC"), (128, "NHWC")]
    x = np.random.default_rng(1).standard_normal((1, 3, 28, 28)).astype(np.float32)
    (got,) = cinn.compile(program, cache_dir=tmp_cache).run({"x": x})
    (want,) = cinn.compile(program, cache_dir=tmp_cache, passes=False).run({"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("hw", "channels", "inner"), [(14, 64, 16), (28, 512, 128)])
def test_pointwise_convs_stay_nchw_without_gain(hw, channels, inner):
    """64->16 gains less than its transposes cost; 28x28's pixels are whole vectors: every conv stays NCHW."""
    _assert_nchw(optimize(_bottlenecks(hw, channels, inner), target=parse_target("llvm -mcpu=znver3")))


def test_pointwise_convs_stay_nchw_with_avx512():
    """With AVX-512 the NCHW tile of a 1x1 conv on 14x14 has 28 accumulators: the convs stay NCHW."""
    _assert_nchw(optimize(_bottlenecks(14, 512, 128), target=parse_target("llvm -mcpu=znver4")))


def _assert_nchw(optimized: Program) -> None:
    assert {n.attrs.data_format for n in optimized.nodes if n.op == "conv2d_packed"} == {"NCHW"}
    assert "transpose" not in {n.op for n in optimized.nodes}


def test_pointwise_convs_share_their_input_transpose():
    """Three 1x1 convs reading one tensor channels last read one transpose of it."""
    b = cinn.NetBuilder("branches")
    x = b.create_input("float32", (1, 512, 14, 14), "x")
    program = b.build([b.relu(_conv(b, x, o, 512, 1)) for o in (256, 320, 384)])
    optimized = optimize(program, target=parse_target("llvm -mcpu=znver3"))
    transposes = [n for n in optimized.nodes if n.op == "transpose"]
    assert sum(t.inputs[0].name == "x" for t in transposes) == 1 and len(transposes) == 4


def test_channels_last_keeps_rows_of_whole_vectors_nchw():
    """Rows of 28 are whole half-vectors with AVX2 (8 lanes): that depthwise conv vectorizes over them, NCHW; with
    AVX-512 it goes channels last."""
    program = _inverted_residual(28, 1)
    formats = {mcpu: {n.attrs.data_format for n in optimize(program, target=parse_target(f"llvm -mcpu={mcpu}")).nodes
                      if n.op == "conv2d_packed"} for mcpu in ("znver3", "znver4")}
    assert formats == {"znver3": {"NCHW"}, "znver4": {"NHWC"}}


# -- squeeze-excite blocks and padded channels ----------------------------------------------------
def _se_block(hw: int, channels: int, stride: int = 1, kernel: int = 3, gate: str = "hard_sigmoid") -> Program:
    """A MobileNetV3 block: 1x1 expand + relu, kxk depthwise + relu, a squeeze-excite gate (global average pool, 1x1
    conv + relu, 1x1 conv + `gate`) scaling it, 1x1 project."""
    b = cinn.NetBuilder("se_block")
    x = b.create_input("float32", (1, 24, hw, hw), "x")
    e = b.relu(_conv(b, x, channels, 24, 1))
    d = b.relu(_conv(b, e, channels, 1, kernel, strides=(stride, stride), paddings=(kernel // 2, kernel // 2),
                     groups=channels))
    squeezed = b.relu(_conv(b, b.reduce_mean(d, [2, 3], keep_dim=True), channels // 4, channels, 1))
    g = getattr(b, gate)(_conv(b, squeezed, channels, channels // 4, 1))
    return b.build([_conv(b, b.multiply(d, g), 24, channels, 1)])


@pytest.mark.parametrize(("hw", "stride", "kernel"), [(14, 1, 3), (28, 2, 5), (7, 1, 5)])
def test_squeeze_excite_gate_goes_channels_last_with_its_block(hw, stride, kernel, tmp_cache):
    """Channels last, a depthwise conv's squeeze-excite gate computes NHWC too: its pool reads the conv's output in
    place and its scale broadcasts over it, so the block keeps only the transposes at its ends (none around the
    pool or the scale); 72 channels, padded to whole vectors by the expand conv, stay padded through the depthwise
    conv, the gate and the scale until the project conv reads them as zero weights: no slice is left. The compiled
    block equals the one compiled without the passes."""
    program = _se_block(hw, 72, stride, kernel)
    optimized = optimize(program, target=parse_target("llvm -mcpu=znver4"))
    convs = [n for n in optimized.nodes if n.op == "conv2d_packed"]
    assert {n.attrs.data_format for n in convs} == {"NHWC"} and len(convs) == 5
    counts = ops(optimized)
    assert counts["transpose"] == 2 and counts["slice"] == 0
    (pool,) = [n for n in optimized.nodes if n.op == "reduce_mean"]
    assert pool.attrs.dim == (1, 2) and pool.inputs[0].shape[-1] == 80  # channels last, padded
    x = np.random.default_rng(1).standard_normal((1, 24, hw, hw)).astype(np.float32)
    (got,) = cinn.compile(program, cache_dir=tmp_cache).run({"x": x})
    (want,) = cinn.compile(program, cache_dir=tmp_cache, passes=False).run({"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("keep", [True, False])
def test_transposes_sink_through_reductions(keep):
    """A reduction of a transposed tensor reduces the tensor itself over the axes the permutation maps its own to:
    only its small result is transposed, where the kept axes change order."""
    b = cinn.NetBuilder("reduce_transposed")
    x = b.create_input("float32", (2, 5, 6, 8), "x")
    t = b.transpose(x, [0, 3, 1, 2])  # NHWC -> NCHW
    program = b.build([b.reduce_mean(t, [2, 3], keep_dim=keep), b.reduce_max(t, [1], keep_dim=keep),
                       b.reduce_sum(t, [], keep_dim=keep)])
    result = check_pass(program, {"x": rand(2, 5, 6, 8)}, sink_transposes)
    reductions = [n for n in result.nodes if n.op.startswith("reduce")]
    assert [n.inputs[0].name for n in reductions] == ["x"] * 3
    assert [n.attrs.dim for n in reductions] == [(1, 2), (3,), (0, 1, 2, 3)]
    # with keep_dim each result is transposed back (a few elements); without, the kept axes stay in order: the
    # mean's (2, 8), the max's (2, 5, 6)
    assert ops(result)["transpose"] == (3 if keep else 0)


@pytest.mark.parametrize("data_format", ["NCHW", "NHWC"])
def test_padded_channels_run_through_depthwise_convs_and_gates(data_format, tmp_cache):
    """pack_weights pads a conv's 72 output channels to 80 where its rows are no whole vectors; the slice back sinks
    below the bias and activation, the depthwise conv (zero weights for the padding), the pool, the gate and the
    scale, and the project conv reads all 80 channels (zero weights): no slice is left, in either layout, and the
    block computes what it did."""
    b = cinn.NetBuilder("padded")
    nhwc = data_format == "NHWC"
    shape = (1, 14, 14, 24) if nhwc else (1, 24, 14, 14)
    x = b.create_input("float32", shape, "x")
    conv = lambda v, o, c, k, **a: b.conv2d(v, b.create_constant(rand(o, c, k, k)), data_format=data_format, **a)
    channel = (72,) if nhwc else (72, 1, 1)
    e = b.relu(b.add(conv(x, 72, 24, 1), b.create_constant(rand(*channel))))
    d = b.relu(conv(e, 72, 1, 3, paddings=(1, 1), groups=72))
    pooled = b.reduce_mean(d, [1, 2] if nhwc else [2, 3], keep_dim=True)
    g = b.sigmoid(conv(b.relu(conv(pooled, 18, 72, 1)), 72, 18, 1))
    program = b.build([conv(b.multiply(d, g), 24, 72, 1)])
    result = check_pass(program, {"x": rand(*shape)}, lambda p: dce(pack_weights(p, AVX512)))
    assert ops(result)["slice"] == 0
    groups = [n.attrs.groups for n in result.nodes if n.op == "conv2d_packed" and n.attrs.groups > 1]
    assert groups == [80]
    check_compiled(program, {"x": rand(*shape)}, tmp_cache, rtol=1e-4)


def test_a_padded_output_read_elsewhere_keeps_its_slice():
    """A slice whose tensor is also a program output stays where it is: sinking it would leave it beside the ops
    that run wider."""
    b = cinn.NetBuilder("kept")
    x = b.create_input("float32", (1, 24, 14, 14), "x")
    e = b.relu(b.conv2d(x, b.create_constant(rand(72, 24, 1, 1))))
    d = b.conv2d(e, b.create_constant(rand(72, 1, 3, 3)), paddings=(1, 1), groups=72)
    result = check_pass(b.build([e, d]), {"x": rand(1, 24, 14, 14)}, lambda p: dce(pack_weights(p, AVX512)))
    assert ops(result)["slice"] == 1
    assert [n.attrs.groups for n in result.nodes if n.op == "conv2d_packed"] == [1, 72]
