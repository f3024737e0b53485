"""The hardware model: no hardware constant outside cinn/core/cpu_model.py, choices that follow the calibrated peaks,
the calibration cache (round trip, bad files) and cinn-calibrate."""
from __future__ import annotations

import ast
import dataclasses
import json
import pathlib
import re
import subprocess
import sys
import tokenize
import warnings

import numpy as np
import pytest

import cinn
from cinn.compiler.passes.winograd import choose_tile
from cinn.core import cpu_model
from cinn.core.cpu_model import Calibration, Peak
from cinn.core.target import parse_target
from cinn.facade import calibrate

ROOT = pathlib.Path(cinn.__file__).parent.parent
SCANNED = ("cinn", "schedules", "autotune", "frontend")
MODEL = "cinn/core/cpu_model.py"
# words of a module-level constant's name that say it holds a hardware fact
HARDWARE_WORDS = {"LANE", "LANES", "PANEL", "PANELS", "TILE", "TILES", "REGISTER", "REGISTERS", "REGS", "CACHE",
                  "CACHES", "L1", "L1D", "L2", "L3", "BYTES", "WIDTH", "WIDTHS", "RATE", "RATES", "GAIN", "GAINS", "FLOP",
                  "FLOPS", "GFLOPS", "BANDWIDTH", "VECTOR", "VECTORS", "FMA", "PEAK", "PEAKS", "CLOCK", "HZ", "BITS",
                  "KIB", "MIB", "WARP"}
CPU_NAMES = re.compile(r"znver|bdver|btver|\bzen\d?\b|haswell|broadwell|skylake|cascadelake|cooperlake|icelake|"
                       r"tigerlake|rocketlake|alderlake|raptorlake|meteorlake|arrowlake|lunarlake|sierraforest|rapids",
                       re.IGNORECASE)
# names that match HARDWARE_WORDS but hold no fact about a CPU
ALLOWED = {
    ("cinn/compiler/passes/fold_constants.py", "MAX_FOLDED_BYTES"): "a budget for folded constants, not a cache",
    ("cinn/compiler/passes/winograd.py", "TILES"): "Winograd's F(m x m) output tiles: the algorithm's, not registers'",
    ("cinn/compiler/passes/winograd.py", "MIN_TILES"): "a count of Winograd output tiles per image (an algorithm limit)",
    ("cinn/runtime/trust.py", "KEY_BYTES"): "the HMAC key's length",
    ("schedules/cpu_int8.py", "VNNI_BITS"): "the width of the vpdpbusd.512 intrinsic it tensorizes with: an ISA fact",
    ("schedules/cpu_bf16.py", "BF16_BITS"): "the width of the vdpbf16ps.512 intrinsic it tensorizes with: an ISA fact",
    ("schedules/replay.py", "MAX_TILE"): "a sanity bound on a replayed log's split factors",
}
# GPU facts: the CpuModel models CPUs (a GPU model is another change)
GPU_MODULES = ("schedules/cuda_common.py", "schedules/cuda_matmul.py", "schedules/cuda_reduction.py",
               "schedules/cuda_tensor_core.py")


def _modules():
    for folder in SCANNED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel != MODEL:
                yield rel, ast.parse(path.read_text(), rel)


def _numeric(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Constant) and isinstance(n.value, int | float) and not isinstance(n.value, bool)
               for n in ast.walk(node))


def _constants(tree: ast.Module):
    """(name, value) of the module-level assignments."""
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign):
            targets, value = stmt.targets, stmt.value
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            targets, value = [stmt.target], stmt.value
        else:
            continue
        for name in (n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)):
            yield name, value


def _docstrings(tree: ast.Module) -> set[int]:
    """The ids of the docstring nodes (documentation, like comments, may name CPUs: their measurements)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                found.add(id(first.value))
    return found


def _words(node: ast.AST, docstrings: set[int]) -> str | None:
    """The identifier or string literal a node holds."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
        return node.value
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return node.name
    if isinstance(node, ast.arg):
        return node.arg
    return None


def test_no_hardware_constant_outside_the_cpu_model():
    found = [f"{rel}: {name}" for rel, tree in _modules() if rel not in GPU_MODULES for name, value in _constants(tree)
             if set(name.upper().strip("_").split("_")) & HARDWARE_WORDS and _numeric(value)
             and (rel, name) not in ALLOWED]
    assert not found, f"hardware constants belong in {MODEL} (CpuModel): {found}"


def test_no_cpu_name_in_code_outside_the_cpu_model():
    found = []
    for rel, tree in _modules():
        docstrings = _docstrings(tree)
        found += [f"{rel}:{getattr(n, 'lineno', '?')}: {text!r}" for n in ast.walk(tree)
                  if (text := _words(n, docstrings)) and CPU_NAMES.search(text)]
    assert not found, f"CPU names belong in {MODEL}'s table of known CPUs: {found}"


MEASUREMENT = re.compile(r"\b\d+(\.\d+)? ?(ms|us|ns)\b|\b\d+\.\d+x\b|GFLOP/s \d|\d GFLOP/s|\d GB/s")


def _prose(path: pathlib.Path) -> list[tuple[int, str]]:
    """The comments and docstrings of a module, with their lines."""
    tree = ast.parse(path.read_text())
    docstrings = _docstrings(tree)  # once: a walk of the tree per node took minutes
    docs = [(n.lineno, n.value) for n in ast.walk(tree) if id(n) in docstrings]
    with path.open("rb") as f:
        comments = [(t.start[0], t.string) for t in tokenize.tokenize(f.readline) if t.type == tokenize.COMMENT]
    return [*docs, *comments]


def test_measurements_live_in_the_notes_not_in_comments():
    """A timing or a machine in a comment cannot be measured again; docs/notes records both with the command."""
    found = [f"{rel}:{line}: {text.strip()[:80]!r}" for rel, _ in _modules() for line, text in _prose(ROOT / rel)
             if CPU_NAMES.search(text) or MEASUREMENT.search(text)]
    assert not found, f"move these to a docs/notes record and point at it: {found}"


def test_the_scans_find_what_they_look_for():
    tree = ast.parse('"""Measured on a znver3."""\nLANES = 16\nMODE = "skylake"\nNAME = 1\n')
    assert [name for name, value in _constants(tree) if set(name.split("_")) & HARDWARE_WORDS] == ["LANES"]
    docstrings = _docstrings(tree)
    assert [t for n in ast.walk(tree) if (t := _words(n, docstrings)) and CPU_NAMES.search(t)] == ["skylake"]
    assert all(reason for reason in ALLOWED.values())
    assert [bool(MEASUREMENT.search(t)) for t in ("1.13 ms against 0.61", "0.88x its time", "16 ms of calls", "a 5x5")] \
        == [True, True, True, False]


def _with_peak(target, flops: float, bandwidth: float):
    """The target on a CPU that differs only in its measured peaks (per core)."""
    model = dataclasses.replace(target.model, peaks=(Peak(1, flops, bandwidth),), calibrated=True)
    return dataclasses.replace(target, cpu=model)


def test_the_winograd_choice_follows_the_calibrated_bandwidth_and_peak():
    """A 64->64 conv on 112x112: its transformed input spills from L2, so with little memory bandwidth, or FMAs fast
    enough that the direct conv wins the race against memory, it stays direct."""
    target = parse_target("llvm -mcpu=znver5 -num-cores=2")
    shape = (1, 64, 64, (112, 112))
    assert choose_tile(*shape, _with_peak(target, 240e9, 20e9)) == 4
    assert choose_tile(*shape, _with_peak(target, 240e9, 2e9)) is None
    assert choose_tile(*shape, _with_peak(target, 960e9, 9e9)) is None
    # in cache the transforms run at the cores' clock, which the FMA peak implies: the choice is the same at any peak
    small = (1, 64, 64, (56, 56))
    assert {choose_tile(*small, _with_peak(target, f, 9e9)) for f in (60e9, 240e9, 960e9)} == {4}


def test_the_channels_last_choice_follows_the_calibrated_bandwidth():
    """With few registers, 1x1 convs over 7x7 pixels go channels last where their estimated gain (FMA peak) exceeds
    the transposes around them (memory bandwidth)."""
    from cinn.compiler.passes.channels_last import channels_last

    b = cinn.NetBuilder("pointwise")
    x = b.create_input("float32", (1, 512, 7, 7), "x")
    w = b.create_constant(np.ones((256, 512, 1, 1), "float32"), "w")
    program = b.build([b.relu(b.conv2d(x, w))])
    avx2 = parse_target("llvm -mcpu=znver3 -num-cores=2")

    def nhwc(bandwidth: float) -> bool:
        return any(n.op == "transpose" for n in channels_last(program, _with_peak(avx2, 120e9, bandwidth)).nodes)

    assert nhwc(100e9) and not nhwc(0.1e9)


def _calibration(**changes) -> dict:
    doc = {"format": "cinn-calibration", "version": 1, "cpu": "somecpu", "fma_width": 512,
           "cores": {"1": {"flops": 1.5e11, "bandwidth": 8e9}, "4": {"flops": 5e11, "bandwidth": 2e10}}}
    return doc | changes


def test_a_calibration_round_trips(tmp_path):
    path = cpu_model.calibration_path("somecpu", tmp_path)
    calibration = Calibration("somecpu", (Peak(1, 1.5e11, 8e9), Peak(4, 5e11, 2e10)), 512, {"fma256_gflops": 75.0},
                              bf16_rate=0.5)
    path.write_text(cpu_model.calibration_json(calibration))
    read = cpu_model.read_calibration(path, "somecpu")
    assert read is not None and (read.peaks, read.fma_width, read.bf16_rate) == (calibration.peaks, 512, 0.5)
    merged = cpu_model.merged(read, Calibration("somecpu", (Peak(4, 6e11, 3e10),)))
    assert merged.peaks == (Peak(1, 1.5e11, 8e9), Peak(4, 6e11, 3e10)) and merged.fma_width == 512
    assert merged.bf16_rate == 0.5  # kept from the old file where the new one did not measure it


def test_a_calibration_written_before_the_bf16_rate_loads(tmp_path):
    path = cpu_model.calibration_path("somecpu", tmp_path)
    path.write_text(json.dumps(_calibration()))  # no bf16_rate field
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        read = cpu_model.read_calibration(path, "somecpu")
    assert read is not None and read.bf16_rate == 0 and read.fma_width == 512


@pytest.mark.parametrize("text", [
    "not json",
    json.dumps([1, 2]),
    json.dumps(_calibration(format="something else")),
    json.dumps(_calibration(version=2)),
    json.dumps(_calibration(cpu="othercpu")),
    json.dumps(_calibration(cores={})),
    json.dumps(_calibration(cores={"0": {"flops": 1e11, "bandwidth": 1e10}})),
    json.dumps(_calibration(cores={"two": {"flops": 1e11, "bandwidth": 1e10}})),
    json.dumps(_calibration(cores={"1": {"flops": "1e11", "bandwidth": 1e10}})),
    json.dumps(_calibration(cores={"1": {"flops": True, "bandwidth": 1e10}})),
    json.dumps(_calibration(cores={"1": {"flops": -1.0, "bandwidth": 1e10}})),
    json.dumps(_calibration(cores={"1": {"flops": 1e30, "bandwidth": 1e10}})),
    json.dumps(_calibration(cores={"1": {"flops": 1e11}})),
    json.dumps(_calibration(cores={"1": [1e11, 1e10]})),
    json.dumps(_calibration(fma_width=384)),
    json.dumps(_calibration(fma_width="512")),
    json.dumps(_calibration(bf16_rate=-0.5)),
    json.dumps(_calibration(bf16_rate=100.0)),
    json.dumps(_calibration(bf16_rate="0.5")),
    json.dumps(_calibration(bf16_rate=True)),
    '{"format": "cinn-calibration", "version": 1, "cpu": "somecpu", "cores": {"1": {"flops": NaN, "bandwidth": 1}}}',
])
def test_a_bad_calibration_warns_once_and_keeps_the_estimates(tmp_path, text):
    path = tmp_path / "calibration-somecpu.json"
    path.write_text(text)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cpu_model.read_calibration(path, "somecpu") is None
    assert len(caught) == 1 and "estimated" in str(caught[0].message)


def test_a_missing_calibration_is_no_warning(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cpu_model.read_calibration(tmp_path / "none.json", "somecpu") is None


def test_the_host_model_uses_its_calibration(tmp_path):
    host = cpu_model.host_cpu()
    path = cpu_model.calibration_path(host, tmp_path)
    estimated = cpu_model.host_model(path)
    assert not estimated.calibrated
    path.write_text(json.dumps(_calibration(cpu=host, fma_width=256)))
    cpu_model.host_model.cache_clear()
    model = cpu_model.host_model(path)
    assert model.calibrated and model.fma_width == 256 and model.peak_flops(4) == 5e11 and model.bandwidth(1) == 8e9
    assert model.peak_flops(2) == 3e11  # the nearest count measured (1), scaled by cores
    path.write_text(json.dumps(_calibration(cpu=host, bf16_rate=2.0)))
    cpu_model.host_model.cache_clear()
    model = cpu_model.host_model(path)  # the measured bf16 rate replaces the table's, on a host with AVX512_BF16
    assert model.bf16_rate == (2.0 if model.bf16 else 0.0) and model.bf16_pays == model.bf16
    cpu_model.host_model.cache_clear()


def test_the_ops_lower_for_the_target_model():
    avx2 = parse_target("llvm -mcpu=znver3").model
    assert cpu_model.lowering_model() == parse_target("llvm").model  # outside any lowering: the host's
    with cpu_model.lowering_for(avx2):
        assert cpu_model.lowering_model() is avx2
        with cpu_model.lowering_for(None):  # a target without a model keeps the one in force
            assert cpu_model.lowering_model() is avx2


def test_known_cpus_and_their_fma_width():
    assert parse_target("llvm -mcpu=znver5").model.fma_bits == 1024  # two full 512-bit FMA units
    assert parse_target("llvm -mcpu=znver4").model.fma_bits == 512  # AVX-512 on 256-bit units
    assert parse_target("llvm -mcpu=haswell").model.fma_bits == 512
    model = parse_target("llvm -mcpu=sapphirerapids").model
    assert (model.vnni, model.bf16, model.amx) == (True, True, True) and not model.calibrated


@pytest.mark.parametrize(("mcpu", "rate", "pays"), [("znver4", 2.0, True), ("znver5", 2.0, True),
                                                    ("emeraldrapids", 0.5, False), ("znver3", 0.0, False),
                                                    ("cooperlake", 0.0, False)])
def test_known_cpus_and_their_bf16_rate(mcpu, rate, pays):
    model = parse_target(f"llvm -mcpu={mcpu}").model
    assert (model.bf16_rate, model.bf16_pays, model.bf16_slower) == (rate, pays, 0 < rate < 1)


def test_calibrate_help_and_version(capsys):
    with pytest.raises(SystemExit) as exit_help:
        calibrate.main(["--help"])
    assert exit_help.value.code == 0 and "--quick" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_version:
        calibrate.main(["--version"])
    assert exit_version.value.code == 0 and capsys.readouterr().out.startswith("cinn-calibrate ")
    assert calibrate.main(["--cores", "0"]) == 2  # a usage error


def test_calibrate_measures_the_host_and_its_model_uses_it(tmp_path):
    """A quick run as its own process (`python -m`): the peaks on one core, cached where the host's model reads."""
    run = subprocess.run([sys.executable, "-m", "cinn.facade.calibrate", "--quick", "--cores", "1", "--cache-dir",
                          str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    path = cpu_model.calibration_path(cpu_model.host_cpu(), tmp_path)
    assert f"measured ({path})" in run.stdout and "1 core: " in run.stdout
    calibration = cpu_model.read_calibration(path, cpu_model.host_cpu())
    assert calibration is not None and [p.cores for p in calibration.peaks] == [1]
    model = cpu_model.host_model(path)
    assert model.calibrated and model.peaks == calibration.peaks
    assert (calibration.bf16_rate > 0) == model.bf16 == ("bf16 dot products: " in run.stdout)  # measured with BF16
    cpu_model.host_model.cache_clear()
