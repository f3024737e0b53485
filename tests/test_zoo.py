"""The zoo in files: its manifest, its check (cinn against onnxruntime) and cinn-bench --zoo on hand-written zoos;
the exporter (torch) on tiny models where torch is importable."""
from __future__ import annotations

import csv
import importlib.util
import json

import numpy as np
import onnx
import pytest
from onnx import helper

from benchmarks.zoo_manifest import (
    OPSET,
    RTOL,
    Exporter,
    Fill,
    Manifest,
    Source,
    ZooEntry,
    ZooInput,
    changes,
    error_line,
    read_manifest,
    relative_difference,
    write_manifest,
)
from tests.test_onnx_import import F32, I64, make_model

SOURCE = Source("onnx", onnx.__version__, "onnx.helper")
HAS_TORCH = all(importlib.util.find_spec(m) for m in ("torch", "torchvision", "transformers", "onnxscript"))


def _entry(name: str, inputs: tuple[ZooInput, ...], bindings=({},), outputs=("y",)) -> ZooEntry:
    return ZooEntry(name, f"{name}.onnx", SOURCE, Exporter.TORCHSCRIPT, inputs, outputs, bindings)


def _zoo(tmp_path, constant_output: bool = False):
    """A zoo of one hand-written model, relu(x @ w + b) over a symbolic batch (with constant_output: x * 0 + b)."""
    rng = np.random.default_rng(0)
    if constant_output:
        nodes = [helper.make_node("Mul", ["x", "zero"], ["x0"]), helper.make_node("Add", ["x0", "b"], ["y"])]
        inits = [("zero", np.zeros(16, np.float32)), ("b", rng.standard_normal(16).astype(np.float32))]
        out = 16
    else:
        nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["z"]),
                 helper.make_node("Relu", ["z"], ["y"])]
        inits = [("w", rng.standard_normal((16, 8)).astype(np.float32)), ("b", rng.standard_normal(8).astype(np.float32))]
        out = 8
    onnx.save(make_model(nodes, [("x", F32, ("n", 16))], [("y", F32, ("n", out))], inits, opset=OPSET),
              str(tmp_path / "tiny.onnx"))
    entry = _entry("tiny", (ZooInput("x", ("n", 16), "float32", Fill.NORMAL),), ({"n": 2}, {"n": 3}))
    write_manifest(tmp_path, Manifest((entry,), {"onnx": onnx.__version__}))
    return entry


def test_manifest_round_trip_and_feeds(tmp_path):
    text = (ZooInput("input_ids", ("batch", 8), "int64", Fill.TOKENS, 50), ZooInput("attention_mask", ("batch", 8), "int64", Fill.ONES))
    entry = _entry("text", text, ({"batch": 2}, {"batch": 1}))
    static = _entry("image", (ZooInput("image", (1, 3, 4, 4), "float32", Fill.NORMAL),))
    write_manifest(tmp_path, Manifest((entry, static), {"torch": "x"}))
    manifest = read_manifest(tmp_path)
    assert manifest.models == (entry, static) and manifest.versions == {"torch": "x"}
    assert entry.dynamic and not static.dynamic
    assert entry.shapes() == {"input_ids": (2, 8), "attention_mask": (2, 8)}
    feeds = entry.feeds(0, {"batch": 1})
    assert feeds["input_ids"].shape == (1, 8) and feeds["input_ids"].dtype == np.int64 and feeds["input_ids"].max() < 50
    assert (feeds["attention_mask"] == 1).all()
    np.testing.assert_array_equal(entry.feeds(0)["input_ids"], entry.feeds(0)["input_ids"])  # seeded
    assert not np.array_equal(entry.feeds(0)["input_ids"], entry.feeds(1)["input_ids"])
    # an entry exported again replaces the old one
    again = manifest.merged([static], {})
    assert [e.name for e in again.models] == ["text", "image"]


def test_a_file_that_is_no_manifest_is_refused(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps({"format": 1, "models": [{"name": "x"}]}))
    with pytest.raises(ValueError, match="not a zoo manifest"):
        read_manifest(tmp_path)
    with pytest.raises(OSError):
        read_manifest(tmp_path / "missing")


def test_relative_difference_and_changes():
    a = [np.array([1.0, -4.0]), np.array([2])]
    assert relative_difference(a, a) == 0.0
    assert relative_difference([np.array([1.0, -4.002])], [np.array([1.0, -4.0])]) == pytest.approx(5e-4)
    assert relative_difference([np.array([np.nan])], [np.array([1.0])]) == float("inf")
    assert relative_difference([np.zeros(3)], [np.zeros(2)]) == float("inf")  # a detector finding other boxes
    assert not changes(a, [np.array([1.0, -4.0 * (1 + RTOL / 2)]), np.array([2])])
    assert changes(a, [np.array([1.0, -3.0]), np.array([2])])


def test_error_line_is_one_line_of_the_outer_or_innermost_error():
    try:
        try:
            raise ValueError("\x1b[96mguard\x1b[0m on u0\nmore")
        except ValueError as inner:
            raise RuntimeError("Failed to export. Step 1/3") from inner
    except RuntimeError as err:
        assert error_line(err) == "RuntimeError: Failed to export. Step 1/3"
        assert error_line(err, innermost=True) == "ValueError: guard on u0"


def test_zoo_check_passes_a_model_at_each_binding(tmp_path, tmp_cache, monkeypatch, capsys):
    from benchmarks.zoo_check import main

    monkeypatch.setenv("CINN_CACHE_DIR", str(tmp_cache))
    _zoo(tmp_path)
    csv_path = tmp_path / "check.csv"
    assert main([str(tmp_path), "--timeout", "600", "--csv", str(csv_path)]) == 0
    with open(csv_path) as f:
        (row,) = list(csv.DictReader(f))
    assert row["model"] == "tiny" and row["status"] == "ok" and row["changes with input"] == "yes"
    assert float(row["rel diff vs ORT"]) <= RTOL and float(row["compile cold s"]) > 0


def test_zoo_check_fails_an_output_that_ignores_the_input(tmp_path, tmp_cache, monkeypatch, capsys):
    from benchmarks.zoo_check import main

    monkeypatch.setenv("CINN_CACHE_DIR", str(tmp_cache))
    _zoo(tmp_path, constant_output=True)
    assert main([str(tmp_path), "tiny", "--timeout", "600"]) == 1
    assert "UNCHANGED" in capsys.readouterr().out


def test_zoo_check_reports_a_timeout_with_its_stage(tmp_path, monkeypatch, capsys):
    from benchmarks import zoo_check

    _zoo(tmp_path)
    result = zoo_check.run_check(tmp_path, read_manifest(tmp_path).entry("tiny"), "llvm", timeout=0.01)
    assert result.stage is zoo_check.Stage.IMPORT and not result.ok
    assert result.status == "FAILED in import: timed out after 0.01 s"


def test_zoo_check_rejects_an_unknown_model(tmp_path, capsys):
    from benchmarks.zoo_check import main

    _zoo(tmp_path)
    assert main([str(tmp_path), "nope"]) == 2
    assert "no model 'nope' in the zoo; it has: tiny" in capsys.readouterr().err


def test_bench_runs_a_zoo_at_its_manifest_shapes(tmp_path, tmp_cache, monkeypatch, capsys):
    from benchmarks.cli import main

    monkeypatch.setenv("CINN_CACHE_DIR", str(tmp_cache))
    _zoo(tmp_path)
    csv_path = tmp_path / "bench.csv"
    assert main(["--zoo", str(tmp_path), "--repeat", "2", "--warmup", "0", "--no-unfused", "--csv", str(csv_path)]) == 0
    with open(csv_path) as f:
        (row,) = list(csv.DictReader(f))
    assert row["model"] == "tiny" and row["check"] == "ok" and float(row["compile cold s"]) > 0


def test_bench_reports_a_zoo_model_that_cinn_cannot_import_as_failed(tmp_path, tmp_cache, monkeypatch, capsys):
    from benchmarks.cli import main

    monkeypatch.setenv("CINN_CACHE_DIR", str(tmp_cache))
    # NonZero: an output shape that depends on the values, which cinn does not import
    model = make_model([helper.make_node("NonZero", ["x"], ["y"])], [("x", F32, (4,))], [("y", I64, (1, None))], opset=OPSET)
    onnx.save(model, str(tmp_path / "nonzero.onnx"))
    entry = _entry("nonzero", (ZooInput("x", (4,), "float32", Fill.NORMAL),))
    write_manifest(tmp_path, Manifest((entry,)))
    assert main(["--zoo", str(tmp_path), "--repeat", "1", "--warmup", "0", "--no-unfused"]) == 1
    out = capsys.readouterr().out
    assert "nonzero" in out and "FAILED: cinn-fused" in out


def test_bench_rejects_a_directory_without_a_manifest(tmp_path, capsys):
    from benchmarks.cli import main

    assert main(["--zoo", str(tmp_path)]) == 2
    assert f"cinn-bench: error: no zoo manifest {tmp_path}/manifest.json" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# the exporter: only where torch is importable (not in cinn's own environment)

needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="the zoo extra (torch, torchvision, transformers) is not installed")


def _tiny_bert():
    from benchmarks.zoo import transformers_model

    config = {"vocab_size": 100, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
              "intermediate_size": 64, "max_position_embeddings": 64}
    text = (ZooInput("input_ids", ("batch", "seq"), "int64", Fill.TOKENS, 100),
            ZooInput("attention_mask", ("batch", "seq"), "int64", Fill.ONES))
    return transformers_model("tiny_bert", "BertModel", "BertConfig", config, text, ("last_hidden_state",),
                              bindings=({"batch": 2, "seq": 16}, {"batch": 1, "seq": 8}))


def _torch_model(name: str, head_input: bool):
    """A conv and a linear head initialized to zeros; head_input=False: the head reads a parameter, not the input."""
    import torch

    from benchmarks.zoo import Library, ZooModel

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.head, self.bias = torch.nn.Conv2d(3, 4, 3), torch.nn.Linear(16, 5), torch.nn.Parameter(torch.ones(16))
            torch.nn.init.zeros_(self.head.weight)

        def forward(self, x):
            features = self.conv(x).mean(dim=(2, 3)).repeat(1, 4) if head_input else self.bias.expand(x.shape[0], 16)
            return self.head(features)

    def call(model, x):
        return (model(x),)

    return ZooModel(name, Library.TORCH, "Net()", Net, call, (ZooInput("image", (1, 3, 8, 8), "float32", Fill.NORMAL),),
                    ("logits",))


@needs_torch
def test_export_reseeds_zero_weights_and_refuses_constant_outputs(tmp_path):
    from benchmarks.zoo import ZooRefused, export_model

    entry = export_model(_torch_model("net", head_input=True), tmp_path)
    assert entry.reseeded == ("head.weight",) and (tmp_path / "net.onnx").is_file()
    assert onnx.load(str(tmp_path / "net.onnx")).opset_import[0].version == OPSET
    with pytest.raises(ZooRefused, match="does not change with its input"):
        export_model(_torch_model("constant", head_input=False), tmp_path)
    assert not (tmp_path / "constant.onnx").exists()


@needs_torch
def test_exported_tiny_models_match_onnxruntime_on_cinn(tmp_path, tmp_cache, monkeypatch, capsys):
    from benchmarks.zoo import export
    from benchmarks.zoo_check import main

    monkeypatch.setenv("CINN_CACHE_DIR", str(tmp_cache))
    models = {m.name: m for m in (_tiny_bert(), _torch_model("net", head_input=True))}
    assert export(tmp_path, list(models), models) == []
    manifest = read_manifest(tmp_path)
    bert = manifest.entry("tiny_bert")
    assert bert.dynamic and bert.source.library == "transformers" and bert.exporter in tuple(Exporter)
    assert [i.name for i in bert.inputs] == ["input_ids", "attention_mask"] and len(bert.bindings) == 2
    assert {"torch", "transformers", "onnx"} <= set(manifest.versions)
    assert main([str(tmp_path), "--timeout", "600"]) == 0
    out = capsys.readouterr().out
    assert out.count(" ok") == 2, out
