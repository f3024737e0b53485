"""Fused attention: the op against numpy (masks, odd sequence lengths, head sizes), the pass that finds it in the
graphs exporters write, and fused == unfused == numpy on whole layers."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

import cinn
from cinn.compiler.passes.attention import is_causal
from cinn.compiler.passes.pipeline import optimize
from cinn.core.ir import TensorType
from cinn.core.ops import get_op
from cinn.core.ops.attention import AttentionAttrs, attention_shape
from frontend.zoo import get_model
from schedules import cpu_attention

RNG = np.random.default_rng(0)
NEG = -10000.0  # the additive mask value BERT and GPT-2 exports use


def _rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype("float32")


def _numpy_attention(q, k, v, bias, heads: int, scale: float) -> np.ndarray:
    """softmax(q k^T * scale + bias) v per head, in float64, written out independently of the op's reference."""
    *lead, s, hd = q.shape
    d, dv = hd // heads, v.shape[-1] // heads
    qh = q.reshape(*lead, s, heads, d).swapaxes(-2, -3).astype(np.float64)
    kh = k.reshape(*lead, k.shape[-2], heads, d).swapaxes(-2, -3).astype(np.float64)
    vh = v.reshape(*lead, v.shape[-2], heads, dv).swapaxes(-2, -3).astype(np.float64)
    logits = qh @ kh.swapaxes(-1, -2) * scale + bias
    with np.errstate(invalid="ignore"):  # fully masked rows: NaN here, compared only where a key is seen
        p = np.exp(logits - logits.max(-1, keepdims=True))
    ctx = (p / p.sum(-1, keepdims=True)) @ vh
    return ctx.swapaxes(-2, -3).reshape(*lead, s, heads * dv)


def _masks(kind: str, batch: int, seq: int, keys: int) -> np.ndarray:
    if kind == "padding":  # row b hides its last b * 3 keys, as BERT's [batch, 1, 1, keys] mask
        keep = np.arange(keys)[None, :] < (keys - 3 * np.arange(batch))[:, None].clip(1)
        return np.where(keep, 0.0, NEG).astype("float32")[:, None, None, :]
    if kind == "causal":  # query i sees keys up to i + keys - seq (prefill of seq tokens after keys - seq cached)
        return np.where(np.arange(keys)[None, :] <= np.arange(seq)[:, None] + keys - seq, 0.0, NEG).astype("float32")
    return np.zeros((), "float32")


def _compile_attention(shapes, heads, scale, cache):
    b = cinn.NetBuilder("attention")
    q, k, v, m = (b.create_input("float32", s, n) for n, s in zip("qkvm", shapes, strict=True))
    exe = cinn.compile(b.build([b.attention(q, k, v, m, heads=heads, scale=scale)]), cache_dir=cache)
    assert exe.num_kernels == 1
    return exe


@pytest.mark.parametrize(("seq", "keys", "heads", "dim", "mask"), [
    (1, 1, 1, 8, "none"), (1, 77, 4, 16, "padding"), (7, 7, 2, 8, "causal"), (77, 77, 3, 16, "padding"),
    (128, 128, 4, 64, "padding"), (128, 128, 2, 32, "causal"), (129, 129, 2, 24, "causal"), (64, 192, 2, 80, "none"),
    (37, 37, 2, 16, "padding"), (23, 53, 2, 8, "none"),  # queries in whole vectors, keys' scores in whole tiles
])
def test_fused_attention_matches_numpy(seq, keys, heads, dim, mask, tmp_cache):
    batch = 2
    q, k, v = _rand(batch, seq, heads * dim), _rand(batch, keys, heads * dim), _rand(batch, keys, heads * dim)
    bias = _masks(mask, batch, seq, keys)
    scale = 1 / math.sqrt(dim)
    exe = _compile_attention([q.shape, k.shape, v.shape, bias.shape], heads, scale, tmp_cache)
    (got,) = exe.run({"q": q, "k": k, "v": v, "m": bias})
    np.testing.assert_allclose(got, _numpy_attention(q, k, v, bias, heads, scale), rtol=1e-4, atol=1e-5)


def test_nan_in_a_row_makes_that_row_nan(tmp_cache):
    q, k, v = _rand(1, 4, 8), _rand(1, 4, 8), _rand(1, 4, 8)
    k[0, 2, 3] = np.nan  # every query's logit for key 2 is NaN
    q[0, 1, :] = 0.0
    exe = _compile_attention([q.shape, k.shape, v.shape, ()], 1, 1.0, tmp_cache)
    (got,) = exe.run({"q": q, "k": k, "v": v, "m": np.zeros((), "float32")})
    assert np.isnan(got).all()  # as numpy: a NaN logit makes its row's softmax NaN


def test_shape_errors_name_every_shape():
    types = [TensorType(s, "float32") for s in [(2, 5, 8), (2, 7, 8), (2, 6, 8), (1,)]]
    with pytest.raises(ValueError, match=r"q \(2, 5, 8\), k \(2, 7, 8\), v \(2, 6, 8\).*key count"):
        attention_shape(types, AttentionAttrs(heads=2))
    types[2] = TensorType((2, 7, 8), "float32")
    with pytest.raises(ValueError, match="divide into 3 heads"):
        attention_shape(types, AttentionAttrs(heads=3))
    types[3] = TensorType((3, 1, 1, 7), "float32")
    with pytest.raises(ValueError, match=r"bias must broadcast to .* \(2, 2, 5, 7\)"):
        attention_shape(types, AttentionAttrs(heads=2))


# -- the pass ---------------------------------------------------------------------------------------
def _split(b, x, heads: int, k_transposed: bool = False):
    *lead, seq, hidden = x.shape
    n = len(lead)
    perm = [*range(n), n + 1, n + 2, n] if k_transposed else [*range(n), n + 1, n, n + 2]
    return b.transpose(b.reshape(x, [*lead, seq, heads, hidden // heads]), perm)


def _attention_graph(form: str, shape=(2, 9, 16), heads=2):
    """An attention subgraph as exporters write it, in one of several forms; returns program and feeds."""
    b = cinn.NetBuilder(form)
    x = b.create_input("float32", shape, "x")
    feeds = {"x": _rand(*shape)}
    hidden = shape[-1]
    if form == "fused-qkv":  # one projection, split in three along its last axis (GPT-2's c_attn)
        qkv = b.matmul(x, b.create_constant(_rand(hidden, 3 * hidden) * 0.3, "qkv"))
        q, k, v = (b.slice(qkv, axes=[-1], starts=[j * hidden], ends=[(j + 1) * hidden]) for j in range(3))
    else:
        q, k, v = (b.matmul(x, b.create_constant(_rand(hidden, hidden) * 0.3, n)) for n in "qkv")
    d = hidden // heads
    if form == "k-transposed":  # Transpose(K, [0, 2, 3, 1]) and MatMul, then Div by sqrt(d)
        scores = b.divide(b.matmul(_split(b, q, heads), _split(b, k, heads, True)),
                          b.create_constant(np.float32(math.sqrt(d)), "root_d"))
    else:
        scores = b.matmul(_split(b, q, heads), _split(b, k, heads), trans_y=True, alpha=1 / math.sqrt(d))
    if form == "padding-mask":
        mask = b.create_input("float32", (shape[0], shape[1]), "mask")
        feeds["mask"] = (RNG.random((shape[0], shape[1])) < 0.8).astype("float32")
        bias = b.reshape(b.scale(mask, scale=-NEG, bias=NEG), [shape[0], 1, 1, shape[1]])
        scores = b.add(bias, scores)  # the mask first: either operand order is recognized
    elif form == "causal":
        scores = b.add(scores, b.create_constant(_masks("causal", 1, shape[1], shape[1]), "causal"))
    probs = b.softmax(scores, axes=[-1])
    ctx = b.matmul(probs, _split(b, v, heads))
    n = len(shape) - 2
    out = b.reshape(b.transpose(ctx, [*range(n), n + 1, n, n + 2]), list(shape))
    outputs = [out, probs] if form == "probs-also-output" else [out]
    return b.build(outputs), feeds


def _merged_heads_graph(order: str, shape=(2, 9, 16), heads=2):
    """torch's bmm form: heads merged with the batch ([batch * heads, seq, dim]; `order` "batch" puts the batch
    outermost, as torch does, "heads" the heads), a [1, seq, seq] bias."""
    b = cinn.NetBuilder(f"merged-{order}")
    batch, seq, hidden = shape
    d = hidden // heads
    x = b.create_input("float32", shape, "x")
    perm = [0, 2, 1, 3] if order == "batch" else [2, 0, 1, 3]

    def split(v):  # [batch, seq, hidden] -> [batch * heads, seq, d] (or [heads * batch, ...])
        return b.reshape(b.transpose(b.reshape(v, [batch, seq, heads, d]), perm), [batch * heads, seq, d])

    q, k, v = (split(b.matmul(x, b.create_constant(_rand(hidden, hidden) * 0.3, n))) for n in "qkv")
    bias = b.create_constant(_rand(1, seq, seq), "bias")
    probs = b.softmax(b.add(b.scale(b.matmul(q, k, trans_y=True), scale=1 / math.sqrt(d)), bias), axes=[-1])
    ctx = b.reshape(b.matmul(probs, v), [batch, heads, seq, d] if order == "batch" else [heads, batch, seq, d])
    out = b.reshape(b.transpose(ctx, [0, 2, 1, 3] if order == "batch" else [1, 2, 0, 3]), list(shape))
    return b.build([out]), {"x": _rand(*shape)}


def _sequence_first_graph(seq=37, hidden=32, heads=4):
    """torch's nn.MultiheadAttention (batch_first, batch 1) as torchvision's ViT exports it: the input turned
    sequence first, one fused projection cut in three by reshapes, a transpose and gathers, q and k^T each scaled
    by the fourth root of 1 / d before their matmul, the context merged back through [seq, 1, heads, d]."""
    b = cinn.NetBuilder("sequence-first")
    d = hidden // heads
    x = b.create_input("float32", (1, seq, hidden), "x")
    qkv = b.add(b.matmul(b.transpose(x, [1, 0, 2]), b.create_constant(_rand(hidden, 3 * hidden) * 0.3, "w")),
                b.create_constant(_rand(3 * hidden), "b"))
    parts = b.squeeze(b.transpose(b.expand_dims(b.reshape(qkv, [seq, 1, 3, hidden]), [0]), [3, 1, 2, 0, 4]), [3])
    root = b.create_constant(np.full((1,), d ** -0.25, "float32"), "fourth_root")
    q, k, v = (b.reshape(b.transpose(b.reshape(b.gather(parts, b.create_constant(np.int64(j), f"i{j}"), axis=0),
                                               [seq, heads, d]), [1, 0, 2]), [1, heads, seq, d]) for j in range(3))
    scores = b.matmul(b.multiply(q, root), b.multiply(b.transpose(k, [0, 1, 3, 2]), root))
    ctx = b.matmul(b.softmax(scores, axes=[-1]), v)
    merged = b.reshape(b.transpose(ctx, [2, 0, 1, 3]), [seq, hidden])
    out = b.matmul(merged, b.create_constant(_rand(hidden, hidden) * 0.3, "out_proj"))
    return b.build([b.transpose(b.reshape(out, [seq, 1, hidden]), [1, 0, 2])]), {"x": _rand(1, seq, hidden)}


def _scaled_split_graph(shape=(1, 37, 32), heads=4):
    """transformers' SDPA export: q and k split to [batch, heads, ...] (k straight to [..., d, seq]), each scaled
    by the square root of the scale before the matmul, the context merged back through reshapes."""
    b = cinn.NetBuilder("scaled-split")
    x = b.create_input("float32", shape, "x")
    q, k, v = (b.matmul(x, b.create_constant(_rand(shape[-1], shape[-1]) * 0.3, n)) for n in "qkv")
    root = b.create_constant(np.float32((shape[-1] // heads) ** -0.25), "fourth_root")
    scores = b.matmul(b.multiply(_split(b, q, heads), root), b.multiply(_split(b, k, heads, True), root))
    ctx = b.matmul(b.softmax(scores, axes=[-1]), _split(b, v, heads))
    out = b.reshape(b.transpose(ctx, [0, 2, 1, 3]), list(shape))
    return b.build([out]), {"x": _rand(*shape)}


EXPORTS = {"merged-heads": lambda: _merged_heads_graph("batch"), "sequence-first": _sequence_first_graph,
           "scaled-split": _scaled_split_graph}


@pytest.mark.parametrize("form", sorted(EXPORTS))
def test_exporters_attention_fuses_into_one_kernel_and_matches_unfused(form, tmp_cache):
    """The layouts torch and transformers export (37 tokens: no whole tiles of rows) fuse into one attention node
    that reads the projections in place: no head split, softmax or merge is left, and the fused model computes
    what the unfused one does."""
    program, feeds = EXPORTS[form]()
    ops = [n.op for n in optimize(program).nodes]
    assert ops.count("attention") == 1 and not {"transpose", "softmax", "gather", "reshape"} & set(ops)
    fused = cinn.compile(program, cache_dir=tmp_cache)
    unfused = cinn.compile(program, fuse=False, passes=False, cache_dir=tmp_cache)
    assert fused.num_kernels == ops.count("matmul_packed") + 1  # the projections' and the attention's
    for a, b in zip(fused.run(feeds), unfused.run(feeds), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_heads_merged_outside_the_batch_are_not_fused(tmp_cache):
    """[heads * batch, seq, d] puts a head's rows of every batch side by side: no [batch, seq, heads * d] layout
    the fused op reads, so the graph stays as it is, and computes the same."""
    program, feeds = _merged_heads_graph("heads")
    assert "attention" not in [n.op for n in optimize(program).nodes]
    fused = cinn.compile(program, cache_dir=tmp_cache)
    unfused = cinn.compile(program, fuse=False, passes=False, cache_dir=tmp_cache)
    np.testing.assert_allclose(fused.run(feeds)[0], unfused.run(feeds)[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("form", ["plain", "k-transposed", "padding-mask", "causal", "probs-also-output", "fused-qkv"])
def test_attention_subgraph_fuses_and_matches_unfused(form, tmp_cache):
    program, feeds = _attention_graph(form)
    nodes = optimize(program).nodes
    ops = [n.op for n in nodes]
    if form == "probs-also-output":  # the probabilities are needed: nothing to fuse
        assert "attention" not in ops
    else:
        assert ops.count("attention") == 1 and "transpose" not in ops and "softmax" not in ops
    if form == "fused-qkv":  # the attention reads the projection's three column ranges in place: no slice copies
        assert "slice" not in ops
        assert next(n for n in nodes if n.op == "attention").attrs.columns == (0, 16, 32)
    fused = cinn.compile(program, cache_dir=tmp_cache)
    unfused = cinn.compile(program, fuse=False, passes=False, cache_dir=tmp_cache)
    for a, b in zip(fused.run(feeds), unfused.run(feeds), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_encoder_layer_is_nine_kernels(tmp_cache):
    """q, k, v, projection and two MLP matmuls (bias, GELU, residual in their epilogues), one attention kernel and
    two layer norms: no head-split copies, no separate softmax."""
    model = get_model("encoder", small=True)
    fused = cinn.compile(model.program, cache_dir=tmp_cache)
    unfused = cinn.compile(model.program, fuse=False, passes=False, cache_dir=tmp_cache)
    assert fused.num_kernels == 9
    for a, b in zip(fused.run(dict(model.feeds)), unfused.run(dict(model.feeds)), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_reference_agrees_with_independent_numpy():
    q, k, v, bias = _rand(2, 5, 12), _rand(2, 6, 12), _rand(2, 6, 9), _masks("padding", 2, 5, 6)
    (ref,) = get_op("attention").reference([q, k, v, bias], AttentionAttrs(heads=3, scale=0.3))
    np.testing.assert_allclose(ref, _numpy_attention(q, k, v, bias, 3, 0.3), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("seq", "keys"), [(3, 5), (19, 37)])
def test_fully_masked_rows_are_zero(seq, keys, tmp_cache):
    """Also where the kernel computes whole tiles of queries and of keys' scores (19 and 37)."""
    q, k, v = _rand(2, seq, 8), _rand(2, keys, 8), _rand(2, keys, 8)
    bias = np.zeros((2, 1, seq, keys), "float32")
    bias[1, 0, 2, :] = -np.inf  # batch 1, query 2 sees no key
    bias[0, 0, 0, :3] = -np.inf
    exe = _compile_attention([q.shape, k.shape, v.shape, bias.shape], 2, 0.5, tmp_cache)
    (got,) = exe.run({"q": q, "k": k, "v": v, "m": bias})
    assert not got[1, 2].any() and np.isfinite(got).all()
    (want,) = get_op("attention").reference([q, k, v, bias], AttentionAttrs(heads=2, scale=0.5))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got[0], _numpy_attention(q, k, v, bias, 2, 0.5)[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("seq", "keys", "mask", "skips"), [
    (128, 128, NEG, True), (128, 128, -np.inf, True), (64, 96, NEG, True), (77, 77, NEG, False), (7, 7, NEG, False),
])
def test_a_constant_causal_mask_skips_the_keys_it_masks(seq, keys, mask, skips, tmp_cache):
    """A causal bias known at compile time marks the attention causal; its kernel then cuts each query block's loops
    over keys at the block's last visible key (where the blocks are whole vectors of rows) and equals numpy."""
    heads, dim, batch = 4, 32, 2
    q, k, v = _rand(batch, seq, heads * dim), _rand(batch, keys, heads * dim), _rand(batch, keys, heads * dim)
    i, j = np.ogrid[:seq, :keys]
    bias = np.where(j > i + keys - seq, mask, 0.0).astype("float32")
    b = cinn.NetBuilder("causal")
    qv, kv, vv = (b.create_input("float32", x.shape, n) for n, x in zip("qkv", (q, k, v), strict=True))
    program = b.build([b.attention(qv, kv, vv, b.create_constant(bias, "bias"), heads=heads, scale=0.125)])
    (node,) = [n for n in optimize(program).nodes if n.op == "attention"]
    assert node.attrs.causal
    exe = cinn.compile(program, cache_dir=tmp_cache)
    assert (cpu_attention.QUERY_ROWS in exe.kernel_sources()[0]) is skips
    (got,) = exe.run({"q": q, "k": k, "v": v})
    np.testing.assert_allclose(got, _numpy_attention(q, k, v, bias, heads, 0.125), rtol=1e-4, atol=1e-5)


def test_only_an_exactly_causal_bias_is_causal():
    i, j = np.ogrid[:4, :6]
    causal = np.where(j > i + 2, NEG, 0.0)
    assert is_causal(causal, 4, 6) and is_causal(causal[None, None], 4, 6)
    assert is_causal(np.where(j > i + 2, -np.inf, 0.5), 4, 6)  # any values where the keys are visible
    assert not is_causal(np.where(j > i + 3, NEG, 0.0), 4, 6)  # one visible key too many
    assert not is_causal(np.where(j > i + 2, -100.0, 0.0), 4, 6)  # not masked: exp(-100) is no zero
    assert not is_causal(causal[:, -1:], 4, 6)  # broadcast over the queries
    assert not is_causal(np.where(j[:, :3] > i, NEG, 0.0), 4, 3)  # more queries than keys: a row sees nothing
    two = np.stack([causal, np.where(j > i + 1, NEG, 0.0)])
    assert not is_causal(two, 4, 6)  # one batch row is not causal


def test_gpt2_attention_is_causal_and_reads_its_qkv_projection_in_place():
    model = get_model("gpt2", small=True)
    nodes = optimize(model.program).nodes
    attention = [n for n in nodes if n.op == "attention"]
    assert attention and all(n.attrs.causal and n.attrs.columns == (0, 16, 32) for n in attention)
    assert "slice" not in [n.op for n in nodes]


def test_heads_at_columns_match_numpy(tmp_cache):
    """q, k and v as column ranges of one tensor, v's heads narrower than q's and k's."""
    heads, d, dv, seq = 2, 8, 4, 5
    qkv = _rand(1, seq, 2 * heads * d + heads * dv + 3)
    attrs = AttentionAttrs(heads, 0.3, columns=(0, heads * d, 2 * heads * d + 3), head_dims=(d, dv))
    b = cinn.NetBuilder("columns")
    x = b.create_input("float32", qkv.shape, "x")
    out = b.attention(x, x, x, b.create_constant(np.zeros((), "float32"), "bias"), heads=heads, scale=0.3,
                      columns=attrs.columns, head_dims=attrs.head_dims)
    (got,) = cinn.compile(b.build([out]), cache_dir=tmp_cache).run({"x": qkv})
    q, k, v = qkv[..., :heads * d], qkv[..., heads * d:2 * heads * d], qkv[..., 2 * heads * d + 3:]
    np.testing.assert_allclose(got, _numpy_attention(q, k, v, np.zeros((), "float32"), heads, 0.3), rtol=1e-4,
                               atol=1e-5)
    (ref,) = get_op("attention").reference([qkv, qkv, qkv, np.zeros((), "float32")], attrs)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
    types = [TensorType(qkv.shape, "float32")] * 3 + [TensorType((), "float32")]
    with pytest.raises(ValueError, match=r"columns \(0, 16, 40\).*heads must lie inside the last axes"):
        attention_shape(types, dataclasses.replace(attrs, columns=(0, 16, 40)))
