"""ONNX importer tests: small hand-built models compared with onnxruntime, error cases, cinn-run."""
from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import cinn  # noqa: E402
from benchmarks.real_models import MODELS, light_path  # noqa: E402
from cinn.compiler.passes.pipeline import optimize  # noqa: E402
from cinn.compiler.passes.simplify import simplify  # noqa: E402
from cinn.facade import cli  # noqa: E402
from cinn.runtime.machine import Peaks  # noqa: E402
from frontend.onnx import OnnxImportError  # noqa: E402

F32, I64 = TensorProto.FLOAT, TensorProto.INT64
RNG = np.random.default_rng(0)


# -- helpers ------------------------------------------------------------------------------------
def make_model(nodes, inputs, outputs, initializers=(), opset=17) -> onnx.ModelProto:
    """A model from nodes; inputs/outputs are (name, elem_type, shape) triples (shape None: inferred)."""
    graph = helper.make_graph(
        nodes, "test",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        [numpy_helper.from_array(np.asarray(a), n) for n, a in initializers],
    )
    # ir_version 10: onnxruntime rejects the newer ones the latest onnx writes
    opsets = [helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def tiny_relu_model(path):
    """A one-Relu model saved at `path` (returned): the least a command can compile."""
    onnx.save(make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", TensorProto.FLOAT, [64])],
                         [("y", TensorProto.FLOAT, [64])]), path)
    return path


def ort_run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    # spinning ORT threads slow TVM's kernels down when both run in one process
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def assert_matches_ort(model, feeds, cache, rtol=1e-4, atol=1e-5, input_shapes=None):
    program = cinn.load_onnx(model, input_shapes=input_shapes)
    got = cinn.compile(program, cache_dir=cache).run(feeds)
    want = ort_run(model, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.dtype, w.shape)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


def rand(*shape, dtype="float32"):
    return RNG.uniform(-1, 1, shape).astype(dtype)


@dataclass(frozen=True)
class OpCase:
    """One ONNX node over float inputs x0, x1, ... (constant initializers given separately)."""

    name: str
    op: str
    shapes: tuple
    attrs: dict = field(default_factory=dict)
    opset: int = 17
    consts: tuple = ()  # (name, array) initializers appended to the node's inputs
    n_out: int = 1
    positive: bool = False  # inputs in (0.1, 2) for log/sqrt/pow
    int64_outputs: tuple = ()  # positions of int64 outputs (indices); the others are float

    def model(self):
        ins = [f"x{i}" for i in range(len(self.shapes))] + [n if n else "" for n, _ in self.consts]
        outs = [f"y{i}" for i in range(self.n_out)]
        node = helper.make_node(self.op, ins, outs, **self.attrs)
        inputs = [(f"x{i}", F32, s) for i, s in enumerate(self.shapes)]
        types = [I64 if k in self.int64_outputs else F32 for k in range(self.n_out)]
        return make_model([node], inputs, list(zip(outs, types, [None] * self.n_out, strict=True)), [c for c in self.consts if c[0]],
                          self.opset)

    def feeds(self):
        def one(s):
            return RNG.uniform(0.1, 2, s).astype("float32") if self.positive else rand(*s)

        return {f"x{i}": one(s) for i, s in enumerate(self.shapes)}


def i64(*v):
    return np.array(v, np.int64)


_W = rand(4, 2, 3, 3)
CASES = [
    # elementwise
    *[OpCase(op.lower(), op, ((2, 3, 4),)) for op in
      ("Relu", "Sigmoid", "Tanh", "Exp", "Abs", "Neg", "Erf", "Floor", "Ceil", "Round", "Sign", "Softplus",
       "HardSwish", "Softsign", "Identity")],
    OpCase("mish", "Mish", ((2, 3, 4),), opset=18),
    *[OpCase(op.lower(), op, ((2, 3, 4),), positive=True) for op in ("Log", "Sqrt", "Reciprocal")],
    *[OpCase(op.lower(), op, ((2, 3, 4), (3, 4))) for op in ("Add", "Sub", "Mul", "Max", "Min", "Sum", "Mean")],
    OpCase("div", "Div", ((2, 3, 4), (4,)), positive=True),
    OpCase("pow", "Pow", ((2, 3), (2, 3)), positive=True),
    OpCase("pow_square", "Pow", ((2, 3),), consts=(("e", np.array(2.0, np.float32)),)),
    OpCase("leaky_relu", "LeakyRelu", ((2, 5),), {"alpha": 0.2}),
    OpCase("elu", "Elu", ((2, 5),), {"alpha": 0.5}),
    OpCase("selu", "Selu", ((2, 5),)),
    OpCase("celu", "Celu", ((2, 5),), {"alpha": 2.0}),
    OpCase("hard_sigmoid", "HardSigmoid", ((2, 5),), {"alpha": 0.3, "beta": 0.4}),
    OpCase("prelu", "PRelu", ((2, 3, 4),), consts=(("slope", rand(3, 1)),)),
    OpCase("gelu", "Gelu", ((2, 5),), opset=20),
    OpCase("gelu_tanh", "Gelu", ((2, 5),), {"approximate": "tanh"}, opset=20),
    OpCase("clip_inputs", "Clip", ((3, 4),), consts=(("lo", np.float32(-0.3)), ("hi", np.float32(0.5)))),
    OpCase("clip_min_only", "Clip", ((3, 4),), consts=(("lo", np.float32(-0.3)),)),
    OpCase("clip_attrs", "Clip", ((3, 4),), {"min": -0.2, "max": 0.1}, opset=10),
    # nn
    OpCase("conv_group_dilation", "Conv", ((1, 4, 9, 9),), {"group": 2, "dilations": [2, 2], "pads": [1, 2, 1, 0]},
           consts=(("w", _W), ("b", rand(4)))),
    OpCase("conv_same_upper", "Conv", ((1, 2, 7, 8),), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}, consts=(("w", rand(3, 2, 3, 3)),)),
    OpCase("conv_same_lower", "Conv", ((1, 2, 7, 8),), {"auto_pad": "SAME_LOWER", "strides": [2, 2]}, consts=(("w", rand(3, 2, 2, 2)),)),
    OpCase("conv_1d", "Conv", ((1, 2, 9),), {"pads": [1, 1], "strides": [2]}, consts=(("w", rand(3, 2, 3)),)),
    OpCase("conv_transpose", "ConvTranspose", ((1, 2, 4, 5),), {"strides": [2, 2], "pads": [1, 0, 0, 1], "output_padding": [1, 0]},
           consts=(("w", rand(2, 3, 3, 3)), ("b", rand(3)))),
    OpCase("conv_transpose_group", "ConvTranspose", ((1, 4, 3, 3),), {"group": 2, "dilations": [2, 1]}, consts=(("w", rand(4, 1, 2, 2)),)),
    OpCase("max_pool_ceil", "MaxPool", ((1, 2, 7, 7),), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    OpCase("max_pool_pads", "MaxPool", ((1, 2, 6, 6),), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
    OpCase("avg_pool_include_pad", "AveragePool", ((1, 2, 6, 6),), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1}),
    OpCase("avg_pool_exclude_pad", "AveragePool", ((1, 2, 6, 6),), {"kernel_shape": [2, 3], "strides": [2, 1], "pads": [1, 1, 0, 1]}),
    OpCase("avg_pool_same", "AveragePool", ((1, 2, 5, 5),), {"kernel_shape": [2, 2], "strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    OpCase("global_avg_pool", "GlobalAveragePool", ((2, 3, 4, 5),)),
    OpCase("global_max_pool", "GlobalMaxPool", ((2, 3, 4, 5),)),
    OpCase("batch_norm", "BatchNormalization", ((2, 3, 4, 4),), {"epsilon": 1e-3},
           consts=(("s", rand(3)), ("bias", rand(3)), ("m", rand(3)), ("v", RNG.uniform(0.5, 1, 3).astype("float32")))),
    OpCase("instance_norm", "InstanceNormalization", ((2, 3, 4, 4),), consts=(("s", rand(3)), ("bias", rand(3)))),
    OpCase("group_norm", "GroupNormalization", ((2, 6, 3, 5),), {"num_groups": 3, "epsilon": 1e-3}, opset=21,
           consts=(("s", rand(6)), ("bias", rand(6)))),
    OpCase("mvn", "MeanVarianceNormalization", ((2, 3, 4, 5),), {"axes": [1, 3]}, opset=18),
    OpCase("shrink", "Shrink", ((3, 40),), {"lambd": 0.3, "bias": 0.2}),
    OpCase("layer_norm", "LayerNormalization", ((2, 3, 8),), {"axis": -1}, consts=(("s", rand(8)), ("bias", rand(8)))),
    OpCase("layer_norm_axis1", "LayerNormalization", ((2, 3, 4),), {"axis": 1}, consts=(("s", rand(3, 4)),)),
    OpCase("lrn", "LRN", ((1, 5, 3, 3),), {"size": 3, "alpha": 0.01}),
    OpCase("gemm", "Gemm", ((3, 4),), {"transB": 1, "alpha": 0.5, "beta": 2.0}, consts=(("w", rand(5, 4)), ("c", rand(5)))),
    OpCase("gemm_trans_a", "Gemm", ((4, 3), (4, 5)), {"transA": 1}),
    OpCase("matmul_batched", "MatMul", ((2, 3, 4), (4, 5))),
    OpCase("softmax_13", "Softmax", ((2, 3, 4),), {"axis": 1}, opset=13),
    OpCase("softmax_11_coerced", "Softmax", ((2, 3, 4),), {"axis": 1}, opset=11),
    OpCase("log_softmax_11", "LogSoftmax", ((2, 3, 4),), opset=11),
    OpCase("log_softmax", "LogSoftmax", ((2, 3, 4),)),
    # reductions
    OpCase("reduce_sum_input", "ReduceSum", ((2, 3, 4),), {"keepdims": 0}, consts=(("axes", i64(1, -1)),), opset=13),
    OpCase("reduce_sum_attr", "ReduceSum", ((2, 3, 4),), {"axes": [1]}, opset=11),
    OpCase("reduce_mean_attr", "ReduceMean", ((2, 3, 4),), {"axes": [0, 2]}),
    OpCase("reduce_max_input", "ReduceMax", ((2, 3, 4),), consts=(("axes", i64(2)),), opset=18),
    OpCase("reduce_min_all", "ReduceMin", ((2, 3, 4),), {"keepdims": 0}),
    OpCase("reduce_prod", "ReduceProd", ((2, 3),), {"axes": [1]}),
    OpCase("reduce_l2", "ReduceL2", ((2, 3, 4),), {"axes": [2]}),
    OpCase("reduce_log_sum_exp", "ReduceLogSumExp", ((2, 3, 4),), {"axes": [1], "keepdims": 0}),
    OpCase("cumsum", "CumSum", ((2, 5),), consts=(("axis", np.array(1, np.int64)),)),
    OpCase("cumsum_reverse_exclusive", "CumSum", ((3, 2),), {"reverse": 1, "exclusive": 1}, consts=(("axis", np.array(0, np.int64)),)),
    # shape
    OpCase("reshape_zero_and_minus_one", "Reshape", ((2, 3, 4),), consts=(("s", i64(0, -1)),)),
    OpCase("flatten", "Flatten", ((2, 3, 4),), {"axis": 2}),
    OpCase("flatten_negative", "Flatten", ((2, 3, 4),), {"axis": -1}),
    OpCase("transpose_default", "Transpose", ((2, 3, 4),)),
    OpCase("squeeze_11", "Squeeze", ((2, 1, 4),), {"axes": [1]}, opset=11),
    OpCase("squeeze_13", "Squeeze", ((2, 1, 4),), consts=(("a", i64(1)),), opset=13),
    OpCase("unsqueeze_11", "Unsqueeze", ((2, 4),), {"axes": [0, 3]}, opset=11),
    OpCase("unsqueeze_13", "Unsqueeze", ((2, 4),), consts=(("a", i64(-1)),), opset=13),
    OpCase("concat", "Concat", ((2, 3), (2, 1)), {"axis": -1}),
    OpCase("split_attr", "Split", ((6, 2),), {"split": [2, 4]}, opset=11, n_out=2),
    OpCase("split_input", "Split", ((6, 2),), consts=(("s", i64(1, 5)),), opset=13, n_out=2),
    OpCase("split_num_outputs", "Split", ((7, 2),), {"num_outputs": 3}, opset=18, n_out=3),
    OpCase("slice_attrs", "Slice", ((5, 6),), {"starts": [1, -4], "ends": [4, 100], "axes": [0, 1]}, opset=9),
    OpCase("slice_inputs", "Slice", ((5, 6),), consts=(("st", i64(4)), ("en", i64(-100)), ("ax", i64(1)), ("sp", i64(-2)))),
    OpCase("expand", "Expand", ((3, 1),), consts=(("s", i64(2, 3, 4)),)),
    OpCase("tile", "Tile", ((2, 3),), consts=(("r", i64(2, 1)),)),
    OpCase("pad_reflect", "Pad", ((3, 4),), {"mode": "reflect"}, consts=(("p", i64(1, 2, 1, 0)),)),
    OpCase("pad_constant_crop", "Pad", ((3, 4),), consts=(("p", i64(1, -1, 0, 2)), ("v", np.float32(0.5)))),
    OpCase("pad_attrs", "Pad", ((3, 4),), {"pads": [0, 1, 2, 0], "mode": "edge"}, opset=10),
    OpCase("gather", "Gather", ((5, 3),), {"axis": 0}, consts=(("i", i64([[0, -1], [2, 4]])),)),
    OpCase("pad_wrap", "Pad", ((3, 4),), {"mode": "wrap"}, consts=(("p", i64(1, 2, 2, 3)),), opset=19),
    OpCase("center_crop_pad", "CenterCropPad", ((3, 6),), consts=(("s", i64(6, 3)),), opset=18),
    OpCase("reverse_sequence", "ReverseSequence", ((4, 3, 2),), {"time_axis": 0, "batch_axis": 1},
           consts=(("n", i64(4, 1, 3)),)),
    OpCase("gather_nd", "GatherND", ((2, 3, 4),), consts=(("i", i64([[0, 1], [1, -1]])),)),
    OpCase("affine_grid", "AffineGrid", ((2, 2, 3),), {"align_corners": 0}, consts=(("s", i64(2, 3, 4, 5)),), opset=20),
    # resize / upsample
    OpCase("resize_nearest_scales", "Resize", ((1, 2, 3, 4),), consts=(("", None), ("sc", np.array([1, 1, 2, 1.5], np.float32)))),
    OpCase("resize_nearest_sizes_floor_asymmetric", "Resize", ((1, 2, 5, 4),),
           {"nearest_mode": "floor", "coordinate_transformation_mode": "asymmetric"},
           consts=(("", None), ("", None), ("sz", i64(1, 2, 3, 7)))),
    OpCase("resize_nearest_ceil_align_corners", "Resize", ((1, 1, 4, 4),),
           {"nearest_mode": "ceil", "coordinate_transformation_mode": "align_corners"},
           consts=(("", None), ("", None), ("sz", i64(1, 1, 7, 3)))),
    OpCase("resize_linear_half_pixel", "Resize", ((1, 2, 4, 5),), {"mode": "linear"},
           consts=(("", None), ("sc", np.array([1, 1, 1.75, 0.6], np.float32)))),
    OpCase("resize_linear_pytorch_half_pixel", "Resize", ((2, 1, 5, 3),),
           {"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"},
           consts=(("", None), ("", None), ("sz", i64(2, 1, 3, 1)))),
    OpCase("resize_linear_align_corners", "Resize", ((1, 3, 3, 4),),
           {"mode": "linear", "coordinate_transformation_mode": "align_corners"},
           consts=(("", None), ("sc", np.array([1, 1, 2, 2], np.float32)))),
    OpCase("resize_cubic_axes", "Resize", ((1, 2, 4, 4),), {"mode": "cubic", "axes": [3, 2]},
           consts=(("", None), ("", None), ("sz", i64(6, 3))), opset=18),
    OpCase("upsample_nearest", "Upsample", ((1, 1, 2, 3),), consts=(("sc", np.array([1, 1, 2, 3], np.float32)),), opset=9),
    # indexing
    OpCase("gather_elements", "GatherElements", ((3, 4),), {"axis": 1},
           consts=(("i", np.array([[0, -1], [3, 1], [2, 2]], np.int64)),)),
    OpCase("gather_elements_axis0", "GatherElements", ((4, 2, 3),), {"axis": 0},
           consts=(("i", RNG.integers(-4, 4, (2, 2, 3))),)),
    OpCase("top_k", "TopK", ((3, 6),), consts=(("k", i64(3)),), n_out=2, int64_outputs=(1,)),
    OpCase("top_k_smallest_axis0", "TopK", ((5, 2, 3),), {"axis": 0, "largest": 0}, consts=(("k", i64(2)),), n_out=2, int64_outputs=(1,)),
    OpCase("depth_to_space", "DepthToSpace", ((1, 8, 2, 3),), {"blocksize": 2}),
    OpCase("depth_to_space_crd", "DepthToSpace", ((1, 8, 2, 3),), {"blocksize": 2, "mode": "CRD"}),
    OpCase("space_to_depth", "SpaceToDepth", ((1, 2, 4, 6),), {"blocksize": 2}),
    OpCase("dropout", "Dropout", ((2, 3),)),
    OpCase("col2im", "Col2Im", ((2, 12, 16),), consts=(("im", i64(5, 6)), ("bl", i64(2, 3))), opset=18),
    OpCase("col2im_strides_pads_dilations", "Col2Im", ((1, 8, 6),), {"strides": [2, 3], "pads": [0, 1, 1, 1],
                                                                      "dilations": [1, 2]},
           consts=(("im", i64(5, 6)), ("bl", i64(2, 2))), opset=18),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_op_matches_onnxruntime(case, tmp_cache):
    assert_matches_ort(case.model(), case.feeds(), tmp_cache)


def test_logic_compare_cast_where(tmp_cache):
    nodes = [
        helper.make_node("Less", ["a", "b"], ["lt"]),
        helper.make_node("Greater", ["a", "b"], ["gt"]),
        helper.make_node("Equal", ["i", "j"], ["eq"]),
        helper.make_node("Or", ["lt", "eq"], ["or"]),
        helper.make_node("And", ["gt", "or"], ["and"]),
        helper.make_node("Not", ["or"], ["not"]),
        helper.make_node("Where", ["not", "a", "b"], ["w"]),
        helper.make_node("Cast", ["lt"], ["c"], to=F32),
        helper.make_node("ArgMax", ["a"], ["am"], axis=1),
        helper.make_node("ArgMin", ["a"], ["an"], axis=0, keepdims=0, select_last_index=1),
        helper.make_node("Div", ["i", "j"], ["idiv"]),
    ]
    model = make_model(nodes, [("a", F32, (3, 4)), ("b", F32, (3, 4)), ("i", I64, (3, 4)), ("j", I64, (3, 4))],
                       [(n, t, None) for n, t in [("and", TensorProto.BOOL), ("w", F32), ("c", F32), ("am", I64),
                                                  ("an", I64), ("idiv", I64)]])
    a = np.round(rand(3, 4), 1)
    feeds = {"a": a, "b": rand(3, 4), "i": RNG.integers(-9, 9, (3, 4)), "j": RNG.choice([-3, -2, 2, 3], (3, 4))}
    assert_matches_ort(model, feeds, tmp_cache)


def test_shape_subgraph_folds_to_constants(tmp_cache):
    """Shape -> Gather -> Unsqueeze -> Concat -> Reshape, ConstantOfShape and Range leave no shape ops behind."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "ax0"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus_one"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["flat"]),
        helper.make_node("ConstantOfShape", ["target_pos"], ["ones"], value=numpy_helper.from_array(np.ones(1, np.float32))),
        helper.make_node("Size", ["x"], ["size"]),
        helper.make_node("Cast", ["size"], ["limit"], to=I64),
        helper.make_node("Range", ["start", "limit", "step"], ["r"]),
        helper.make_node("Cast", ["r"], ["rf"], to=F32),
        helper.make_node("Constant", [], ["two"], value_float=2.0),
        helper.make_node("Mul", ["flat", "two"], ["y"]),
    ]
    inits = [("zero", np.array(0, np.int64)), ("ax0", i64(0)), ("minus_one", i64(-1)), ("target_pos", i64(2, 12)),
             ("start", np.array(0, np.int64)), ("step", np.array(5, np.int64))]
    model = make_model(nodes, [("x", F32, (2, 3, 4))], [("y", F32, None), ("ones", F32, None), ("rf", F32, None)], inits)
    program = cinn.load_onnx(model)
    assert [n.op for n in program.nodes] == ["reshape", "multiply"]
    assert_matches_ort(model, {"x": rand(2, 3, 4)}, tmp_cache)


def test_bert_style_encoder_matches_onnxruntime(tmp_cache):
    """One transformer encoder layer: attention with head reshapes, softmax, residuals, LayerNorm, Erf-GELU MLP."""
    s, d, h = 8, 16, 2
    w = {n: rand(*shape) * 0.3 for n, shape in
         [("wq", (d, d)), ("wk", (d, d)), ("wv", (d, d)), ("wo", (d, d)), ("w1", (d, 2 * d)), ("w2", (2 * d, d))]}
    inits = list(w.items()) + [("bq", rand(d)), ("g1", rand(d)), ("b1", rand(d)), ("heads", i64(1, s, h, d // h)),
                               ("merged", i64(1, s, d)), ("scale", np.float32(np.sqrt(d // h))),
                               ("half", np.float32(0.5)), ("one", np.float32(1.0)), ("rsqrt2", np.float32(2 ** -0.5))]
    n = helper.make_node
    nodes = [
        n("MatMul", ["x", "wq"], ["q0"]), n("Add", ["q0", "bq"], ["q1"]),
        n("MatMul", ["x", "wk"], ["k0"]), n("MatMul", ["x", "wv"], ["v0"]),
        *[n("Reshape", [f"{t}", "heads"], [f"{t}h"]) for t in ("q1", "k0", "v0")],
        n("Transpose", ["q1h"], ["q"], perm=[0, 2, 1, 3]), n("Transpose", ["k0h"], ["k"], perm=[0, 2, 3, 1]),
        n("Transpose", ["v0h"], ["v"], perm=[0, 2, 1, 3]),
        n("MatMul", ["q", "k"], ["qk"]), n("Div", ["qk", "scale"], ["qks"]), n("Softmax", ["qks"], ["p"], axis=-1),
        n("MatMul", ["p", "v"], ["ctx"]), n("Transpose", ["ctx"], ["ctxt"], perm=[0, 2, 1, 3]),
        n("Reshape", ["ctxt", "merged"], ["ctxm"]), n("MatMul", ["ctxm", "wo"], ["att"]), n("Add", ["att", "x"], ["r1"]),
        n("LayerNormalization", ["r1", "g1", "b1"], ["ln1"], axis=-1, epsilon=1e-5),
        n("MatMul", ["ln1", "w1"], ["f1"]), n("Mul", ["f1", "rsqrt2"], ["f2"]), n("Erf", ["f2"], ["f3"]),
        n("Add", ["f3", "one"], ["f4"]), n("Mul", ["f1", "f4"], ["f5"]), n("Mul", ["f5", "half"], ["gelu"]),
        n("MatMul", ["gelu", "w2"], ["f6"]), n("Add", ["f6", "ln1"], ["y"]),
    ]
    model = make_model(nodes, [("x", F32, (1, s, d))], [("y", F32, None)], inits)
    # the head splits, both MatMuls, the Div and the Softmax become one fused attention op
    assert [n.op for n in optimize(cinn.load_onnx(model)).nodes].count("attention") == 1
    assert_matches_ort(model, {"x": rand(1, s, d)}, tmp_cache, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize(("rank", "mask", "causal"), [(3, "float", 0), (4, "bool", 0), (3, None, 1)])
def test_onnx_attention_runs_as_the_fused_op(rank, mask, causal, tmp_cache):
    """ONNX's Attention (opset 23) with 3-D or 4-D heads, a float or boolean mask, or is_causal: one fused op."""
    b, s, h, d = 2, 9, 3, 8
    shape = (b, s, h * d) if rank == 3 else (b, h, s, d)
    feeds = {n: rand(*shape) for n in ("q", "k", "v")}
    inputs = [(n, F32, shape) for n in ("q", "k", "v")]
    if mask is not None:
        feeds["m"] = rand(b, 1, s, s) if mask == "float" else RNG.random((b, 1, s, s)) < 0.7
        inputs.append(("m", F32 if mask == "float" else TensorProto.BOOL, (b, 1, s, s)))
    heads = {"q_num_heads": h, "kv_num_heads": h} if rank == 3 else {}
    node = helper.make_node("Attention", [n for n, _, _ in inputs], ["y"], is_causal=causal, **heads)
    model = make_model([node], inputs, [("y", F32, None)], opset=23)
    ops = [n.op for n in optimize(cinn.load_onnx(model)).nodes]
    assert ops.count("attention") == 1 and "softmax" not in ops and "matmul" not in ops
    assert_matches_ort(model, feeds, tmp_cache)


def _ms(op: str, inputs, outputs, **attrs):
    return helper.make_node(op, inputs, outputs, domain="com.microsoft", **attrs)


@pytest.mark.parametrize("mask", [None, "lengths", "raw", "raw3d"])
def test_com_microsoft_attention_matches_onnxruntime(mask, tmp_cache):
    """onnxruntime's fused Attention (packed QKV weights and bias, a mask, unidirectional): the fused attention op."""
    b, s, hin, h, heads = 2, 7, 12, 16, 2
    inits = [("w", rand(hin, 3 * h) * 0.5), ("bias", rand(3 * h))]
    inputs, feeds = [("x", F32, (b, s, hin))], {"x": rand(b, s, hin)}
    names = ["x", "w", "bias"]
    if mask is not None:
        data = {"lengths": np.array([s, 4], np.int32), "raw": (RNG.random((b, s)) < 0.7).astype(np.int32),
                "raw3d": (RNG.random((b, s, s)) < 0.7).astype(np.int32)}[mask]
        data[..., 0] = 1  # every query sees a key (onnxruntime and ONNX differ on rows that see none)
        inputs.append(("m", TensorProto.INT32, data.shape))
        feeds["m"] = data
        names.append("m")
    node = _ms("Attention", names, ["y"], num_heads=heads, unidirectional=int(mask == "raw"))
    model = make_model([node], inputs, [("y", F32, (b, s, h))], inits)
    assert [n.op for n in optimize(cinn.load_onnx(model)).nodes].count("attention") == 1
    assert_matches_ort(model, feeds, tmp_cache)


def test_com_microsoft_layer_ops_match_onnxruntime(tmp_cache):
    """SkipLayerNormalization (all four outputs), BiasGelu and FastGelu, as onnxruntime's optimizer writes them."""
    d = 16
    inits = [("g", rand(d) + 1.5), ("beta", rand(d)), ("sb", rand(d)), ("gb", rand(d))]
    nodes = [_ms("SkipLayerNormalization", ["x", "skip", "g", "beta", "sb"], ["y", "mean", "inv", "sum"], epsilon=1e-5),
             _ms("BiasGelu", ["y", "gb"], ["g1"]), _ms("FastGelu", ["g1", "gb"], ["g2"]), _ms("FastGelu", ["g2"], ["z"])]
    outputs = [("z", F32, (2, 3, d)), ("mean", F32, (2, 3, 1)), ("inv", F32, (2, 3, 1)), ("sum", F32, (2, 3, d))]
    model = make_model(nodes, [("x", F32, (2, 3, d)), ("skip", F32, (2, 3, d))], outputs, inits)
    assert_matches_ort(model, {"x": rand(2, 3, d), "skip": rand(2, 3, d)}, tmp_cache, rtol=1e-4, atol=1e-4)


def test_com_microsoft_attention_with_a_cache_is_refused():
    node = _ms("Attention", ["x", "w", "", "", "past"], ["y"], num_heads=2)
    model = make_model([node], [("x", F32, (1, 3, 4)), ("past", F32, (2, 1, 2, 5, 2))], [("y", F32, (1, 3, 4))],
                       [("w", rand(4, 12))])
    with pytest.raises(OnnxImportError, match="past input"):
        cinn.load_onnx(model)


@pytest.mark.parametrize(("equation", "shapes"), [
    ("bhqd,bhkd->bhqk", [(2, 3, 4, 5), (2, 3, 6, 5)]),  # attention scores: one batched matmul
    ("ij,jk,kl->il", [(3, 4), (4, 5), (5, 2)]),  # three operands: aligned, multiplied, summed
    ("...ij,jk", [(2, 1, 3, 4), (4, 5)]),  # implicit output, an ellipsis
    ("bij,bjk->bik", [(1, 2, 3), (4, 3, 5)]),  # a batch index that broadcasts
])
def test_einsum_matches_onnxruntime(equation, shapes, tmp_cache):
    names = [f"x{i}" for i in range(len(shapes))]
    model = make_model([helper.make_node("Einsum", names, ["y"], equation=equation)],
                       [(n, F32, s) for n, s in zip(names, shapes, strict=True)], [("y", F32, None)], opset=12)
    assert_matches_ort(model, {n: rand(*s) for n, s in zip(names, shapes, strict=True)}, tmp_cache)


def test_cnn_block_matches_onnxruntime(tmp_cache):
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        n("BatchNormalization", ["c", "s", "bb", "m", "v"], ["bn"]),
        n("Relu", ["bn"], ["r"]), n("MaxPool", ["r"], ["mp"], kernel_shape=[2, 2], strides=[2, 2]),
        n("Add", ["mp", "mp"], ["res"]), n("GlobalAveragePool", ["res"], ["g"]), n("Flatten", ["g"], ["f"]),
        n("Gemm", ["f", "fc", "fcb"], ["y"], transB=1),
    ]
    inits = [("w", rand(4, 3, 3, 3)), ("b", rand(4)), ("s", rand(4)), ("bb", rand(4)), ("m", rand(4)),
             ("v", RNG.uniform(0.5, 1, 4).astype("float32")), ("fc", rand(5, 4)), ("fcb", rand(5))]
    model = make_model(nodes, [("x", F32, (1, 3, 8, 8))], [("y", F32, None)], inits)
    assert_matches_ort(model, {"x": rand(1, 3, 8, 8)}, tmp_cache)


# -- BatchNormalization after any producer: folded into a conv's or matmul's weights only where that is exact ----
def _conv(inputs, out, **attrs):
    return helper.make_node("Conv", inputs, [out], pads=[1, 1, 1, 1], **attrs)


_BN_PRODUCERS = {  # name: (the nodes making "p" from x (1, 4, 6, 6) or, for matmul, x2 (5, 8); outputs besides y)
    "relu": ([helper.make_node("Relu", ["x"], ["p"])], []),
    "sigmoid": ([helper.make_node("Sigmoid", ["x"], ["p"])], []),
    "max-pool": ([helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[2, 2], strides=[2, 2])], []),
    "transpose": ([helper.make_node("Transpose", ["x"], ["p"], perm=[0, 1, 3, 2])], []),
    "conv-without-bias": ([_conv(["x", "w"], "p")], []),
    "conv-with-bias": ([_conv(["x", "w", "wb"], "p")], []),
    "conv-with-other-consumers": ([_conv(["x", "w"], "p"), helper.make_node("Relu", ["p"], ["z"])], ["z"]),
    "grouped-conv": ([_conv(["x", "gw"], "p", group=2)], []),
    "matmul": ([helper.make_node("MatMul", ["x2", "mw"], ["p"])], []),
}
_BN_FOLDED = ("conv-without-bias", "grouped-conv", "matmul")


def _bn_model(producer: str) -> onnx.ModelProto:
    nodes, extra = _BN_PRODUCERS[producer]
    matmul = producer == "matmul"
    bn = helper.make_node("BatchNormalization", ["p", "s", "bb", "m", "v"], ["y"], epsilon=1e-3)
    c = 3 if matmul else 4
    inits = [("s", rand(c) + 1.5), ("bb", rand(c)), ("m", rand(c)), ("v", RNG.uniform(0.5, 1, c).astype("float32")),
             ("w", rand(4, 4, 3, 3)), ("wb", rand(4)), ("gw", rand(4, 2, 3, 3)), ("mw", rand(8, 3))]
    x = ("x2", F32, (5, 8)) if matmul else ("x", F32, (1, 4, 6, 6))
    used = {i for node in nodes for i in node.input} | {"s", "bb", "m", "v"}
    return make_model(nodes + [bn], [x], [(o, F32, None) for o in ("y", *extra)], [i for i in inits if i[0] in used])


@pytest.mark.parametrize("producer", list(_BN_PRODUCERS))
def test_batchnorm_after_any_producer_matches_onnxruntime(producer, tmp_cache):
    model = _bn_model(producer)
    folded = "batchnorm" not in [n.op for n in simplify(cinn.load_onnx(model)).nodes]
    assert folded == (producer in _BN_FOLDED)
    feeds = {"x2": rand(5, 8)} if producer == "matmul" else {"x": rand(1, 4, 6, 6)}
    assert_matches_ort(model, feeds, tmp_cache, rtol=1e-4)


# -- inputs, initializers, errors ---------------------------------------------------------------
def _relu_model(shape=("batch", 3)) -> onnx.ModelProto:
    return make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", F32, shape)], [("y", F32, None)])


def test_symbolic_dim_is_a_symbol_unless_input_shapes_fixes_it(tmp_cache):
    assert str(cinn.load_onnx(_relu_model())) == "symbolic program test(%x:float32[batch, 3])"
    program = cinn.load_onnx(_relu_model(), input_shapes={"x": (4, 3)})
    assert program.inputs[0].shape == (4, 3)
    with pytest.raises(OnnxImportError, match="not graph inputs"):
        cinn.load_onnx(_relu_model(), input_shapes={"nope": (1,)})


def test_initializer_listed_as_input_is_a_constant():
    model = make_model([helper.make_node("Add", ["x", "w"], ["y"])], [("x", F32, (2,)), ("w", F32, (2,))],
                       [("y", F32, None)], [("w", np.ones(2, np.float32))])
    program = cinn.load_onnx(model)
    assert [v.name for v in program.inputs] == ["x"] and "w" in program.constants
    assert [v.name for v in program.outputs] == ["y"]


def _ir3_model(listed: tuple[str, ...] = ()) -> onnx.ModelProto:
    """y = relu(x @ w + b) at IR version 3 (opset 8), as old exporters and onnx's version converter write it: the
    initializers w and b are graph inputs only where `listed` names them."""
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["a"]),
                        helper.make_node("Relu", ["a"], ["y"])],
                       [("x", F32, (2, 4))] + [(n, F32, (4, 3) if n == "w" else (3,)) for n in listed],
                       [("y", F32, (2, 3))], [("w", rand(4, 3)), ("b", rand(3))], opset=8)
    model.ir_version = 3
    del model.opset_import[1:]  # IR 3 has no other domains
    return model


@pytest.mark.parametrize("listed", [(), ("b",), ("w", "b")], ids=["none-listed", "some-listed", "all-listed"])
def test_ir3_initializers_missing_from_the_graph_inputs_are_constants(listed, tmp_cache):
    # refused before: "w in initializer but not in graph input" (onnxruntime and OpenVINO run such files)
    model = _ir3_model(listed)
    program = cinn.load_onnx(model)
    assert [v.name for v in program.inputs] == ["x"] and {"w", "b"} <= set(program.constants)
    assert_matches_ort(model, {"x": rand(2, 4)}, tmp_cache)


def test_ir3_initializers_are_still_checked():
    model = _ir3_model()
    model.graph.initializer[1].dims[:] = [4]  # b holds 3 values
    with pytest.raises(OnnxImportError, match=r"invalid ONNX model: TensorProto \(tensor name: b\) raw_data size"):
        cinn.load_onnx(model)
    model = _ir3_model()
    model.graph.node.append(helper.make_node("Neg", ["x"], ["w"]))  # a node output named like an initializer
    with pytest.raises(OnnxImportError, match=r"invalid ONNX model: .*SSA.*'w' has been used as output names"):
        cinn.load_onnx(model)


def test_unsupported_ops_listed_in_one_error():
    n = helper.make_node
    nodes = [n("Relu", ["x"], ["a"]), n("Foo", ["a"], ["b"], name="foo1"), n("Bar", ["b"], ["c"], name="bar1"),
             n("Foo", ["c"], ["y"], name="foo2")]
    model = make_model(nodes, [("x", F32, (2,))], [("y", F32, None)])
    with pytest.raises(NotImplementedError) as err:
        cinn.load_onnx(model)
    message = str(err.value)
    assert "Bar (nodes 'bar1')" in message and "Foo (nodes 'foo1', 'foo2')" in message


def test_truncated_file_names_the_file(tmp_path):
    path = tmp_path / "broken.onnx"
    data = _relu_model((2, 3)).SerializeToString()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(OnnxImportError, match=r"broken\.onnx: not a valid ONNX model"):
        cinn.load_onnx(path)
    with pytest.raises(FileNotFoundError, match=r"missing\.onnx"):
        cinn.load_onnx(tmp_path / "missing.onnx")


def test_bad_use_of_an_op_names_the_node():
    model = make_model([helper.make_node("DepthToSpace", ["x"], ["y"], name="r1", blocksize=2, mode="XYZ")],
                       [("x", F32, (1, 4, 2, 2))], [("y", F32, None)])
    with pytest.raises(OnnxImportError, match=r"node 'r1' \(DepthToSpace\): mode 'XYZ' is neither DCR nor CRD"):
        cinn.load_onnx(model)
    # a shape argument computed from a large input at run time cannot be read by value
    nodes = [helper.make_node("ReduceMax", ["s"], ["t"], axes=[0], keepdims=0),
             helper.make_node("Reshape", ["x", "t"], ["y"], name="r2")]
    model = make_model(nodes, [("x", F32, (2, 3)), ("s", I64, (70000, 2))], [("y", F32, None)], opset=13)
    with pytest.raises(OnnxImportError, match=r"node 'r2' \(Reshape\): the target shape \(input 1\) must be a constant"):
        cinn.load_onnx(model)


def test_importing_cinn_does_not_import_onnx():
    code = "import sys, cinn; assert 'onnx' not in sys.modules; cinn.load_onnx; assert 'onnx' in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# -- cinn-run -----------------------------------------------------------------------------------
def test_cinn_run_prints_outputs_and_latency(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CINN_CACHE_DIR", str(tmp_path / "cache"))  # empty: progress is shown for built kernels
    path = tmp_path / "tiny.onnx"
    onnx.save(_relu_model(), path)
    assert cli.main([str(path), "--input-shape", "x=2,3", "--repeat", "2"]) == 0
    out = capsys.readouterr()
    assert "output y: shape (2, 3) float32" in out.out and "median latency" in out.out
    assert "compiling: 1/1 kernels" in out.err


def test_cinn_run_profile_prints_rates_and_percent_of_peak(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CINN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(cli, "machine_peaks", lambda target, cache: Peaks(gflops=100.0, gbps=10.0))
    path = tmp_path / "tiny.onnx"
    onnx.save(_relu_model(), path)
    assert cli.main([str(path), "--input-shape", "x=2,3", "--repeat", "2", "--profile"]) == 0
    lines = capsys.readouterr().out.splitlines()
    start = lines.index("machine: FMA peak 100 GFLOP/s, memory 10.0 GB/s (measured, all cores)")
    assert lines[start + 1].split()[-3:] == ["GFLOP/s", "GB/s", "peak"]
    assert lines[start + 2].startswith("relu ") and lines[start + 2].endswith(" mem")  # 6 flops on 48 bytes


@pytest.mark.parametrize(
    ("args", "status", "message"),
    [
        (["model.pdmodel"], 2, "no such Paddle model file"),
        (["model.txt"], 2, "unknown model format"),
        (["missing.onnx"], 2, "no such ONNX file"),
        (["tiny.onnx"], 2, "inputs %x:float32[batch, 3] have symbolic dims; pass --input-shape"),
        (["tiny.onnx", "--input-shape", "x=2,a"], 2, "expected NAME=D0,D1"),
        (["tiny.onnx", "--input-shape", "x=2,3", "--log", "missing.jsonl"], 2, "no such schedule log"),
    ],
)
def test_cinn_run_user_errors(args, status, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    onnx.save(_relu_model(), tmp_path / "tiny.onnx")
    assert cli.main(args) == status
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and err.count("\n") == 1


def test_python_m_cinn_help():
    result = subprocess.run([sys.executable, "-m", "cinn", "--help"], capture_output=True, text=True, check=True)
    assert "cinn-run" in result.stdout and "--input-shape" in result.stdout


# -- real CNNs shipped with the onnx package ---------------------------------------------------
def _light_model(name: str):
    path = light_path(name)
    if not path.exists():
        pytest.skip(f"{path} is not installed")
    return onnx.load(path)


@pytest.mark.parametrize("name", ["squeezenet", pytest.param("resnet50", marks=pytest.mark.slow),
                                  pytest.param("vgg19", marks=pytest.mark.slow)])
def test_light_cnn_matches_onnxruntime(name, tmp_cache):
    """The CNNs shipped with onnx (their weights are constant fills, so this checks import and compile)."""
    model = _light_model(name)
    model.ir_version = min(model.ir_version, 10)
    inp = next(i for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer})
    shape = [d.dim_value for d in inp.type.tensor_type.shape.dim]
    assert_matches_ort(model, {inp.name: RNG.uniform(0, 1, shape).astype("float32")}, tmp_cache, rtol=1e-3, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MODELS))
def test_real_cnn_with_random_weights_matches_onnxruntime(name, tmp_cache):
    """The ten CNNs of cinn-bench (onnx's models with seeded random weights, MobileNetV2) through every conv form
    (grouped, depthwise, strided, 1x1, LRN, GEMV): rtol 1e-3, atol 1e-3 of the output's magnitude."""
    check_real_cnn(name, tmp_cache, "llvm")


def check_real_cnn(name: str, cache, target: str) -> None:
    """One of cinn-bench's CNNs compiled for `target` against onnxruntime."""
    if name != "mobilenet_v2" and not light_path(name).exists():
        pytest.skip(f"{light_path(name)} is not installed")
    model = MODELS[name]()
    inp = next(i for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer})
    feeds = {inp.name: RNG.uniform(0, 1, [d.dim_value for d in inp.type.tensor_type.shape.dim]).astype("float32")}
    want = ort_run(model, feeds)
    (got,) = cinn.compile(cinn.load_onnx(model), target=target, cache_dir=cache).run(feeds)
    np.testing.assert_allclose(got, want[0], rtol=1e-3, atol=1e-3 * float(np.abs(want[0]).max()))


def _if_model(cond_const: bool | None) -> onnx.ModelProto:
    """y = If(c) then relu(x) * 2 else x - 1; the branches read x from the enclosing graph."""
    two, one = numpy_helper.from_array(np.float32(2), "two"), numpy_helper.from_array(np.float32(1), "one")
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Mul", ["r", "two"], ["t"])],
                             "then", [], [helper.make_tensor_value_info("t", F32, (2, 3))], [two])
    other = helper.make_graph([helper.make_node("Sub", ["x", "one"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", F32, (2, 3))], [one])
    node = helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)
    inputs = [("x", F32, (2, 3))] + ([("c", TensorProto.BOOL, ())] if cond_const is None else [])
    inits = [] if cond_const is None else [("c", np.array(cond_const))]
    return make_model([node], inputs, [("y", F32, (2, 3))], inits)


@pytest.mark.parametrize("cond", [True, False])
def test_if_with_a_constant_condition_inlines_its_branch(cond, tmp_cache):
    model = _if_model(cond)
    assert "If" not in [n.op for n in cinn.load_onnx(model).nodes]
    assert_matches_ort(model, {"x": rand(2, 3)}, tmp_cache)


def test_if_on_an_input_is_specialized_by_its_value(tmp_cache):
    model = _if_model(None)
    exe = cinn.compile(cinn.load_onnx(model), cache_dir=tmp_cache)
    x = rand(2, 3)
    for c in (True, False, True):
        feeds = {"x": x, "c": np.array(c)}
        np.testing.assert_allclose(exe.run(feeds)[0], ort_run(model, feeds)[0], rtol=1e-6)


def test_if_branch_with_an_unsupported_op_is_refused_by_name():
    model = _if_model(True)
    branch_node = next(a.g for a in model.graph.node[0].attribute if a.name == "then_branch").node[0]
    branch_node.op_type, branch_node.domain = "NotAnOp", "com.microsoft"
    with pytest.raises(NotImplementedError, match="NotAnOp"):
        cinn.load_onnx(model)


def _loop_model(trip_count=4, stop=None, scan_slice=False, cond_on_data=False) -> onnx.ModelProto:
    """y = Loop: y <- y * 0.5 + x[i] for i < trip_count (and i + 1 < stop when given), emitting relu(y) per iteration;
    the body reads x from the enclosing graph. scan_slice emits x[:i + 1] instead (a shape that changes),
    cond_on_data continues while sum(x[i]) > 0 (run-time data); a trip_count of None makes it a graph input."""
    n = helper.make_node
    nodes = [n("Gather", ["x", "i"], ["row"], axis=0), n("Mul", ["y_in", "half"], ["h"]), n("Add", ["h", "row"], ["y_out"]),
             n("Relu", ["y_out"], ["s"])]
    if scan_slice:
        nodes += [n("Add", ["i", "one"], ["end"]), n("Unsqueeze", ["end", "zero"], ["ends"]),
                  n("Slice", ["x", "zero", "ends"], ["s_slice"])]
    if stop is not None:
        nodes += [n("Add", ["i", "one"], ["next"]), n("Less", ["next", "stop"], ["c_out"])]
    elif cond_on_data:
        nodes += [n("ReduceSum", ["row"], ["total"], keepdims=0), n("Greater", ["total", "zerof"], ["c_out"])]
    else:
        nodes += [n("Identity", ["c_in"], ["c_out"])]
    body_inits = [numpy_helper.from_array(np.float32(0.5), "half"), numpy_helper.from_array(np.int64(1), "one"),
                  numpy_helper.from_array(i64(0), "zero"), numpy_helper.from_array(np.float32(0), "zerof")]
    body = helper.make_graph(
        nodes, "body",
        [helper.make_tensor_value_info("i", I64, ()), helper.make_tensor_value_info("c_in", TensorProto.BOOL, ()),
         helper.make_tensor_value_info("y_in", F32, (3,))],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, ()), helper.make_tensor_value_info("y_out", F32, (3,)),
         helper.make_tensor_value_info("s_slice" if scan_slice else "s", F32, None)], body_inits)
    loop = helper.make_node("Loop", ["m", "cond", "y0"], ["y", "scan"], name="loop", body=body)
    inputs = [("x", F32, (5, 3)), ("y0", F32, (3,))] + ([("m", I64, ())] if trip_count is None else [])
    inits = [("cond", np.array(True)), ("stop", np.array(stop or 0, np.int64))]
    inits += [] if trip_count is None else [("m", np.array(trip_count, np.int64))]
    return make_model([loop], inputs, [("y", F32, (3,)), ("scan", F32, None)], inits)


@pytest.mark.parametrize("trip_count,stop", [(4, None), (5, 3)], ids=["trip-count", "condition-from-iteration"])
def test_loop_with_a_static_trip_count_is_unrolled(trip_count, stop, tmp_cache):
    model = _loop_model(trip_count, stop)
    program = cinn.load_onnx(model)
    assert "Loop" not in [n.op for n in program.nodes]
    assert program.outputs[1].shape == (stop or trip_count, 3)
    assert_matches_ort(model, {"x": rand(5, 3), "y0": rand(3)}, tmp_cache)


def test_loop_trip_count_input_is_read_by_value(tmp_cache):
    model = _loop_model(None)
    exe = cinn.compile(cinn.load_onnx(model), cache_dir=tmp_cache)
    x, y0 = rand(5, 3), rand(3)
    for m in (2, 5):
        feeds = {"x": x, "y0": y0, "m": np.array(m, np.int64)}
        for got, want in zip(exe.run(feeds), ort_run(model, feeds), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _dynamic_trip_count_model() -> onnx.ModelProto:
    """The Loop's trip count is computed from a float input's data (not read by value)."""
    model = _loop_model(None)
    graph = model.graph
    graph.node.insert(0, helper.make_node("ReduceMax", ["t"], ["tmax"], keepdims=0))
    graph.node.insert(1, helper.make_node("Cast", ["tmax"], ["m"], to=I64))
    del graph.input[2]
    graph.input.append(helper.make_tensor_value_info("t", F32, (4, 4)))
    return model


@pytest.mark.parametrize("model,message", [
    (_dynamic_trip_count_model, r"node 'loop' \(Loop\): Loop is unrolled when converting: its trip count \(input 0\) must be a constant"),
    (lambda: _loop_model(4, cond_on_data=True),
     r"Loop is unrolled when converting: its condition before iteration 1 must be a constant"),
    (lambda: _loop_model(3, scan_slice=True), r"Loop's scan output 'scan' changes shape between iterations"),
    (lambda: _loop_model(1000), r"node 'loop' \(Loop\): Loop's body 'body' \(5 nodes\) would take the nodes converted "
                                r"from subgraphs over 4101 \(the model's 5 and 4096 more\)"),
    (lambda: _loop_model(0), r"runs no iteration, so its scan outputs \['scan'\] would be empty"),
], ids=["dynamic-trip-count", "data-dependent-condition", "changing-scan-shape", "too-many-iterations", "no-iteration"])
def test_loop_refusals_say_why(model, message):
    with pytest.raises(OnnxImportError, match=message):
        cinn.load_onnx(model())


def _nested_loops(depth: int, trips: int, inner: str = "Loop") -> onnx.ModelProto:
    """y = x + trips**depth: `depth` Loops nested (named loop1, loop2, ... from the outside), the innermost body adding
    1, or an If (named if) taking a branch that adds 1 when inner is "If"."""
    n, vi = helper.make_node, helper.make_tensor_value_info
    head = [vi("i", I64, ()), vi("c_in", TensorProto.BOOL, ()), vi("y_in", F32, (3,))]
    tail = [vi("c_out", TensorProto.BOOL, ()), vi("y_out", F32, (3,))]
    add = n("Add", ["y_in", "one"], ["y_out"])
    if inner == "If":
        branch = helper.make_graph([n("Add", ["y_in", "one"], ["y_if"])], "then", [], [vi("y_if", F32, (3,))])
        add = n("If", ["yes"], ["y_out"], name="if", then_branch=branch, else_branch=branch)
    body = helper.make_graph([add, n("Identity", ["c_in"], ["c_out"])], f"body{depth}", head, tail)
    for d in range(depth - 1, 0, -1):
        loop = n("Loop", ["m", "", "y_in"], ["y_out"], name=f"loop{d + 1}", body=body)
        body = helper.make_graph([loop, n("Identity", ["c_in"], ["c_out"])], f"body{d}", head, tail)
    inits = [("m", np.array(trips, np.int64)), ("one", np.ones(3, np.float32)), ("yes", np.array(True))]
    return make_model([n("Loop", ["m", "", "x"], ["y"], name="loop1", body=body)], [("x", F32, (3,))],
                      [("y", F32, (3,))], inits)


@pytest.mark.parametrize("depth,trips,inner", [(3, 30, "Loop"), (2, 60, "Loop"), (2, 64, "If")])
def test_nested_control_flow_is_limited_over_the_whole_model(depth, trips, inner):
    # the limit was per Loop: 3 nested Loops of 30 iterations imported as 27,000 nodes, 2 of 60 compiled for minutes
    outer = r"node 'loop1' \(Loop\): ONNX node 'loop2' \(Loop\): .*"
    with pytest.raises(OnnxImportError, match=outer + r"would take the nodes converted from subgraphs over \d+ "
                                              r"\(the model's \d+ and 4096 more\)"):
        cinn.load_onnx(_nested_loops(depth, trips, inner))


@pytest.mark.parametrize("inner", ["Loop", "If"])
def test_nested_control_flow_within_the_limit_matches_onnxruntime(inner, tmp_cache):
    model = _nested_loops(3, 4, inner)
    assert {n.op for n in cinn.load_onnx(model).nodes} <= {"add", "identity"}
    assert_matches_ort(model, {"x": rand(3)}, tmp_cache)


def test_a_subgraph_initializer_becomes_one_constant_however_often_its_graph_runs(tmp_cache):
    # an If branch's initializer was copied for every iteration of the enclosing Loop (memory grew with the trips)
    n, vi = helper.make_node, helper.make_tensor_value_info
    branch = helper.make_graph([n("Add", ["y_in", "big"], ["y_if"])], "then", [], [vi("y_if", F32, (3,))],
                               [numpy_helper.from_array(np.array([0.25, 0.5, 0.75], np.float32), "big")])
    body = helper.make_graph([n("If", ["yes"], ["y_out"], then_branch=branch, else_branch=branch),
                              n("Identity", ["c_in"], ["c_out"])], "body",
                             [vi("i", I64, ()), vi("c_in", TensorProto.BOOL, ()), vi("y_in", F32, (3,))],
                             [vi("c_out", TensorProto.BOOL, ()), vi("y_out", F32, (3,))])
    model = make_model([n("Loop", ["m", "", "x"], ["y"], body=body)], [("x", F32, (3,))], [("y", F32, (3,))],
                       [("m", np.array(20, np.int64)), ("yes", np.array(True))])
    program = cinn.load_onnx(model)
    assert [a.tolist() for a in program.constants.values()].count([0.25, 0.5, 0.75]) == 1
    assert_matches_ort(model, {"x": rand(3)}, tmp_cache)


def test_scan_cumulative_sums_both_directions(tmp_cache):
    """Scan over axis 1 of x twice, forward and reverse: running sums (outputs written in the same directions, one
    along axis 1 and one along axis -1), and the totals as the final states."""
    n = helper.make_node
    body = helper.make_graph(
        [n("Add", ["a_in", "xa"], ["a_out"]), n("Add", ["b_in", "xb"], ["b_out"]),
         n("Identity", ["a_out"], ["a_scan"]), n("Identity", ["b_out"], ["b_scan"])], "body",
        [helper.make_tensor_value_info(v, F32, (3,)) for v in ("a_in", "b_in", "xa", "xb")],
        [helper.make_tensor_value_info(v, F32, (3,)) for v in ("a_out", "b_out", "a_scan", "b_scan")])
    node = n("Scan", ["zeros", "zeros", "x", "x"], ["a", "b", "cumsum", "reverse_cumsum"], body=body,
             num_scan_inputs=2, scan_input_axes=[1, 1], scan_input_directions=[0, 1], scan_output_axes=[1, -1],
             scan_output_directions=[0, 1])
    model = make_model([node], [("x", F32, (3, 5))], [(v, F32, None) for v in ("a", "b", "cumsum", "reverse_cumsum")],
                       [("zeros", np.zeros(3, np.float32))], opset=16)
    assert "Scan" not in [n.op for n in cinn.load_onnx(model).nodes]
    x = rand(3, 5)
    assert_matches_ort(model, {"x": x}, tmp_cache)
    a, b, cumsum, reverse = cinn.compile(cinn.load_onnx(model), cache_dir=tmp_cache).run({"x": x})
    np.testing.assert_allclose(cumsum, np.cumsum(x, axis=1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(reverse, np.cumsum(x[:, ::-1], axis=1)[:, ::-1], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


# -- spatial index ops: indices and rois are run-time inputs ---------------------------------------
@pytest.mark.parametrize(("shape", "pool"), [((2, 3, 6, 8), {"kernel_shape": [2, 2], "strides": [2, 2]}),
                                             ((1, 2, 7, 7), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
                                             ((2, 2, 9), {"kernel_shape": [3], "strides": [3]})])
def test_max_unpool_of_max_pool_indices_matches_onnxruntime(shape, pool, tmp_cache):
    """MaxUnpool of the values and indices of onnxruntime's MaxPool (overlapping windows too)."""
    pooling = make_model([helper.make_node("MaxPool", ["x"], ["v", "i"], **pool)], [("x", F32, shape)],
                         [("v", F32, None), ("i", I64, None)], opset=12)
    values, index = ort_run(pooling, {"x": rand(*shape)})
    unpool = make_model([helper.make_node("MaxUnpool", ["v", "i"], ["y"], **pool)],
                        [("v", F32, values.shape), ("i", I64, index.shape)], [("y", F32, None)], opset=11)
    assert_matches_ort(unpool, {"v": values, "i": index}, tmp_cache)


def test_max_unpool_output_shape_smaller_than_the_unpooled_one_is_refused():
    node = helper.make_node("MaxUnpool", ["v", "i", "s"], ["y"], kernel_shape=[2, 2], strides=[2, 2])
    model = make_model([node], [("v", F32, (1, 1, 2, 2)), ("i", I64, (1, 1, 2, 2))], [("y", F32, None)],
                       [("s", i64(1, 1, 3, 4))], opset=11)
    with pytest.raises(OnnxImportError, match=r"at least the unpooled shape \(1, 1, 4, 4\)"):
        cinn.load_onnx(model)


@pytest.mark.parametrize(("opset", "attrs"), [
    (10, {"output_height": 3, "output_width": 2, "sampling_ratio": 2}),  # output_half_pixel, the opset 10 default
    (16, {"output_height": 2, "output_width": 3, "spatial_scale": 0.5}),  # half_pixel, adaptive sampling
    (16, {"output_height": 3, "output_width": 3, "mode": "max", "coordinate_transformation_mode": "output_half_pixel"}),
])
def test_roi_align_matches_onnxruntime(opset, attrs, tmp_cache):
    """RoiAlign with the rois and their images fed at run time."""
    scale = attrs.get("spatial_scale", 1.0)
    lo = RNG.uniform(0, 5, (6, 2))
    rois = np.concatenate([lo, lo + RNG.uniform(0.5, 4, (6, 2))], axis=1) / scale
    feeds = {"x": rand(2, 3, 9, 10), "rois": rois.astype("float32"), "b": RNG.integers(0, 2, 6)}
    node = helper.make_node("RoiAlign", ["x", "rois", "b"], ["y"], **attrs)
    model = make_model([node], [("x", F32, (2, 3, 9, 10)), ("rois", F32, (6, 4)), ("b", I64, (6,))], [("y", F32, None)],
                       opset=opset)
    assert_matches_ort(model, feeds, tmp_cache)


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_recurrent_sequence_lens_mask_the_padding(op, tmp_cache):
    """sequence_lens fed at run time: past its length a sequence outputs zeros and keeps its state, and the reverse
    direction starts at its last step."""
    gates, hidden, (seq, batch, size) = {"RNN": 1, "GRU": 3, "LSTM": 4}[op], 5, (4, 3, 2)
    outputs = ["y", "y_h"] + (["y_c"] if op == "LSTM" else [])
    node = helper.make_node(op, ["x", "w", "r", "b", "lens"], outputs, hidden_size=hidden, direction="bidirectional")
    weights = [("w", rand(2, gates * hidden, size)), ("r", rand(2, gates * hidden, hidden)),
               ("b", rand(2, 2 * gates * hidden))]
    model = make_model([node], [("x", F32, (seq, batch, size)), ("lens", TensorProto.INT32, (batch,))],
                       [(o, F32, None) for o in outputs], weights, opset=14)
    assert_matches_ort(model, {"x": rand(seq, batch, size), "lens": np.array([4, 1, 3], np.int32)}, tmp_cache)
