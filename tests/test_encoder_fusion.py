"""A transformer encoder layer followed by a final layer norm, through each front door (issue 52).

The last layer's norm and the final norm fuse into one REDUCTION kernel, where both read their shared epsilon: one
scalar constant, folded into the kernel as a block without loops. The row schedule kept that block as a stage (two
blocks read it), and rfactor failed inside TVM (`block_realize == old_block_realize_`). Each test compiles fused,
compares with the reference and with the unfused compile, and counts the kernels. Paddle itself is not needed."""
from __future__ import annotations

import pathlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import cinn

D, HEADS, FF, SEQ = 32, 2, 64, 8  # 32 wide: every norm's reduction is two or more vectors, rfactored (AVX2, AVX-512)
HEAD = D // HEADS
EPS = 1e-5
NORMS = ("ln1", "ln2", "final")
FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "paddle" / "encoder_norm"
RNG = np.random.default_rng(52)


def _weights() -> dict[str, np.ndarray]:
    shapes = {"wq": (D, D), "wk": (D, D), "wv": (D, D), "wo": (D, D), "w1": (D, FF), "w2": (FF, D),
              "bq": (D,), "bk": (D,), "bv": (D,), "bo": (D,), "b1": (FF,), "b2": (D,)}
    w = {k: RNG.uniform(-0.3, 0.3, s).astype("float32") for k, s in shapes.items()}
    for norm in NORMS:
        w[f"{norm}_g"] = RNG.uniform(0.5, 1.5, D).astype("float32")
        w[f"{norm}_b"] = RNG.uniform(-0.2, 0.2, D).astype("float32")
    return w


W = _weights()
X = RNG.uniform(-1, 1, (1, SEQ, D)).astype("float32")


def _reference(x: np.ndarray) -> np.ndarray:
    """The post-norm encoder layer and the final norm in numpy (float64)."""
    w = {k: v.astype("float64") for k, v in W.items()}

    def norm(v, name):
        c = v - v.mean(-1, keepdims=True)
        return c / np.sqrt((c * c).mean(-1, keepdims=True) + EPS) * w[f"{name}_g"] + w[f"{name}_b"]

    def heads(v):
        return v.reshape(1, SEQ, HEADS, HEAD).transpose(0, 2, 1, 3)

    q, k, v = (heads(x @ w[f"w{n}"] + w[f"b{n}"]) for n in "qkv")
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(HEAD)
    p = np.exp(s - s.max(-1, keepdims=True))
    ctx = (p / p.sum(-1, keepdims=True)) @ v
    h = norm(x + ctx.transpose(0, 2, 1, 3).reshape(1, SEQ, D) @ w["wo"] + w["bo"], "ln1")
    f = np.maximum(h @ w["w1"] + w["b1"], 0) @ w["w2"] + w["b2"]
    return norm(norm(h + f, "ln2"), "final")


# the fused attention's kernels: the q, k and v projections, the attention, the output projection with the residual,
# the first norm, the feed-forward's two matmuls (relu; the residual), and the second norm with the final norm.
# Paddle's MultiHeadAttention scales q before the scores: fuse_attention takes that scale into the fused op's
ATTENTION_KERNELS = 9


def _compare(program, feeds, want, cache, kernels):
    """Fused == reference == unfused, in `kernels` kernels, two of them for the three norms."""
    fused = cinn.compile(program, cache_dir=cache)
    (got,) = fused.run(feeds)
    (unfused,) = cinn.compile(program, fuse=False, cache_dir=cache).run(feeds)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got, unfused, rtol=1e-5, atol=1e-5)
    assert fused.num_kernels == kernels, fused.kernel_names
    assert sum(name.startswith("fused_reduce_mean") for name in fused.kernel_names) == 2, fused.kernel_names


# -- NetBuilder -----------------------------------------------------------------------------------
def _netbuilder() -> cinn.Program:
    b = cinn.NetBuilder("encoder_norm")
    x = b.create_input("float32", (1, SEQ, D), "x")
    c = {k: b.create_constant(v, k) for k, v in W.items()}

    def linear(v, n):
        return b.add(b.matmul(v, c[f"w{n}"]), c[f"b{n}"])

    def heads(v):
        return b.transpose(b.reshape(v, [1, SEQ, HEADS, HEAD]), axis=[0, 2, 1, 3])

    def norm(v, name):
        return b.layer_norm(v, c[f"{name}_g"], c[f"{name}_b"], begin_norm_axis=2, epsilon=EPS)

    q, k, v = (heads(linear(x, n)) for n in "qkv")
    p = b.softmax(b.matmul(q, k, trans_y=True, alpha=HEAD**-0.5), axes=[-1])
    ctx = b.reshape(b.transpose(b.matmul(p, v), axis=[0, 2, 1, 3]), [1, SEQ, D])
    h = norm(b.add(x, linear(ctx, "o")), "ln1")
    f = linear(b.relu(linear(h, 1)), 2)
    return b.build([norm(norm(b.add(h, f), "ln2"), "final")])


def test_netbuilder_encoder_with_final_norm(tmp_cache):
    _compare(_netbuilder(), {"x": X}, _reference(X), tmp_cache, ATTENTION_KERNELS)


# -- ONNX -----------------------------------------------------------------------------------------
def _onnx_model() -> onnx.ModelProto:
    """The same encoder as exporters write it: LayerNormalization (opset 17), heads by Reshape and Transpose, the
    scores scaled by a scalar."""
    nodes: list[onnx.NodeProto] = []

    def node(op, inputs, **attrs):
        out = f"{op.lower()}_{len(nodes)}"
        nodes.append(helper.make_node(op, inputs, [out], **attrs))
        return out

    def linear(v, n):
        return node("Add", [node("MatMul", [v, f"w{n}"]), f"b{n}"])

    def norm(v, name):
        return node("LayerNormalization", [v, f"{name}_g", f"{name}_b"], axis=-1, epsilon=EPS)

    def heads(v, perm):
        return node("Transpose", [node("Reshape", [v, "heads_shape"])], perm=perm)

    q, v = heads(linear("x", "q"), [0, 2, 1, 3]), heads(linear("x", "v"), [0, 2, 1, 3])
    k_t = heads(linear("x", "k"), [0, 2, 3, 1])
    p = node("Softmax", [node("Mul", [node("MatMul", [q, k_t]), "scale"])], axis=-1)
    ctx = node("Reshape", [node("Transpose", [node("MatMul", [p, v])], perm=[0, 2, 1, 3]), "model_shape"])
    h = norm(node("Add", ["x", linear(ctx, "o")]), "ln1")
    f = linear(node("Relu", [linear(h, 1)]), 2)
    out = norm(norm(node("Add", [h, f]), "ln2"), "final")
    constants = {**W, "scale": np.array(HEAD**-0.5, "float32"), "heads_shape": np.array([1, SEQ, HEADS, HEAD]),
                 "model_shape": np.array([1, SEQ, D])}
    graph = helper.make_graph(
        nodes, "encoder_norm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, SEQ, D])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, [1, SEQ, D])],
        [numpy_helper.from_array(a, k) for k, a in constants.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def test_onnx_encoder_with_final_norm(tmp_cache):
    _compare(cinn.load_onnx(_onnx_model()), {"x": X}, _reference(X), tmp_cache, ATTENTION_KERNELS)


def test_onnx_encoder_matches_onnxruntime(tmp_cache):
    ort = pytest.importorskip("onnxruntime")
    model = _onnx_model()
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": X})
    (got,) = cinn.compile(cinn.load_onnx(model), cache_dir=tmp_cache).run({"x": X})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


# -- Paddle ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("model_file", ["pir/inference.json", "legacy/inference.pdmodel"])
def test_paddle_encoder_with_final_norm(model_file, tmp_cache):
    """Saved by tools/make_paddle_fixtures.py: nn.TransformerEncoder(layer, 1, norm=nn.LayerNorm(32)), Paddle's
    outputs beside it."""
    data = np.load(FIXTURE / "data.npz")
    _compare(cinn.load_paddle(FIXTURE / model_file), {"x": data["in_x"]}, data["out_0"], tmp_cache, ATTENTION_KERNELS)
