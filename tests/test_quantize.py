"""cinn.quantize: the calibration methods' ranges by hand, quantized CNNs and MLPs against float32 and in the integer
kernels, onnxruntime's quantizer as a peer, the program file and cinn-quantize."""
from __future__ import annotations

import dataclasses
import math
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import cinn
from cinn.core.ir import Program
from cinn.core.ir_json import DecodeError, load_program, save_program
from cinn.core.target import parse_target
from cinn.facade import quantize_cli
from cinn.facade.command import ExitStatus
from cinn.facade.quant_calibration import (
    BINS,
    CalibrationMethod,
    RangeCollector,
    activation_params,
    weight_params,
)
from cinn.facade.quant_sensitivity import FloatLayer, choose_float_layers
from cinn.facade.quantize import (
    AccuracyReport,
    FeedSetError,
    OpKind,
    OutputError,
    QuantizePolicy,
    bias_shift,
    quantize,
)
from tests.test_onnx_import import make_model

RNG = np.random.default_rng(53)
F32 = TensorProto.FLOAT
TOLERANCE = 3e-2  # relative L2 error of the quantized outputs against float32 on held-back feeds
VNNI = parse_target("llvm").has_vnni


def _collected(data: np.ndarray, method: CalibrationMethod, percentile: float = 99.0):
    c = RangeCollector()
    for chunk in np.array_split(data, 4):  # several feeds
        c.observe_range(chunk)
    if method is not CalibrationMethod.MINMAX:
        for chunk in np.array_split(data, 4):
            c.observe_histogram(chunk)
    return c.params(method, percentile)


def test_minmax_is_the_range_widened_to_zero():
    p = _collected(np.array([-1.0, 0.5, 3.0, 2.0], np.float32), CalibrationMethod.MINMAX)
    assert p.scale == pytest.approx(4 / 255, rel=1e-6) and p.zero_point == 64  # round(1 / (4 / 255)) = round(63.75)
    positive = _collected(np.array([0.5, 2.0], np.float32), CalibrationMethod.MINMAX)
    assert positive.scale == pytest.approx(2 / 255, rel=1e-6) and positive.zero_point == 0
    assert activation_params(0.0, 0.0).scale == 1.0  # an all-zero tensor


def test_percentile_cuts_half_the_rest_at_each_end():
    width = 100 / BINS  # a bin of the histogram over [0, 100)
    p = _collected(np.arange(100_000, dtype=np.float32) / 1000, CalibrationMethod.PERCENTILE, 99.0)
    assert p.zero_point == 0 and abs(p.scale * 255 - 99.5) <= width  # [0.5, 99.5] widened to 0: [0, 99.5]
    symmetric = _collected(np.linspace(-50, 50, 100_001, dtype=np.float32), CalibrationMethod.PERCENTILE, 98.0)
    assert abs(symmetric.scale * 255 - 98) <= 2 * width and symmetric.zero_point in (127, 128)  # [-49, 49]


def test_entropy_keeps_a_uniform_range_and_clips_rare_outliers():
    uniform = _collected(RNG.uniform(0, 1, 100_000).astype(np.float32), CalibrationMethod.ENTROPY)
    assert uniform.scale == pytest.approx(1 / 255, rel=0.05)
    values = np.maximum(RNG.standard_normal(100_000), 0).astype(np.float32)
    values[0] = 100.0  # one outlier: minmax spends the whole range on it
    assert _collected(values, CalibrationMethod.MINMAX).scale == pytest.approx(100 / 255)
    assert 2 / 255 < _collected(values, CalibrationMethod.ENTROPY).scale < 8 / 255  # the normal's values end near 4


def test_weights_are_symmetric_int8_per_output_channel():
    w = np.array([[0.5, -1.27, 0.3], [2.54, 0.0, -1.0], [0.0, 0.0, 0.0]], np.float32)
    p = weight_params(w)
    np.testing.assert_allclose(p.scale, [0.01, 0.02, 1.0], rtol=1e-6)
    np.testing.assert_array_equal(p.values, [[50, -127, 30], [127, 0, -50], [0, 0, 0]])
    assert p.values.dtype == np.int8


def test_bias_correction_undoes_the_rounding_on_the_mean_input():
    b = cinn.NetBuilder("one")
    x = b.create_input("float32", (1, 2, 3, 3), "x")
    conv = b.conv2d(x, b.create_constant(np.zeros((1, 2, 1, 1), np.float32), "w"))
    node = b.build([conv]).nodes[-1]
    w = np.array([[[[0.5]], [[0.25]]]], np.float32)
    rounded = np.array([[[[0.5]], [[0.3]]]], np.float32)  # channel 1's weight rounded up by 0.05
    np.testing.assert_allclose(bias_shift(node, w, rounded, np.array([1.0, 2.0])), [[[-0.1]]], rtol=1e-6)
    assert bias_shift(node, w, rounded, None) is None and bias_shift(node, w, rounded, np.ones(3)) is None


def _cnn() -> Program:
    """conv 3->16 (3x3) + relu, conv 16->32 (3x3, stride 2) + relu, flatten, matmul -> 10."""
    b = cinn.NetBuilder("cnn")
    x = b.create_input("float32", (1, 3, 16, 16), "x")
    w1 = b.create_constant((RNG.standard_normal((16, 3, 3, 3)) * 0.3).astype(np.float32), "w1")
    w2 = b.create_constant((RNG.standard_normal((32, 16, 3, 3)) * 0.1).astype(np.float32), "w2")
    h = b.relu(b.conv2d(x, w1, paddings=[1, 1]))
    h = b.relu(b.conv2d(h, w2, paddings=[1, 1], strides=[2, 2]))
    w3 = b.create_constant((RNG.standard_normal((32 * 8 * 8, 10)) * 0.05).astype(np.float32), "w3")
    return b.build([b.matmul(b.reshape(h, [1, 32 * 8 * 8]), w3)])


def _mlp() -> Program:
    """x @ w1 + b1 -> relu -> @ w2 (transposed) + b2, over 8 rows."""
    b = cinn.NetBuilder("mlp")
    x = b.create_input("float32", (8, 64), "x")
    w1 = b.create_constant((RNG.standard_normal((64, 128)) * 0.2).astype(np.float32), "w1")
    b1 = b.create_constant(RNG.standard_normal(128).astype(np.float32), "b1")
    w2 = b.create_constant((RNG.standard_normal((32, 128)) * 0.1).astype(np.float32), "w2")
    h = b.relu(b.add(b.matmul(x, w1), b1))
    return b.build([b.add(b.matmul(h, w2, trans_y=True), b.create_constant(RNG.standard_normal(32).astype(np.float32)))])


def _feeds(program: Program, count: int) -> list[dict[str, np.ndarray]]:
    return [{v.name: RNG.standard_normal(v.shape).astype(np.float32) for v in program.inputs} for _ in range(count)]


def _check_quantized(program: Program, integer_op: str, tmp_cache, method=CalibrationMethod.MINMAX) -> None:
    """Quantized on 16 feeds: within TOLERANCE of float32 on 4 others, in the integer kernels, and not constant."""
    held_back = _feeds(program, 4)
    result = quantize(program, _feeds(program, 16), method, held_back_feeds=held_back, cache_dir=tmp_cache)
    assert result.report.worst("held-back") <= TOLERANCE, str(result.report)
    assert [s.name for s in result.report.sets] == ["calibration", "held-back"]
    assert "held-back" in str(result.report) and "rel. L2 error" in str(result.report)
    exe = cinn.compile(result.program, cache_dir=tmp_cache)
    if VNNI:
        assert integer_op in {n.op for n in exe.program.nodes}
    # an output that ignored its input could still be near float32's (a bias): the error must be far below how much
    # the float outputs of two inputs differ
    floats = cinn.compile(program, cache_dir=tmp_cache)
    (want, other), (got,) = (floats.run(f)[0] for f in held_back[:2]), exe.run(held_back[0])
    assert np.linalg.norm(got - want) <= min(TOLERANCE * np.linalg.norm(want), 0.2 * np.linalg.norm(other - want))


@pytest.mark.parametrize("method", list(CalibrationMethod))
def test_a_small_cnn_quantizes_into_the_integer_convs(method, tmp_cache):
    _check_quantized(_cnn(), "conv2d_u8i8", tmp_cache, method)


def test_a_small_mlp_quantizes_into_the_integer_matmuls(tmp_cache):
    _check_quantized(_mlp(), "matmul_u8i8", tmp_cache)


def test_the_policy_excludes_op_kinds_and_named_nodes(tmp_cache):
    program = _cnn()
    feeds = _feeds(program, 4)
    convs_only = quantize(program, feeds, policy=QuantizePolicy(frozenset({OpKind.CONV})), cache_dir=tmp_cache)
    assert convs_only.report.quantized_ops == 2
    first_conv = next(n for n in program.nodes if n.op == "conv2d").outputs[0].name
    one_less = quantize(program, feeds, policy=QuantizePolicy(exclude_nodes=frozenset({first_conv})),
                        cache_dir=tmp_cache)
    assert one_less.report.quantized_ops == 2 and "x" not in one_less.activations
    corrected = quantize(program, feeds, cache_dir=tmp_cache)
    assert len(corrected.report.sets) == 2  # one feed of 4 held back
    assert sum("bias_correction" in name for name in corrected.program.constants) == 3
    plain = quantize(program, feeds, bias_correction=False, cache_dir=tmp_cache).program
    assert not any("bias_correction" in name for name in plain.constants)


def test_bad_feeds_are_refused_by_name():
    program = _mlp()
    with pytest.raises(ValueError, match="no array for input 'x'"):
        quantize(program, [{"y": np.zeros((8, 64), np.float32)}])
    with pytest.raises(ValueError, match=r"has shape \(8, 63\)"):
        quantize(program, [{"x": np.zeros((8, 63), np.float32)}])
    with pytest.raises(ValueError, match="no calibration feeds"):
        quantize(program, [])


def _onnx_cnn() -> onnx.ModelProto:
    """conv 3->16 + relu, conv 16->32 (stride 2) + relu, global average pool, flatten, gemm 32->10."""
    w = lambda *shape, s=0.3: (RNG.standard_normal(shape) * s).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Relu", ["c2"], ["r2"]), helper.make_node("GlobalAveragePool", ["r2"], ["p"]),
             helper.make_node("Flatten", ["p"], ["f"]), helper.make_node("Gemm", ["f", "w3", "b3"], ["y"], transB=1)]
    inits = [("w1", w(16, 3, 3, 3)), ("b1", w(16, s=0.05)), ("w2", w(32, 16, 3, 3, s=0.1)), ("b2", w(32, s=0.05)),
             ("w3", w(10, 32)), ("b3", w(10, s=0.05))]
    return make_model(nodes, [("x", F32, (1, 3, 16, 16))], [("y", F32, (1, 10))], inits, opset=17)


def test_a_model_from_onnx_quantizes(tmp_cache):
    _check_quantized(cinn.load_onnx(_onnx_cnn()), "conv2d_u8i8", tmp_cache)


def test_minmax_scales_match_onnxruntimes_quantizer(tmp_path, tmp_cache):
    quantization = pytest.importorskip("onnxruntime.quantization")
    model = _onnx_cnn()
    onnx.save(model, tmp_path / "m.onnx")
    feeds = _feeds(cinn.load_onnx(model), 8)

    class Reader(quantization.CalibrationDataReader):
        def __init__(self):
            self._feeds = iter(feeds)

        def get_next(self):
            return next(self._feeds, None)

    quantization.quantize_static(str(tmp_path / "m.onnx"), str(tmp_path / "q.onnx"), Reader(),
                                 quant_format=quantization.QuantFormat.QDQ, per_channel=True,
                                 activation_type=quantization.QuantType.QUInt8, weight_type=quantization.QuantType.QInt8,
                                 calibrate_method=quantization.CalibrationMethod.MinMax)
    qdq = onnx.load(tmp_path / "q.onnx")
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in qdq.graph.initializer}
    dequantizer = {n.output[0]: n for n in qdq.graph.node if n.op_type == "DequantizeLinear"}
    theirs = [(float(inits[d.input[1]]), int(inits[d.input[2]]))
              for n in qdq.graph.node if n.op_type in ("Conv", "Gemm") for d in [dequantizer[n.input[0]]]]
    ours = quantize(cinn.load_onnx(model), feeds, held_back_feeds=[], cache_dir=tmp_cache).activations.values()
    assert len(theirs) == 3
    for (scale, zero), p in zip(theirs, ours, strict=True):
        assert p.scale == pytest.approx(scale, rel=1e-5) and abs(p.zero_point - zero) <= 1


def test_the_program_file_round_trips(tmp_path, tmp_cache):
    program = quantize(_mlp(), _feeds(_mlp(), 4), cache_dir=tmp_cache).program
    save_program(program, tmp_path / "m.cinn")
    again = load_program(tmp_path / "m.cinn")
    assert again.nodes == program.nodes and again.outputs == program.outputs
    assert all(np.array_equal(again.constants[k], a) for k, a in program.constants.items())
    (tmp_path / "bad.cinn").write_bytes(b"not a zip")
    with pytest.raises(DecodeError, match="not a cinn-program file"):
        load_program(tmp_path / "bad.cinn")


# -- cinn-quantize -----------------------------------------------------------------------------------------------


def test_help_and_version():
    for flag, text in (("--help", "--calibration"), ("--version", "cinn-quantize")):
        proc = subprocess.run([sys.executable, "-m", "cinn.facade.quantize_cli", flag], capture_output=True, text=True)
        assert proc.returncode == 0 and text in proc.stdout


@pytest.fixture
def files(tmp_path, monkeypatch, tmp_cache):
    monkeypatch.setenv("CINN_CACHE_DIR", str(tmp_cache))
    onnx.save(_onnx_cnn(), tmp_path / "m.onnx")
    np.savez(tmp_path / "cal.npz", x=RNG.standard_normal((8, 1, 3, 16, 16)).astype(np.float32))
    np.savez(tmp_path / "held.npz", x=RNG.standard_normal((1, 3, 16, 16)).astype(np.float32))  # one sample
    np.savez(tmp_path / "other.npz", y=np.zeros((2, 1, 3, 16, 16), np.float32))
    np.savez(tmp_path / "shape.npz", x=np.zeros((2, 3, 16, 16), np.float32))
    (tmp_path / "junk.npz").write_text("junk")
    return tmp_path


def test_the_cli_writes_a_program_that_runs(files, capsys):
    out = files / "q.cinn"
    status = quantize_cli.main([str(files / "m.onnx"), "--calibration", str(files / "cal.npz"), "--held-back",
                                str(files / "held.npz"), "-o", str(out), "--method", "percentile"])
    assert status == ExitStatus.OK
    printed = capsys.readouterr().out
    assert "held-back" in printed and f"wrote {out}" in printed
    program = cinn.load_model(str(out))
    x = RNG.standard_normal((1, 3, 16, 16)).astype(np.float32)
    (got,) = cinn.compile(program).run({"x": x})
    (want,) = cinn.compile(cinn.load_onnx(files / "m.onnx")).run({"x": x})
    assert np.linalg.norm(got - want) / np.linalg.norm(want) <= TOLERANCE


@pytest.mark.parametrize(("args", "message"), [
    (["missing.onnx", "--calibration", "cal.npz"], "missing.onnx"),
    (["m.onnx", "--calibration", "none.npz"], "none.npz: no such file"),
    (["m.onnx", "--calibration", "other.npz"], "no array for the model's input 'x'"),
    (["m.onnx", "--calibration", "shape.npz"], "should be [samples, 1, 3, 16, 16]"),
    (["m.onnx", "--calibration", "junk.npz"], "not an .npz"),
    (["m.onnx", "--calibration", "cal.npz", "--held-back", "shape.npz"], "--held-back"),
])
def test_bad_input_is_one_line_and_exit_2(args, message, files, capsys):
    argv = [str(files / a) if a.endswith((".onnx", ".npz")) else a for a in args]
    assert quantize_cli.main([*argv, "-o", str(files / "q.cinn")]) == ExitStatus.USAGE
    err = capsys.readouterr().err
    assert err.startswith("cinn-quantize: error: ") and message in err and "Traceback" not in err


def test_usage_errors_of_the_command_line(files):
    model, cal = str(files / "m.onnx"), str(files / "cal.npz")
    for extra in (["-o", str(files / "q.onnx")], ["-o", "q.cinn", "--percentile", "0"], ["-o", "q.cinn", "--method", "x"]):
        proc = subprocess.run([sys.executable, "-m", "cinn.facade.quantize_cli", model, "--calibration", cal, *extra],
                              capture_output=True, text=True)
        assert proc.returncode == ExitStatus.USAGE and "Traceback" not in proc.stderr, proc.stderr


# -- the error budget ---------------------------------------------------------------------------------------------


def _sensitive_feeds(count: int) -> list[dict[str, np.ndarray]]:
    """Feeds of _cnn whose channel 0 is 1000 times the others: one uint8 range for the tensor leaves the other
    channels a step of about 25 (their values are near 1), so quantizing the first conv alone loses them."""
    feeds = _feeds(_cnn(), count)
    for f in feeds:
        f["x"][:, 0] *= 1000
    return feeds


def test_the_budget_keeps_the_costly_layer_in_float(tmp_cache):
    program = _cnn()
    program = program.replace(constants={**program.constants, "w1": program.constants["w1"] * np.array(
        [1e-3, 1, 1], np.float32)[None, :, None, None]})  # channel 0's huge values reach the output as the others do
    calibration, held_back = _sensitive_feeds(8), _sensitive_feeds(4)
    first_conv = next(n for n in program.nodes if n.op == "conv2d").outputs[0].name
    unbounded = quantize(program, calibration, held_back_feeds=held_back, max_error=math.inf, cache_dir=tmp_cache)
    assert unbounded.report.error > TOLERANCE and unbounded.report.kept_float == ()
    assert "budget" not in str(unbounded.report)
    stages = set()
    result = quantize(program, calibration, held_back_feeds=held_back, max_error=TOLERANCE, cache_dir=tmp_cache,
                      progress=lambda stage, done, total: stages.add(stage))
    assert "sensitivity analysis: runs (at most)" in stages and "compiling sensitivity analysis kernels" in stages
    report = result.report
    assert [k.name for k in report.kept_float] == [first_conv] and report.quantized_ops == 2, str(report)
    assert report.within_budget and report.error <= TOLERANCE and "x" not in result.activations
    (kept,) = report.kept_float
    assert kept.error_alone > TOLERANCE and kept.error_with_all > TOLERANCE
    assert f"kept in float: {first_conv}" in str(report) and "within the error budget" in str(report)
    # the output follows the input: far nearer float32's output for the same feed than for another
    floats, exe = cinn.compile(program, cache_dir=tmp_cache), cinn.compile(result.program, cache_dir=tmp_cache)
    (want, other), (got,) = (floats.run(f)[0] for f in held_back[:2]), exe.run(held_back[0])
    assert np.linalg.norm(got - want) <= min(TOLERANCE * np.linalg.norm(want), 0.2 * np.linalg.norm(other - want))


def test_a_report_over_budget_says_so():
    outputs = (OutputError("y", 0.05, 1.0),)
    report = AccuracyReport(CalibrationMethod.MINMAX, 3, (FeedSetError("held-back", 4, outputs),), max_error=0.03)
    assert not report.within_budget and "OVER the error budget: 5.000e-02 on the held-back feeds" in str(report)


def test_the_cli_takes_an_error_budget(files, capsys):
    argv = [str(files / "m.onnx"), "--calibration", str(files / "cal.npz"), "--held-back", str(files / "held.npz"),
            "-o", str(files / "q.cinn")]
    assert quantize_cli.main([*argv, "--max-error", "inf"]) == ExitStatus.OK
    assert "budget" not in capsys.readouterr().out
    assert quantize_cli.main([*argv, "--max-error", "0.5"]) == ExitStatus.OK
    assert "within the error budget" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="2"):
        quantize_cli.main([*argv, "--max-error", "-1"])


def test_the_accuracy_table_measures_logits_on_seeded_feeds():
    from benchmarks.quantize_accuracy import feeds, logits

    b = cinn.NetBuilder("classifier")
    x = b.create_input("float32", (1, 4), "x")
    ids = b.create_input("int64", (1, 3), "ids")
    h = b.matmul(x, b.create_constant(np.ones((4, 4), np.float32)))
    program = b.build([b.reshape(b.softmax(h), [4]), b.cast(ids, "float32")])
    cut = logits(program)
    assert cut.outputs[0].name == h.name and "softmax" not in {n.op for n in cut.nodes}
    assert cut.outputs[1] == program.outputs[1]
    drawn = feeds(program, {"ids": np.array([[0, 5, 2]])}, 3, np.random.default_rng(0))
    assert len(drawn) == 3 and all(f["ids"].dtype == np.int64 and 0 <= f["ids"].min() <= f["ids"].max() <= 5
                                   for f in drawn)
    assert not np.array_equal(drawn[0]["x"], drawn[1]["x"])


def test_the_cli_fails_over_budget_but_writes_the_program(files, capsys, monkeypatch):
    real = quantize_cli.quantize

    def over_budget(*args, **kwargs):  # as if no float layers could meet the budget
        result = real(*args, **kwargs)
        return dataclasses.replace(result, report=dataclasses.replace(result.report, max_error=0.0))

    monkeypatch.setattr(quantize_cli, "quantize", over_budget)
    out = files / "q.cinn"
    assert quantize_cli.main([str(files / "m.onnx"), "--calibration", str(files / "cal.npz"), "-o", str(out)]
                             ) == ExitStatus.FAILED
    assert "OVER the error budget" in capsys.readouterr().out and out.exists()


def test_the_fewest_costly_layers_are_chosen_by_their_error_alone():
    cost = {0: 0.01, 1: 0.05, 2: 0.02, 3: 0.04}  # each layer's error quantized alone; errors add in quadrature
    measured = []

    def measure(floats: frozenset[int]) -> float:
        measured.append(floats)
        return float(np.sqrt(sum(c * c for i, c in cost.items() if i not in floats)))

    choice = choose_float_layers(["a", "b", "c", "d"], measure, 0.03)
    assert choice.layers == (1, 3) and [k.name for k in choice.ranked] == ["b", "d"]  # leaves sqrt(5e-4) = 0.022
    assert choice.ranked[0] == FloatLayer("b", pytest.approx(0.05), pytest.approx(np.sqrt(0.0046)))
    assert len(measured) == 1 + 4 + 2
    assert choose_float_layers(["a"], lambda floats: 0.0 if floats else 1.0, 0.5).layers == (0,)
    assert choose_float_layers(["a"], lambda floats: 0.1, 0.5).layers == ()
