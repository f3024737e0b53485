"""Schedule rules: the registry picks the rule the former elif chain did (by priority, per target kind), a rule
registered by a test wins or loses by its priority, post-processors run in the build, ops that need a rule get it or
fail clearly, and each feature's parts exist and are registered (cinn.compiler.features)."""
from __future__ import annotations

import dataclasses
import importlib
import pathlib
import pkgutil
from typing import ClassVar

import numpy as np
import pytest
import tvm
from tvm.s_tir import Schedule

import cinn
import schedules
from cinn.compiler.build import KernelSpec, build_kernel, workload_key
from cinn.compiler.features import FEATURES
from cinn.compiler.lower import lower_program
from cinn.compiler.passes.pipeline import PASSES, winograd_shapes
from cinn.core.ops import OPS, PatternKind, RuleName, TargetKind
from cinn.core.ops.quant import pack_vnni
from cinn.core.ops.registry import register
from cinn.core.target import parse_target
from schedules import cpu_attention, cpu_tiling, registry
from schedules.analysis import blocks
from schedules.cuda_common import unbound_blocks
from schedules.knobs import DEFAULT, Knob, Knobs
from schedules.registry import FALLBACK, MissingRule, apply_default, pick, postprocessor, schedule_rule

ROOT = pathlib.Path(__file__).resolve().parents[1]
RNG = np.random.default_rng(0)
VNNI, AVX2, CUDA = (parse_target(s) for s in ("llvm -mcpu=cascadelake -num-cores=2", "llvm -mcpu=znver3 -num-cores=2",
                                              "cuda -arch=sm_80"))


def _constant(b: cinn.NetBuilder, shape: tuple[int, ...], name: str):
    return b.create_constant(RNG.standard_normal(shape).astype("float32"), name)


def _matmul(b: cinn.NetBuilder):
    x = b.create_input("float32", (64, 128), "x")
    return [b.relu(b.add(b.matmul(x, _constant(b, (128, 96), "w")), _constant(b, (96,), "bias")))]


def _gemv(b: cinn.NetBuilder):
    return [b.matmul(b.create_input("float32", (1, 256), "x"), _constant(b, (256, 512), "w"))]


def _conv(channels: int, size: int):
    def make(b: cinn.NetBuilder):
        x = b.create_input("float32", (1, channels, size, size), "x")
        return [b.relu(b.conv2d(x, _constant(b, (channels, channels, 3, 3), "w"), paddings=[1, 1]))]

    return make


def _quantized_matmul(b: cinn.NetBuilder):
    """x -> quantize -> dequantize -> matmul of int8-valued weights: integer_kernels' pattern on a VNNI CPU."""
    x = b.create_input("float32", (6, 32), "x")
    s, z = b.create_constant(np.float32(0.05), "s"), b.create_constant(np.float32(3), "z")
    q = b.cast(b.clip(b.add(b.round(b.divide(x, s)), z), 0.0, 255.0), "uint8")
    deq = b.multiply(b.subtract(b.cast(q, "float32"), z), s)
    w = (RNG.integers(-127, 128, (32, 48)).astype(np.float32) * np.float32(0.01)).astype(np.float32)
    return [b.matmul(deq, b.create_constant(w, "w"))]


def _matmul_u8i8(b: cinn.NetBuilder):
    w = pack_vnni(RNG.integers(-128, 128, (64, 32)).astype("int8"), 16)  # AVX-512's 16 int32 lanes
    return [b.matmul_u8i8(b.create_input("uint8", (8, 64), "x"), b.create_constant(w, "w"))]


def _attention(b: cinn.NetBuilder):
    q, k, v = (b.create_input("float32", (2, 16, 32), n) for n in "qkv")
    return [b.attention(q, k, v, b.create_constant(np.float32(0), "bias"), heads=2, scale=0.25)]


def _softmax(b: cinn.NetBuilder):
    return [b.softmax(b.create_input("float32", (32, 128), "x"), axes=[-1])]


def _column_sum(b: cinn.NetBuilder):
    return [b.reduce_sum(b.create_input("float32", (64, 32), "x"), [0])]


def _long_rows(b: cinn.NetBuilder):
    """Two rows of 20000: too few to fill a GPU with one block per row."""
    return [b.reduce_sum(b.create_input("float32", (2, 20000), "x"), [1])]


def _squeeze_excite(b: cinn.NetBuilder):
    """A squeeze-excite gate over 14x14 maps of 64 channels, scaling them: one vector chain kernel."""
    x = b.create_input("float32", (1, 64, 14, 14), "x")
    pooled = b.reduce_mean(x, [2, 3], keep_dim=True)
    hidden = b.relu(b.conv2d(pooled, _constant(b, (16, 64, 1, 1), "w1")))
    return [b.multiply(x, b.hard_sigmoid(b.conv2d(hidden, _constant(b, (64, 16, 1, 1), "w2"))))]


def _elementwise(b: cinn.NetBuilder):
    x, y = (b.create_input("float32", (32, 128), n) for n in "xy")
    return [b.tanh(b.add(x, y))]


# program, its passes on: whether its 3x3 convs become Winograd convs
PROGRAMS = {"matmul": _matmul, "gemv": _gemv, "conv": _conv(8, 16), "winograd": _conv(64, 24),
            "quantized": _quantized_matmul, "matmul_u8i8": _matmul_u8i8, "attention": _attention,
            "softmax": _softmax, "column_sum": _column_sum, "long_rows": _long_rows, "elementwise": _elementwise,
            "squeeze_excite": _squeeze_excite}
WINOGRAD_TRANSFORMS = ["Winograd", "Matmul", "Winograd"]
# the rule of each kernel, as the elif chains of schedules/cpu.py and cuda.py chose them before the registry
CHAIN = {
    (VNNI, "matmul"): ["Matmul"], (VNNI, "gemv"): ["Gemv"], (VNNI, "conv"): ["Matmul"],
    (VNNI, "winograd"): WINOGRAD_TRANSFORMS, (VNNI, "quantized"): ["Generic", "Int8"], (VNNI, "matmul_u8i8"): ["Int8"],
    (VNNI, "attention"): ["Attention"], (VNNI, "softmax"): ["RowReduction"], (VNNI, "column_sum"): ["RowReduction"],
    (VNNI, "elementwise"): ["Generic"], (VNNI, "squeeze_excite"): ["SqueezeExcite"],
    (AVX2, "winograd"): WINOGRAD_TRANSFORMS, (AVX2, "quantized"): ["Generic", "Matmul"], (AVX2, "matmul_u8i8"): ["Matmul"],
    (AVX2, "attention"): ["Attention"],
    (CUDA, "matmul"): ["CudaMatmul"], (CUDA, "gemv"): ["CudaMatmul"], (CUDA, "conv"): ["CudaMatmul"],
    (CUDA, "winograd"): ["CudaMatmul"], (CUDA, "quantized"): ["CudaGeneric", "CudaMatmul"],
    (CUDA, "matmul_u8i8"): ["CudaMatmul"], (CUDA, "attention"): ["CudaGeneric"],
    (CUDA, "softmax"): ["CudaRowReduction"], (CUDA, "column_sum"): ["CudaRowReduction"],
    (CUDA, "long_rows"): ["CudaGeneric"], (CUDA, "elementwise"): ["CudaGeneric"],
    (CUDA, "squeeze_excite"): ["CudaGeneric"],
}
ORDER = {TargetKind.CPU: [("Winograd", 70), ("Attention", 60), ("Bf16", 52), ("Int8", 50), ("SqueezeExcite", 44),
                          ("Gemv", 40), ("Matmul", 30), ("RowReduction", 20), ("Generic", FALLBACK)],
         TargetKind.CUDA: [("CudaTensorCore", 40), ("CudaMatmul", 30), ("CudaRowReduction", 20),
                           ("CudaGeneric", FALLBACK)]}


def kernels(name: str, target) -> list[tuple[Schedule, PatternKind]]:
    """The kernels of a program as the compiler lowers them for `target` (Winograd convs only for "winograd")."""
    b = cinn.NetBuilder(name)
    program = b.build(PROGRAMS[name](b))
    tiles = {shape.key: 4 if name == "winograd" else 0 for shape in winograd_shapes(program, target)}
    _, lowered = lower_program(program, passes=name != "matmul_u8i8", target=target, winograd_choices=tiles)
    return [(Schedule(tvm.IRModule({"main": lg.func})), lg.group.kind) for lg in lowered]


@pytest.fixture
def scratch(monkeypatch) -> registry.Registry:
    """A copy of the registry that the test may register into."""
    copy = registry.REGISTRY.copy()
    monkeypatch.setattr(registry, "REGISTRY", copy)
    return copy


class Always:
    """A test rule that applies to every kernel and records what it scheduled."""

    applied: ClassVar[list[Schedule]] = []

    def applicable(self, sch: Schedule, kind: PatternKind, target, knobs: Knobs) -> bool:
        return True

    def apply(self, sch: Schedule, target, knobs: Knobs) -> None:
        Always.applied.append(sch)


@pytest.mark.parametrize(("target", "name"), list(CHAIN), ids=[f"{t.mcpu or t.arch}-{n}" for t, n in CHAIN])
def test_registry_picks_the_former_chains_rule(target, name):
    """Every kernel gets the former chain's rule, which schedules it (a CUDA kernel's blocks all bound)."""
    found = kernels(name, target)
    assert [pick(sch, kind, target).name for sch, kind in found] == CHAIN[target, name]
    for sch, kind in found:
        apply_default(sch, kind, target)
        if target.is_cuda:
            assert unbound_blocks(sch) == []


def test_cuda_schedule_generates_a_kernel():
    """A CUDA rule's schedule builds into CUDA source without a GPU (PTX: tests/test_cuda.py)."""
    ((sch, kind),) = kernels("softmax", CUDA)
    apply_default(sch, kind, CUDA)
    with CUDA.tvm() as tgt:
        ex = tvm.compile(sch.mod, target=tgt)
    assert "__global__" in ex.mod.imports[0].inspect_source("cuda")


def test_rules_by_priority_as_the_docs_list_them():
    page = (ROOT / "docs" / "features.md").read_text()
    for target_kind, order in ORDER.items():
        assert [(e.name, e.priority) for e in registry.rules(target_kind)] == order
        assert all(f"`{name}` {priority}" in page for name, priority in order)


def test_the_package_registers_every_rule_module():
    """Importing every module of schedules registers nothing new: `import schedules` has imported them all."""
    before = registry.REGISTRY.copy()
    for info in pkgutil.iter_modules(schedules.__path__):
        importlib.import_module(f"schedules.{info.name}")
    assert registry.REGISTRY == before


@pytest.mark.parametrize(("priority", "wins"), [(65, True), (25, False)])
def test_a_registered_rule_wins_or_loses_by_priority(scratch, priority, wins):
    schedule_rule(TargetKind.CPU, priority)(Always)
    ((sch, kind),) = kernels("matmul", AVX2)
    assert (pick(sch, kind, AVX2).name == "Always") == wins
    ((sch, kind),) = kernels("elementwise", AVX2)
    Always.applied.clear()
    apply_default(sch, kind, AVX2)
    assert Always.applied == [sch]  # above the fallback either way
    ((sch, kind),) = kernels("elementwise", CUDA)
    assert pick(sch, kind, CUDA).name == "CudaGeneric"  # registered for CPU only


def test_priorities_are_unique_per_target_kind(scratch):
    with pytest.raises(ValueError, match="share priority 30"):
        schedule_rule(TargetKind.CPU, 30)(Always)
    schedule_rule(TargetKind.CUDA, 60)(Always)  # another kind's priorities are its own


def test_a_rule_serves_a_name_of_its_own_target_kind():
    with pytest.raises(ValueError, match="CPU_ATTENTION is for CPU"):
        schedule_rule(TargetKind.CUDA, 5, serves=RuleName.CPU_ATTENTION)


def test_sketch_knob_picks_generic_tiling(monkeypatch):
    """The tuner's SKETCH knob: 1 schedules a matmul by cpu_tiling's multi-level tiling, 0 by cinn's register tiles."""
    tiled: list[Schedule] = []
    monkeypatch.setattr(cpu_tiling, "schedule", lambda sch, target, knobs: tiled.append(sch))

    class Sketch:
        def choose(self, sch, knob, candidates, default):
            return 1 if knob == Knob.SKETCH else default

        def tile(self, sch, knob, loop, n, default, max_innermost):
            return list(default)

    ((sch, kind),) = kernels("matmul", AVX2)
    apply_default(sch, kind, AVX2, Sketch())
    assert tiled == [sch]
    ((sch, kind),) = kernels("matmul", AVX2)
    apply_default(sch, kind, AVX2, DEFAULT)
    assert len(tiled) == 1


def test_postprocessors_run_on_every_built_kernel_of_their_kind(scratch, tmp_path):
    seen: list[str] = []

    @postprocessor(TargetKind.CPU)
    def record(mod: tvm.IRModule) -> tvm.IRModule:
        seen.append(workload_key(mod["main"]))
        return mod

    assert scratch.postprocessors[TargetKind.CPU] == [cpu_attention.skip_masked_keys, record]
    assert TargetKind.CUDA not in scratch.postprocessors
    ((sch, kind),) = kernels("elementwise", AVX2)
    func = sch.mod["main"]
    build_kernel(KernelSpec(workload_key(func), func, kind), parse_target("llvm"), str(tmp_path / "k.so"))
    assert len(seen) == 1


def test_skip_masked_keys_cuts_a_causal_attention():
    """The registered post-processor shortens a causal attention's loops over keys, which the schedule marks."""
    b = cinn.NetBuilder("causal")
    q, k, v = (b.create_input("float32", (1, 64, 32), n) for n in "qkv")
    mask = np.triu(np.full((64, 64), -np.inf, "float32"), 1)
    program = b.build([b.attention(q, k, v, b.create_constant(mask, "mask"), heads=1, scale=0.25)])
    (lowered,) = lower_program(program, target=AVX2)[1]
    sch = Schedule(tvm.IRModule({"main": lowered.func}))
    apply_default(sch, lowered.group.kind, AVX2)
    marked = sch.mod.script().count(cpu_attention.KEY_STEP)
    assert marked >= 3 and cpu_attention.KEY_STEP not in registry.postprocess(sch.mod, AVX2).script()
    assert registry.postprocess(sch.mod, CUDA).same_as(sch.mod)  # no CUDA post-processors


def _op_kernels(op: str) -> list[tuple[Schedule, PatternKind]]:
    """The kernels of the op's first test case, passes off (tests/cases)."""
    from tests.test_ops import CASES, _build

    case = next(c for c in CASES if c.op == op)
    program, _ = _build(case, case.arrays(np.random.default_rng(0)))
    _, lowered = lower_program(program, passes=False, target=AVX2)
    found = [(Schedule(tvm.IRModule({"main": lg.func})), lg.group.kind) for lg in lowered]
    return [(sch, kind) for sch, kind in found if op in {sch.get(b).name_hint for b in blocks(sch)}]


NEEDY = sorted(name for name, op in OPS.items() if op.needs_rules)


def test_ops_that_need_a_rule():
    assert NEEDY == ["attention", "winograd_input", "winograd_output"]
    both = dataclasses.replace(OPS["attention"], name="two_rules", needs_rules=tuple(RuleName))
    with pytest.raises(ValueError, match="two schedule rules for one target kind"):
        register(both)


@pytest.mark.parametrize("op", NEEDY)
def test_every_declared_rule_is_registered_and_schedules_the_op(op):
    """Each rule an op needs is registered under its name for its target kind, and is the one its kernels get."""
    for need in OPS[op].needs_rules:
        assert [e.name for e in registry.rules(need.target_kind) if e.serves is need]
    for sch, kind in _op_kernels(op):
        chosen = pick(sch, kind, AVX2)
        assert chosen.serves in OPS[op].needs_rules and chosen.target_kind is TargetKind.CPU
        assert pick(sch, kind, CUDA).serves is None  # on CUDA the generic rule runs it


def test_an_op_without_its_rule_fails_clearly(scratch):
    ((sch, kind),) = _op_kernels("attention")
    with pytest.raises(MissingRule, match="'attention' needs the schedule rule CPU_ATTENTION on CPU, but it does not "
                                          "apply to this kernel"):
        pick(sch, PatternKind.OUT_FUSIBLE, AVX2)
    scratch.rules[TargetKind.CPU] = [e for e in scratch.rules[TargetKind.CPU] if e.name != "Attention"]
    with pytest.raises(MissingRule, match="CPU_ATTENTION on CPU, but no rule is registered under that name"):
        pick(sch, kind, AVX2)


@pytest.mark.parametrize("feature", FEATURES, ids=lambda f: f.name)
def test_every_part_of_a_feature_exists_and_is_registered(feature):
    page = (ROOT / "docs" / "features.md").read_text()
    registered = [e.rule for kind in TargetKind for e in registry.rules(kind)]
    hooks = [fn for fns in registry.REGISTRY.postprocessors.values() for fn in fns]
    assert all(OPS[op.name] is op and f"`{op.name}`" in page for op in feature.ops)
    served = {e.serves for e in registry.rules(TargetKind.CPU) if isinstance(e.rule, feature.rules)}
    assert {need for op in feature.ops for need in op.needs_rules} <= served
    for rule in feature.rules:
        assert any(isinstance(r, rule) for r in registered) and f"`{rule.__module__.split('.')[-1]}.{rule.__name__}`" in page
    assert all(fn in hooks and f"`{fn.__name__}`" in page for fn in feature.postprocessors)
    declared = {p.name for p in PASSES}
    assert all(name in declared and f"`{name}`" in page for name in feature.passes)
    assert all(importlib.import_module(m) and f"`{m}`" in page for m in feature.modules)
    assert all(feature.name in (ROOT / doc).read_text().lower() for doc in feature.docs)
