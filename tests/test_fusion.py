"""Fusion: kernel counts for named patterns, and fused output == unfused output == numpy."""
from __future__ import annotations

import numpy as np
import pytest

import cinn
from cinn.compiler.passes.fusion import fuse
from cinn.compiler.passes.pipeline import optimize
from cinn.core.ops import PatternKind
from cinn.core.views import View, concat_views, find_views, resolve

RNG = np.random.default_rng(0)


def _rand(*shape):
    return RNG.standard_normal(shape).astype("float32")


def _run_both(program, feeds, cache):
    fused = cinn.compile(program, cache_dir=cache)
    unfused = cinn.compile(program, fuse=False, cache_dir=cache)
    out_f, out_u = fused.run(feeds), unfused.run(feeds)
    for a, b in zip(out_f, out_u, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    return fused, unfused, out_f


def test_matmul_bias_relu_is_one_kernel(tmp_cache):
    b = cinn.NetBuilder("mbr")
    x = b.create_input("float32", (8, 32), "x")
    w, bias = _rand(32, 16), _rand(16)
    y = b.relu(b.add(b.matmul(x, b.create_constant(w, "w")), b.create_constant(bias, "bias")))
    xv = _rand(8, 32)
    fused, unfused, (out,) = _run_both(b.build([y]), {"x": xv}, tmp_cache)
    assert fused.num_kernels == 1
    assert unfused.num_kernels == 3
    np.testing.assert_allclose(out, np.maximum(xv @ w + bias, 0), rtol=1e-5, atol=1e-5)


def test_chain_of_ten_elementwise_ops_is_one_kernel(tmp_cache):
    b = cinn.NetBuilder("chain")
    x = b.create_input("float32", (4, 64), "x")
    y, ref = x, _rand(4, 64)
    xv = ref.copy()
    for i in range(5):
        y = b.scale(b.relu(y), 0.5, float(i))
        ref = np.maximum(ref, 0) * 0.5 + i
    fused, unfused, (out,) = _run_both(b.build([y]), {"x": xv}, tmp_cache)
    assert fused.num_kernels == 1
    assert unfused.num_kernels == 10
    np.testing.assert_allclose(out, ref, rtol=1e-5)


def test_layer_norm_at_most_two_kernels(tmp_cache):
    b = cinn.NetBuilder("ln")
    x = b.create_input("float32", (16, 64), "x")
    g, beta = _rand(64), _rand(64)
    y = b.layer_norm(x, b.create_constant(g, "g"), b.create_constant(beta, "b"), begin_norm_axis=1, epsilon=1e-5)
    xv = _rand(16, 64)
    fused, _, (out,) = _run_both(b.build([y]), {"x": xv}, tmp_cache)
    assert fused.num_kernels <= 2
    mean, var = xv.mean(-1, keepdims=True), xv.var(-1, keepdims=True)
    np.testing.assert_allclose(out, (xv - mean) / np.sqrt(var + 1e-5) * g + beta, rtol=1e-4, atol=1e-4)


def test_softmax_at_most_two_kernels(tmp_cache):
    b = cinn.NetBuilder("sm")
    x = b.create_input("float32", (4, 8, 32), "x")
    y = b.softmax(b.scale(x, 0.125), axes=[-1])
    xv = _rand(4, 8, 32)
    fused, _, (out,) = _run_both(b.build([y]), {"x": xv}, tmp_cache)
    assert fused.num_kernels <= 2
    e = np.exp(xv * 0.125 - (xv * 0.125).max(-1, keepdims=True))
    np.testing.assert_allclose(out, e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)


def test_conv_bn_relu_residual_is_one_kernel(tmp_cache):
    b = cinn.NetBuilder("cbr")
    x = b.create_input("float32", (1, 4, 8, 8), "x")
    w = b.create_constant(_rand(4, 4, 3, 3), "w")
    params = [b.create_constant(a, n) for a, n in [(_rand(4), "s"), (_rand(4), "b"), (_rand(4), "m"), (np.abs(_rand(4)) + 0.5, "v")]]
    y = b.relu(b.add(b.batchnorm(b.conv2d(x, w, paddings=[1, 1]), *params), x))
    fused, unfused, _ = _run_both(b.build([y]), {"x": _rand(1, 4, 8, 8)}, tmp_cache)
    assert fused.num_kernels == 1
    assert unfused.num_kernels > 1


def test_multi_output_group(tmp_cache):
    b = cinn.NetBuilder("multi")
    x = b.create_input("float32", (32,), "x")
    r = b.relu(x)
    e = b.exp(r)
    fused, _, (out_r, out_e) = _run_both(b.build([r, e]), {"x": (xv := _rand(32))}, tmp_cache)
    assert fused.num_kernels == 1
    np.testing.assert_allclose(out_r, np.maximum(xv, 0))
    np.testing.assert_allclose(out_e, np.exp(np.maximum(xv, 0)), rtol=1e-6)


def test_siblings_reading_one_input_merge(tmp_cache):
    b = cinn.NetBuilder("siblings")
    x = b.create_input("float32", (64,), "x")
    p, q = b.relu(x), b.exp(x)
    fused, _, _ = _run_both(b.build([p, q]), {"x": _rand(64)}, tmp_cache)
    assert fused.num_kernels == 1


def test_no_cycle_through_a_heavy_group(tmp_cache):
    # a -> matmul -> add(a, .) must not fuse `a`'s group with the add when the matmul sits between them
    b = cinn.NetBuilder("diamond")
    x = b.create_input("float32", (8, 8), "x")
    a = b.relu(x)
    m = b.matmul(a, b.create_constant(_rand(8, 8), "w"))
    y = b.add(b.exp(a), m)
    program = b.build([y])
    groups = fuse(optimize(program))
    # relu feeds the matmul and (through exp) the add: joining it with the add's group would make the matmul's group
    # both its consumer and its producer; the add joins the matmul as its epilogue instead
    assert [[n.op for n in g.nodes] for g in groups] == [["relu", "exp"], ["matmul", "add"]]
    fused, _, _ = _run_both(program, {"x": _rand(8, 8)}, tmp_cache)
    assert fused.num_kernels == 2


def test_group_kinds_and_io():
    b = cinn.NetBuilder("kinds")
    x = b.create_input("float32", (8, 16), "x")
    y = b.reduce_sum(b.exp(x), dim=[1], keep_dim=True)
    z = b.matmul(b.relu(x), b.create_constant(_rand(16, 4), "w"))
    groups = fuse(optimize(b.build([y, z])))
    kinds = sorted(g.kind for g in groups)
    assert PatternKind.REDUCTION in kinds and PatternKind.OUT_FUSIBLE in kinds
    for g in groups:
        made = {v.name for n in g.nodes for v in n.outputs}
        assert all(v.name in made for v in g.outputs)
        assert not any(v.name in made for v in g.inputs)


@pytest.mark.parametrize("shape", [(3, 5), (1, 7), (2, 1, 9)])
def test_reduction_then_broadcast_elementwise(shape, tmp_cache):
    b = cinn.NetBuilder("center")
    x = b.create_input("float32", shape, "x")
    y = b.subtract(x, b.reduce_mean(x, dim=[-1], keep_dim=True))
    xv = _rand(*shape)
    fused, _, (out,) = _run_both(b.build([y]), {"x": xv}, tmp_cache)
    assert fused.num_kernels == 1
    np.testing.assert_allclose(out, xv - xv.mean(-1, keepdims=True), rtol=1e-5, atol=1e-6)


# -- concats written in place (passes.views) ------------------------------------------------------
def _conv(b, x, cin, cout, name):
    return b.relu(b.conv2d(x, b.create_constant(_rand(cout, cin, 3, 3), name), paddings=[1, 1]))


def test_concat_parts_are_written_in_place(tmp_cache):
    # a dense block: every layer's new channels go onto all earlier ones, and each concat feeds the next layer; the
    # concats take no kernel and share one buffer
    b = cinn.NetBuilder("dense")
    x = b.create_input("float32", (1, 4, 6, 6), "x")
    feats = b.relu(x)
    for i in range(3):
        feats = b.concat([feats, _conv(b, feats, 4 + 2 * i, 2, f"w{i}")], axis=1)
    program, feeds = b.build([b.scale(feats, 2.0)]), {"x": _rand(1, 4, 6, 6)}
    views = concat_views(optimize(program, True))
    assert len({v.base for v in views.values()}) == 3
    fused, unfused, _ = _run_both(program, feeds, tmp_cache)
    assert fused.num_kernels == 5  # relu, three convs, scale
    assert unfused.num_kernels == 11
    # relu(x) sits at offset 0 of the last concat's buffer, the layers' new channels after it in order
    program = optimize(program, True)
    last = program.nodes[-2].outputs[0].name
    parts = [v.name for n in program.nodes if n.op == "concat" for v in n.inputs[1:]]
    assert [resolve(views, n) for n in [program.nodes[0].outputs[0].name, *parts]] == [
        View(last, offset) for offset in (0, 4 * 36 * 4, 6 * 36 * 4, 8 * 36 * 4)]


@pytest.mark.parametrize("shape, axis, output_part, in_place", [
    ((1, 3, 4, 5), 1, False, True),
    ((1, 3, 4, 5), -1, False, False),  # the parts interleave along rows
    ((2, 3, 4, 5), 1, False, False),   # batch 2: each part is two ranges
    ((1, 3, 4, 5), 1, True, False),    # a part is a program output: written into the caller's array
])
def test_which_concats_are_in_place(shape, axis, output_part, in_place, tmp_cache):
    b = cinn.NetBuilder("which")
    x = b.create_input("float32", shape, "x")
    p, q = b.relu(x), b.exp(x)
    y = b.scale(b.concat([p, q], axis=axis), 3.0)
    program, feeds = b.build([y, p] if output_part else [y]), {"x": _rand(*shape)}
    assert bool(concat_views(optimize(program, True))) == in_place
    _run_both(program, feeds, tmp_cache)


def test_a_kernel_reading_an_in_place_concat_never_writes_one_of_its_parts(tmp_cache):
    # relu(x) and exp(x) read x (siblings), and the slice of the concat + exp(x) would fuse with them: that kernel
    # would read the concat's relu part before writing it
    b = cinn.NetBuilder("own_part")
    x = b.create_input("float32", (1, 4, 5, 5), "x")
    p, q = b.relu(x), b.exp(x)
    y = b.concat([p, b.sigmoid(x)], axis=1)
    z = b.add(b.slice(y, axes=[1], starts=[0], ends=[4]), q)
    xv = _rand(1, 4, 5, 5)
    _, _, (out,) = _run_both(b.build([z]), {"x": xv}, tmp_cache)
    np.testing.assert_allclose(out, np.maximum(xv, 0) + np.exp(xv), rtol=1e-5)


@pytest.mark.parametrize("axis, in_place", [(1, True), (2, False)])
def test_channel_slices_are_views(axis, in_place, tmp_cache):
    # shufflenet's channel groups: each slice of a batch-1 tensor's channels is a range of its buffer, no kernel; a
    # slice of rows is two ranges per channel and stays a copy (fused into its consumer)
    b = cinn.NetBuilder("groups")
    x = b.create_input("float32", (1, 4, 6, 6), "x")
    y = b.relu(x)
    halves = [b.slice(y, axes=[axis], starts=[i * 2], ends=[i * 2 + 2]) for i in range(2)]
    outs = [_conv(b, h, 2 if axis == 1 else 4, 3, f"w{i}") for i, h in enumerate(halves)]
    program, xv = b.build(outs), _rand(1, 4, 6, 6)
    names = {n.outputs[0].name for n in optimize(program, True).nodes if n.op == "slice"}
    assert (set(find_views(optimize(program, True))) == names) == in_place
    fused, _, _ = _run_both(program, {"x": xv}, tmp_cache)
    assert fused.num_kernels == 3  # relu and the two convs


def test_a_concat_that_only_a_slice_views_still_runs(tmp_cache):
    # a batch-2 concat is no in-place concat, but its first row is a contiguous slice of it: the slice is a view of
    # the concat's output, which its own kernel must still write
    b = cinn.NetBuilder("row_of_concat")
    x = b.create_input("float32", (2, 3), "x")
    y = b.concat([b.relu(x), b.exp(x)], axis=1)
    z = b.scale(b.slice(y, axes=[0], starts=[0], ends=[1]), 2.0)
    program, xv = b.build([z]), _rand(2, 3)
    assert {v.base for v in find_views(optimize(program, True)).values()} == {y.name}
    _, _, (out,) = _run_both(program, {"x": xv}, tmp_cache)
    np.testing.assert_allclose(out, 2 * np.concatenate([np.maximum(xv, 0), np.exp(xv)], axis=1)[:1], rtol=1e-5)


def test_a_slice_that_is_a_concat_part_writes_it(tmp_cache):
    # a crop (rows and columns: no range of its input) feeding an in-place concat is a part of that concat, not a view
    # of its input: its kernel must still copy the crop into the concat's buffer (a Winograd conv's overhanging
    # tiles, sliced back in front of inception's concat, left those channels unwritten)
    b = cinn.NetBuilder("crop_into_concat")
    x = b.create_input("float32", (1, 4, 6, 6), "x")
    crop = b.slice(b.exp(x), axes=[2, 3], starts=[0, 0], ends=[5, 5])
    z = b.scale(b.concat([crop, b.relu(b.slice(x, axes=[2, 3], starts=[1, 1], ends=[6, 6]))], axis=1), 2.0)
    program, xv = b.build([z]), _rand(1, 4, 6, 6)
    _, _, (out,) = _run_both(program, {"x": xv}, tmp_cache)
    np.testing.assert_allclose(out, 2 * np.concatenate([np.exp(xv)[:, :, :5, :5], np.maximum(xv, 0)[:, :, 1:, 1:]], 1),
                               rtol=1e-5)


def test_a_concat_of_slices_is_one_kernel(tmp_cache):
    # shufflenet's padded per-group convs, each sliced back to its channels and concatenated: the slices are views of
    # the convs' outputs and one concat kernel (with the scale after it) reads them, not a copy kernel per slice
    b = cinn.NetBuilder("concat_of_slices")
    x = b.create_input("float32", (1, 6, 4, 4), "x")
    parts = [b.slice(f(x), axes=[1], starts=[0], ends=[4]) for f in (b.exp, b.relu)]
    program, xv = b.build([b.scale(b.concat(parts, axis=1), 2.0)]), _rand(1, 6, 4, 4)
    assert not concat_views(optimize(program, True))
    fused, _, (out,) = _run_both(program, {"x": xv}, tmp_cache)
    assert fused.num_kernels == 2  # exp and relu (siblings), then the concat with the scale
    np.testing.assert_allclose(out, 2 * np.concatenate([np.exp(xv)[:, :4], np.maximum(xv, 0)[:, :4]], 1), rtol=1e-5)


def _squeeze_excite(b: cinn.NetBuilder, x, channels: int, layout: str, gate: str):
    """A squeeze-excite gate scaling x (global average pool, 1x1 conv + relu, 1x1 conv + `gate`, times x), and the
    two convs' weights."""
    nhwc = layout == "NHWC"
    pooled = b.reduce_mean(x, [1, 2] if nhwc else [2, 3], keep_dim=True)
    w1, w2 = _rand(channels // 4, channels, 1, 1), _rand(channels, channels // 4, 1, 1)
    hidden = b.relu(b.conv2d(pooled, b.create_constant(w1), data_format=layout))
    logits = b.conv2d(hidden, b.create_constant(w2), data_format=layout)
    g = b.multiply(logits, b.sigmoid(logits)) if gate == "silu" else getattr(b, gate)(logits)
    return b.multiply(x, g), w1, w2


def _se_reference(xv, w1, w2, nhwc: bool, gate: str):
    """The squeeze-excite gate's scale of xv in numpy."""
    spatial = (1, 2) if nhwc else (2, 3)
    pooled = xv.mean(axis=spatial)  # [n, c]
    hidden = np.maximum(pooled @ w1[:, :, 0, 0].T, 0)
    logits = hidden @ w2[:, :, 0, 0].T
    # hard_sigmoid at the builder's (and ONNX's) default slope
    g = {"hard_sigmoid": np.clip(logits * 0.2 + 0.5, 0, 1), "sigmoid": 1 / (1 + np.exp(-logits)),
         "silu": logits / (1 + np.exp(-logits))}[gate]
    return xv * (g[:, None, None, :] if nhwc else g[:, :, None, None])


@pytest.mark.parametrize(("layout", "shape", "gate"), [
    ("NHWC", (1, 14, 14, 96), "hard_sigmoid"),  # mobilenet_v3's, channels last
    ("NCHW", (1, 32, 28, 28), "sigmoid"),  # efficientnet's early blocks: the pool reduces rows
    ("NHWC", (2, 7, 7, 40), "silu"),  # a batch of two; channels of no whole vector; the gate's own activation fused
    ("NCHW", (1, 20, 9, 9), "hard_sigmoid"),
])
def test_squeeze_excite_is_one_kernel(layout, shape, gate, tmp_cache):
    """A squeeze-excite block's pool, two fully connected layers (1x1 convs over one pixel), their activations and
    the scale of the pooled tensor are one kernel, as unfused and as numpy."""
    b = cinn.NetBuilder("se")
    x = b.create_input("float32", shape, "x")
    channels = shape[-1] if layout == "NHWC" else shape[1]
    scaled, w1, w2 = _squeeze_excite(b, x, channels, layout, gate)
    program = b.build([scaled])
    xv = _rand(*shape)
    fused, unfused, (out,) = _run_both(program, {"x": xv}, tmp_cache)
    assert fused.num_kernels == 1 and unfused.num_kernels >= 6
    np.testing.assert_allclose(out, _se_reference(xv, w1, w2, layout == "NHWC", gate), rtol=1e-4, atol=1e-5)


def test_squeeze_excite_block_takes_three_kernels(tmp_cache):
    """A mobilenet_v3 block at 14x14: the depthwise conv (with its activation), the squeeze-excite gate and scale,
    and the project conv (with the residual add): three kernels, however many ops the gate has."""
    b = cinn.NetBuilder("block")
    x = b.create_input("float32", (1, 14, 14, 96), "x")
    d = b.relu(b.conv2d(x, b.create_constant(_rand(96, 1, 3, 3)), paddings=(1, 1), groups=96, data_format="NHWC"))
    s, _, _ = _squeeze_excite(b, d, 96, "NHWC", "hard_sigmoid")
    program = b.build([b.add(b.conv2d(s, b.create_constant(_rand(96, 96, 1, 1)), data_format="NHWC"), x)])
    fused, _, _ = _run_both(program, {"x": _rand(1, 14, 14, 96)}, tmp_cache)
    assert fused.num_kernels == 3
