"""Paddle importer tests: models saved by real paddlepaddle (tests/fixtures/paddle, made by
tools/make_paddle_fixtures.py) compared with Paddle's outputs, in both formats; error cases; cinn-run.
paddle itself is not needed."""
from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

import cinn
from cinn.facade import cli
from frontend.paddle import PaddleImportError
from frontend.paddle.registry import dtype_of_code, dtype_of_name
from frontend.paddle.schema import AttrType, VarKind, program_desc

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "paddle"
MODELS = ("mlp", "cnn", "encoder", "ops")
FORMATS = {"pir": "inference.json", "legacy": "inference.pdmodel"}
FLOAT32_CODE = 5  # Paddle's data type code of float32


def fixture_data(model: str) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
    """The saved inputs (by name) and Paddle's outputs (in fetch order) of a fixture model."""
    data = np.load(FIXTURES / model / "data.npz")
    feeds = {k.removeprefix("in_"): data[k] for k in data.files if k.startswith("in_")}
    outputs = [data[f"out_{k}"] for k in range(sum(k.startswith("out_") for k in data.files))]
    return feeds, outputs


def shapes_of(feeds: dict[str, np.ndarray]) -> dict[str, tuple[int, ...]]:
    return {k: v.shape for k, v in feeds.items()}


def copy_model(model: str, fmt: str, tmp_path: pathlib.Path) -> pathlib.Path:
    """A writable copy of a fixture model folder; returns the model file's path."""
    folder = tmp_path / f"{model}_{fmt}"
    shutil.copytree(FIXTURES / model / fmt, folder)
    return folder / FORMATS[fmt]


# -- models saved by Paddle ----------------------------------------------------------------------
@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("model", MODELS)
def test_matches_paddle(model, fmt, tmp_cache):
    """MLP (matmul, add, gelu, relu, log_softmax), CNN (conv, batch norm, residual, depthwise conv, max and
    adaptive pooling, hardswish, flatten), transformer encoder with a dynamic batch (layer_norm, softmax,
    dropout, reshape/transpose, shape64/slice/stack folding), and shape ops (split, stack, concat, squeeze,
    strided slice, scale, cast, maximum, ...)."""
    feeds, want = fixture_data(model)
    program = cinn.load_paddle(FIXTURES / model / fmt, input_shapes=shapes_of(feeds))
    got = cinn.compile(program, cache_dir=tmp_cache).run(feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.dtype, w.shape)
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_model_file_or_directory(fmt):
    """A model file and its directory give the same program; parameters become named constants."""
    by_dir = cinn.load_paddle(FIXTURES / "mlp" / fmt)
    by_file = cinn.load_paddle(str(FIXTURES / "mlp" / fmt / FORMATS[fmt]))
    assert [n.op for n in by_dir.nodes] == [n.op for n in by_file.nodes]
    assert [v.name for v in by_dir.inputs] == ["x"]
    assert "linear_0.w_0" in by_dir.constants and by_dir.constants["linear_0.w_0"].shape == (16, 32)


def test_input_shapes_checks():
    with pytest.raises(PaddleImportError, match="not model inputs"):
        cinn.load_paddle(FIXTURES / "encoder" / "pir", input_shapes={"nope": (1,)})
    with pytest.raises(PaddleImportError, match=r"does not fit the model's shape \[-1, 8, 16\]"):
        cinn.load_paddle(FIXTURES / "encoder" / "pir", input_shapes={"x": (2, 9, 16)})


# -- legacy programs built here: semantics the fixtures do not reach ------------------------------
def legacy_program(path: pathlib.Path, inputs: dict[str, tuple[int, ...]], ops: list[tuple], fetch: list[str],
                   dtypes: dict[str, int] | None = None) -> None:
    """Write a parameter-free .pdmodel: ops are (type, {slot: [vars]}, {slot: [vars]}, {attr: int, float, ints, floats,
    bool or str}); variables are float32 unless `dtypes` gives their data type code."""
    desc = program_desc()()
    block = desc.blocks.add()
    names = list(inputs) + [n for _, _, outs, _ in ops for vs in outs.values() for n in vs]
    for name in names:
        var = block.vars.add(name=name)
        var.type.type = VarKind.DENSE_TENSOR
        var.type.dense_tensor.tensor.data_type = (dtypes or {}).get(name, FLOAT32_CODE)
        var.type.dense_tensor.tensor.dims.extend(inputs.get(name, ()))
    for col, name in enumerate(inputs):
        _add_op(block, "feed", {"X": ["feed"]}, {"Out": [name]}, {"col": col})
    for op in ops:
        _add_op(block, *op)
    for col, name in enumerate(fetch):
        _add_op(block, "fetch", {"X": [name]}, {"Out": ["fetch"]}, {"col": col})
    path.write_bytes(desc.SerializeToString())


def _add_op(block, op_type: str, inputs: dict, outputs: dict, attrs: dict) -> None:
    op = block.ops.add(type=op_type)
    for slots, target in ((inputs, op.inputs), (outputs, op.outputs)):
        for slot, args in slots.items():
            target.add(parameter=slot, arguments=args)
    for name, value in attrs.items():
        if isinstance(value, list) and any(isinstance(v, float) for v in value):
            op.attrs.add(name=name, type=AttrType.FLOATS, floats=value)
        elif isinstance(value, list):
            op.attrs.add(name=name, type=AttrType.INTS, ints=value)
        elif isinstance(value, bool):
            op.attrs.add(name=name, type=AttrType.BOOLEAN, b=value)
        elif isinstance(value, str):
            op.attrs.add(name=name, type=AttrType.STRING, s=value)
        elif isinstance(value, float):
            op.attrs.add(name=name, type=AttrType.FLOAT, f=value)
        else:
            op.attrs.add(name=name, type=AttrType.INT, i=value)


def run_program(program, feeds, cache):
    return cinn.compile(program, cache_dir=cache).run(feeds)


def test_legacy_elementwise_axis_and_mul(tmp_path, tmp_cache):
    """elementwise_* `axis` aligns a lower-rank Y at dim `axis` of X; mul flattens at x/y_num_col_dims."""
    path = tmp_path / "legacy.pdmodel"
    ops = [
        ("elementwise_add", {"X": ["x"], "Y": ["c"]}, {"Out": ["a"]}, {"axis": 1}),
        ("elementwise_mul", {"X": ["a"], "Y": ["hw"]}, {"Out": ["m"]}, {"axis": 2}),
        ("mul", {"X": ["m"], "Y": ["w"]}, {"Out": ["y"]}, {"x_num_col_dims": 2, "y_num_col_dims": 1}),
    ]
    legacy_program(path, {"x": (2, 3, 4, 5), "c": (3,), "hw": (4, 5), "w": (20, 6)}, ops, ["y", "a"])
    rng = np.random.default_rng(0)
    feeds = {k: rng.uniform(-1, 1, s).astype("float32") for k, s in
             (("x", (2, 3, 4, 5)), ("c", (3,)), ("hw", (4, 5)), ("w", (20, 6)))}
    got_y, got_a = run_program(cinn.load_paddle(path), feeds, tmp_cache)
    a = feeds["x"] + feeds["c"][:, None, None]
    np.testing.assert_allclose(got_a, a, rtol=1e-5)
    want_y = ((a * feeds["hw"]).reshape(6, 20) @ feeds["w"]).reshape(2, 3, 6)
    np.testing.assert_allclose(got_y, want_y, rtol=1e-4, atol=1e-5)


def test_reading_an_unsupported_output_names_the_op(tmp_path):
    path = tmp_path / "xshape.pdmodel"
    ops = [("reshape2", {"X": ["x"]}, {"Out": ["r"], "XShape": ["xs"]}, {"shape": [6]}),
           ("relu", {"X": ["xs"]}, {"Out": ["y"]}, {})]
    legacy_program(path, {"x": (2, 3)}, ops, ["y"])
    with pytest.raises(PaddleImportError, match=r"relu 'y': reads 'xs', output XShape of reshape2 'r'"):
        cinn.load_paddle(path)


@pytest.mark.parametrize(("code", "element_type", "dtype"), [(20, "0.t_ui8", "uint8"), (1, "0.t_i16", "int16")])
def test_uint8_and_int16_are_read_in_both_formats(code, element_type, dtype):
    assert dtype_of_code(code, "x") == dtype_of_name(element_type, "x") == dtype_of_name(dtype, "x") == dtype


# -- errors ---------------------------------------------------------------------------------------
def test_an_unsupported_data_type_is_named():
    with pytest.raises(PaddleImportError, match=r"x: data type bfloat16 is not supported \(supported: bool, int8"):
        dtype_of_code(22, "x")
    with pytest.raises(PaddleImportError, match=r"x: data type bf16 is not supported"):
        dtype_of_name("0.t_bf16", "x")


def test_unsupported_ops_listed_in_one_error_pir(tmp_path):
    path = copy_model("mlp", "pir", tmp_path)
    doc = json.loads(path.read_text())
    ops = doc["program"]["regions"][0]["blocks"][0]["ops"]
    renames = {"1.relu": "1.foo_op", "1.gelu": "1.bar_op", "1.log_softmax": "1.foo_op"}
    for op in ops:
        op["#"] = renames.get(op["#"], op["#"])
    path.write_text(json.dumps(doc))
    with pytest.raises(NotImplementedError) as err:
        cinn.load_paddle(path)
    message = str(err.value)
    assert "unsupported Paddle ops: bar_op (outputs '%" in message
    assert message.count("'%") == 3 and "foo_op (outputs '%" in message and str(path) in message


def test_unsupported_ops_listed_in_one_error_legacy(tmp_path):
    path = copy_model("cnn", "legacy", tmp_path)
    desc = program_desc()()
    desc.ParseFromString(path.read_bytes())
    for op in desc.blocks[0].ops:
        if op.type in ("hard_swish", "depthwise_conv2d"):
            op.type = "my_" + op.type
    path.write_bytes(desc.SerializeToString())
    with pytest.raises(NotImplementedError, match=r"unsupported Paddle ops: my_depthwise_conv2d \(outputs '[^']+'\); "
                                                  r"my_hard_swish \(outputs '[^']+'\)"):
        cinn.load_paddle(path)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_truncated_model_file_names_the_file(fmt, tmp_path):
    path = copy_model("cnn", fmt, tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(PaddleImportError, match=rf"{path}: not a valid Paddle"):
        cinn.load_paddle(path)


def test_json_that_is_not_pir_names_the_file(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"hidden_size": 16}')
    with pytest.raises(PaddleImportError, match=rf"{path}: not a valid Paddle PIR .json file"):
        cinn.load_paddle(path)


@pytest.mark.parametrize("cut", [10, 100, -3])
def test_truncated_params_file_names_the_file(cut, tmp_path):
    path = copy_model("mlp", "legacy", tmp_path)
    params = path.with_suffix(".pdiparams")
    params.write_bytes(params.read_bytes()[:cut])
    with pytest.raises(PaddleImportError, match=rf"{params}: truncated or malformed parameter file"):
        cinn.load_paddle(path)


def test_params_of_another_model_are_refused(tmp_path):
    path = copy_model("mlp", "pir", tmp_path)
    shutil.copy(FIXTURES / "cnn" / "pir" / "inference.pdiparams", path.with_suffix(".pdiparams"))
    with pytest.raises(PaddleImportError, match="does not belong to this model"):
        cinn.load_paddle(path)


def test_missing_files(tmp_path):
    path = copy_model("mlp", "legacy", tmp_path)
    path.with_suffix(".pdiparams").unlink()
    with pytest.raises(FileNotFoundError, match=r"inference.pdiparams: no such Paddle parameter file"):
        cinn.load_paddle(path)
    with pytest.raises(FileNotFoundError, match=r"missing\.pdmodel: no such Paddle model file"):
        cinn.load_paddle(tmp_path / "missing.pdmodel")
    with pytest.raises(PaddleImportError, match="no Paddle model files"):
        cinn.load_paddle(tmp_path)


def test_importing_cinn_does_not_import_protobuf_or_the_importer():
    code = ("import sys, cinn; assert 'google.protobuf' not in sys.modules and 'frontend.paddle' not in sys.modules; "
            "cinn.load_paddle; assert 'frontend.paddle' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


# -- cinn-run -------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_cinn_run_on_a_paddle_model(fmt, tmp_cache, monkeypatch, capsys):
    monkeypatch.setenv("CINN_CACHE_DIR", str(tmp_cache))
    args = [str(FIXTURES / "encoder" / fmt), "--input-shape", "x=2,8,16", "--repeat", "2"]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert "shape (2, 4) float32" in out and "median latency" in out


def test_cinn_run_paddle_errors(capsys):
    assert cli.main([str(FIXTURES / "encoder" / "pir")]) == 2
    err = capsys.readouterr().err
    assert "have symbolic dims; pass --input-shape" in err and "Traceback" not in err and err.count("\n") == 1


def test_conv3d_and_pool3d(tmp_path, tmp_cache):
    """Paddle's conv3d (6-value paddings, groups, dilations) and pool3d (max, exclusive average, global) against the
    same ops in onnxruntime."""
    from onnx import TensorProto, helper

    from tests.test_onnx_import import make_model, ort_run

    path = tmp_path / "volumetric.pdmodel"
    ops = [
        ("conv3d", {"Input": ["x"], "Filter": ["w"]}, {"Output": ["c"]},
         {"strides": [1, 2, 1], "paddings": [1, 0, 0, 1, 1, 1], "dilations": [2, 1, 1], "groups": 2}),
        ("pool3d", {"X": ["c"]}, {"Out": ["m"]}, {"pooling_type": "max", "ksize": [2, 2, 2], "strides": [2, 2, 2],
                                                 "paddings": [0, 0, 0], "ceil_mode": True}),
        ("pool3d", {"X": ["c"]}, {"Out": ["a"]}, {"pooling_type": "avg", "ksize": [3, 2, 2], "strides": [1, 1, 1],
                                                 "paddings": [1, 1, 0], "exclusive": True}),
        ("pool3d", {"X": ["c"]}, {"Out": ["g"]}, {"pooling_type": "avg", "ksize": [1, 1, 1], "global_pooling": True}),
    ]
    legacy_program(path, {"x": (1, 4, 6, 7, 5), "w": (6, 2, 2, 3, 3)}, ops, ["m", "a", "g"])
    rng = np.random.default_rng(3)
    feeds = {"x": rng.uniform(-1, 1, (1, 4, 6, 7, 5)).astype("float32"),
             "w": rng.uniform(-1, 1, (6, 2, 2, 3, 3)).astype("float32")}
    got = run_program(cinn.load_paddle(path), feeds, tmp_cache)
    f32 = TensorProto.FLOAT
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], strides=[1, 2, 1], pads=[1, 0, 1, 0, 1, 1], dilations=[2, 1, 1],
                              group=2),
             helper.make_node("MaxPool", ["c"], ["m"], kernel_shape=[2, 2, 2], strides=[2, 2, 2], ceil_mode=1),
             helper.make_node("AveragePool", ["c"], ["a"], kernel_shape=[3, 2, 2], pads=[1, 1, 0, 1, 1, 0]),
             helper.make_node("GlobalAveragePool", ["c"], ["g"])]
    model = make_model(nodes, [("x", f32, (1, 4, 6, 7, 5)), ("w", f32, (6, 2, 2, 3, 3))],
                       [("m", f32, None), ("a", f32, None), ("g", f32, None)])
    for g, w in zip(got, ort_run(model, feeds), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_pool3d_refusals(tmp_path):
    path = tmp_path / "pool.pdmodel"
    op = ("pool3d", {"X": ["x"]}, {"Out": ["y"]}, {"pooling_type": "max", "ksize": [2, 2, 2], "adaptive": True})
    legacy_program(path, {"x": (1, 2, 5, 4, 4)}, [op], ["y"])
    with pytest.raises(PaddleImportError, match=r"adaptive pool3d to \(2, 2, 2\) is supported where it divides"):
        cinn.load_paddle(path)


INT32_CODE = 2


def test_unpool_with_plane_indices(tmp_path, tmp_cache):
    """unpool's indices count within each channel's plane of output_size (a 5x7 map pooled 2x2 back to 5x7)."""
    rng = np.random.default_rng(5)
    x = rng.permutation(2 * 3 * 5 * 7).reshape(2, 3, 5, 7).astype("float32")
    windows = x[:, :, :4, :6].reshape(2, 3, 2, 2, 3, 2).transpose(0, 1, 2, 4, 3, 5).reshape(2, 3, 2, 3, 4)
    best = windows.argmax(-1)
    rows, cols = np.arange(2)[:, None] * 2 + best // 2, np.arange(3)[None] * 2 + best % 2
    feeds = {"v": windows.max(-1), "i": (rows * 7 + cols).astype("int32")}
    path = tmp_path / "unpool.pdmodel"
    op = ("unpool", {"X": ["v"], "Indices": ["i"]}, {"Out": ["y"]},
          {"unpooling_type": "max", "ksize": [2, 2], "strides": [2, 2], "paddings": [0, 0], "output_size": [5, 7]})
    legacy_program(path, {"v": (2, 3, 2, 3), "i": (2, 3, 2, 3)}, [op], ["y"], {"i": INT32_CODE})
    (got,) = run_program(cinn.load_paddle(path), feeds, tmp_cache)
    want = np.zeros((2, 3, 35), "float32")
    np.put_along_axis(want, feeds["i"].reshape(2, 3, -1), feeds["v"].reshape(2, 3, -1), axis=2)
    np.testing.assert_array_equal(got, want.reshape(2, 3, 5, 7))


@pytest.mark.parametrize(("aligned", "sampling_ratio"), [(True, -1), (False, 2)])
def test_roi_align_with_rois_num(aligned, sampling_ratio, tmp_path, tmp_cache):
    """roi_align's RoisNum (rois grouped by image) against onnxruntime's RoiAlign given each roi's image."""
    from onnx import TensorProto, helper

    from tests.test_onnx_import import make_model, ort_run

    rng = np.random.default_rng(6)
    lo = rng.uniform(0, 10, (5, 2))
    feeds = {"x": rng.uniform(-1, 1, (2, 3, 8, 9)).astype("float32"), "num": np.array([2, 3], np.int32),
             "rois": np.concatenate([lo, lo + rng.uniform(1, 8, (5, 2))], axis=1).astype("float32")}
    attrs = {"pooled_height": 2, "pooled_width": 3, "spatial_scale": 0.5, "sampling_ratio": sampling_ratio,
             "aligned": aligned}
    path = tmp_path / "roi_align.pdmodel"
    op = ("roi_align", {"X": ["x"], "ROIs": ["rois"], "RoisNum": ["num"]}, {"Out": ["y"]}, attrs)
    legacy_program(path, {"x": (2, 3, 8, 9), "rois": (5, 4), "num": (2,)}, [op], ["y"], {"num": INT32_CODE})
    (got,) = run_program(cinn.load_paddle(path), feeds, tmp_cache)
    node = helper.make_node("RoiAlign", ["x", "rois", "b"], ["y"], output_height=2, output_width=3, spatial_scale=0.5,
                            sampling_ratio=max(sampling_ratio, 0),
                            coordinate_transformation_mode="half_pixel" if aligned else "output_half_pixel")
    f32 = TensorProto.FLOAT
    model = make_model([node], [("x", f32, (2, 3, 8, 9)), ("rois", f32, (5, 4)), ("b", TensorProto.INT64, (5,))],
                       [("y", f32, None)], opset=16)
    (want,) = ort_run(model, {"x": feeds["x"], "rois": feeds["rois"], "b": np.array([0, 0, 1, 1, 1])})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
