"""Inputs that used to crash the process or give wrong numbers silently: each gets numpy's answer or a clear error.

Cases that could kill the interpreter (SIGFPE, SIGBUS) run in a subprocess, so a crash fails the test instead of
ending the test run.
"""
from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

import cinn
from autotune.cost_model import CostModel
from cinn.core.ir import ShapeTooLarge
from frontend.onnx import OnnxImportError
from tests.test_onnx_import import make_model
from tests.timeouts import scaled

F32 = T.FLOAT
INT32_MIN = np.iinfo(np.int32).min


def _in_subprocess(code: str, tmp_path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=scaled(300),
                          cwd=tmp_path)


# -- 1. integer division by zero ----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_integer_division_by_zero_and_int_min_by_minus_one_do_not_kill_the_process(tmp_path, dtype):
    code = f"""
        import numpy as np, cinn
        b = cinn.NetBuilder("div")
        x, y = b.create_input("{dtype}", (6,), "x"), b.create_input("{dtype}", (6,), "y")
        prog = b.build([b.floor_divide(x, y), b.mod(x, y)])
        lo = np.iinfo("{dtype}").min
        xs = np.array([7, -7, 0, lo, lo, 5], "{dtype}")
        ys = np.array([0, 0, 0, -1, 1, -1], "{dtype}")
        for fuse in (True, False):
            q, r = cinn.compile(prog, fuse=fuse, cache_dir="cache").run({{"x": xs, "y": ys}})
            with np.errstate(all="ignore"):
                np.testing.assert_array_equal(q, np.floor_divide(xs, ys))
                np.testing.assert_array_equal(r, np.mod(xs, ys))
        print("ok")
    """
    proc = _in_subprocess(code, tmp_path)
    assert proc.returncode == 0 and "ok" in proc.stdout, f"status {proc.returncode}: {proc.stderr[-2000:]}"


@pytest.mark.parametrize("dtype", ["int8", "int32", "int64"])
@pytest.mark.parametrize("fuse", [True, False])
def test_abs_of_int_min_wraps_as_numpy_even_under_relu(dtype, fuse, tmp_cache):
    # found by the fuzz test: TVM's simplifier took abs(x) to be non-negative and folded relu(abs(x)) to abs(x),
    # so relu(abs(INT_MIN)) gave INT_MIN where numpy gives 0
    low = np.iinfo(dtype).min
    b = cinn.NetBuilder("abs_min")
    x = b.create_input(dtype, (4,), "x")
    xs = np.array([low, -5, 0, 7], dtype)
    got = cinn.compile(b.build([b.relu(b.abs(x)), b.abs(x)]), fuse=fuse, cache_dir=tmp_cache).run({"x": xs})
    np.testing.assert_array_equal(got[0], np.maximum(np.abs(xs), 0))
    np.testing.assert_array_equal(got[1], np.abs(xs))


def test_onnx_integer_div_and_mod_by_zero_give_zero(tmp_cache):
    model = make_model([helper.make_node("Div", ["x", "y"], ["q"]), helper.make_node("Mod", ["x", "y"], ["r"])],
                       [("x", T.INT32, [3]), ("y", T.INT32, [3])], [("q", T.INT32, [3]), ("r", T.INT32, [3])])
    q, r = cinn.compile(cinn.load_onnx(model), cache_dir=tmp_cache).run(
        {"x": np.array([7, -7, 3], "int32"), "y": np.array([0, 2, 0], "int32")})
    np.testing.assert_array_equal(q, [0, -3, 0])  # ONNX truncates: -7 / 2 = -3
    np.testing.assert_array_equal(r, [0, 1, 0])


# -- 3. NaN through max, min, relu, clip ----------------------------------------------------------------
@pytest.mark.parametrize("fuse", [True, False])
def test_nan_propagates_through_max_min_relu_and_clip(fuse, tmp_cache):
    b = cinn.NetBuilder("nan")
    x, y = b.create_input("float32", (6,), "x"), b.create_input("float32", (6,), "y")
    outs = [b.max(x, y), b.min(x, y), b.relu(x), b.clip(x, min=-1.0, max=1.0), b.relu(b.exp(x))]
    xs = np.array([np.nan, 1, -np.inf, np.nan, 0, -2], "float32")
    ys = np.array([0, np.nan, np.nan, np.nan, -0.5, np.inf], "float32")
    got = cinn.compile(b.build(outs), fuse=fuse, cache_dir=tmp_cache).run({"x": xs, "y": ys})
    want = [np.maximum(xs, ys), np.minimum(xs, ys), np.maximum(xs, 0), np.clip(xs, -1, 1), np.maximum(np.exp(xs), 0)]
    for g, w in zip(got, want, strict=True):  # NaN in the same places; exp's fast form is within an ulp
        np.testing.assert_allclose(g, w, rtol=1e-6, equal_nan=True)


@pytest.mark.parametrize("fuse", [True, False])
def test_comparing_a_value_with_itself_keeps_nan(fuse, tmp_cache):
    # found by the fuzz test: TVM's simplifier folded x == x to true (and x <= x, x >= x; x != x to false)
    b = cinn.NetBuilder("self_compare")
    x = b.create_input("float32", (2, 3), "x")
    outs = [b.equal(x, x), b.not_equal(x, x), b.less_equal(x, x), b.greater_equal(x, x), b.less_than(x, x)]
    xs = np.array([[0, 1, np.nan], [np.inf, -np.inf, np.nan]], "float32")
    got = cinn.compile(b.build(outs), fuse=fuse, cache_dir=tmp_cache).run({"x": xs})
    for g, w in zip(got, [xs == xs, xs != xs, xs <= xs, xs >= xs, xs < xs], strict=True):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("fuse", [True, False])
def test_folded_float_identities_keep_nan_inf_and_signed_zero(fuse, tmp_cache):
    # found by the fuzz test: TVM's simplifier folded x - x to 0 and x * 0 to 0 (inf and NaN give NaN), x + 0 to x
    # (-0.0 + 0.0 is +0.0); floor_divide lost numpy's fmod-based answers for infinities
    b = cinn.NetBuilder("identities")
    x, y = b.create_input("float32", (7,), "x"), b.create_input("float32", (7,), "y")
    zero = b.create_constant(np.float32(0))
    outs = [b.subtract(x, x), b.multiply(x, zero), b.add(x, zero), b.floor_divide(x, y)]
    xs = np.array([0, 1, np.nan, np.inf, -np.inf, -0.0, -3.5], "float32")
    ys = np.array([2, np.inf, 1, 2.5, 0, 1, np.inf], "float32")
    got = cinn.compile(b.build(outs), fuse=fuse, cache_dir=tmp_cache).run({"x": xs, "y": ys})
    with np.errstate(all="ignore"):
        want = [xs - xs, xs * np.float32(0), xs + np.float32(0), np.floor_divide(xs, ys)]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
        np.testing.assert_array_equal(np.signbit(g[~np.isnan(g)]), np.signbit(w[~np.isnan(w)]))


def _nan_rows() -> np.ndarray:
    """Rows for max/min reductions: NaN beside -inf, first, last, in a long row (the vectorized rfactor path), none."""
    rows = np.tile(np.linspace(-3, 3, 300, dtype="float32"), (6, 1))
    rows[0, :4] = [0, 1, np.nan, -np.inf]
    rows[1, :4] = [-np.inf, np.nan, 0, 1]
    rows[2, 0] = rows[3, -1] = rows[4, 157] = np.nan
    return rows


def _nan_reductions(target: str, fuse: bool, cache) -> None:
    b = cinn.NetBuilder("nan_reduce")
    x = b.create_input("float32", (6, 300), "x")
    outs = [b.reduce_max(x, dim=[1]), b.reduce_min(x, dim=[1]), b.softmax(x, axes=[-1])]
    xs = _nan_rows()
    got = cinn.compile(b.build(outs), target=target, fuse=fuse, cache_dir=cache).run({"x": xs})
    e = np.exp(xs - xs.max(-1, keepdims=True))
    want = [xs.max(1), xs.min(1), e / e.sum(-1, keepdims=True)]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-7, equal_nan=True)


@pytest.mark.parametrize("fuse", [True, False])
def test_nan_propagates_through_max_and_min_reductions(fuse, tmp_cache):
    _nan_reductions("llvm", fuse, tmp_cache)


@pytest.mark.gpu
@pytest.mark.parametrize("fuse", [True, False])
def test_nan_propagates_on_the_gpu(fuse, tmp_cache):
    _nan_reductions("cuda", fuse, tmp_cache)
    b = cinn.NetBuilder("nan")
    x, y = b.create_input("float32", (6,), "x"), b.create_input("float32", (6,), "y")
    xs = np.array([np.nan, 1, -np.inf, np.nan, 0, -2], "float32")
    ys = np.array([0, np.nan, np.nan, np.nan, -0.5, np.inf], "float32")
    got = cinn.compile(b.build([b.max(x, y), b.min(x, y), b.relu(x), b.clip(x, min=-1.0, max=1.0)]), target="cuda",
                       fuse=fuse, cache_dir=tmp_cache).run({"x": xs, "y": ys})
    for g, w in zip(got, [np.maximum(xs, ys), np.minimum(xs, ys), np.maximum(xs, 0), np.clip(xs, -1, 1)], strict=True):
        np.testing.assert_array_equal(g, w)


def test_cuda_kernels_keep_the_nan_tests(tmp_cache):
    """Without a GPU: the CUDA code of max and the max/min reductions tests its input for NaN (x != x; CUDA's fmaxf
    and fminf, like a plain comparison, would return the number); relu and clip against a constant bound pick the
    bound only where a comparison holds, which it never does for NaN, so the input is kept."""
    b = cinn.NetBuilder("nan_cuda")
    x, y = b.create_input("float32", (6, 300), "x"), b.create_input("float32", (6, 300), "y")
    outs = [b.max(x, y), b.reduce_max(x, dim=[1]), b.reduce_min(x, dim=[1]), b.relu(x), b.clip(x, min=-1.0, max=1.0)]
    exe = cinn.compile(b.build(outs), target="cuda", fuse=False, cache_dir=tmp_cache)
    sources = exe.kernel_sources()
    assert len(sources) == 5
    for src in sources[:3]:
        assert re.search(r"(\w+_ptr\[[^\]]*\]) != \1", src), src
    for src in sources[3:]:
        assert "fmaxf" not in src and "fminf" not in src, src
        assert re.search(r"if \(x_ptr\[[^\]]*\] [<>] [^)]*\) \{\n\s*condval\w* = [^x]", src), src


# -- 4. values that wrapped ---------------------------------------------------------------------------------
def test_out_of_range_integer_feed_is_refused(tmp_cache):
    b = cinn.NetBuilder("narrow")
    x = b.create_input("int32", (2,), "x")
    exe = cinn.compile(b.build([b.add(x, x)]), cache_dir=tmp_cache)
    with pytest.raises(ValueError, match=r"input 'x' holds 1099511627776, which does not fit its dtype int32"):
        exe.run({"x": np.array([1, 2**40], "int64")})
    np.testing.assert_array_equal(exe.run({"x": np.array([1, -3], "int64")})[0], [2, -6])  # in range: converted


def test_integer_feeds_of_the_other_signedness_are_converted_when_they_fit(tmp_cache):
    b = cinn.NetBuilder("unsigned")
    x = b.create_input("uint8", (3,), "x")
    exe = cinn.compile(b.build([b.add(x, x)]), cache_dir=tmp_cache)
    np.testing.assert_array_equal(exe.run({"x": [1, 2, 200]})[0], np.array([2, 4, 144], np.uint8))  # a list: int64
    with pytest.raises(ValueError, match=r"input 'x' holds -1, which does not fit its dtype uint8 \[0, 255\]"):
        exe.run({"x": np.array([1, -1, 3], "int32")})
    with pytest.raises(TypeError, match="input 'x' has dtype float32, expected uint8"):
        exe.run({"x": np.ones(3, "float32")})


def test_constant_gather_index_out_of_range_is_a_compile_error_naming_the_node(tmp_cache):
    b = cinn.NetBuilder("g")
    x = b.create_input("float32", (4, 3), "x")
    y = b.gather(x, b.create_constant(np.array([0, 9], "int64"), "idx"), axis=0)
    with pytest.raises(ValueError, match=r"node 'gather_0' \(gather\) index 9 is out of range for axis 0 of size 4"):
        cinn.compile(b.build([y]), cache_dir=tmp_cache)


def test_run_time_gather_indices_are_clamped_not_wrapped(tmp_cache):
    b = cinn.NetBuilder("g")
    x, idx = b.create_input("float32", (4,), "x"), b.create_input("int64", (5,), "idx")
    exe = cinn.compile(b.build([b.gather(x, idx, axis=0), b.gather_elements(x, idx, axis=0)]), cache_dir=tmp_cache)
    xs = np.array([10, 11, 12, 13], "float32")
    for out in exe.run({"x": xs, "idx": np.array([9, 10**9, -1, -4, -9], "int64")}):
        np.testing.assert_array_equal(out, [13, 13, 13, 10, 10])  # -1 and -4 count from the end, as numpy


# -- 5. invalid ONNX models -----------------------------------------------------------------------------
def _onnx(nodes, outputs=(("y", F32, [2, 3]),), inputs=(("x", F32, [2, 3]),), inits=()):
    return make_model(nodes, list(inputs), list(outputs), list(inits))


INVALID = {
    "two nodes producing one name": (_onnx([helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["x"], ["y"])]),
                                     "'y' has been used as output names multiple times"),
    "a node overwriting a graph input": (_onnx([helper.make_node("Relu", ["x"], ["x"]), helper.make_node("Neg", ["x"], ["y"])]),
                                         "'x' has been used as output names multiple times"),
    "Flatten axis 7 on rank 2": (_onnx([helper.make_node("Flatten", ["x"], ["y"], axis=7, name="flat")]),
                                 r"node name: flat.*Invalid value\(7\) for attribute 'axis'"),
    "Concat without axis": (_onnx([helper.make_node("Concat", ["x", "x"], ["y"], name="cat")]),
                            r"Required attribute 'axis' is missing.*Name: cat OpType: Concat"),
    "Relu with two inputs": (_onnx([helper.make_node("Relu", ["x", "x"], ["y"], name="r")]),
                             r"input size 2 not in range.*Name: r OpType: Relu"),
    "a declared int64 output that is float32": (_onnx([helper.make_node("Relu", ["x"], ["y"], name="r")],
                                                      outputs=[("y", T.INT64, [2, 3])]),
                                                r"node name: r.*Inferred elem type differs"),
    "Conv kernel_shape disagreeing with its weights": (
        _onnx([helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[5, 5], name="c")], outputs=[("y", F32, [1, 1, 4, 4])],
              inputs=[("x", F32, [1, 1, 8, 8])], inits=[("w", np.ones((1, 1, 3, 3), np.float32))]),
        r"node name: c|'c'.*kernel_shape \(5, 5\) disagrees"),
}


@pytest.mark.parametrize("case", list(INVALID))
def test_invalid_onnx_models_are_refused(case):
    model, message = INVALID[case]
    with pytest.raises((OnnxImportError, ValueError), match=message):
        cinn.load_onnx(model)


# -- 6. external data -----------------------------------------------------------------------------------
def _external_model(tmp_path):
    w = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "w")
    model = make_model([helper.make_node("Add", ["x", "w"], ["y"])], [("x", F32, [2, 3])], [("y", F32, [2, 3])])
    model.graph.initializer.append(w)
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    onnx.save(model, model_dir / "m.onnx", save_as_external_data=True, all_tensors_to_one_file=True, location="w.bin",
              size_threshold=0)
    return model_dir / "m.onnx"


def test_external_data_is_read_only_beside_the_model(tmp_path, monkeypatch, tmp_cache):
    path = _external_model(tmp_path)
    decoy = tmp_path / "cwd"
    decoy.mkdir()
    (decoy / "w.bin").write_bytes(np.full(6, 1000, np.float32).tobytes())
    monkeypatch.chdir(decoy)
    bare = onnx.load(path, load_external_data=False)
    with pytest.raises(OnnxImportError, match=r"tensor 'w' keeps its data in the external file 'w.bin'"):
        cinn.load_onnx(bare)
    x = np.zeros((2, 3), np.float32)
    for program in (cinn.load_onnx(path), cinn.load_onnx(bare, base_dir=path.parent)):
        np.testing.assert_array_equal(cinn.compile(program, cache_dir=tmp_cache).run({"x": x})[0],
                                      np.arange(6, dtype=np.float32).reshape(2, 3))


# -- 7. huge shapes -------------------------------------------------------------------------------------
def test_huge_shapes_are_refused_where_they_are_made():
    b = cinn.NetBuilder("huge")
    with pytest.raises(ShapeTooLarge, match=r"input 'x': shape \(1000000, 1000000\) has 1e\+12 elements"):
        b.create_input("float32", (10**6, 10**6), "x")
    x = b.create_input("float32", (1, 3, 8, 8), "x")
    w = b.create_constant(np.ones((4, 3, 3, 3), np.float32), "w")
    with pytest.raises(ShapeTooLarge, match=r"conv2d: output shape \(1, 4, 2000006, 2000006\)"):
        b.conv2d(x, w, paddings=[10**6] * 2)


def _const_node(op: str, inits: list, attrs: dict | None = None, inputs: list | None = None) -> onnx.ModelProto:
    """A model of one node `n` over initializers (and graph inputs), its output y of an inferred shape."""
    names = [name for name, _ in inits]
    node = helper.make_node(op, [i[0] for i in inputs or []] + names, ["y"], name="n", **(attrs or {}))
    return make_model([node], list(inputs or []), [("y", F32 if op != "Range" else T.INT64, None)], inits)


HUGE_CONSTANTS = {  # sizes that numpy tried to allocate before any check (MemoryError), or whose element count
    # overflowed int64 in the check itself (accepted)
    "ConstantOfShape [2**31, 4]": _const_node("ConstantOfShape", [("s", np.array([2**31, 4], np.int64))]),
    "ConstantOfShape [2**32, 2**32]": _const_node("ConstantOfShape", [("s", np.array([2**32, 2**32], np.int64))]),
    "OneHot depth 2**33": _const_node("OneHot", [("d", np.array(2**33, np.int64)), ("v", np.array([0, 1], np.float32))],
                                      inputs=[("i", T.INT64, [2])]),
    "Range 0 to 2**40": _const_node("Range", [("a", np.array(0, np.int64)), ("b", np.array(2**40, np.int64)),
                                              ("d", np.array(1, np.int64))]),
    "Tile by [2**32, 2**32]": _const_node("Tile", [("r", np.array([2**32, 2**32], np.int64))], inputs=[("x", F32, [2, 3])]),
    "Expand to [2**32, 2**32]": _const_node("Expand", [("s", np.array([2**32, 2**32], np.int64))], inputs=[("x", F32, [1, 1])]),
    "Resize to sizes [2**40, 2**40]": make_model(
        [helper.make_node("Resize", ["x", "", "", "s"], ["y"], name="n")], [("x", F32, [1, 1, 2, 2])], [("y", F32, None)],
        [("s", np.array([1, 1, 2**40, 2**40], np.int64))]),
}


@pytest.mark.parametrize("case", list(HUGE_CONSTANTS))
def test_huge_shapes_from_constants_are_refused_naming_the_node(case):
    with pytest.raises(ShapeTooLarge, match=r"ONNX node 'n' \(\w+\): .*a tensor may have at most 2147483647"):
        cinn.load_onnx(HUGE_CONSTANTS[case])


def _long_attention(causal: int, op: str = "Attention") -> onnx.ModelProto:
    """Attention of 60000 queries over as many keys (one head of 1 dim), causal or not."""
    inputs = [(n, F32, [1, 1, 60000, 1]) for n in ("q", "k", "v")]
    if op == "Attention":
        node = helper.make_node("Attention", ["q", "k", "v"], ["y"], name="n", is_causal=causal)
        return make_model([node], inputs, [("y", F32, None)], opset=23)
    node = helper.make_node("Attention", ["x", "w", "b"], ["y"], name="n", domain="com.microsoft", num_heads=1,
                            unidirectional=causal)
    return make_model([node], [("x", F32, [1, 60000, 2])], [("y", F32, None)],
                      [("w", np.ones((2, 6), np.float32)), ("b", np.zeros(6, np.float32))])


def test_attention_position_masks_are_sized_before_they_are_made():
    # the query-key position offsets ([queries, keys] int64: 29 GiB here) were computed for every Attention node,
    # causal or not, before any size check
    program = cinn.load_onnx(_long_attention(causal=0))
    assert sum(a.nbytes for a in program.constants.values()) < 1024
    for model in (_long_attention(causal=1), _long_attention(causal=1, op="com.microsoft")):
        with pytest.raises(ShapeTooLarge, match=r"ONNX node 'n' \(Attention\): .*\(60000, 60000\) has 3\.6e\+09 elements"):
            cinn.load_onnx(model)


def test_a_constant_too_large_to_fold_is_computed_at_run_time():
    # a 128 MiB ConstantOfShape was allocated, filled and stored in the program at import
    program = cinn.load_onnx(_const_node("ConstantOfShape", [("s", np.array([4096, 8192], np.int64))]))
    assert sum(a.nbytes for a in program.constants.values()) < 1024
    assert program.outputs[0].shape == (4096, 8192)
    value = numpy_helper.from_array(np.array([0.1], np.float64))
    program = cinn.load_onnx(make_model([helper.make_node("ConstantOfShape", ["s"], ["y"], value=value)], [],
                                        [("y", T.DOUBLE, [2, 3])], [("s", np.array([2, 3], np.int64))]))
    assert program.outputs[0].dtype == "float64" and program.constants[program.outputs[0].name].dtype == np.float64


def test_a_huge_paddle_fill_constant_is_refused_naming_the_op(tmp_path):
    from tests.test_paddle_import import legacy_program

    path = tmp_path / "fill.pdmodel"
    legacy_program(path, {"x": (2,)}, [("fill_constant", {}, {"Out": ["y"]}, {"shape": [2**16, 2**16], "dtype": 5,
                                                                              "value": 1.0})], ["y"])
    with pytest.raises(ShapeTooLarge, match=r"Paddle op fill_constant 'y': .*a tensor may have at most 2147483647"):
        cinn.load_paddle(path)


def _resize(scales, op: str = "Resize", opset: int = 17, **attrs) -> onnx.ModelProto:
    """A Resize (or Upsample) node 'n' of a (1, 1, 4, 4) input by constant scales (Upsample-7: its attribute)."""
    scales = np.array(scales, np.float32)
    inputs = {"Resize": ["x", "", "s"], "Upsample": ["x", "s"]}[op]
    if opset < 9:
        inputs, attrs = ["x"], {**attrs, "scales": scales.tolist()}
    node = helper.make_node(op, inputs, ["y"], name="n", **attrs)
    return make_model([node], [("x", F32, [1, 1, 4, 4])], [("y", F32, None)], [("s", scales)] if opset >= 9 else [],
                      opset=opset)


NON_FINITE = {
    "Resize scales inf": (_resize([1, 1, np.inf, np.inf]), r"scales \(1\.0, 1\.0, inf, inf\) must be finite and positive"),
    "Resize scales nan": (_resize([1, 1, np.nan, 2]), r"scales \(1\.0, 1\.0, nan, 2\.0\) must be finite and positive"),
    "Resize scales 1e30": (_resize([1, 1, 1e30, 1e30]), r"resize: output shape \(1, 1, 4\d+, 4\d+\) has 1\.6e\+61 elements"),
    "Resize cubic_coeff_a nan": (_resize([1, 1, 2, 2], mode="cubic", cubic_coeff_a=float("nan")),
                                 r"cubic_coeff_a \(nan,\) must be finite"),
    "Upsample-9 scales inf": (_resize([1, 1, np.inf, 2], "Upsample", 9), r"scales \(1\.0, 1\.0, inf, 2\.0\) must be finite"),
    "Upsample-7 scales nan": (_resize([1, 1, np.nan, 2], "Upsample", 7), r"scales \(1\.0, 1\.0, nan, 2\.0\) must be finite"),
}


@pytest.mark.parametrize("case", list(NON_FINITE))
def test_non_finite_or_absurd_attributes_are_refused_naming_the_node(case):
    model, message = NON_FINITE[case]
    with pytest.raises(ValueError, match=r"ONNX node 'n' \((Resize|Upsample)\): " + message):
        cinn.load_onnx(model)


def test_non_finite_op_attributes_are_refused_naming_the_op():
    b = cinn.NetBuilder("p")
    x = b.create_input("float32", (1, 1, 4, 4), "x")
    with pytest.raises(ValueError, match=r"resize: scales \(inf, 2\.0\) must be 2 positive finite factors"):
        b.resize(x, out_shape=[8, 8], scales=[float("inf"), 2.0])
    for end in (float("inf"), float("nan")):
        with pytest.raises(ValueError, match=r"arange: start, end and step must be finite"):
            b.arange(start=0, end=end)


@pytest.mark.parametrize("text,dtype,message", [("inf", 3, r"value 'inf' is not a finite number, as a fill of int64"),
                                                ("nan", 2, r"value 'nan' is not a finite number, as a fill of int32"),
                                                ("1e30", 3, r"value '1e30' does not fit int64")])
def test_a_paddle_integer_fill_value_that_is_not_an_integer_of_its_dtype_is_refused(text, dtype, message, tmp_path):
    # int(float("inf")) raised a bare OverflowError
    from tests.test_paddle_import import legacy_program

    path = tmp_path / "fill.pdmodel"
    legacy_program(path, {"x": (2,)}, [("fill_constant", {}, {"Out": ["y"]}, {"shape": [2], "dtype": dtype,
                                                                              "str_value": text})], ["y"])
    with pytest.raises(ValueError, match=r"Paddle op fill_constant 'y': " + message):
        cinn.load_paddle(path)


def test_a_paddle_int64_fill_value_is_read_exactly(tmp_path):
    from tests.test_paddle_import import legacy_program

    path = tmp_path / "fill.pdmodel"
    legacy_program(path, {"x": (2,)}, [("fill_constant", {}, {"Out": ["y"]}, {"shape": [2], "dtype": 3,
                                                                              "str_value": str(2**53 + 1)})], ["y"])
    program = cinn.load_paddle(path)
    np.testing.assert_array_equal(program.constants[program.outputs[0].name], [2**53 + 1] * 2)


# -- 8. tuning ------------------------------------------------------------------------------------------
def test_cost_model_is_written_atomically(tmp_path, monkeypatch):
    path = tmp_path / "xgb.npz"
    CostModel(seed=0).save(path)
    good = path.read_bytes()

    def crash(f, **arrays):
        f.write(b"half a zip")
        raise KeyboardInterrupt

    monkeypatch.setattr(np, "savez", crash)
    with pytest.raises(KeyboardInterrupt):
        CostModel(seed=1).save(path)
    assert path.read_bytes() == good and CostModel.load(path) is not None


def test_a_corrupt_cost_model_file_is_named(tmp_path):
    path = tmp_path / "random.npz"
    path.write_bytes(np.random.default_rng(0).bytes(256))
    with pytest.raises(ValueError, match=r"not a cinn cost model file: .*random\.npz"):
        CostModel.load(path)


def test_cinn_tune_checks_the_log_directory_before_measuring(tmp_path, capsys):
    from cinn.facade.command import ExitStatus
    from cinn.facade.tune_cli import main

    assert main(["mlp", "--trials", "1", "--log", str(tmp_path / "missing" / "t.jsonl")]) == ExitStatus.USAGE
    assert "no such directory" in capsys.readouterr().err


# -- 9. messages ----------------------------------------------------------------------------------------
def test_a_wrong_attribute_type_is_named():
    b = cinn.NetBuilder("p")
    x = b.create_input("float32", (2, 3), "x")
    with pytest.raises(TypeError, match=r"SoftmaxAttrs: attribute 'axes' must be tuple\[int, \.\.\.\], got 'one'"):
        b.softmax(x, axes="one")
    with pytest.raises(TypeError, match=r"attribute 'scale' must be float, got 'x'"):
        b.scale(x, scale="x")


def test_average_pooling_of_integers_is_refused():
    b = cinn.NetBuilder("p")
    x = b.create_input("uint8", (1, 1, 4, 4), "x")
    with pytest.raises(TypeError, match=r"pool2d: average pooling needs a float input, got uint8\(1, 1, 4, 4\)"):
        b.pool2d(x, "avg", [2, 2])


def test_a_bitcast_between_widths_is_refused():
    b = cinn.NetBuilder("p")
    x = b.create_input("float32", (2,), "x")
    with pytest.raises(TypeError, match=r"bitcast: float32\(2,\) and int64 differ in width"):
        b.bitcast(x, dtype="int64")
    with pytest.raises(TypeError, match=r"bitcast: uint8\(2,\) to bool: compare with 0 or cast instead"):
        b.bitcast(b.create_input("uint8", (2,), "y"), dtype="bool")


def test_an_initializer_shorter_than_its_dims_is_named():
    w = numpy_helper.from_array(np.ones(6, np.float32), "w")
    w.dims[:] = [4, 3]
    model = make_model([helper.make_node("Add", ["x", "w"], ["y"])], [("x", F32, [4, 3])], [("y", F32, [4, 3])])
    model.graph.initializer.append(w)
    with pytest.raises(OnnxImportError, match=r"tensor name: w\) raw_data size \(24 bytes\) is too small"):
        cinn.load_onnx(model)


def test_feeds_given_as_a_list_get_a_clear_error(tmp_cache):
    b = cinn.NetBuilder("p")
    x = b.create_input("float32", (2,), "x")
    exe = cinn.compile(b.build([b.relu(x)]), cache_dir=tmp_cache)
    with pytest.raises(TypeError, match=r"feeds must be a mapping of input name -> array, got a list; inputs are \['x'\]"):
        exe.run([np.zeros(2, np.float32)])


BAD_FEEDS = {  # numpy's own message (no input named), "has shape ()", "has dtype object"
    "ragged": ([[1.0, 2.0], [3.0]], ValueError, r"run: input 'x' cannot be read as one array \(setting an array "
                                                  r"element with a sequence.*\); expected float32 of shape \(2, 2\)"),
    "None": (None, TypeError, r"run: input 'x' is None; expected float32 of shape \(2, 2\)"),
    "huge int": (2**70, TypeError, r"run: input 'x' holds 1180591620717411303424, an integer that does not fit 64 bits"),
    "None inside": ([[1.0, None], [2.0, 3.0]], TypeError, r"run: input 'x' holds None, which is not a number"),
}


@pytest.mark.parametrize("case", list(BAD_FEEDS))
def test_feeds_numpy_cannot_read_as_numbers_are_named(case, tmp_cache):
    feed, error, message = BAD_FEEDS[case]
    b = cinn.NetBuilder("p")
    exe = cinn.compile(b.build([b.relu(b.create_input("float32", (2, 2), "x"))]), cache_dir=tmp_cache)
    with pytest.raises(error, match=message):
        exe.run({"x": feed})
    b = cinn.NetBuilder("p")
    dynamic = cinn.compile(b.build_symbolic([b.relu(b.create_input("float32", ("n", 2), "x"))]), cache_dir=tmp_cache,
                           shape_hints={"n": [2]}, symbolic_kernels=False)
    with pytest.raises(error, match=message.replace(r"\(2, 2\)", r"\(n, 2\)")):
        dynamic.run({"x": feed})


@pytest.mark.parametrize("shape", [(2.5, 3), "34"])
def test_non_integer_input_shapes_are_refused(shape):
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", F32, ["n", 3])], [("y", F32, ["n", 3])])
    with pytest.raises(TypeError, match=r"input_shapes\['x'\]"):
        cinn.load_onnx(model, input_shapes={"x": shape})
    with pytest.raises(TypeError, match=r"input 'x'"):
        cinn.NetBuilder("p").create_input("float32", shape, "x")


def test_a_read_only_cache_directory_builds_without_the_cache():
    b = cinn.NetBuilder("p")
    x = b.create_input("float32", (2,), "x")
    with pytest.warns(UserWarning, match=r"kernel cache /sys/kernel cannot be written; building without it"):
        exe = cinn.compile(b.build([b.relu(x)]), cache_dir="/sys/kernel")  # not writable even by root
    np.testing.assert_array_equal(exe.run({"x": np.array([-1, 2], np.float32)})[0], [0, 2])


def test_a_deeply_nested_json_model_is_refused(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(ValueError, match=r"deep\.json: not a valid Paddle PIR \.json file"):
        cinn.load_paddle(path)


def test_compiling_something_else_than_a_program_names_what_it_got():
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", T.FLOAT, [2])], [("y", T.FLOAT, [2])])
    with pytest.raises(TypeError, match=r"expected a cinn Program .*got onnx.*ModelProto"):
        cinn.compile(model)
