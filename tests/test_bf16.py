"""bf16 precision: the policy, matmul_bf16 in the op table, pack_weights' rewrite, the vdpbf16ps kernels and compiles
with precision="bf16" against fp32 ones.

Tolerances: bf16 keeps 8 significant bits, so one product of rounded inputs is within 2**-8 of the float32 one;
a model's output is compared by relative L2 error (BF16_REL_L2), a kernel against the op table's reference (the same
rounding, float64 sums) within float32 accumulation error (F32_RTOL)."""
from __future__ import annotations

import dataclasses
import warnings

import ml_dtypes
import numpy as np
import onnx
import pytest
import tvm
from tvm import te
from tvm.s_tir import Schedule

import cinn
from benchmarks import precision_accuracy
from benchmarks.onnx_export import to_onnx
from cinn.compiler import llvm_calls
from cinn.compiler.passes.pack_weights import pack_weights
from cinn.core.cpu_model import Calibration, Peak, calibrated, calibration_json, calibration_path, cpu_model, host_cpu, host_model
from cinn.core.ir import NoAttrs, TensorType
from cinn.core.ops import get_op
from cinn.core.ops.bf16 import from_bf16, pack_bf16, to_bf16
from cinn.core.precision import BF16, FP32, OpKind, Precision, PrecisionPolicy, cuda_target, resolve
from cinn.core.target import TensorCores, parse_target
from schedules import cpu_bf16
from tests.test_passes import evaluate

BF16_REL_L2 = 1e-2
F32_RTOL = 1e-5
BF16_CPU = "sapphirerapids"  # an AVX512_BF16 CPU by LLVM's name: IR and asm checks on any host
NO_BF16_CPU = "znver3"
HOST_BF16 = cpu_model(host_cpu()).bf16
runs_bf16 = pytest.mark.skipif(not HOST_BF16, reason="the host has no avx512_bf16")
RNG = np.random.default_rng(11)
# the bf16 CPUs here (the host, BF16_CPU) run bf16 slower than fp32: compiles for them warn (test_bf16_is_obeyed_...)
pytestmark = pytest.mark.filterwarnings("ignore:cinn. precision bf16 on CPU")


def _rel_l2(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want))


# ---------------------------------------------------------------------------------------------
# the policy


def test_precision_names_parse_and_int8_or_gpu_only_ones_on_a_cpu_are_refused_with_what_to_use():
    assert Precision.parse("BF16") is Precision.BF16 and Precision.parse(Precision.AUTO) is Precision.AUTO
    with pytest.raises(ValueError, match=r"cinn\.quantize"):
        Precision.parse("int8")
    for gpu_only in ("fp16", "tf32"):
        with pytest.raises(ValueError, match="GPU tensor-core precision"):
            resolve(gpu_only, cpu_model(NO_BF16_CPU))
    with pytest.raises(ValueError, match="expected one of"):
        Precision.parse("fp64")


def test_policy_choices():
    with_bf16, without = cpu_model(BF16_CPU), cpu_model(NO_BF16_CPU)
    assert resolve("fp32", with_bf16) == FP32 and not FP32.computes_bf16(OpKind.MATMUL)
    assert resolve("bf16", with_bf16) == BF16 and BF16.computes_bf16(OpKind.MATMUL) and BF16.computes_bf16(OpKind.CONV)
    assert resolve("auto", without) == FP32 and resolve("auto", None) == FP32
    kept = PrecisionPolicy.bf16_except(["stem_conv"])
    assert resolve(kept, with_bf16) is kept and not kept.computes_bf16(OpKind.STEM_CONV)
    assert kept.computes_bf16(OpKind.CONV)
    assert len({FP32.key, BF16.key, kept.key}) == 3


@pytest.mark.parametrize(("mcpu", "auto"), [("znver4", BF16), ("znver5", BF16), ("emeraldrapids", FP32),
                                            ("znver3", FP32)])
def test_auto_picks_bf16_where_the_cpu_runs_it_faster(mcpu, auto):
    assert resolve(Precision.AUTO, cpu_model(mcpu)) == auto


@pytest.mark.parametrize(("rate", "auto"), [(2.0, BF16), (1.2, FP32), (0.5, FP32)])
def test_auto_follows_a_calibrated_bf16_rate(rate, auto):
    model = cpu_model(BF16_CPU)
    measured = calibrated(model, Calibration(model.name, model.peaks, bf16_rate=rate))
    assert measured.bf16_rate == rate and resolve("auto", measured) == auto
    without = dataclasses.replace(model, bf16=False)  # a host whose VM hides AVX512_BF16: no rate to calibrate
    assert calibrated(without, Calibration(model.name, model.peaks, bf16_rate=rate)).bf16_rate == 0


def test_auto_on_the_host_follows_its_calibration(tmp_path):
    path = calibration_path(host_cpu(), tmp_path)
    for rate, auto in ((2.0, BF16), (0.5, FP32)):
        path.write_text(calibration_json(Calibration(host_cpu(), (Peak(1, 1e11, 1e10),), bf16_rate=rate)))
        host_model.cache_clear()
        assert resolve("auto", host_model(path)) == (auto if HOST_BF16 else FP32)
    host_model.cache_clear()


@pytest.mark.filterwarnings("default")
def test_bf16_is_obeyed_where_it_is_slower_with_a_warning():
    with pytest.warns(UserWarning, match="slower than in fp32"):
        assert resolve("bf16", cpu_model("emeraldrapids")) == BF16
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve("bf16", cpu_model("znver4")) == BF16 and resolve("auto", cpu_model("emeraldrapids")) == FP32


def test_precision_and_policy_are_cinn_names():
    assert cinn.Precision is Precision and cinn.PrecisionPolicy is PrecisionPolicy
    assert {"Precision", "PrecisionPolicy"} <= set(cinn.__all__)


def test_bf16_is_refused_on_a_cpu_without_avx512_bf16():
    with pytest.raises(ValueError, match="AVX512_BF16"):
        resolve("bf16", cpu_model(NO_BF16_CPU))
    with pytest.raises(ValueError, match="AVX512_BF16"):
        cinn.compile(_mlp(), f"llvm -mcpu={NO_BF16_CPU} -num-cores=2", precision="bf16")
    with pytest.raises(ValueError, match="on a GPU pass precision='bf16'"):
        resolve(BF16, None)  # a policy, on a GPU target


# ---------------------------------------------------------------------------------------------
# the op table


def test_bf16_rounding_is_to_nearest_even():
    ties = np.array([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 3.0e38, 1e-30], np.float32)
    np.testing.assert_array_equal(from_bf16(to_bf16(ties)), ties.astype(ml_dtypes.bfloat16).astype(np.float32))
    assert from_bf16(to_bf16(np.float32(1 + 2**-8))) == 1.0  # the tie goes to the even neighbour


def test_matmul_bf16_reference_is_the_product_of_rounded_operands():
    x, w = RNG.standard_normal((3, 5, 64)).astype(np.float32), RNG.standard_normal((64, 32)).astype(np.float32)
    (got,) = get_op("matmul_bf16").reference([x, pack_bf16(w, 16)], NoAttrs())
    rounded = [a.astype(ml_dtypes.bfloat16).astype(np.float64) for a in (x, w)]
    np.testing.assert_allclose(got, np.matmul(*rounded), rtol=F32_RTOL, atol=F32_RTOL)
    assert _rel_l2(got, np.matmul(x.astype(np.float64), w)) < BF16_REL_L2


def test_matmul_bf16_refuses_mismatched_operands():
    infer = get_op("matmul_bf16").infer
    with pytest.raises(TypeError, match="bf16"):
        infer([TensorType((4, 64), "float32"), TensorType((2, 32, 16, 2), "float32")], NoAttrs())
    with pytest.raises(ValueError, match="do not match"):
        infer([TensorType((4, 62), "float32"), TensorType((2, 32, 16, 2), "uint16")], NoAttrs())
    assert infer([TensorType((4, 64), "float32"), TensorType((2, 32, 16, 2), "uint16")], NoAttrs())[0].shape == (4, 32)


# ---------------------------------------------------------------------------------------------
# pack_weights


def _mlp(n_out: int = 40) -> cinn.Program:
    b = cinn.NetBuilder("mlp")
    x = b.create_input("float32", (8, 64), "x")
    w1 = b.create_constant(RNG.standard_normal((64, 96)).astype(np.float32) * 0.1, "w1")
    b1 = b.create_constant(RNG.standard_normal(96).astype(np.float32), "b1")
    w2 = b.create_constant(RNG.standard_normal((n_out, 96)).astype(np.float32) * 0.1, "w2")
    return b.build([b.matmul(b.relu(b.add(b.matmul(x, w1), b1)), w2, trans_y=True)])


def test_pack_weights_puts_matmuls_in_bf16_only_under_a_bf16_policy():
    model = cpu_model(BF16_CPU)
    program = _mlp()
    assert "matmul_bf16" not in [n.op for n in pack_weights(program, model).nodes]
    rewritten = pack_weights(program, model, precision=BF16)
    assert [n.op for n in rewritten.nodes].count("matmul_bf16") == 2  # the second padded 40 -> 48 and sliced back
    x = RNG.standard_normal((8, 64)).astype(np.float32)
    assert _rel_l2(evaluate(rewritten, {"x": x})[0], evaluate(program, {"x": x})[0]) < BF16_REL_L2


def _convs() -> cinn.Program:
    """A stem conv (strided, 3 channels: padded to 4) and a padded 3x3 conv of 20 channels (padded to 32)."""
    b = cinn.NetBuilder("convs")
    x = b.create_input("float32", (1, 3, 10, 10), "x")
    w0 = b.create_constant(RNG.standard_normal((20, 3, 3, 3)).astype(np.float32), "w0")
    w1 = b.create_constant(RNG.standard_normal((20, 20, 3, 3)).astype(np.float32) * 0.2, "w1")
    y = b.relu(b.conv2d(x, w0, strides=[2, 2], paddings=[1, 1]))
    return b.build([b.conv2d(y, w1, paddings=[1, 1])])


def test_pack_weights_puts_convs_in_bf16_channels_last_and_keeps_a_stem_conv_if_asked():
    model = cpu_model(BF16_CPU)
    program = _convs()
    rewritten = pack_weights(program, model, precision=BF16)
    assert [n.op for n in rewritten.nodes].count("conv2d_bf16") == 2
    x = RNG.standard_normal((1, 3, 10, 10)).astype(np.float32)
    assert _rel_l2(evaluate(rewritten, {"x": x})[0], evaluate(program, {"x": x})[0]) < BF16_REL_L2
    kept = pack_weights(program, model, precision=PrecisionPolicy.bf16_except(["stem_conv"]))
    assert [n.op for n in kept.nodes if n.op.startswith("conv2d")] == ["conv2d_packed", "conv2d_bf16"]


def test_conv2d_bf16_reference_is_the_conv_of_rounded_operands():
    """With operands that bf16 holds exactly, the bf16 conv equals the float32 one up to the order of its sums."""
    b = cinn.NetBuilder("conv")
    x = b.create_input("float32", (1, 6, 9, 9), "x")
    w = from_bf16(to_bf16(RNG.standard_normal((20, 6, 3, 3)).astype(np.float32)))
    program = b.build([b.conv2d(x, b.create_constant(w, "w"), strides=[2, 2], paddings=[1, 1])])
    rewritten = pack_weights(program, cpu_model(BF16_CPU), precision=BF16)
    assert "conv2d_bf16" in [n.op for n in rewritten.nodes]
    xs = from_bf16(to_bf16(RNG.standard_normal((1, 6, 9, 9)).astype(np.float32)))
    y = evaluate(rewritten, {"x": xs})[0]
    np.testing.assert_allclose(y, evaluate(program, {"x": xs})[0], rtol=F32_RTOL, atol=F32_RTOL * np.abs(y).max())


# ---------------------------------------------------------------------------------------------
# the kernel


def _kernel(m: int, k: int, n: int):
    """matmul_bf16 [m, k] x [k, n] scheduled by the bf16 rule for BF16_CPU, and compiled."""
    op = get_op("matmul_bf16")
    x, w = te.placeholder((m, k), "float32", name="x"), te.placeholder((n // 16, k // 2, 16, 2), "uint16", name="w")
    types = op.infer([TensorType((m, k), "float32"), TensorType(tuple(w.shape), "uint16")], NoAttrs())
    (out,) = op.compute([x, w], NoAttrs(), types)
    target = parse_target(f"llvm -mcpu={BF16_CPU} -num-cores=2")
    sch = Schedule(tvm.IRModule({"main": te.create_prim_func([x, w, out]).with_attr("global_symbol", "main")}))
    assert cpu_bf16.applicable(sch, target)
    cpu_bf16.Bf16().apply(sch, target)
    return llvm_calls.resolved(tvm.compile(sch.mod, target=target.tvm()))


def test_the_kernel_calls_vdpbf16ps_and_no_stand_in():
    asm = _kernel(8, 64, 32).mod.inspect_source("asm")
    assert "vdpbf16ps" in asm
    assert "vpdpwssd" not in asm


def test_a_stand_in_call_the_rewrite_does_not_know_is_refused():
    call = f"  %3 = call <16 x i32> @{cpu_bf16.STAND_IN}(<16 x i32> %0, <16 x i32> %1, <16 x i32> %2)\n"
    with pytest.raises(llvm_calls.UnresolvedCall, match="could not be made"):
        llvm_calls.rewritten(call, llvm_calls.DPBF16)


@runs_bf16
def test_the_kernel_equals_the_reference_and_rounds_like_ml_dtypes():
    m, k, n = 8, 64, 32
    x = RNG.standard_normal((m, k)).astype(np.float32)
    x[0, :4] = [1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 1e30]  # ties and a large value
    x[1, 0] = np.nan
    w = RNG.standard_normal((k, n)).astype(np.float32)
    packed = pack_bf16(w, 16)
    dev = tvm.cpu()
    out = tvm.runtime.tensor(np.zeros((m, n), np.float32), dev)
    _kernel(m, k, n)["main"](tvm.runtime.tensor(x, dev), tvm.runtime.tensor(packed, dev), out)
    got, (want,) = out.numpy(), get_op("matmul_bf16").reference([x, packed], NoAttrs())
    assert np.isnan(got[1]).all()
    np.testing.assert_allclose(got[[0, *range(2, m)]], want[[0, *range(2, m)]], rtol=F32_RTOL, atol=F32_RTOL * 40)


# ---------------------------------------------------------------------------------------------
# compiles


def _cnn() -> cinn.Program:
    b = cinn.NetBuilder("cnn")
    x = b.create_input("float32", (1, 8, 12, 12), "x")
    w = b.create_constant(RNG.standard_normal((16, 8, 3, 3)).astype(np.float32) * 0.2, "w")
    y = b.relu(b.conv2d(x, w, paddings=[1, 1]))
    flat = b.reshape(b.reduce_mean(y, dim=[2, 3]), [1, 16])
    fc = b.create_constant(RNG.standard_normal((16, 10)).astype(np.float32) * 0.3, "fc")
    return b.build([b.matmul(flat, fc)])


def test_the_precision_is_part_of_the_compile_cache_key(tmp_path):
    target = f"llvm -mcpu={BF16_CPU} -num-cores=2"
    program = _mlp()
    for precision, bf16 in (("fp32", False), ("bf16", True), ("fp32", False), ("bf16", True)):
        exe = cinn.compile(program, target, cache_dir=tmp_path, precision=precision)
        assert ("matmul_bf16" in [n.op for n in exe.program.nodes]) == bf16


@runs_bf16
@pytest.mark.parametrize("build", [_mlp, _cnn])
def test_a_bf16_compile_matches_fp32_and_reads_its_input(build, tmp_cache):
    program = build()
    fp32 = cinn.compile(program, "llvm -num-cores=2", cache_dir=tmp_cache)
    bf16 = cinn.compile(program, "llvm -num-cores=2", cache_dir=tmp_cache, precision="bf16")
    assert "matmul_bf16" in [n.op for n in bf16.program.nodes]
    shape = program.inputs[0].shape
    x1, x2 = (RNG.standard_normal(shape).astype(np.float32) for _ in range(2))
    want1, want2 = (fp32.run({"x": x})[0] for x in (x1, x2))
    got1, got2 = (bf16.run({"x": x})[0] for x in (x1, x2))
    assert _rel_l2(got1, want1) <= BF16_REL_L2 and _rel_l2(got2, want2) <= BF16_REL_L2
    assert _rel_l2(got2, want1) > 10 * BF16_REL_L2  # an output that ignored its input would match both


@runs_bf16
def test_a_symbolic_program_compiles_its_bindings_in_bf16(tmp_cache):
    weights = RNG.standard_normal((64, 32)).astype(np.float32)
    b = cinn.NetBuilder("symbolic")
    x = b.create_input("float32", ("batch", 64), "x")
    program = b.build_symbolic([b.matmul(x, b.create_constant(weights, "w"))])
    exe = cinn.compile(program, "llvm -num-cores=2", cache_dir=tmp_cache, precision="bf16", shape_hints={"batch": [4]})
    assert "bf16" in exe.symbolic_reason
    for rows in (4, 7):
        xs = RNG.standard_normal((rows, 64)).astype(np.float32)
        assert _rel_l2(exe.run({"x": xs})[0], xs @ weights) <= BF16_REL_L2


# ---------------------------------------------------------------------------------------------
# benchmarks.precision_accuracy


def _classifier() -> cinn.Program:
    b = cinn.NetBuilder("classifier")
    x = b.create_input("float32", (1, 64), "x")
    logits = b.matmul(x, b.create_constant(RNG.standard_normal((64, 32)).astype(np.float32), "w"))
    return b.build([b.reshape(b.softmax(logits, axes=[-1]), [1, 32, 1])])


def test_the_accuracy_table_compares_logits_not_their_softmax():
    program = _classifier()
    kept = precision_accuracy.logits(program)
    assert [n.op for n in kept.nodes] == ["matmul"] and kept.outputs == program.nodes[0].outputs
    assert precision_accuracy.logits(kept) == kept  # no softmax: the program as it is
    rel, worst = precision_accuracy.errors([np.array([3.0, 4.0])], [np.array([3.0, 3.0])])
    assert (round(rel, 6), worst) == (round(1 / np.sqrt(18), 6), 1.0)


@runs_bf16
def test_the_accuracy_table_of_a_model_file(tmp_path, capsys):
    path = tmp_path / "classifier.onnx"
    onnx.save(to_onnx(_classifier()), path)
    assert precision_accuracy.main([str(tmp_path), "classifier"]) == 0
    header, _rule, row = capsys.readouterr().out.splitlines()
    assert header.startswith("| model | rel L2") and row.startswith("| classifier | ") and row.endswith("| yes |")


@pytest.mark.parametrize(("precision", "cores"), [("fp32", TensorCores.OFF), ("bf16", TensorCores.BF16),
                                                  ("fp16", TensorCores.FP16), ("tf32", TensorCores.TF32),
                                                  ("auto", TensorCores.TF32)])
def test_a_gpu_precision_picks_tensor_cores_and_keeps_the_graph_fp32(precision, cores):
    target = parse_target("cuda -arch=sm_90")
    assert cuda_target(precision, target).tensor_cores is cores and resolve(precision, None) is FP32
    assert cuda_target(precision, parse_target("cuda -arch=sm_90 -tensor-cores=fp16")).tensor_cores is TensorCores.FP16
    assert cuda_target(precision, parse_target("llvm")) == parse_target("llvm")


def test_cinn_run_refuses_a_gpu_precision_on_a_cpu_with_one_line(tmp_path, capsys):
    from cinn.facade import cli

    model = tmp_path / "mlp.onnx"
    onnx.save(to_onnx(_mlp()), model)
    assert cli.main([str(model), "--precision", "fp16"]) != 0
    err = capsys.readouterr().err
    assert "GPU tensor-core precision" in err and "Traceback" not in err
