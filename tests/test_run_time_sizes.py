"""Sizes known only at run time: NonZero, NonMaxSuppression and Compress as host ops between the stages of a
StagedProgram, against numpy and onnxruntime."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402

import cinn  # noqa: E402
from cinn.core import host_ops  # noqa: E402
from cinn.core.host_ops import HostOpKind, NmsAttrs, non_max_suppression  # noqa: E402
from cinn.core.symbolic import ShapeBindingError, StagedProgram, SymbolicProgram, require_static  # noqa: E402
from cinn.runtime import dynamic  # noqa: E402
from cinn.runtime.dynamic import StagedExecutable  # noqa: E402
from tests.test_onnx_import import make_model, ort_run  # noqa: E402

F32, I64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
RNG = np.random.default_rng(3)


def node(op: str, inputs: list[str], outputs: list[str], **attrs) -> onnx.NodeProto:
    return helper.make_node(op, inputs, outputs, **attrs)


def const(name: str, array) -> onnx.NodeProto:
    return node("Constant", [], [name], value=onnx.numpy_helper.from_array(np.asarray(array), name))


def nonzero_reference(x: np.ndarray) -> np.ndarray:
    return np.array(np.nonzero(np.atleast_1d(x)), np.int64).reshape(max(x.ndim, 1), -1)


def compile_onnx(model, cache, **options) -> StagedExecutable:
    program = cinn.load_onnx(model)
    assert isinstance(program, StagedProgram), program
    return cinn.compile(program, cache_dir=cache, **options)


# -- NonZero ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(("dtype", "shape"), [("float32", (3, 5)), ("int32", (7,)), ("bool", (2, 3, 4)),
                                              ("uint8", (4, 1, 3)), ("int64", ()), ("float16", (6, 2))])
def test_nonzero_matches_numpy_for_dtypes_and_shapes(dtype, shape, tmp_cache):
    """A NonZero of a computed value (x + 0), so that its size is known only at run time: every data set, the
    all-zero and the all-nonzero ones included, against numpy (a 0-d input as one element, as onnxruntime)."""
    elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    zero = np.zeros((), dtype)
    model = make_model([const("zero", zero), node("Add" if dtype != "bool" else "Or", ["x", "zero"], ["y"]),
                        node("NonZero", ["y"], ["nz"])], [("x", elem, list(shape))], [("nz", I64, None)])
    exe = compile_onnx(model, tmp_cache)
    size = int(np.prod(shape))
    sparse = (RNG.uniform(size=shape) < 0.4) * RNG.integers(1, 5, shape)
    for data in (sparse, np.zeros(shape), np.ones(shape), np.arange(size).reshape(shape) % 3):
        x = np.asarray(data).astype(dtype)
        (got,) = exe.run({"x": x})
        np.testing.assert_array_equal(got, nonzero_reference(x))
        assert got.dtype == np.int64


def test_nonzero_counts_nan_and_not_negative_zero(tmp_cache):
    model = make_model([node("Relu", ["x"], ["r"]), node("Sub", ["x", "r"], ["y"]), node("NonZero", ["y"], ["nz"])],
                       [("x", F32, [5])], [("nz", I64, None)])
    x = np.array([np.nan, -0.0, 0.5, -2.0, 0.0], np.float32)  # y = min(x, 0): NaN, -0, 0, -2, 0
    (got,) = compile_onnx(model, tmp_cache).run({"x": x})
    np.testing.assert_array_equal(got, ort_run(model, {"x": x})[0])
    np.testing.assert_array_equal(got, [[0, 3]])


def _select_model() -> onnx.ModelProto:
    """x > 0.5 -> NonZero feeding GatherND, a Gather of the flattened x and a Reshape, and one output that needs no
    run-time size."""
    nodes = [
        const("half", np.float32(0.5)), const("two", np.float32(2.0)), const("flat", np.array([-1], np.int64)),
        const("rows", np.array([-1, 1], np.int64)), const("five", np.int64(5)), const("axis0", np.int64(0)),
        const("axis1", np.int64(1)),
        node("Greater", ["x", "half"], ["mask"]),
        node("NonZero", ["mask"], ["nz"]),
        node("Transpose", ["nz"], ["nz_t"]),
        node("GatherND", ["x", "nz_t"], ["picked"]),
        node("Mul", ["picked", "two"], ["doubled"]),
        node("Reshape", ["doubled", "rows"], ["column"]),
        node("Gather", ["nz", "axis0"], ["row_index"], axis=0),
        node("Gather", ["nz", "axis1"], ["col_index"], axis=0),
        node("Mul", ["row_index", "five"], ["row_start"]),
        node("Add", ["row_start", "col_index"], ["flat_index"]),
        node("Reshape", ["x", "flat"], ["x_flat"]),
        node("Gather", ["x_flat", "flat_index"], ["gathered"], axis=0),
        node("Exp", ["gathered"], ["exp"]),
        node("Sigmoid", ["x"], ["static"]),
    ]
    return make_model(nodes, [("x", F32, [4, 5])], [("column", F32, None), ("exp", F32, None), ("static", F32, [4, 5])])


@pytest.mark.parametrize("fuse", [True, False])
def test_nonzero_feeds_gather_and_reshape(fuse, tmp_cache):
    model = _select_model()
    exe = compile_onnx(model, tmp_cache, fuse=fuse)
    # the tail's size is one symbol, affine everywhere: symbolic kernels serve every count (but 0: built)
    assert exe.tail.symbolic_kernels, exe.tail.symbolic_reason
    x = RNG.uniform(0, 1, (4, 5)).astype(np.float32)
    for data in (x, np.zeros_like(x), np.ones_like(x), x[::-1].copy()):
        got = exe.run({"x": data})
        for g, w in zip(got, ort_run(model, {"x": data}), strict=True):
            assert g.shape == w.shape and g.dtype == w.dtype
            np.testing.assert_allclose(g, w, rtol=1e-6)
    assert exe.tail.served_symbolic >= 2 and exe.tail.built_on_demand == 1  # the count of 0 folds instead


def test_repeated_nonzero_of_one_mask_runs_once(tmp_cache):
    """Two NonZeros of one value share one host op; the count read back by Shape is a constant of each binding."""
    model = make_model([node("Abs", ["x"], ["a"]), node("NonZero", ["a"], ["n1"]), node("NonZero", ["a"], ["n2"]),
                        node("Concat", ["n1", "n2"], ["both"], axis=0), node("Shape", ["n2"], ["shape"])],
                       [("x", F32, [6])], [("both", I64, None), ("shape", I64, None)])
    program = cinn.load_onnx(model)
    assert isinstance(program, StagedProgram) and len(program.host_ops) == 1
    assert program.tail.symbols == ("n1",)
    exe = cinn.compile(program, cache_dir=tmp_cache)
    assert "constant" in exe.tail.symbolic_reason  # the shape: built for each count
    both, shape = exe.run({"x": np.array([0, 1, 0, 2, 3, 0], np.float32)})
    np.testing.assert_array_equal(both, [[1, 3, 4], [1, 3, 4]])
    np.testing.assert_array_equal(shape, [1, 3])


def test_a_tail_keeps_a_bounded_number_of_builds(tmp_cache, monkeypatch):
    """Every new count of a tail without symbolic kernels is built; past MANY_ON_DEMAND the oldest are dropped (a
    server meets new counts at every request), with one warning."""
    monkeypatch.setattr(dynamic, "MANY_ON_DEMAND", 2)
    model = make_model([node("Abs", ["x"], ["a"]), node("NonZero", ["a"], ["nz"]), node("Shape", ["nz"], ["shape"])],
                       [("x", F32, [4])], [("shape", I64, None)])
    exe = compile_onnx(model, tmp_cache)
    with pytest.warns(UserWarning, match="sizes known only at run time.*the oldest are dropped"):
        for count in (1, 2, 3, 1):
            (shape,) = exe.run({"x": (np.arange(4) < count).astype(np.float32)})
            np.testing.assert_array_equal(shape, [1, count])
    assert exe.tail.built_on_demand == 4 and len(exe.tail.bindings) == 2


def test_nonzero_of_constants_and_empty_inputs_folds(tmp_cache):
    """A NonZero known when converting (of a constant, or of an empty tensor) is a constant: no stage."""
    model = make_model([const("c", np.array([[0, 3], [4, 0]], np.float32)), node("NonZero", ["c"], ["nz"]),
                        node("NonZero", ["x"], ["empty"])], [("x", F32, [2, 0])],
                       [("nz", I64, None), ("empty", I64, None)])
    program = cinn.load_onnx(model)
    assert not isinstance(program, StagedProgram)
    nz, empty = cinn.compile(program, cache_dir=tmp_cache).run({"x": np.zeros((2, 0), np.float32)})
    np.testing.assert_array_equal(nz, [[0, 1], [1, 0]])
    assert empty.shape == (2, 0)


def test_symbolic_input_with_nonzero(tmp_cache):
    """A model with a symbolic batch and a NonZero: each binding's program is staged."""
    model = make_model([node("Neg", ["x"], ["y"]), node("NonZero", ["y"], ["nz"])], [("x", F32, ["batch", 3])],
                       [("nz", I64, None)])
    program = cinn.load_onnx(model)
    assert isinstance(program, SymbolicProgram) and program.symbols == ("batch",)
    exe = cinn.compile(program, cache_dir=tmp_cache)
    assert "stages" in exe.symbolic_reason
    for batch in (1, 4):
        x = RNG.integers(0, 2, (batch, 3)).astype(np.float32)
        (got,) = exe.run({"x": x})
        np.testing.assert_array_equal(got, nonzero_reference(x))


def test_nonzero_inside_an_if_branch_is_cut(tmp_cache):
    """An If whose chosen branch holds a NonZero is inlined node by node, so that the NonZero can be cut."""
    then_branch = helper.make_graph([node("NonZero", ["x"], ["nz_then"])], "then", [],
                                    [helper.make_tensor_value_info("nz_then", I64, None)])
    else_branch = helper.make_graph([const("none", np.zeros((1, 0), np.int64)), node("Identity", ["none"], ["empty"])],
                                    "else", [], [helper.make_tensor_value_info("empty", I64, None)])
    model = make_model([const("yes", np.array(True)), node("If", ["yes"], ["nz"], then_branch=then_branch,
                                                           else_branch=else_branch)],
                       [("x", F32, [5])], [("nz", I64, None)])
    x = np.array([1, 0, 0, 2, 0], np.float32)
    (got,) = compile_onnx(model, tmp_cache).run({"x": x})
    np.testing.assert_array_equal(got, [[0, 3]])


@pytest.mark.parametrize(("data", "index", "batch_dims"), [((5,), (3, 1), 0), ((4, 3), (2, 2, 1), 0),
                                                          ((4, 3, 2), (5, 2), 0), ((2, 4, 3), (2, 3, 1), 1)])
def test_gather_nd_of_run_time_indices(data, index, batch_dims, tmp_cache):
    """GatherND of indices fed at run time (as NonZero's are), negative ones included, against onnxruntime."""
    model = make_model([node("GatherND", ["x", "i"], ["y"], batch_dims=batch_dims)],
                       [("x", F32, list(data)), ("i", I64, list(index))], [("y", F32, None)])
    exe = cinn.compile(cinn.load_onnx(model), cache_dir=tmp_cache)
    x = RNG.uniform(size=data).astype(np.float32)
    lead = np.array(data[batch_dims : batch_dims + index[-1]])
    for _ in range(3):
        i = RNG.integers(-lead, lead, (*index[:-1], index[-1]))
        (got,) = exe.run({"x": x, "i": i})
        np.testing.assert_array_equal(got, ort_run(model, {"x": x, "i": i})[0])


# -- Compress ------------------------------------------------------------------------------------
@pytest.mark.parametrize("axis", [None, 0, 1, -1])
def test_compress_of_a_computed_condition(axis, tmp_cache):
    attrs = {} if axis is None else {"axis": axis}
    length = 12 if axis is None else 4 if axis in (1, -1) else 3
    model = make_model([node("Greater", ["c", "zero"], ["cond"]), node("Compress", ["x", "cond"], ["y"], **attrs)],
                       [("x", F32, [3, 4]), ("c", F32, [length])], [("y", F32, None)],
                       initializers=[("zero", np.float32(0))])
    exe = compile_onnx(model, tmp_cache)
    x = RNG.uniform(size=(3, 4)).astype(np.float32)
    for data in (RNG.uniform(-1, 1, length), np.zeros(length), np.ones(length)):
        c = data.astype(np.float32)
        (got,) = exe.run({"x": x, "c": c})
        np.testing.assert_array_equal(got, np.compress(c > 0, x, axis=axis))


# -- NonMaxSuppression ----------------------------------------------------------------------------------
def _nms_model(center: bool) -> onnx.ModelProto:
    return make_model([node("NonMaxSuppression", ["b", "s", "m", "i", "t"], ["y"], center_point_box=int(center))],
                      [("b", F32, None), ("s", F32, None), ("m", I64, [1]), ("i", F32, [1]), ("t", F32, [1])],
                      [("y", I64, None)])


@pytest.mark.parametrize("matrix_boxes", [host_ops.MATRIX_BOXES, 4])
def test_non_max_suppression_matches_onnxruntime(matrix_boxes, monkeypatch):
    """Random boxes (corner and center formats, degenerate and flipped ones, rounded ones with tied scores and
    identical boxes) against onnxruntime's selections, in order; with clusters of overlaps computed at once and row
    by row."""
    monkeypatch.setattr(host_ops, "MATRIX_BOXES", matrix_boxes)
    for trial in range(16):
        center = bool(trial % 2)
        batches, classes, n = RNG.integers(1, 3), RNG.integers(1, 4), RNG.integers(1, 120)
        corner = RNG.uniform(0, 60, (batches, n, 2))
        boxes = np.concatenate([corner, RNG.uniform(-5, 25, (batches, n, 2)) + (0 if center else corner)], -1)
        scores = RNG.uniform(size=(batches, classes, n))
        if trial % 4 == 0:
            boxes, scores = np.round(boxes / 10) * 10, np.round(scores * 4) / 4
        feeds = {"b": boxes.astype(np.float32), "s": scores.astype(np.float32), "m": np.array([RNG.integers(0, 30)]),
                 "i": np.array([RNG.choice([0.0, 0.4, 1.0])], np.float32), "t": np.array([RNG.uniform(0, 0.7)], np.float32)}
        got = non_max_suppression(list(feeds.values()), NmsAttrs(center))[0]
        np.testing.assert_array_equal(got, ort_run(_nms_model(center), feeds)[0])


def test_non_max_suppression_defaults_and_bad_threshold():
    boxes = np.array([[[0, 0, 1, 1], [0, 0, 1, 1]]], np.float32)
    scores = np.array([[[0.2, 0.9]]], np.float32)
    assert non_max_suppression([boxes, scores], NmsAttrs())[0].shape == (0, 3)  # max_output_boxes_per_class 0
    limit = np.array([5])
    np.testing.assert_array_equal(non_max_suppression([boxes, scores, limit], NmsAttrs())[0], [[0, 0, 1]])
    with pytest.raises(ValueError, match=r"iou_threshold 1\.5"):
        non_max_suppression([boxes, scores, limit, np.array([1.5], np.float32)], NmsAttrs())


def _detector() -> onnx.ModelProto:
    """A detection post-processing tail in miniature: scores > threshold -> NonZero -> GatherND of scores and boxes
    -> TopK of min(3, count) -> NonMaxSuppression -> the kept boxes: three stages."""
    nodes = [
        const("thr", np.float32(0.3)), const("k3", np.array([3], np.int64)), const("zero", np.array([0], np.int64)),
        const("iou", np.array([0.5], np.float32)), const("limit", np.array([100], np.int64)),
        const("box_axes", np.array([0], np.int64)), const("score_axes", np.array([0, 1], np.int64)),
        const("column2", np.array([2], np.int64)), const("row_shape", np.array([-1], np.int64)),
        node("Sigmoid", ["logits"], ["scores"]),
        node("Greater", ["scores", "thr"], ["mask"]),
        node("NonZero", ["mask"], ["nz"]),
        node("Transpose", ["nz"], ["nz_t"]),
        node("GatherND", ["scores", "nz_t"], ["kept_scores"]),
        node("GatherND", ["boxes", "nz_t"], ["kept_boxes"]),
        node("Shape", ["kept_scores"], ["count"]),
        node("Concat", ["k3", "count"], ["ks"], axis=0),
        node("ReduceMin", ["ks"], ["k"], keepdims=1),
        node("TopK", ["kept_scores", "k"], ["top_scores", "top"]),
        node("Gather", ["kept_boxes", "top"], ["top_boxes"], axis=0),
        node("Unsqueeze", ["top_boxes", "box_axes"], ["nms_boxes"]),
        node("Unsqueeze", ["top_scores", "score_axes"], ["nms_scores"]),
        node("NonMaxSuppression", ["nms_boxes", "nms_scores", "limit", "iou"], ["selected"]),
        node("Gather", ["selected", "column2"], ["picked"], axis=1),
        node("Reshape", ["picked", "row_shape"], ["keep"]),
        node("Gather", ["top_boxes", "keep"], ["out_boxes"], axis=0),
        node("Gather", ["top_scores", "keep"], ["out_scores"], axis=0),
    ]
    return make_model(nodes, [("logits", F32, [12]), ("boxes", F32, [12, 4])],
                      [("out_boxes", F32, None), ("out_scores", F32, None)])


def test_detection_tail_runs_in_three_stages(tmp_cache):
    model = _detector()
    program = cinn.load_onnx(model)
    assert isinstance(program, StagedProgram) and [op.kind for op in program.host_ops] == [HostOpKind.NONZERO]
    exe = cinn.compile(program, cache_dir=tmp_cache)
    corner = RNG.uniform(0, 10, (12, 2))
    boxes = np.concatenate([corner, corner + RNG.uniform(1, 6, (12, 2))], -1).astype(np.float32)
    for logits in (RNG.normal(0, 2, 12), np.full(12, -5.0), np.full(12, 5.0), np.linspace(-3, 3, 12)):
        feeds = {"logits": logits.astype(np.float32), "boxes": boxes}
        for g, w in zip(exe.run(feeds), ort_run(model, feeds), strict=True):
            assert g.shape == w.shape
            np.testing.assert_allclose(g, w, rtol=1e-6)
    # each count's tail is staged again, after its NonMaxSuppression (but for a count of 0, where it folds)
    assert any(isinstance(exe.tail.executable(b), StagedExecutable) for b in exe.tail.bindings)


# -- what is refused, and how -------------------------------------------------------------------------
def test_nonzero_in_a_loop_body_is_refused_at_import():
    body = helper.make_graph([node("NonZero", ["x"], ["nz"]), node("Identity", ["c"], ["c_out"])], "body",
                             [helper.make_tensor_value_info("i", I64, []), helper.make_tensor_value_info("c", BOOL, [])],
                             [helper.make_tensor_value_info("c_out", BOOL, []),
                              helper.make_tensor_value_info("nz", I64, None)])
    model = make_model([const("trips", np.int64(2)), node("Loop", ["trips", ""], ["stacked"], body=body)],
                       [("x", F32, [3])], [("stacked", I64, None)])
    with pytest.raises(NotImplementedError, match=r"NonZero's output size is known only at run time: .* not inside a "
                                                  r"Loop or Scan body"):
        cinn.load_onnx(model)


def test_a_shape_read_from_run_time_values_is_refused_naming_the_node(tmp_cache):
    """A ConstantOfShape whose shape is computed from NonZero's values (not from its size) cannot be converted, even
    at a binding of the size: the first run says which node needs what."""
    model = make_model([node("Abs", ["x"], ["a"]), node("NonZero", ["a"], ["nz"]),
                        node("ReduceMax", ["nz"], ["top"], axes=[1], keepdims=0), node("ConstantOfShape", ["top"], ["y"])],
                       [("x", F32, [2])], [("y", F32, None)])
    exe = compile_onnx(model, tmp_cache)
    with pytest.raises(ValueError, match=r"ConstantOfShape\): shape \(input 0\) must be a constant"):
        exe.run({"x": np.array([0, 3], np.float32)})


def test_staged_programs_name_their_host_ops():
    program = cinn.load_onnx(_detector())
    assert str(program).startswith("staged program test: head of")
    with pytest.raises(ShapeBindingError, match="known only at run time"):
        require_static(program, "")
