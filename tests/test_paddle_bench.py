"""The Paddle model set and Paddle Inference as a cinn-bench peer: the manifest, the CLI's options, the Paddle worker's
protocol (with a fake runner: paddle is not needed), the message when paddle is missing; and, where a Python with paddle
is found ($CINN_PADDLE_PYTHON, else this one), a tiny set exported and benchmarked."""
from __future__ import annotations

import csv
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from benchmarks import harness
from benchmarks.harness import BenchConfig, Engine, ModelRef, PaddlePeer, Worker, find_paddle
from benchmarks.paddle_export import InputDef, InputKind, PaddleFormat
from benchmarks.paddle_models import Manifest, SetEntry, TensorInfo, read_manifest
from benchmarks.worker_protocol import load_outputs, save_feeds
from tests.timeouts import scaled

ROOT = pathlib.Path(__file__).resolve().parent.parent
PADDLE_PYTHON_ENV = "CINN_PADDLE_PYTHON"


def _entry(name: str, onnx: bool = True, formats: tuple[PaddleFormat, ...] = tuple(PaddleFormat)) -> SetEntry:
    return SetEntry(name, (TensorInfo("x", (1, 3, 8, 8), "float32"),), (TensorInfo("fetch_name_0", (1, 10), "float32"),),
                    f"{name}/inputs.npz", {f: f"{name}/{f.value}/inference{f.suffix}" for f in formats},
                    {f: f"{name}/{f.value}/reference.npz" for f in formats}, f"{name}/model.onnx" if onnx else None,
                    {} if onnx else {"onnx": "paddle2onnx: no converter"})


def _manifest(tmp_path: pathlib.Path, *entries: SetEntry) -> Manifest:
    manifest = Manifest(tmp_path, "3.3.1", "2.1.0", False, entries)
    manifest.write()
    return manifest


def test_manifest_round_trips(tmp_path):
    manifest = _manifest(tmp_path, _entry("a"), _entry("b", onnx=False, formats=(PaddleFormat.PIR,)))
    assert read_manifest(tmp_path) == manifest == read_manifest(tmp_path / "manifest.json")
    assert manifest.entry("b").errors == {"onnx": "paddle2onnx: no converter"} and manifest.entry("c") is None


def test_a_bad_manifest_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match=r"no manifest.json .*benchmarks.paddle_models export"):
        read_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="not a Paddle model set manifest"):
        read_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"version": 99, "models": {}}))
    with pytest.raises(ValueError, match="version 99"):
        read_manifest(tmp_path)


def test_token_inputs_end_in_padding():
    ids = InputDef("ids", (1, 8), (2, 8), InputKind.TOKENS, 50).draw(np.random.default_rng(0))
    assert ids.dtype == np.int64 and (ids[:, :6] >= 1).all() and (ids[:, 6:] == 0).all() and (ids < 50).all()


def test_engines_of_a_set_model():
    """Paddle Inference joins on Paddle models only; a set's model that paddle2onnx could not convert has no ONNX
    peer (cinn's own export of it would be no peer)."""
    config = BenchConfig(paddle=PaddlePeer(sys.executable, "3.3.1"), unfused=False)
    with_onnx = config.model_engines(ModelRef("m/pir/inference.json", "m", "m/inputs.npz", "m/model.onnx", True))
    assert Engine.PADDLE in with_onnx and Engine.ORT in with_onnx
    without = config.model_engines(ModelRef("m/pir/inference.json", "m", "m/inputs.npz", None, True))
    assert Engine.PADDLE in without and Engine.ORT not in without and Engine.OPENVINO not in without
    assert Engine.PADDLE not in config.model_engines(ModelRef("mlp"))
    assert Engine.PADDLE not in BenchConfig().model_engines(ModelRef("m/pir/inference.json"))


def _run_cli(monkeypatch, argv: list[str]) -> tuple[list[ModelRef], BenchConfig]:
    """cinn-bench's parsing of argv, up to the models and config it would run (found: a fake paddle)."""
    from benchmarks import cli

    seen: dict = {}
    monkeypatch.setattr(cli, "find_paddle", lambda python, timeout: PaddlePeer(python, "3.3.1"))

    def run(refs, config):
        seen.update(refs=list(refs), config=config)
        return []

    monkeypatch.setattr(cli, "run_benchmarks", run)
    assert cli.main(argv) == 0
    return seen["refs"], seen["config"]


def test_cli_runs_a_set(tmp_path, monkeypatch, capsys):
    """--paddle-set runs the set's models saved in --paddle-format (all, or those named), fed their inputs, the ONNX
    peers on their paddle2onnx files; other names are built-in models; a model not saved in the format is left out."""
    _manifest(tmp_path, _entry("a"), _entry("b", onnx=False), _entry("c", formats=(PaddleFormat.PIR,)))
    refs, config = _run_cli(monkeypatch, ["--paddle-set", str(tmp_path), "--paddle-python", "py"])
    assert [r.name for r in refs] == ["a", "b", "c"] and config.paddle == PaddlePeer("py", "3.3.1")
    assert refs[0] == ModelRef(str(tmp_path / "a/pir/inference.json"), "a", str(tmp_path / "a/inputs.npz"),
                               str(tmp_path / "a/model.onnx"), paddle_set=True)
    assert refs[1].onnx is None and "b: no onnxruntime or OpenVINO, paddle2onnx failed" in capsys.readouterr().err
    refs, _ = _run_cli(monkeypatch, ["--paddle-set", str(tmp_path), "--paddle-format", "legacy", "c", "a", "mlp"])
    assert [r.name for r in refs] == ["a", "mlp"] and refs[0].model.endswith("a/legacy/inference.pdmodel")
    assert "c: left out, not saved in the legacy format" in capsys.readouterr().err


def test_cli_rejects_a_folder_without_a_set(tmp_path, capsys):
    from benchmarks.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["--paddle-set", str(tmp_path)])
    assert exc.value.code == 2 and f"--paddle-set {tmp_path}: no manifest.json" in capsys.readouterr().err


def _python_without_paddle(tmp_path: pathlib.Path) -> str:
    """A Python interpreter that cannot import paddle (the environment's own, told to ignore site-packages)."""
    script = tmp_path / "bare-python"
    script.write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")
    script.chmod(0o755)
    return str(script)


def test_a_missing_paddle_names_the_extra(tmp_path, capsys):
    """With --paddle-set, a Python without paddle is a usage error saying how to install it, not a traceback."""
    from benchmarks.cli import main

    _manifest(tmp_path, _entry("a"))
    python = _python_without_paddle(tmp_path)
    with pytest.raises(ValueError, match=r"no paddle there .*pip install cinn\[paddle\]"):
        find_paddle(python, scaled(60))
    with pytest.raises(SystemExit) as exc:
        main(["--paddle-set", str(tmp_path), "--paddle-python", python])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "pip install cinn[paddle]" in err and "Traceback" not in err


# a Paddle worker whose runner is a fake: paddle itself is not needed; the worker must not import cinn
_FAKE_PADDLE_WORKER = """
import sys
import numpy as np
from benchmarks import paddle_worker

class Fake:
    def __init__(self, model, threads):
        assert not [m for m in sys.modules if m.split(".")[0] in ("cinn", "frontend", "tvm")], "imported cinn"
        self.model = model

    def run(self, feeds):
        return [feeds["x"] * 2, np.array([len(self.model)])]

sys.exit(paddle_worker.main(sys.argv[1:], runner=Fake))
"""


def test_the_paddle_worker_speaks_the_protocol(tmp_path, monkeypatch):
    """The parent starts Paddle Inference's worker in the --paddle-python interpreter with this benchmarks package on
    its path alone; it reports ready, saves a first run's outputs and times a round per request."""
    model = tmp_path / "inference.json"
    model.write_text("{}")
    feeds = tmp_path / "feeds.npz"
    save_feeds(str(feeds), {"x": np.arange(3, dtype=np.float32)})
    monkeypatch.setattr(PaddlePeer, "command", lambda self: [self.python, "-P", "-c", _FAKE_PADDLE_WORKER])
    config = BenchConfig(paddle=PaddlePeer(sys.executable, "fake"), repeat=2, warmup=0, timeout=scaled(60))
    out = tmp_path / "out.npz"
    with Worker(Engine.PADDLE, ModelRef(str(model), feeds=str(feeds)), config, str(out)) as worker:
        assert worker.facts == {}
        assert worker.time_round() >= 0 and worker.time_round() >= 0
    doubled, length = load_outputs(str(out))
    assert doubled.tolist() == [0, 2, 4] and length.tolist() == [len(str(model))]


def test_a_failing_paddle_worker_is_one_line(tmp_path):
    """A model Paddle Inference cannot load is the engine's failure, told in one line."""
    feeds = tmp_path / "feeds.npz"
    save_feeds(str(feeds), {"x": np.zeros(1, np.float32)})
    proc = subprocess.run([sys.executable, "-m", "benchmarks.paddle_worker", str(tmp_path / "missing.json"), "--feeds",
                           str(feeds)], capture_output=True, text=True, input="", cwd=ROOT)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1].startswith(f"[cinn-bench] {tmp_path / 'missing.json'}: paddle-inference:")


def test_paddle_inference_is_the_reference(monkeypatch):
    """On a Paddle model every engine, onnxruntime too, is checked against Paddle Inference's outputs."""
    outputs = {Engine.FUSED: 1.0, Engine.ORT: 1.5, Engine.PADDLE: 1.0}

    class FakeWorker:
        def __init__(self, engine, model, config, path):
            np.savez(path, np.full(2, outputs[engine], np.float32))
            self.facts = {}

        def time_round(self):
            return 1.0

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

    monkeypatch.setattr(harness, "Worker", FakeWorker)
    monkeypatch.setattr(BenchConfig, "model_engines", lambda self, model: tuple(outputs))
    result = harness.bench_model(ModelRef("m/pir/inference.json", "m", "m/inputs.npz", "m/model.onnx", True),
                                 BenchConfig(paddle=PaddlePeer(sys.executable, "3.3.1")))
    assert {c.engine: c.ok for c in result.checks} == {Engine.FUSED: True, Engine.ORT: False}
    assert result.model == "m" and result.best_peer_ms() == 1.0


@pytest.fixture(scope="module")
def paddle_python() -> str:
    """A Python with paddle: $CINN_PADDLE_PYTHON, else this one; the test is skipped where it has none."""
    python = os.environ.get(PADDLE_PYTHON_ENV, sys.executable)
    try:
        find_paddle(python, scaled(120))
    except ValueError as err:
        pytest.skip(f"no paddle ({err})")
    return python


@pytest.mark.paddle
@pytest.mark.slow
def test_a_tiny_set_exports_and_benches(paddle_python, tmp_path, tmp_cache, monkeypatch, capsys):
    """squeezenet at 64x64, saved in both formats with Paddle Inference's references and paddle2onnx's file, then
    benchmarked: cinn, onnxruntime and OpenVINO agree with Paddle Inference."""
    from benchmarks.cli import main

    env = dict(os.environ, PYTHONPATH=str(ROOT))  # the checkout's benchmarks package, where cinn is not installed
    proc = subprocess.run([paddle_python, "-m", "benchmarks.paddle_models", "export", str(tmp_path / "set"),
                           "squeezenet1_1", "--small"], env=env, capture_output=True, text=True, timeout=scaled(600))
    assert proc.returncode == 0, proc.stderr[-3000:]
    entry = read_manifest(tmp_path / "set").entry("squeezenet1_1")
    assert entry is not None and set(entry.models) == set(PaddleFormat) and entry.onnx, entry.errors
    monkeypatch.setenv("CINN_CACHE_DIR", str(tmp_cache))
    csv_path = tmp_path / "bench.csv"
    rc = main(["--paddle-set", str(tmp_path / "set"), "--paddle-python", paddle_python, "--repeat", "1", "--warmup",
               "0", "--no-unfused", "--csv", str(csv_path)])
    assert rc == 0, capsys.readouterr().err[-3000:]
    with open(csv_path) as f:
        (row,) = list(csv.DictReader(f))
    assert row["model"] == "squeezenet1_1" and row["check"] == "ok"
    assert float(row["Paddle ms"]) > 0 and float(row["fused ms"]) > 0 and float(row["ORT ms"]) > 0
