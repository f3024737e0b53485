"""Paddle's op set: models saved by real paddlepaddle (tests/fixtures/paddle, made by tools/make_paddle_fixtures.py)
covering activations, indexing, reductions, vision ops, paddle.vision's mobile blocks and an ERNIE-style encoder,
compared with Paddle's outputs in both formats on two sets of inputs; the generated list of supported ops; and,
where a paddlepaddle interpreter is at hand, paddle.vision's models at full size. paddle itself is not needed."""
from __future__ import annotations

import importlib.util
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import cinn
from frontend.paddle import PaddleImportError, oplist
from frontend.paddle.registry import CONVERTERS, converter_of
from tests.test_paddle_import import FIXTURES, FORMATS, legacy_program, run_program

ROOT = pathlib.Path(__file__).resolve().parent.parent
MODELS = ("activations", "indexing", "reductions", "vision_ops", "mobile", "ernie", "algebra", "pir_only")
# |got - want| <= atol + rtol |want| per output dtype; integers and booleans exactly
TOLERANCES = {"float32": (1e-4, 1e-5), "float64": (1e-9, 1e-12)}


def feeds_and_outputs(data, tag: str) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
    """One input set of a fixture's data (`in_` / `out_`, or the second, `in2_` / `out2_`)."""
    feeds = {k.removeprefix(f"in{tag}_"): data[k] for k in data.files if k.startswith(f"in{tag}_")}
    outputs = [data[f"out{tag}_{k}"] for k in range(sum(k.startswith(f"out{tag}_") for k in data.files))]
    return feeds, outputs


def assert_matches(got: list[np.ndarray], want: list[np.ndarray], what: str) -> None:
    """Each output has Paddle's dtype and shape, and its values within the dtype's tolerance."""
    assert len(got) == len(want), f"{what}: {len(got)} outputs, Paddle has {len(want)}"
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        where = f"{what} output {k}"
        assert (g.dtype, g.shape) == (w.dtype, w.shape), f"{where}: {g.dtype} {g.shape}, Paddle {w.dtype} {w.shape}"
        if str(w.dtype) in TOLERANCES:
            rtol, atol = TOLERANCES[str(w.dtype)]
            # rounding grows with the magnitudes summed: the absolute part scales with the output's largest
            scale = max(1.0, float(np.abs(w).max(initial=0.0)))
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol * scale, err_msg=where)
        else:
            np.testing.assert_array_equal(g, w, err_msg=where)


def check_model(folder: pathlib.Path, data_path: pathlib.Path, cache) -> None:
    """A saved model's cinn outputs match Paddle's on both input sets, and each output changes with the inputs."""
    data = np.load(data_path)
    (feeds, want), (others, want_others) = feeds_and_outputs(data, ""), feeds_and_outputs(data, "2")
    program = cinn.load_paddle(folder, input_shapes={k: v.shape for k, v in feeds.items()})
    exe = cinn.compile(program, cache_dir=cache)
    got, got_others = exe.run(feeds), exe.run(others)
    assert_matches(got, want, folder.name)
    assert_matches(got_others, want_others, f"{folder.name} (second inputs)")
    for k, (a, b) in enumerate(zip(got, got_others, strict=True)):
        assert not np.array_equal(a, b), f"{folder}: output {k} does not depend on the inputs"


@pytest.mark.parametrize(("model", "fmt"), [(m, f) for m in MODELS for f in sorted(FORMATS) if (FIXTURES / m / f).is_dir()])
def test_op_set_matches_paddle(model, fmt, tmp_cache):
    """Activations (relu6, hardswish, swish, mish, gelu, elu, selu, celu, softplus, shrinks, prelu, ...); gathers,
    scatters (overwrite and add), sorts, top-k, prefix sums, set_value; reductions, norms, einsum, expand, tile,
    unbind, padding modes, one_hot, arange from a dynamic shape; conv2d_transpose, group and instance norm,
    interpolation modes, pixel_shuffle, adaptive and ceil-mode pooling, unfold; paddle.vision's mobile blocks; an
    ERNIE-style encoder with dynamic batch and sequence, its mask built from the ids; APIs paddle 3 saves only as
    PIR (grid_sample, affine_grid, bilinear, index_put, median, ...)."""
    check_model(FIXTURES / model / fmt, FIXTURES / model / "data.npz", tmp_cache)


# -- the generated list of supported ops ---------------------------------------------------------
def test_op_list_is_up_to_date():
    """docs/paddle-ops.md is what `python -m frontend.paddle.oplist` writes from the converter table."""
    assert (ROOT / oplist.DOC).read_text() == oplist.render(), "run: python -m frontend.paddle.oplist"


def test_op_list_names_every_converter():
    text = oplist.render()
    for op_type in CONVERTERS:
        assert f"`{op_type}`" in text


def test_in_place_variants_convert_as_their_op():
    assert converter_of("relu_") is converter_of("relu") is not None
    assert converter_of("no_such_op_") is None and converter_of("builtin.split_") is None


# -- semantics the fixtures do not reach --------------------------------------------------------------
def test_legacy_paddle2_attribute_spellings(tmp_path, tmp_cache):
    """Paddle 2's legacy ops: relu6 with its threshold, swish with beta, lookup_table (ids ending in 1) with a
    padding row, assign_value's typed values, fill_constant_batch_size_like, flatten2's matrix."""
    path = tmp_path / "paddle2.pdmodel"
    ops = [
        ("relu6", {"X": ["x"]}, {"Out": ["r"]}, {"threshold": 3.0}),
        ("swish", {"X": ["x"]}, {"Out": ["s"]}, {"beta": 2.0}),
        ("lookup_table", {"W": ["w"], "Ids": ["ids"]}, {"Out": ["e"]}, {"padding_idx": 1}),
        ("assign_value", {}, {"Out": ["a"]}, {"dtype": 5, "shape": [2], "fp32_values": [1.5, -2.0]}),
        ("fill_constant_batch_size_like", {"Input": ["x"]}, {"Out": ["f"]},
         {"shape": [-1, 2], "input_dim_idx": 0, "output_dim_idx": 0, "dtype": 5, "value": 0.5}),
        ("elementwise_add", {"X": ["f"], "Y": ["a"]}, {"Out": ["fa"]}, {"axis": -1}),
        ("flatten2", {"X": ["x3"]}, {"Out": ["m"], "XShape": ["xs"]}, {"axis": 2}),
    ]
    legacy_program(path, {"x": (3, 4), "w": (5, 2), "ids": (3, 1), "x3": (2, 3, 4)}, ops, ["r", "s", "e", "fa", "m"],
                   {"ids": 3, "a": 5})
    rng = np.random.default_rng(0)
    feeds = {"x": rng.uniform(-5, 5, (3, 4)).astype("float32"), "w": rng.uniform(-1, 1, (5, 2)).astype("float32"),
             "ids": np.array([[1], [4], [0]], np.int64), "x3": rng.uniform(-1, 1, (2, 3, 4)).astype("float32")}
    r, s, e, fa, m = run_program(cinn.load_paddle(path), feeds, tmp_cache)
    x = feeds["x"]
    np.testing.assert_allclose(r, np.clip(x, 0, 3), rtol=1e-6)
    np.testing.assert_allclose(s, x / (1 + np.exp(-2 * x)), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(e, np.stack([np.zeros(2, np.float32), feeds["w"][4], feeds["w"][0]]))
    np.testing.assert_allclose(fa, np.full((3, 2), 0.5) + [1.5, -2.0])
    np.testing.assert_array_equal(m, feeds["x3"].reshape(6, 4))


def test_scatter_overwrite_keeps_the_last_update(tmp_path, tmp_cache):
    """scatter with repeated ids: overwrite keeps each row's last update; otherwise a row hit is the sum of its
    updates (its old value dropped), as Paddle's kernels compute them."""
    path = tmp_path / "scatter.pdmodel"
    ops = [("scatter", {"X": ["x"], "Ids": ["ids"], "Updates": ["u"]}, {"Out": ["o"]}, {"overwrite": True}),
           ("scatter", {"X": ["x"], "Ids": ["ids"], "Updates": ["u"]}, {"Out": ["s"]}, {"overwrite": False})]
    legacy_program(path, {"x": (4, 3), "ids": (5,), "u": (5, 3)}, ops, ["o", "s"], {"ids": 3})
    rng = np.random.default_rng(1)
    feeds = {"x": rng.uniform(-1, 1, (4, 3)).astype("float32"), "ids": np.array([2, 0, 2, 3, 0], np.int64),
             "u": rng.uniform(-1, 1, (5, 3)).astype("float32")}
    overwrite, summed = run_program(cinn.load_paddle(path), feeds, tmp_cache)
    x, u = feeds["x"], feeds["u"]
    np.testing.assert_array_equal(overwrite, np.stack([u[4], x[1], u[2], u[3]]))
    np.testing.assert_allclose(summed, np.stack([u[1] + u[4], x[1], u[0] + u[2], u[3]]), rtol=1e-6)


def test_data_dependent_shapes_stay_unsupported(tmp_path):
    """Ops whose output shape depends on the values (where_index, masked_select) are named, with the others, in
    the one unsupported-ops error."""
    path = tmp_path / "nonzero.pdmodel"
    ops = [("where_index", {"Condition": ["c"]}, {"Out": ["i"]}, {}),
           ("masked_select", {"X": ["x"], "Mask": ["c"]}, {"Y": ["y"]}, {})]
    legacy_program(path, {"c": (4,), "x": (4,)}, ops, ["i", "y"], {"c": 0})
    with pytest.raises(NotImplementedError, match=r"unsupported Paddle ops: masked_select \(outputs 'y'\); "
                                                  r"where_index \(outputs 'i'\)"):
        cinn.load_paddle(path)


# -- paddle.vision's models at full size (a paddlepaddle interpreter needed) ----------------------------
VISION_MODELS = ("alexnet", "densenet121", "googlenet", "inception_v3", "mobilenet_v1", "mobilenet_v2",
                 "mobilenet_v3_large", "mobilenet_v3_small", "resnet18", "resnext50_32x4d", "shufflenet_v2_swish",
                 "shufflenet_v2_x0_25", "squeezenet1_0", "squeezenet1_1", "vgg11", "wide_resnet50_2")


def paddle_python() -> str | None:
    """An interpreter with paddlepaddle: $CINN_PADDLE_PYTHON, else this one where it has paddle."""
    given = os.environ.get("CINN_PADDLE_PYTHON")
    if given:
        return given
    return sys.executable if importlib.util.find_spec("paddle") is not None else None


@pytest.mark.slow
@pytest.mark.parametrize("name", VISION_MODELS)
def test_vision_model_matches_paddle(name, tmp_path, tmp_cache):
    """A paddle.vision model saved at full size in both formats (by tools/make_paddle_fixtures.py) imports and
    matches Paddle's outputs."""
    python = paddle_python()
    if python is None:
        pytest.skip("no paddlepaddle: install it, or set CINN_PADDLE_PYTHON to an interpreter that has it")
    subprocess.run([python, str(ROOT / "tools" / "make_paddle_fixtures.py"), "--out", str(tmp_path), "--models", name],
                   check=True, capture_output=True)
    for fmt in sorted(FORMATS):
        check_model(tmp_path / name / fmt, tmp_path / name / "data.npz", tmp_cache)


def test_a_probe_size_past_a_table_is_named():
    """Without input_shapes the symbolic sequence length is probed at a size past the position table: the error
    names the op and says input_shapes may fit."""
    with pytest.raises(PaddleImportError, match=r"embedding '%\d+': index \d+ is out of bounds.*input_shapes"):
        cinn.load_paddle(FIXTURES / "ernie" / "pir")
