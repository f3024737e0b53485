"""The schedule log as compile reads it: best record per workload, corrupt lines skipped."""
from __future__ import annotations

import importlib
import json
import os
import pathlib
import pkgutil
import random
import re
import subprocess
import sys
import warnings
from collections import Counter

import numpy as np
import pytest
import tvm_ffi
from tvm.s_tir import Schedule

import cinn
import tests.cases as cases_pkg
from autotune import space
from autotune.database import (
    DEFAULT_TRACE,
    FailureKind,
    Record,
    Scope,
    best_traces,
    fastest_traces,
    noted_baselines,
    read_records,
)
from autotune.task import extract_tasks
from cinn.compiler.build import KernelSpec, build_kernel
from cinn.core.ops import PatternKind
from cinn.core.target import parse_target
from schedules import replay
from schedules.analysis import blocks
from tests.test_onnx_import import tiny_relu_model
from tests.test_ops import emit


def _rec(workload, cost, target="llvm -mcpu=x -num-cores=2", error=""):
    """A record whose trace (a lookup of a block named after its cost) tells it apart."""
    trace = json.dumps([[["GetSBlock", [], [f"t{cost}", "main"], ["b0"]]], []])
    return Record(workload, target, trace, (cost,) if cost else (), error=error)


def test_best_record_per_workload_and_target(tmp_path):
    log = tmp_path / "log.jsonl"
    recs = [_rec("a", 3.0), _rec("a", 1.0), _rec("a", 0.5, target="cuda -arch=sm_90"), _rec("b", 2.0), _rec("b", 0.1, error="crashed")]
    log.write_text("".join(r.to_json() + "\n" for r in recs) + '{"workload": "torn', encoding="utf-8")
    with pytest.warns(UserWarning, match="log.jsonl:6: skipping corrupt"):
        best = best_traces(log, parse_target("llvm -mcpu=x -num-cores=2"))
    assert best == {"a": recs[1].trace, "b": recs[3].trace}


def test_compile_with_log_of_unknown_workloads_falls_back(tmp_path, tmp_cache):
    log = tmp_path / "log.jsonl"
    log.write_text(_rec("0123", 1.0).to_json() + "\n")
    b = cinn.NetBuilder("p")
    x = b.create_input("float32", (4,), "x")
    exe = cinn.compile(b.build([b.relu(x)]), tuning_log=log, cache_dir=tmp_cache)
    np.testing.assert_array_equal(exe.run({"x": np.array([-1, 2, -3, 4], "float32")})[0], [0, 2, 0, 4])


def test_re_measured_trace_is_judged_on_all_its_runs(tmp_path):
    log = tmp_path / "log.jsonl"
    lucky, steady, flaky = _rec("a", 0.1), _rec("a", 1.0), _rec("a", 0.2)
    again = Record("a", lucky.target, lucky.trace, (3.0, 3.0))  # the lucky one re-measured: mean 2.03 over 3 runs
    crashed = Record("a", flaky.target, flaky.trace, (), error="crashed")  # one failure rules a trace out
    log.write_text("".join(r.to_json() + "\n" for r in (lucky, steady, flaky, again, crashed)), encoding="utf-8")
    assert best_traces(log, parse_target("llvm -mcpu=x -num-cores=2")) == {"a": steady.trace}


def test_failure_kinds_round_trip_and_old_lines_load():
    """A record's failure kind is written and read back; lines from logs written before kinds existed still load."""
    rec = Record("a", "llvm", "[]", (), error="after 10 s", failure=FailureKind.RUN_TIMEOUT)
    again = Record.from_json(rec.to_json())
    assert again == rec and again.failed and json.loads(rec.to_json())["failure"] == "run_timeout"
    old_failed = Record.from_json('{"workload": "a", "target": "llvm", "trace": "[]", "costs": [], "error": "run: boom"}')
    old_ok = Record.from_json('{"workload": "a", "target": "llvm", "trace": "[]", "costs": [1.0]}')
    assert old_failed.failure is FailureKind.UNKNOWN and old_failed.error == "run: boom"
    assert old_ok.failure is None and not old_ok.failed


def test_a_missing_tuning_log_is_an_error(tmp_path, tmp_cache):
    b = cinn.NetBuilder("p")
    x = b.create_input("float32", (4,), "x")
    with pytest.raises(FileNotFoundError, match=r"tuning_log .*nope\.jsonl.*no such schedule log"):
        cinn.compile(b.build([b.relu(x)]), tuning_log=tmp_path / "nope.jsonl", cache_dir=tmp_cache)


def test_model_scope_records_decide_where_present():
    """Times inside the model (cinn-tune's in-model check) overrule the kernel's own: the default schedule
    (DEFAULT_TRACE) winning there leaves the workload without a trace; medians, so one slow round does not decide."""
    target = parse_target("llvm -mcpu=x -num-cores=2")
    fast_alone, slow_alone = _rec("a", 0.1), _rec("a", 0.3)

    def model(trace, *costs):
        return Record("a", fast_alone.target, trace, costs, scope=Scope.MODEL)

    assert fastest_traces([fast_alone, slow_alone], target) == {"a": fast_alone.trace}
    loses = [model(fast_alone.trace, 2.0, 2.0, 2.0), model(DEFAULT_TRACE, 1.0, 1.0, 1.0)]
    assert fastest_traces([fast_alone, slow_alone, *loses], target) == {}
    one_slow_round = [model(fast_alone.trace, 0.5, 0.5, 9.0), model(DEFAULT_TRACE, 1.0, 1.0, 1.0)]
    assert fastest_traces([fast_alone, slow_alone, *one_slow_round], target) == {"a": fast_alone.trace}
    assert fastest_traces([*loses, _rec("b", 0.2)], target) == {"b": _rec("b", 0.2).trace}


def test_scope_round_trips_and_old_lines_are_kernel_scope():
    rec = Record("a", "llvm", DEFAULT_TRACE, (1e-3, 2e-3), scope=Scope.MODEL)
    assert Record.from_json(rec.to_json()) == rec and json.loads(rec.to_json())["scope"] == "model"
    old = Record.from_json('{"workload": "a", "target": "llvm", "trace": "[]", "costs": [1.0]}')
    assert old.scope is Scope.KERNEL


def test_verdicts_judged_against_another_default_do_not_count():
    """A model-scope verdict notes the fingerprint of the default schedule it beat: once today's default differs (a
    newer cinn), the tuned schedule is not applied on the old verdict's word, nor on the kernel's own times; verdicts
    against today's default (re-judged) and old lines without a fingerprint count."""
    target = parse_target("llvm -mcpu=x -num-cores=2")
    alone = _rec("a", 0.1)

    def model(trace, cost, baseline):
        return Record("a", alone.target, trace, (cost,) * 3, scope=Scope.MODEL, baseline=baseline)

    wins_old = [model(alone.trace, 0.5, "old"), model(DEFAULT_TRACE, 1.0, "old")]
    assert fastest_traces([alone, *wins_old], target) == {"a": alone.trace}  # no fingerprint asked: as before
    assert fastest_traces([alone, *wins_old], target, {"a": "old"}) == {"a": alone.trace}
    assert fastest_traces([alone, *wins_old], target, {"a": "new"}) == {}
    loses_new = [model(alone.trace, 2.0, "new"), model(DEFAULT_TRACE, 1.0, "new")]
    assert fastest_traces([alone, *wins_old, *loses_new], target, {"a": "new"}) == {}
    wins_new = [model(alone.trace, 0.5, "new"), model(DEFAULT_TRACE, 1.0, "new")]
    assert fastest_traces([alone, *wins_new], target, {"a": "new"}) == {"a": alone.trace}
    unnoted = [model(alone.trace, 0.5, ""), model(DEFAULT_TRACE, 1.0, "")]
    assert fastest_traces([alone, *unnoted], target, {"a": "new"}) == {"a": alone.trace}
    assert noted_baselines([alone, *wins_old, *wins_new, *unnoted], target) == {"a": {"old", "new", ""}}


def test_baseline_round_trips_and_old_lines_have_none():
    rec = Record("a", "llvm", DEFAULT_TRACE, (1e-3,), scope=Scope.MODEL, baseline="00ff")
    assert Record.from_json(rec.to_json()) == rec and json.loads(rec.to_json())["baseline"] == "00ff"
    assert Record.from_json('{"workload": "a", "target": "llvm", "trace": "", "costs": [1.0], "scope": "model"}').baseline == ""


# --- replaying a log: only what cinn's schedules emit (schedules.replay) ---

CPU = parse_target("llvm")


def _payload(marker) -> str:
    """LLVM IR whose module-level assembly creates `marker` from the kernel library's .init_array, at load."""
    lines = [".text", "cinn_evil:", "push %rbp", "lea cinn_evil_path(%rip), %rdi", "mov $420, %esi", "call creat@PLT",
             "pop %rbp", "ret", ".section .rodata", f"cinn_evil_path: .asciz \\22{marker}\\22",
             ".section .init_array,\\22aw\\22", ".p2align 3", ".quad cinn_evil", ".text"]
    return "".join(f'module asm "{line}"\n' for line in lines)


def _relu(n=64):
    b = cinn.NetBuilder("p")
    x = b.create_input("float32", (n,), "x")
    return b.build([b.relu(x)])


def _task(program, target=CPU):
    (task,) = extract_tasks(program, target=target)
    return task


def _with(trace: str, *insts, decisions=()) -> str:
    """A trace with instructions (and decisions) appended."""
    old_insts, old_decisions = json.loads(trace)
    return json.dumps([old_insts + list(insts), old_decisions + list(decisions)])


def _block_name(task) -> str:
    """The name of the kernel's (one) block."""
    sch = Schedule(task.module())
    return sch.get(blocks(sch)[0]).name_hint


def _annotated(task, key: str, value) -> str:
    """The default schedule's trace with an annotation on the kernel's outer loop."""
    cand, block = space.default_candidate(task, CPU), _block_name(task)
    loops = [f"l{900 + i}" for i in range(len(cand.sch.get_loops(cand.sch.get_sblock(block))))]
    return _with(cand.trace_json(), ["GetSBlock", [], [block, "main"], ["b899"]], ["GetLoops", ["b899"], [], loops],
                 ["Annotate", [loops[0], value], [key], []])


def _log(tmp_path, task, *traces) -> str:
    log = tmp_path / "evil.jsonl"
    log.write_text("".join(Record(task.workload, str(CPU), t, (1e-9,)).to_json() + "\n" for t in traces))
    return str(log)


@pytest.mark.parametrize("key", ["pragma_import_llvm", "pragma_import_c"])
def test_a_log_that_would_link_code_is_refused(key, tmp_path, tmp_cache):
    """Finding 3 of issue 49: TVM links a pragma_import_llvm annotation's IR into the kernel library, whose
    .init_array then ran at load. The record is skipped, with a warning naming the log's line; the default schedule
    runs."""
    marker = tmp_path / "marker"
    program, task = _relu(), _task(_relu())
    log = _log(tmp_path, task, _annotated(task, key, f'"{_payload(marker)}"'))
    with pytest.warns(UserWarning, match=rf"evil\.jsonl:1: skipping a tuning record .*annotation '{key}'"):
        exe = cinn.compile(program, tuning_log=log, cache_dir=tmp_cache)
    x = np.arange(-32, 32, dtype="float32")
    np.testing.assert_array_equal(exe.run({"x": x})[0], np.maximum(x, 0))
    assert not marker.exists()
    assert exe.kernel_sources() == cinn.compile(program, cache_dir=tmp_cache).kernel_sources()


def test_cinn_run_refuses_a_log_that_would_link_code(tmp_path):
    from frontend.loading import load_model

    model = tiny_relu_model(tmp_path / "tiny.onnx")
    marker = tmp_path / "marker"
    task = _task(load_model(str(model), {}))
    log = _log(tmp_path, task, _annotated(task, "pragma_import_llvm", f'"{_payload(marker)}"'))
    env = {**os.environ, "CINN_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-m", "cinn", str(model), "--log", log, "--repeat", "1"], capture_output=True,
                          text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert "evil.jsonl:1: skipping a tuning record" in done.stderr and "pragma_import_llvm" in done.stderr
    assert not marker.exists()


def _tile(task, decision) -> str:
    """A trace that splits the kernel's loop by a sampled tile with this decision."""
    block = _block_name(task)
    return json.dumps([[["GetSBlock", [], [block, "main"], ["b0"]], ["GetLoops", ["b0"], [], ["l1"]],
                        ["SamplePerfectTile", ["l1"], [2, 64], ["v2", "v3"]],
                        ["Split", ["l1", "v2", "v3"], [True, False], ["l4", "l5"]]], [[2, decision]]])


def _loop_step(task, kind: str, *inputs) -> str:
    """A trace with one instruction on the kernel's loop."""
    block = _block_name(task)
    outputs = ["l2", "l3"] if kind == "Split" else []
    return json.dumps([[["GetSBlock", [], [block, "main"], ["b0"]], ["GetLoops", ["b0"], [], ["l1"]],
                        [kind, ["l1", *inputs], [True, False] if kind == "Split" else [], outputs]], []])


BAD_TRACES = {  # refused when the log is read (read) or when the trace is replayed onto the kernel (replay)
    "unknown instruction": ("read", lambda t: json.dumps([[["UnsafeSetDType", ["b0"], [0, "float64"], []]], []])),
    "not JSON": ("read", lambda t: "{not json"),
    "deeply nested": ("read", lambda t: "[" * 100_000 + "]" * 100_000),
    "not a trace": ("read", lambda t: json.dumps({"winograd_tile": 2})),
    "string annotation": ("read", lambda t: _annotated(t, "pragma_auto_unroll_max_step", '"512"')),
    "absurd unroll": ("read", lambda t: _annotated(t, "pragma_auto_unroll_max_step", 2**30)),
    "negative unroll": ("read", lambda t: _annotated(t, "pragma_auto_unroll_max_step", -16)),
    "negative tile": ("read", lambda t: _tile(t, [-1, -64])),
    "huge tile": ("read", lambda t: _tile(t, [2**40, 1])),
    "tile of three": ("read", lambda t: _tile(t, [4, 4, 4])),
    "categorical out of range": ("read", lambda t: json.dumps(
        [[["SampleCategorical", [], [[0, 16], [0.5, 0.5]], ["v0"]]], [[0, 7]]])),
    "tile not the extent": ("replay", lambda t: _tile(t, [3, 5])),
    "tile past the extent": ("replay", lambda t: _tile(t, [2**20, 1])),
    "split far past the extent": ("replay", lambda t: _loop_step(t, "Split", "None", 2**30)),
    "long unroll": ("replay", lambda t: _loop_step(t, "Unroll")),
}


@pytest.mark.parametrize("case", sorted(BAD_TRACES))
def test_bad_traces_are_refused_and_the_default_schedule_runs(case, tmp_path, tmp_cache):
    """Unknown instructions, malformed JSON, and decisions, splits and unrolls no schedule of cinn's takes are
    refused when the log is read (a warning naming its line) or when the trace is replayed (the kernel keeps its
    default schedule); nothing crashes."""
    when, make = BAD_TRACES[case]
    program, task = _relu(4096), _task(_relu(4096))
    trace = make(task)
    with pytest.raises(replay.TraceRefused):
        replay.replay(Schedule(task.module()), trace)
    if when == "replay":
        replay.check(trace)  # well-formed: only the kernel's loop sizes refuse it
    log = _log(tmp_path, task, trace)
    message = r"evil\.jsonl:1: skipping a tuning record" if when == "read" else "does not apply"
    with pytest.warns(UserWarning, match=message):
        exe = cinn.compile(program, tuning_log=log, cache_dir=tmp_cache)
    x = np.linspace(-1, 1, 4096, dtype="float32")
    np.testing.assert_array_equal(exe.run({"x": x})[0], np.maximum(x, 0))


def test_a_kernel_build_refuses_a_trace_itself(tmp_path):
    """The second line of defence: a spec with a refused trace (records handed to compile as they are) never
    reaches TVM's compiler."""
    marker = tmp_path / "marker"
    task = _task(_relu())
    trace = _annotated(task, "pragma_import_llvm", f'"{_payload(marker)}"')
    spec = KernelSpec(task.workload, task.func(), task.kind, trace)
    with pytest.raises(replay.TraceRefused, match="pragma_import_llvm"):
        build_kernel(spec, CPU, str(tmp_path / "k.so"))
    assert not marker.exists() and not (tmp_path / "k.so").exists()


def test_algorithm_and_default_records_are_not_schedule_traces(tmp_path):
    log = tmp_path / "log.jsonl"
    recs = [Record("winograd/r1/x", "llvm", json.dumps({"winograd_tile": 2}), (1.0,)),
            Record("a", "llvm", DEFAULT_TRACE, (1.0,), scope=Scope.MODEL)]
    log.write_text("".join(r.to_json() + "\n" for r in recs))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert list(read_records(log)) == recs


# every trace the search space samples passes: sampled from the op tests' models, and models that reach the
# schedules' rarer paths (a causal attention, Winograd kernels, int8, a conv one vector wide)
CASE_MODULES = sorted(m.name for m in pkgutil.iter_modules(cases_pkg.__path__))
TARGETS = {"cpu": CPU, "avx2": parse_target("llvm -mcpu=znver3 -num-cores=2"), "cuda": parse_target("cuda -arch=sm_90")}


def _case_programs(module: str) -> list:
    rng = np.random.default_rng(0)
    programs = []
    for case in importlib.import_module(f"tests.cases.{module}").CASES:
        builder, outputs, _ = emit(case, case.arrays(rng))
        programs.append(builder.build(outputs))
    return programs


def _causal_attention():
    i, j = np.ogrid[:128, :128]
    b = cinn.NetBuilder("causal")
    q, k, v = (b.create_input("float32", (2, 128, 128), n) for n in "qkv")
    causal = b.create_constant(np.where(j > i, -1e9, 0.0).astype("float32"), "bias")
    return b.build([b.attention(q, k, v, causal, heads=4, scale=0.125)])


def _one_vector_conv():
    """A 1x1 conv of 8 channels x 13 columns a tile on AVX2: compiled without partial unrolling."""
    b = cinn.NetBuilder("conv")
    x = b.create_input("float32", (1, 512, 13, 13), "x")
    return b.build([b.conv2d(x, b.create_input("float32", (1000, 512, 1, 1), "w"))])


def _sampled_tasks(programs, target, winograd=None, per_kind=4):
    """The programs' tasks: every one of INJECTIVE and later kinds, the first few elementwise and broadcast ones
    (they share one schedule)."""
    tasks, simple = {}, Counter()
    for p in programs:
        for t in extract_tasks(p, target=target, winograd_choices=winograd or {}):
            if t.workload not in tasks and (t.kind > PatternKind.BROADCAST or simple[t.kind] < per_kind):
                simple[t.kind] += 1
                tasks[t.workload] = t
    return list(tasks.values())


def _assert_replayable(tasks, target, samples: int) -> set[str]:
    """Sample each task's default and `samples` random candidates; each must pass the allow-list and replay to the
    same schedule. Returns the annotation keys seen."""
    keys = set()
    for task in tasks:
        rng = random.Random(0)
        for cand in [space.default_candidate(task, target)] + [space.sample(task, target, rng) for _ in range(samples)]:
            if cand is None:
                continue
            sch = Schedule(task.module())
            replay.replay(sch, cand.trace_json())
            assert tvm_ffi.structural_equal(sch.mod, cand.sch.mod), task.name
            keys |= {inst[2][0] for inst in json.loads(cand.trace_json())[0] if inst[0] == "Annotate"}
    return keys


@pytest.mark.parametrize("target", ["cpu", "cuda"])
@pytest.mark.parametrize("module", CASE_MODULES)
def test_every_trace_the_search_space_samples_is_replayable(module, target):
    """The allow-list cannot drift from the schedules: a new instruction, literal or annotation fails here."""
    _assert_replayable(_sampled_tasks(_case_programs(module), TARGETS[target]), TARGETS[target],
                       samples=2 if target == "cpu" else 1)


def test_every_allowed_annotation_is_one_the_schedules_emit():
    """The rarer paths' traces replay too, and every annotation the allow-list names is one of theirs (no key is
    allowed that cinn never writes)."""
    from autotune.algorithms import conv_program
    from cinn.compiler.passes.winograd import TILES, ConvShape

    shape = ConvShape(1, 16, 16, (14, 14), (1, 1, 1, 1))
    winograd = [t for tile in TILES
                for t in _sampled_tasks([conv_program(shape)], CPU, {shape.key: tile})]
    keys = _assert_replayable(_sampled_tasks([_causal_attention()], CPU) + winograd, CPU, samples=3)
    keys |= _assert_replayable(_sampled_tasks([_one_vector_conv()], TARGETS["avx2"]), TARGETS["avx2"], samples=3)
    assert keys == set(replay.ANNOTATIONS)


def test_every_schedule_primitive_the_schedules_call_is_allowed():
    """Read from the schedules' source, so a primitive on a path the samples above miss is covered too."""
    primitives = {m for m in dir(Schedule) if not m.startswith("_")} - {"get", "same_as", "copy"}  # not traced
    sources = [*pathlib.Path(blocks.__code__.co_filename).parent.glob("*.py"), pathlib.Path(space.__file__)]
    called = {m for path in sources for m in re.findall(r"\bsch\.(\w+)\(", path.read_text()) if m in primitives}
    kinds = {m: {"get_sblock": "GetSBlock", "rfactor": "RFactor"}.get(m, m.title().replace("_", "")) for m in called}
    assert {m for m, kind in kinds.items() if kind not in replay.RULES} == set()
    assert len(called) > 20
