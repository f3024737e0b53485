"""The pass manager: named passes in declared pipelines, the IR printed after a pass, per-pass timing, disabled
passes (validated, kept apart in the compile cache) and cinn-run's --pass-timing and --disable-pass."""
from __future__ import annotations

import numpy as np
import pytest

import cinn
from cinn.compiler.passes import pipeline
from cinn.compiler.passes.attention import fold_attention_slices, fuse_attention, mark_causal
from cinn.compiler.passes.conv_forms import conv_forms
from cinn.compiler.passes.cse import cse
from cinn.compiler.passes.dce import dce
from cinn.compiler.passes.decompose import decompose
from cinn.compiler.passes.fold_constants import fold_constants
from cinn.compiler.passes.manager import PRINT_IR_AFTER_ENV, PassContext, PassName
from cinn.compiler.passes.simplify import simplify
from cinn.compiler.passes.sink_transposes import sink_transposes
from cinn.core.ir import Program
from cinn.core.target import Target, parse_target
from cinn.facade import cli
from cinn.facade.command import ExitStatus
from frontend.zoo import MODELS
from tests.test_integer_kernels import _quantized_conv, _weights
from tests.test_onnx_import import tiny_relu_model
from tests.test_passes import _inverted_residual, evaluate
from tests.test_winograd import _conv_program

VNNI = parse_target("llvm -mcpu=znver5 -num-cores=2")  # full-width AVX-512 with VNNI: every CPU pass has work
AVX2 = parse_target("llvm -mcpu=znver3 -num-cores=2")
TARGETS = {"none": None, "cuda": parse_target("cuda"), "avx2": AVX2, "vnni": VNNI}


def _programs() -> dict[str, Program]:
    """Small programs that give each pass work: attention, batch norm, 3x3 convs, int8 convs, a depthwise block."""
    programs = {name: MODELS[name](True).program for name in ("mlp", "conv_bn_relu", "encoder", "gpt2")}
    programs["conv3x3"] = _conv_program(1, 64, 64, (24, 24), (1, 1), True)
    programs["qconv"] = _quantized_conv(_weights(8 * 9, 32, True).T.reshape(32, 8, 3, 3).copy(), 0, (1, 8, 9, 9),
                                        paddings=[1, 1])
    programs["depthwise"] = _inverted_residual(7, 1)
    return programs


def _nested(program: Program, passes: bool, target: Target | None) -> Program:
    """The pipeline as the nested calls that were there before the pass manager (the target's passes through their
    Pass, which turns the target into their arguments)."""
    if not passes:
        return decompose(program)
    context = PassContext(target)
    if target is not None and target.has_vnni:
        program = pipeline.INTEGER_KERNELS.apply(program, context)
        program = sink_transposes(program) if any(n.op == "conv2d_u8i8" for n in program.nodes) else program
    program = fold_attention_slices(fuse_attention(simplify(program)))
    program = dce(cse(mark_causal(fold_constants(conv_forms(simplify(decompose(program)))))))
    if target is None or target.is_cuda:
        return dce(pipeline.PACK_WEIGHTS.apply(program, context))
    program = pipeline.CHANNELS_LAST.apply(pipeline.WINOGRAD.apply(program, context), context)
    return dce(pipeline.PACK_WEIGHTS.apply(program, context))


def _same(a: Program, b: Program) -> bool:
    return str(a) == str(b) and a.constants.keys() == b.constants.keys() and all(
        a.constants[k].dtype == b.constants[k].dtype and np.array_equal(a.constants[k], b.constants[k])
        for k in a.constants)


def _headers(text: str) -> list[str]:
    return [line.removeprefix("// IR after ") for line in text.splitlines() if line.startswith("// IR after ")]


def test_pass_names_are_unique_and_each_pipeline_runs_the_declared_passes():
    assert [p.name for p in pipeline.PASSES] == list(PassName)
    by_name = {p.name: p for p in pipeline.PASSES}
    for declared in pipeline.PIPELINES:
        assert all(by_name[p.name] is p for p in declared.passes), declared.name
    assert [p.name for p in pipeline.PASSES if p.required] == [PassName.ZERO_SIZE, PassName.DECOMPOSE]
    assert all(p.passes[0] is pipeline.ZERO_SIZE for p in pipeline.PIPELINES if p is not pipeline.VNNI)
    assert pipeline.CPU_VNNI.passes[1:3] == pipeline.VNNI.passes


@pytest.mark.parametrize("target", TARGETS.values(), ids=TARGETS.keys())
def test_the_pipelines_give_the_programs_of_the_nested_calls(target):
    for name, program in _programs().items():
        for passes in (True, False):
            assert _same(pipeline.optimize(program, passes, target), _nested(program, passes, target)), (name, passes)


def test_winograd_shapes_are_those_of_the_passes_before_winograd():
    program = _conv_program(2, 64, 64, (27, 22), (1, 1), False)
    (shape,) = pipeline.winograd_shapes(program, AVX2)
    assert shape.batch == 2 and pipeline.winograd_shapes(program, TARGETS["cuda"]) == []


def test_print_ir_after_one_pass_each_time_it_runs(monkeypatch, capsys):
    program = MODELS["encoder"](True).program
    monkeypatch.setenv(PRINT_IR_AFTER_ENV, "cse")
    optimized = pipeline.optimize(program, target=AVX2)
    err = capsys.readouterr().err
    assert _headers(err) == ["cse"] and f"program {program.name}(" in err
    monkeypatch.setenv(PRINT_IR_AFTER_ENV, " simplify, dce ")
    pipeline.optimize(program, target=AVX2)
    err = capsys.readouterr().err
    assert _headers(err) == ["simplify", "simplify", "dce", "dce"]
    assert err.rstrip().endswith(str(optimized))  # the last dce's program is the result


def test_print_ir_after_all(monkeypatch, capsys):
    monkeypatch.setenv(PRINT_IR_AFTER_ENV, "all")
    pipeline.optimize(MODELS["mlp"](True).program, target=VNNI, disabled=frozenset({PassName.CSE}))
    assert _headers(capsys.readouterr().err) == [p.name.value for p in pipeline.CPU_VNNI.passes if p.name != "cse"]


def test_print_ir_after_an_unknown_pass_lists_the_passes(monkeypatch):
    monkeypatch.setenv(PRINT_IR_AFTER_ENV, "cse,fusion")
    with pytest.raises(ValueError, match=rf"\${PRINT_IR_AFTER_ENV}: unknown pass 'fusion'; the passes are .*winograd"):
        pipeline.optimize(MODELS["mlp"](True).program)


def test_a_compile_times_every_pass_it_ran_and_a_cached_one_none(tmp_path):
    program = MODELS["mlp"](True).program
    target = parse_target("llvm")
    exe = cinn.compile(program, target, cache_dir=tmp_path)
    assert [t.name for t in exe.pass_times] == [p.name.value for p in pipeline.pipeline_for(target).passes]
    assert all(t.seconds >= 0 for t in exe.pass_times)
    assert cinn.compile(program, target, cache_dir=tmp_path).pass_times == ()  # from the compile cache
    unoptimized = cinn.compile(program, target, cache_dir=tmp_path, passes=False)
    assert [t.name for t in unoptimized.pass_times] == ["zero_size", "decompose"]


def test_disabling_fuse_attention_gives_more_kernels_and_the_same_outputs(tmp_path):
    model = MODELS["encoder"](True)
    want = evaluate(model.program, dict(model.feeds))
    fused = cinn.compile(model.program, cache_dir=tmp_path)
    plain = cinn.compile(model.program, cache_dir=tmp_path, disabled_passes=["fuse_attention"])
    assert "attention" in {n.op for n in fused.program.nodes} - {n.op for n in plain.program.nodes}
    assert plain.num_kernels > fused.num_kernels
    assert "fuse_attention" not in [t.name for t in plain.pass_times]
    for exe in (fused, plain):
        for got, ref in zip(exe.run(model.feeds), want, strict=True):
            np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_disabling_winograd_keeps_the_direct_conv_with_the_same_outputs():
    program = _conv_program(1, 64, 64, (24, 24), (1, 1), True)
    (shape,) = pipeline.winograd_shapes(program, VNNI)
    choices = {shape.key: 4}
    winograd = pipeline.optimize(program, target=VNNI, winograd_choices=choices)
    direct = pipeline.optimize(program, target=VNNI, winograd_choices=choices, disabled=frozenset({PassName.WINOGRAD}))
    assert "winograd_input" in {n.op for n in winograd.nodes}
    assert {n.op for n in direct.nodes} & {"winograd_input", "winograd_output"} == set()
    rng = np.random.default_rng(0)
    feeds = {v.name: rng.standard_normal(v.shape).astype(np.float32) for v in program.inputs}
    for optimized in (winograd, direct):
        np.testing.assert_allclose(evaluate(optimized, feeds)[0], evaluate(program, feeds)[0], rtol=1e-4, atol=1e-4)


def test_unknown_or_required_passes_are_rejected():
    program = MODELS["mlp"](True).program
    with pytest.raises(ValueError, match=r"disabled_passes: unknown pass 'fusion'; the passes are .*\bcse\b"):
        cinn.compile(program, disabled_passes=["cse", "fusion"])
    with pytest.raises(ValueError, match="pass 'decompose' cannot be disabled: composite ops have no kernel"):
        cinn.compile(program, disabled_passes=["decompose"])
    with pytest.raises(TypeError, match="a list of pass names, got the string 'cse'"):
        cinn.compile(program, disabled_passes="cse")


def test_the_compile_cache_keeps_compiles_with_and_without_a_pass_apart(tmp_path):
    """Each of the four compiles comes from the cache only where one with the same passes was made before."""
    program = MODELS["encoder"](True).program
    fused = cinn.compile(program, cache_dir=tmp_path)
    plain = cinn.compile(program, cache_dir=tmp_path, disabled_passes=[PassName.FUSE_ATTENTION])
    assert plain.pass_times and str(plain.program) != str(fused.program)
    again = cinn.compile(program, cache_dir=tmp_path)
    plain_again = cinn.compile(program, cache_dir=tmp_path, disabled_passes=["fuse_attention"])
    assert again.pass_times == () == plain_again.pass_times
    assert str(again.program) == str(fused.program) and str(plain_again.program) == str(plain.program)


def test_cinn_run_prints_the_pass_timing_without_the_disabled_pass(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CINN_CACHE_DIR", str(tmp_path / "cache"))
    model = str(tiny_relu_model(tmp_path / "relu.onnx"))
    assert cli.main([model, "--repeat", "1", "--pass-timing", "--disable-pass", "cse", "--disable-pass", "dce"]) == 0
    rows = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    table = rows[rows.index("pass") + 1 :]
    assert "simplify" in table and table[-1] == "total" and not {"cse", "dce"} & set(table)


@pytest.mark.parametrize(("name", "message"), [("fusion", "unknown pass 'fusion'; the passes are"),
                                               ("decompose", "pass 'decompose' cannot be disabled")])
def test_cinn_run_rejects_a_pass_it_cannot_disable(name, message, tmp_path, capsys):
    model = str(tiny_relu_model(tmp_path / "relu.onnx"))
    assert cli.main([model, "--disable-pass", name]) == ExitStatus.USAGE
    assert f"--disable-pass: {message}" in capsys.readouterr().err
