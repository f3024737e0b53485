"""Benchmark harness: ONNX export of the built-in models agrees with cinn; the CLI runs end to end."""
from __future__ import annotations

import csv
import importlib.util
import io
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import cinn
from autotune.database import Record
from benchmarks.harness import (
    ATOL,
    ONNX_PEERS,
    RTOL,
    Baseline,
    BenchConfig,
    Engine,
    EngineResult,
    ModelRef,
    ModelResult,
    compare,
    ort_session,
    run_worker,
)
from benchmarks.onnx_export import CONVERTERS, IR_VERSION, to_onnx
from benchmarks.report import format_table
from cinn.core.target import parse_target
from frontend import NetBuilder
from frontend.zoo import MODELS, get_model
from tests.timeouts import scaled

pytest.importorskip("onnxruntime")


@pytest.mark.parametrize("name", list(MODELS))
def test_onnx_export_matches_cinn(name, tmp_cache):
    model = get_model(name, small=True)
    onnx_model = to_onnx(model.program)
    assert onnx_model.ir_version == IR_VERSION
    want = cinn.compile(model.program, cache_dir=tmp_cache).run(dict(model.feeds))
    got = ort_session(onnx_model).run(None, dict(model.feeds))
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL)


def _attr_variants() -> tuple:
    """A program using the attribute variants the built-in models do not: trans_x, tanh gelu, SAME/4-value pads..."""
    rng = np.random.default_rng(1)
    b = NetBuilder("variants")
    x = b.create_input("float32", (2, 3, 4), "x")
    w = b.create_constant(rng.standard_normal((2, 5, 3), dtype=np.float32), "w")
    y = b.matmul(x, w, trans_x=True, trans_y=True, alpha=0.5)  # (2, 4, 5)
    y = b.scale(b.gelu(y, approximate=True), scale=2.0, bias=0.1, bias_after_scale=False)
    img = b.create_input("float32", (1, 2, 7, 7), "img")
    k = b.create_constant(rng.standard_normal((4, 1, 3, 3), dtype=np.float32), "k")
    c1 = b.conv2d(img, k, strides=[2, 2], paddings=[0, 1, 2, 1], dilations=[1, 1], groups=2)
    c2 = b.conv2d(img, k, strides=[2, 2], groups=2, padding_algorithm="SAME")
    z = b.log_softmax(b.reshape(y, [8, 5]), axes=[0])
    feeds = {"x": rng.standard_normal((2, 3, 4), dtype=np.float32), "img": rng.standard_normal((1, 2, 7, 7), dtype=np.float32)}
    return b.build([z, c1, c2]), feeds


def test_export_attribute_variants(tmp_cache):
    program, feeds = _attr_variants()
    want = cinn.compile(program, cache_dir=tmp_cache).run(feeds)
    got = ort_session(to_onnx(program)).run(None, feeds)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL)


def test_export_unsupported_op_names_it():
    b = NetBuilder("unsupported")
    x = b.create_input("float32", (2, 3), "x")
    y = b.topk(x, k=2)[0]
    assert "topk" not in CONVERTERS
    with pytest.raises(NotImplementedError, match="'topk'"):
        to_onnx(b.build([y]))


def test_unknown_model_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown model 'nope'"):
        get_model("nope")


def test_compare_flags_mismatch():
    a = np.ones((2, 2), np.float32)
    assert compare(Engine.FUSED, [a], [a + 1e-5]).ok
    bad = compare(Engine.FUSED, [a], [a + 0.1])
    assert not bad.ok and bad.max_abs_err == pytest.approx(0.1, rel=1e-3)
    assert not compare(Engine.FUSED, [a], [a[:1]]).ok


def test_quantized_models_are_compared_by_mean_error(tmp_path):
    """A quantized model's engines may round an intermediate to the neighbouring step: a few large differences pass,
    a shifted output does not."""
    want = np.linspace(-6, 6, 1000).astype(np.float32)
    flipped = want.copy()
    flipped[::100] += 0.14
    assert not compare(Engine.FUSED, [flipped], [want]).ok and compare(Engine.FUSED, [flipped], [want], True).ok
    assert not compare(Engine.FUSED, [want + 0.1], [want], True).ok
    import onnx
    from onnx import TensorProto, helper

    from benchmarks.harness import is_quantized
    from tests.test_onnx_import import make_model

    f32, u8 = TensorProto.FLOAT, TensorProto.UINT8
    q = make_model([helper.make_node("QuantizeLinear", ["x", "s"], ["y"])], [("x", f32, (2,))], [("y", u8, (2,))],
                   [("s", np.float32(0.1))])
    onnx.save(q, tmp_path / "q.onnx")
    onnx.save(make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", f32, (2,))], [("y", f32, (2,))]),
              tmp_path / "f.onnx")
    assert is_quantized(str(tmp_path / "q.onnx")) and not is_quantized(str(tmp_path / "f.onnx"))
    assert not is_quantized("bert_base")


def test_table_shows_ratios_and_failures():
    res = {
        Engine.FUSED: EngineResult(Engine.FUSED, "m", 1.0, 2, 3, 0.5, 0.1),
        Engine.UNFUSED: EngineResult(Engine.UNFUSED, "m", 2.0, 2),
        Engine.TUNED: EngineResult(Engine.TUNED, "m", 0.8, 2, 3),
        Engine.ORT: EngineResult(Engine.ORT, "m", 4.0, 2),
        Engine.OPENVINO: EngineResult(Engine.OPENVINO, "m", 3.2, 2),
    }
    table = format_table([ModelResult("m", res), ModelResult("n", {}, errors={Engine.ORT: "boom"})], tuned=True)
    header, _, row, failed = table.splitlines()
    assert "tuned ms" in header and "ORT/fused" in header and "tuned speed-up vs fused" in header and "ORT/tuned" in header
    assert "2.00x" in row and "4.00x" in row and "1.25x" in row and "5.00x" in row
    assert "OpenVINO ms" in header and "fused/best peer" in header and "tuned/best peer" in header
    assert "0.31x" in row and "0.25x" in row  # 1.0 / 3.2 and 0.8 / 3.2: over the faster peer
    assert "FAILED: onnxruntime" in failed
    assert "tuned" not in format_table([ModelResult("m", res)], tuned=False)


def _unknown_workload_log(path) -> str:
    """A schedule log whose only record is for a workload no model has: the tuned build falls back to default schedules."""
    rec = Record("00000000deadbeef", str(parse_target("llvm")), json.dumps([[], []]), (1e-3,))
    path.write_text(rec.to_json() + "\n")
    return str(path)


def test_tuned_engine_with_unknown_workload_log_matches_fused(tmp_path, tmp_cache, monkeypatch):
    monkeypatch.setenv("TVM_NUM_THREADS", "1")  # run_worker sets it when unset; keep it out of other tests
    model = get_model("mlp", small=True)
    config = BenchConfig(tuning_log=_unknown_workload_log(tmp_path / "log.jsonl"), small=True, repeat=1, warmup=0)
    outputs = tmp_path / "tuned.npz"
    result = run_worker(Engine.TUNED, "mlp", config, str(outputs))
    fused = cinn.compile(model.program, cache_dir=tmp_cache)
    assert result.engine is Engine.TUNED and result.median_ms > 0 and result.num_kernels == fused.num_kernels
    with np.load(outputs) as got:
        np.testing.assert_allclose(got["arr_0"], fused.run(dict(model.feeds))[0], rtol=RTOL, atol=ATOL)


def test_cli_rejects_missing_log(tmp_path, capsys):
    from benchmarks.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["mlp", "--log", str(tmp_path / "missing.jsonl")])
    assert exc.value.code == 2
    assert "no such schedule log" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_end_to_end(tmp_path, tmp_cache, monkeypatch, capsys):
    from benchmarks.cli import main

    monkeypatch.setenv("CINN_CACHE_DIR", str(tmp_cache))
    csv_path, png_path = tmp_path / "out" / "bench.csv", tmp_path / "out" / "bench.png"
    log = _unknown_workload_log(tmp_path / "log.jsonl")
    rc = main(["mlp", "--small", "--repeat", "2", "--warmup", "1", "--log", log, "--csv", str(csv_path), "--plot", str(png_path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "mlp" in out and "ORT/fused" in out and "ORT/tuned" in out
    with open(csv_path) as f:
        rows = list(csv.DictReader(f))
    assert [r["model"] for r in rows] == ["mlp"]
    assert float(rows[0]["fused ms"]) > 0 and float(rows[0]["tuned ms"]) > 0 and float(rows[0]["ORT ms"]) > 0
    assert rows[0]["check"] == "ok"
    assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_rejects_unknown_model(capsys):
    from benchmarks.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["nope"])
    assert exc.value.code != 0
    assert "unknown model" in capsys.readouterr().err


def test_cuda_target_without_a_gpu_fails_clearly(tmp_cache, monkeypatch, capfd):
    """cinn-bench --target cuda builds the CUDA kernels, then each engine says in one line why it cannot run here."""
    from benchmarks.cli import main
    from cinn.runtime.cuda_module import device_present

    if device_present():
        pytest.skip("a GPU is present: the gpu-marked tests run cinn-bench --target cuda")
    monkeypatch.setenv("CINN_CACHE_DIR", str(tmp_cache))
    assert main(["mlp", "--small", "--target", "cuda", "--repeat", "1", "--warmup", "0"]) == 1
    err = capfd.readouterr().err  # the workers' stderr too
    assert "cinn-fused: no CUDA device present" in err and "Traceback" not in err


def _onnx_file(path) -> str:
    """A small ONNX model with a symbolic batch dim, written as a file: relu(x @ w + b)."""
    import onnx
    from onnx import helper

    from tests.test_onnx_import import F32, make_model

    rng = np.random.default_rng(2)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["z"]),
             helper.make_node("Relu", ["z"], ["y"])]
    inits = [("w", rng.standard_normal((16, 8)).astype(np.float32)), ("b", rng.standard_normal(8).astype(np.float32))]
    onnx.save(make_model(nodes, [("x", F32, ("batch", 16))], [("y", F32, ("batch", 8))], inits), str(path))
    return str(path)


def test_model_file_engines_agree(tmp_path, monkeypatch):
    """A model file runs on cinn and, as the file itself, on onnxruntime, with the same seeded inputs."""
    monkeypatch.setenv("TVM_NUM_THREADS", "1")
    path = _onnx_file(tmp_path / "tiny.onnx")
    config = BenchConfig(repeat=1, warmup=0, input_shapes=(("x", (4, 16)),))
    model = get_model(path, input_shapes={"x": (4, 16)})
    assert model.name == "tiny" and model.onnx_path == path and model.feeds["x"].shape == (4, 16)
    engines = [Engine.FUSED, Engine.ORT] + ([Engine.OPENVINO] if importlib.util.find_spec("openvino") else [])
    outs = {e: tmp_path / f"{e.value}.npz" for e in engines}
    for engine, out in outs.items():
        assert run_worker(engine, path, config, str(out)).model == "tiny"
    for engine in engines[:1] + engines[2:]:
        with np.load(outs[engine]) as got, np.load(outs[Engine.ORT]) as want:
            np.testing.assert_allclose(got["arr_0"], want["arr_0"], rtol=RTOL, atol=ATOL)


def test_cli_runs_a_model_file(tmp_path, tmp_cache, monkeypatch, capsys):
    from benchmarks.cli import main

    monkeypatch.setenv("CINN_CACHE_DIR", str(tmp_cache))
    path = _onnx_file(tmp_path / "tiny.onnx")
    csv_path = tmp_path / "bench.csv"
    assert main([path, "--input-shape", "x=2,16", "--repeat", "2", "--warmup", "0", "--csv", str(csv_path)]) == 0
    with open(csv_path) as f:
        (row,) = list(csv.DictReader(f))
    assert row["model"] == "tiny" and row["check"] == "ok" and float(row["ORT ms"]) > 0


def test_cli_rejects_a_missing_model_file(tmp_path, capsys):
    from benchmarks.cli import main

    with pytest.raises(SystemExit) as exc:
        main([str(tmp_path / "missing.onnx")])
    assert exc.value.code == 2
    assert "no such model file" in capsys.readouterr().err


def test_latency_is_timed_after_the_settling_runs():
    """median_seconds keeps running untimed for settle_s before it times: right after a compile the cores are slow."""
    from cinn.core.utils import median_seconds

    calls = []
    start = time.perf_counter()  # the settling is counted from the call, not from its first run (a VM can stall between)
    median_seconds(lambda: calls.append(time.perf_counter()), repeat=3, warmup=1, settle_s=0.05)
    assert len(calls) > 4 and calls[-4] - start >= 0.05


def test_rounds_interleave_the_engines_and_report_the_median_round(monkeypatch):
    """Each engine's worker is started once; the rounds visit the engines in a rotating order, and the median over
    rounds is reported next to the median of the per-round ratios."""
    from benchmarks import harness

    started: list[Engine] = []
    calls: list[Engine] = []
    times = {Engine.FUSED: iter([5.0, 2.0, 3.0]), Engine.ORT: iter([8.0, 4.0, 7.0])}  # round 2: a fast stretch

    class FakeWorker:
        def __init__(self, engine, model, config, path):
            started.append(engine)
            np.savez(path, np.ones(2, np.float32))
            self.engine, self.facts = engine, {"num_kernels": 1} if engine is Engine.FUSED else {}

        def time_round(self):
            calls.append(self.engine)
            return next(times[self.engine])

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

    monkeypatch.setattr(harness, "Worker", FakeWorker)
    monkeypatch.setattr(BenchConfig, "engines", lambda self: (Engine.FUSED, Engine.ORT))
    result = harness.bench_model("mlp", BenchConfig(repeat=4, rounds=3))
    assert started == [Engine.FUSED, Engine.ORT]
    assert calls == [Engine.FUSED, Engine.ORT, Engine.ORT, Engine.FUSED, Engine.FUSED, Engine.ORT]
    assert result.ms(Engine.FUSED) == 3.0 and result.ms(Engine.ORT) == 7.0
    assert result.results[Engine.FUSED].rounds_ms == (5.0, 2.0, 3.0) and result.results[Engine.FUSED].num_kernels == 1
    assert result.results[Engine.FUSED].runs == 12 and not result.failed
    assert result.paired_vs_best_peer(Engine.FUSED) == pytest.approx(0.5)  # median of 5/8, 2/4, 3/7


def test_paired_ratio_takes_the_faster_peer_of_each_round():
    res = {Engine.FUSED: EngineResult(Engine.FUSED, "m", 2.0, 2, rounds_ms=(2.0, 4.0)),
           Engine.ORT: EngineResult(Engine.ORT, "m", 3.0, 2, rounds_ms=(2.0, 5.0)),
           Engine.OPENVINO: EngineResult(Engine.OPENVINO, "m", 3.0, 2, rounds_ms=(4.0, 4.0))}
    assert ModelResult("m", res).paired_vs_best_peer(Engine.FUSED) == pytest.approx(1.0)  # 2/2, 4/4
    assert ModelResult("m", {Engine.FUSED: res[Engine.FUSED]}).paired_vs_best_peer(Engine.FUSED) is None


def test_paired_ratio_to_an_engine_takes_each_round():
    res = {Engine.FUSED: EngineResult(Engine.FUSED, "m", 2.0, 2, rounds_ms=(2.0, 3.0, 9.0)),
           Engine.BASELINE: EngineResult(Engine.BASELINE, "m", 2.0, 2, rounds_ms=(1.0, 3.0, 10.0))}
    assert ModelResult("m", res).paired(Engine.FUSED, Engine.BASELINE) == pytest.approx(1.0)  # median of 2, 1, 0.9
    assert ModelResult("m", res).paired(Engine.FUSED, Engine.ORT) is None


def test_table_shows_the_baseline_when_given():
    res = {e: EngineResult(e, "m", ms, 2, rounds_ms=(ms,)) for e, ms in
           ((Engine.FUSED, 1.0), (Engine.BASELINE, 1.25), (Engine.UNFUSED, 2.0), (Engine.ORT, 4.0))}
    header, _, row = format_table([ModelResult("m", res)], tuned=False, baseline=True).splitlines()
    assert "baseline ms" in header and "baseline/best peer paired" in header and "0.800x" in row  # fused/baseline
    assert "baseline" not in format_table([ModelResult("m", res)], tuned=False)


def test_engines_follow_the_options():
    baseline = Baseline(sys.executable, os.path.dirname(cinn.__file__), "benchmarks.harness")
    engines = BenchConfig(baseline=baseline, unfused=False).engines()
    assert engines[:2] == (Engine.FUSED, Engine.BASELINE) and Engine.UNFUSED not in engines
    assert Engine.UNFUSED in BenchConfig().engines() and Engine.BASELINE not in BenchConfig().engines()


def test_a_cinn_program_file_runs_in_cinn_alone():
    """A .cinn program (cinn-quantize's) has no ONNX file for the peers to run: they are left out, not failed."""
    engines = BenchConfig().model_engines(ModelRef("model_int8.cinn"))
    assert Engine.FUSED in engines and not set(engines) & set(ONNX_PEERS)
    assert Engine.ORT in BenchConfig().model_engines(ModelRef("model.onnx"))


def test_cli_rejects_a_baseline_without_cinn(tmp_path, capsys):
    from benchmarks.cli import main

    for python, why in ((str(tmp_path / "python"), "no such Python interpreter"), ("/bin/true", "not a Python"),
                        (_python_without_cinn(tmp_path), "no cinn there")):
        with pytest.raises(SystemExit) as exc:
            main(["mlp", "--small", "--baseline", python])
        assert exc.value.code == 2
        assert f"--baseline {python}: {why}" in capsys.readouterr().err


def _python_without_cinn(tmp_path) -> str:
    """A Python interpreter that cannot import cinn (the environment's own, told to ignore site-packages)."""
    script = tmp_path / "bare-python"
    script.write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")
    script.chmod(0o755)
    return str(script)


def test_cli_times_a_baseline_install(tmp_path, tmp_cache, monkeypatch, capsys):
    """--baseline PYTHON times that interpreter's cinn as one more engine (here: this one's own) and reports this cinn's
    ratio to it, round by round."""
    from benchmarks.cli import main

    monkeypatch.setenv("CINN_CACHE_DIR", str(tmp_cache))
    monkeypatch.setattr(BenchConfig, "engines", lambda self: (Engine.FUSED, Engine.BASELINE, Engine.ORT))
    csv_path = tmp_path / "bench.csv"
    rc = main(["mlp", "--small", "--repeat", "1", "--warmup", "0", "--rounds", "2", "--baseline", sys.executable,
               "--csv", str(csv_path)])
    captured = capsys.readouterr()
    assert rc == 0, captured.out
    assert f"cinn@baseline: the cinn in {os.path.dirname(cinn.__file__)}" in captured.err
    with open(csv_path) as f:
        (row,) = list(csv.DictReader(f))
    assert float(row["baseline ms"]) > 0 and float(row["fused/baseline paired"]) > 0 and row["check"] == "ok"


def test_a_worker_times_a_round_per_command():
    from benchmarks.worker_protocol import serve

    runs: list[int] = []
    replies = io.StringIO()
    serve(lambda: runs.append(1) or [], 3, 1, io.StringIO("time\ntime\n"), replies)
    lines = replies.getvalue().splitlines()
    assert len(lines) == 2 and all(json.loads(line)["ms"] >= 0 for line in lines) and len(runs) >= 8


def test_a_worker_past_the_timeout_is_killed(tmp_path, monkeypatch):
    from benchmarks import harness

    popen = subprocess.Popen
    monkeypatch.setattr(harness.subprocess, "Popen",
                        lambda args, **kw: popen([sys.executable, "-c", "import time; time.sleep(60)"], **kw))
    started = time.perf_counter()
    with pytest.raises(subprocess.TimeoutExpired):
        harness.Worker(Engine.ORT, "mlp", BenchConfig(timeout=0.5), str(tmp_path / "out.npz"))
    assert time.perf_counter() - started < scaled(10)


def test_a_worker_that_dies_is_an_engine_failure(tmp_path):
    from benchmarks.harness import Worker

    with pytest.raises(RuntimeError, match="onnxruntime worker exited with status"):
        Worker(Engine.ORT, str(tmp_path / "missing.onnx"), BenchConfig(timeout=scaled(60)), str(tmp_path / "out.npz"))


@pytest.mark.parametrize("name", ["layernorm_gelu", "encoder"])
def test_exported_models_have_no_unread_initializers(name):
    # onnxruntime warns about every initializer no node reads (hundreds of lines in the demo's BERT and GPT-2 runs)
    graph = to_onnx(get_model(name, small=True).program).graph
    read = {i for node in graph.node for i in node.input}
    assert [t.name for t in graph.initializer if t.name not in read] == []
