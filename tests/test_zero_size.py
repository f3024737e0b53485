"""Zero-size tensors through NetBuilder, the ONNX and Paddle importers, the zero_size pass and the runtime: empty
values become constants (no kernel computes or reads one), and what is computed from them matches numpy and
onnxruntime (a reduction over an empty axis gives its identity, a concat drops its empty parts)."""
from __future__ import annotations

import numpy as np
import pytest

import cinn
from cinn.compiler.passes.pipeline import optimize
from cinn.compiler.passes.zero_size import zero_size
from cinn.core.builder import NetBuilder
from tests.test_passes import evaluate

RNG = np.random.default_rng(0)


def rand(*shape, dtype="float32"):
    return RNG.uniform(-1, 1, shape).astype(dtype)


def _check(program, feeds, outputs, cache, **options):
    """Compile and run: every output has numpy's shape, dtype and values (NaN where numpy has NaN)."""
    got = cinn.compile(program, cache_dir=cache, **options).run(feeds)
    for g, w in zip(got, outputs, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


# -- NetBuilder ---------------------------------------------------------------------------------
def _builder_program():
    """A zero-size input, empty intermediates and outputs, and non-empty results computed from empty values."""
    b = NetBuilder("zero")
    x = b.create_input("float32", (2, 0, 4), "x")
    y = b.create_input("float32", (2, 3, 4), "y")
    reductions = [getattr(b, f"reduce_{op}")(x, [1]) for op in ("sum", "prod", "max", "min", "mean")]
    flags = [b.reduce_any(b.greater_than(x, b.slice(y, [1], [3], [3])), [1]),
             b.reduce_all(b.less_than(x, b.slice(y, [1], [0], [0])), [1], keep_dim=True)]
    joined = b.concat([x, y, x], axis=1)  # empty parts dropped: y itself
    left, empty, right = b.split(y, [1, 0, 2], axis=1)
    inner = b.matmul(b.transpose(x, [0, 2, 1]), b.slice(y, [1], [0], [0]))  # an empty inner axis: zeros
    sliced = b.relu(b.slice(y, [2], [9], [9]))  # past the end: an empty intermediate and output
    rng = b.arange(3.0, 1.0, 1.0, "int32")  # an empty range
    return b.build([*reductions, *flags, joined, left, empty, right, inner, sliced, rng, b.add(x, b.slice(x, [2], [0], [1]))])


def test_builder_program_with_zero_size_values_matches_numpy(tmp_cache):
    program = _builder_program()
    feeds = {"x": np.zeros((2, 0, 4), np.float32), "y": rand(2, 3, 4)}
    want = evaluate(program, feeds)
    identities = [0, 1, -np.inf, np.inf, np.nan, False, True]  # of sum, prod, max, min, mean, any, all
    for got, identity in zip(want, identities, strict=False):
        np.testing.assert_array_equal(got, np.full(got.shape, identity, got.dtype))
    for options in ({}, {"fuse": False}, {"passes": False}):
        _check(program, feeds, want, tmp_cache, **options)


def test_zero_size_pass_leaves_no_empty_value_to_a_kernel(tmp_cache):
    program = _builder_program()
    optimized = optimize(program)
    computed = [v for n in optimized.nodes for v in (*n.inputs, *n.outputs)]
    assert computed and all(v.type.size for v in computed)
    # the kernels left: the split of y into its two non-empty sections, nothing else
    assert [n.op for n in optimized.nodes] == ["split"] and optimized.nodes[0].attrs.num_or_sections == (1, 2)
    exe = cinn.compile(program, cache_dir=tmp_cache)
    assert exe.num_kernels == 1
    assert zero_size(optimized) is optimized  # nothing empty: the program itself


def test_an_empty_value_with_one_computed_at_run_time_and_a_non_empty_result_is_refused():
    b = NetBuilder("gather_empty")
    x = b.create_input("float32", (0, 4), "x")
    index = b.create_input("int64", (2, 4), "index")
    program = b.build([b.gather_elements(x, index, axis=0)])
    with pytest.raises(NotImplementedError, match=r"gather_elements\) reads zero-size values and values computed "
                                                  r"at run time \(\['index'\]\).*not supported"):
        optimize(program)


def test_argmax_over_an_empty_axis_names_the_node():
    b = NetBuilder("argmax_empty")
    program = b.build([b.argmax(b.create_input("float32", (3, 0), "x"), axis=1)])
    with pytest.raises(ValueError, match=r"node 'argmax_0' \(argmax\) of zero-size inputs: .*empty"):
        optimize(program)


def test_symbolic_size_of_zero_is_built_for_its_binding(tmp_cache):
    """A past length of 0 (a first decoding step): the binding is compiled for itself, its zero-size values
    folded, while other sizes run on the kernels built for every size."""
    b = NetBuilder("cache")
    past = b.create_input("float32", (2, "past", 4), "past")
    new = b.create_input("float32", (2, 1, 4), "new")
    keys = b.concat([past, new], axis=1)
    program = b.build_symbolic([keys, b.reduce_sum(keys, [1]), b.reduce_max(past, [1])])
    exe = cinn.compile(program, cache_dir=tmp_cache, shape_hints={"past": [3]})
    assert exe.symbolic_kernels
    for n in (0, 5):
        feeds = {"past": rand(2, n, 4), "new": rand(2, 1, 4)}
        got = exe.run(feeds)
        keys = np.concatenate([feeds["past"], feeds["new"]], axis=1)
        for g, w in zip(got, [keys, keys.sum(1), np.max(feeds["past"], 1, initial=-np.inf)], strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-5)
    assert (exe.built_on_demand, exe.served_symbolic) == (1, 1)


# -- ONNX ---------------------------------------------------------------------------------------
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402

from tests.test_onnx_import import assert_matches_ort, make_model, ort_run  # noqa: E402

F32, I64 = TensorProto.FLOAT, TensorProto.INT64
BIG = np.iinfo(np.int64).max


def _const(name: str, values, dtype=np.int64):
    return helper.make_node("Constant", [], [name], value=onnx.numpy_helper.from_array(np.asarray(values, dtype), name))


def _tail_of_shape(x: str, out: str, start: int) -> list:
    """Shape(x)[start:]: empty where x has rank `start` (torchvision's swin_t)."""
    return [helper.make_node("Shape", [x], [f"{out}_shape"]), _const(f"{out}_start", [start]),
            _const(f"{out}_end", [BIG]), helper.make_node("Slice", [f"{out}_shape", f"{out}_start", f"{out}_end"], [out])]


def test_swin_shape_slice_concat_reshape_matches_onnxruntime(tmp_cache):
    """swin_t's export: Shape of a 2-D tensor sliced [2:] (no element) concatenated into a Reshape's shape."""
    nodes = [*_tail_of_shape("x", "tail", 2), _const("head", [2, 3, -1]),
             helper.make_node("Concat", ["head", "tail"], ["shape"], axis=0),
             helper.make_node("Reshape", ["x", "shape"], ["y"])]
    model = make_model(nodes, [("x", F32, (6, 8))], [("y", F32, None)])
    assert_matches_ort(model, {"x": rand(6, 8)}, tmp_cache)


def test_empty_shape_tensors_in_concat_reshape_and_expand_match_onnxruntime(tmp_cache):
    nodes = [*_tail_of_shape("x", "none", 2), _const("wide", [3, 5]),
             helper.make_node("Concat", ["none", "wide", "none"], ["to"], axis=0),
             helper.make_node("Expand", ["z", "to"], ["expanded"]),
             helper.make_node("Expand", ["x", "none"], ["same"]),  # an empty shape: x as it is
             helper.make_node("Concat", ["none", "none"], ["nothing"], axis=0),
             helper.make_node("Reshape", ["x", "to"], ["reshaped"]),
             helper.make_node("Concat", ["x", "e"], ["joined"], axis=1)]  # an empty input as a part
    model = make_model(nodes, [("x", F32, (3, 5)), ("z", F32, (3, 1)), ("e", F32, (3, 0))],
                       [(n, t, None) for n, t in (("expanded", F32), ("same", F32), ("nothing", I64),
                                                  ("reshaped", F32), ("joined", F32))])
    assert_matches_ort(model, {"x": rand(3, 5), "z": rand(3, 1), "e": rand(3, 0)}, tmp_cache)


def test_zero_dim_intermediate_and_output_match_onnxruntime(tmp_cache):
    """A slice to nothing feeds an output, a reduction, a matmul over the empty axis and a concat."""
    nodes = [_const("s", [2]), _const("e", [2]), _const("ax", [1]),
             helper.make_node("Slice", ["x", "s", "e", "ax"], ["empty"]),
             helper.make_node("Relu", ["empty"], ["relu"]),
             helper.make_node("ReduceSum", ["empty", "ax"], ["total"], keepdims=0),
             helper.make_node("ReduceMax", ["empty"], ["peak"], axes=[1], keepdims=1),
             helper.make_node("Transpose", ["empty"], ["t"], perm=[1, 0]),
             helper.make_node("MatMul", ["empty", "t"], ["gram"]),
             helper.make_node("Concat", ["empty", "x", "relu"], ["joined"], axis=1)]
    model = make_model(nodes, [("x", F32, (3, 4))], [(n, F32, None) for n in ("relu", "total", "peak", "gram", "joined")],
                       opset=17)
    assert_matches_ort(model, {"x": rand(3, 4)}, tmp_cache)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceProd", "ReduceMax", "ReduceMin", "ReduceL1", "ReduceL2",
                                "ReduceLogSumExp", "ReduceSumSquare"])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reductions_over_an_empty_axis_match_onnxruntime(op, keepdims, tmp_cache):
    nodes = [_const("axes", [1]), helper.make_node(op, ["x", "axes"], ["y"], keepdims=keepdims)]
    model = make_model(nodes, [("x", F32, (2, 0, 4))], [("y", F32, None)], opset=18)
    assert_matches_ort(model, {"x": np.zeros((2, 0, 4), np.float32)}, tmp_cache)


def test_onnx_symbolic_past_length_zero_matches_onnxruntime(tmp_cache):
    """A key cache of symbolic length concatenated with the new key: run at past length 0 and 3."""
    nodes = [helper.make_node("Concat", ["past", "new"], ["keys"], axis=1),
             helper.make_node("ReduceMean", ["keys"], ["mean"], axes=[1], keepdims=0),
             helper.make_node("Shape", ["past"], ["length"], start=1, end=2)]
    model = make_model(nodes, [("past", F32, (2, "past_len", 4)), ("new", F32, (2, 1, 4))],
                       [("keys", F32, None), ("mean", F32, None), ("length", I64, None)], opset=17)
    program = cinn.load_onnx(model)
    assert program.symbols == ("past_len",)
    exe = cinn.compile(program, cache_dir=tmp_cache)
    for n in (0, 3):
        feeds = {"past": rand(2, n, 4), "new": rand(2, 1, 4)}
        for g, w in zip(exe.run(feeds), ort_run(model, feeds), strict=True):
            assert g.shape == w.shape and g.dtype == w.dtype
            np.testing.assert_allclose(g, w, rtol=1e-5)


# -- Paddle -------------------------------------------------------------------------------------
def test_paddle_model_at_batch_zero_gives_empty_outputs(tmp_cache):
    """The Paddle `ops` fixture (split, stack, concat, squeeze, strided slice, reshape) at batch 0: empty outputs of
    its shapes at other batches. (Paddle 3.3 itself fails there: its reshape reads [0, 0, 8]'s 0s literally for a
    zero-size input, not as the copied dims they are at every other batch.)"""
    from tests.test_paddle_import import FIXTURES, fixture_data

    feeds, want = fixture_data("ops")
    zero = {k: np.zeros((0, *v.shape[1:]), v.dtype) for k, v in feeds.items()}
    for fmt in ("pir", "legacy"):
        program = cinn.load_paddle(FIXTURES / "ops" / fmt, input_shapes={k: v.shape for k, v in zero.items()})
        got = cinn.compile(program, cache_dir=tmp_cache).run(zero)
        assert [(g.shape, g.dtype) for g in got] == [((0, *w.shape[1:]), w.dtype) for w in want]
