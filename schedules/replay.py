"""Replaying a logged schedule trace: only what cinn's own schedules emit.

A tuning log is shared like data, but a TVM trace can hold any schedule instruction, and some of them are code:
TVM links the LLVM IR of a `pragma_import_llvm` annotation into the kernel library cinn loads. So a trace is
checked against an allow-list of the instruction kinds, literal values and annotations that cinn's schedules (the
tuner's search space) emit, before it is read into the tuner or replayed (tests/test_tuning_log.py samples the
space to keep the list complete); replaying also checks the sizes its decisions and splits give each loop.
"""
from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Container, Mapping
from dataclasses import dataclass

import tvm
from tvm.s_tir import Schedule, Trace

from cinn.core.target import NO_PARTIAL_UNROLL
from schedules.cpu_attention import KEY_OFFSET, KEY_STEP, QUERY_BLOCKS, QUERY_ROWS
from schedules.cpu_bf16 import INTRIN as BF16_INTRIN
from schedules.cpu_int8 import INTRIN
from schedules.knobs import AUTO_UNROLL, EXPLICIT_UNROLL, MAX_UNROLLED, TILED_UNROLL_STEPS, UNROLL_STEPS


class TraceRefused(ValueError):
    """A trace holding something cinn's schedules never emit."""


@dataclass(frozen=True)
class Rule:
    """What one instruction kind may carry besides random variables, None, bools and ints in INTS."""

    strings: frozenset[str] = frozenset()  # literal strings: storage scopes, thread axes, a tensor intrinsic
    names: bool = False  # block and function names (GetSBlock)
    floats: bool = False  # sampling probabilities, in [0, 1]
    index_maps: bool = False  # a layout (TVM JSON) of integer arithmetic only


SCOPES = frozenset({"global", "local", "shared"})
_PLAIN = Rule()
RULES: Mapping[str, Rule] = {
    **dict.fromkeys(("GetLoops", "GetChildBlocks", "GetConsumers", "GetProducers", "SamplePerfectTile", "Split",
                     "Fuse", "Reorder", "LoopPartition", "Parallel", "Vectorize", "Unroll", "ComputeInline",
                     "ReverseComputeInline", "ComputeAt", "ReverseComputeAt", "DecomposeReduction", "AddUnitLoop",
                     "RFactor", "Reindex", "StorageAlign"), _PLAIN),
    "GetSBlock": Rule(names=True),
    "SampleCategorical": Rule(floats=True),
    "Bind": Rule(strings=frozenset({"blockIdx.x", "threadIdx.x"})),
    "CacheRead": Rule(strings=SCOPES),
    "CacheWrite": Rule(strings=SCOPES),
    "SetScope": Rule(strings=SCOPES),
    "TransformLayout": Rule(index_maps=True),
    "TransformBlockLayout": Rule(index_maps=True),
    "Tensorize": Rule(strings=frozenset({INTRIN, BF16_INTRIN})),
    # the dtype a tensor-core kernel stages its operands in (schedules.cuda_tensor_core); its wmma scopes, thread
    # axes and intrinsics are not listed: a tensor-core trace is refused (those schedules take no knobs)
    "UnsafeSetDtype": Rule(strings=frozenset({"float16", "bfloat16"})),
    "Annotate": _PLAIN,  # its key and value: ANNOTATIONS
}
SIZES = range(2**31)  # sizes of a causal attention's blocks (schedules.cpu_attention), whatever the model
# annotation keys and the int values each may take (no other value type: strings are what pragma_import_llvm reads)
ANNOTATIONS: Mapping[str, Container[int]] = {
    AUTO_UNROLL: frozenset(UNROLL_STEPS + TILED_UNROLL_STEPS),
    EXPLICIT_UNROLL: frozenset({1}),
    NO_PARTIAL_UNROLL: frozenset({1}),
    QUERY_ROWS: SIZES[1:], QUERY_BLOCKS: SIZES[1:], KEY_STEP: SIZES[1:], KEY_OFFSET: SIZES,
}
SAMPLING = ("SampleCategorical", "SamplePerfectTile")
INTS = range(-1, 2**31)  # buffer and loop positions (-1: the last), factors, sampled candidates
# the node types of a layout's TVM JSON: variables, integers and the arithmetic of indices
INDEX_MAP_NODES = frozenset({"None", "int", "ffi.Array", "ffi.String", "ir.IntImm", "ir.PrimType", "ir.Var",
                             "tirx.IndexMap", "prim.Add", "prim.Sub", "prim.Mul", "prim.FloorDiv", "prim.FloorMod",
                             "prim.Min", "prim.Max"})
_RV = re.compile(r"[blv]\d{1,9}|None")  # the names TVM writes for random variables (blocks, loops, values) and None
_NAME = re.compile(r"[A-Za-z_][\w.]{0,255}")
MAX_TILE = 1024  # the most a literal split factor may exceed its loop by (a CUDA block's threads over a short loop)


def check(trace_text: str) -> list:
    """The trace's JSON after checking it against the allow-list; TraceRefused naming the first thing not in it."""
    try:
        trace = json.loads(trace_text)
    except (ValueError, RecursionError) as err:
        raise TraceRefused(f"not JSON ({type(err).__name__})") from None
    if not (isinstance(trace, list) and len(trace) == 2 and all(isinstance(part, list) for part in trace)):
        raise TraceRefused("not a TVM trace ([instructions, decisions])")
    insts, decisions = trace
    for i, inst in enumerate(insts):
        _check_instruction(i, inst)
    _check_decisions(insts, decisions)
    return trace


def replay(sch: Schedule, trace_text: str) -> None:
    """Apply a logged trace to a fresh schedule once check() passes it and every sampled tile multiplies to its loop's
    extent, every split stays near its loop's extent and every unrolled loop is short; else
    TraceRefused."""
    trace = check(trace_text)
    scratch = Schedule(sch.mod)  # the JSON read into a Trace; applying that again lets _loop_sizes see each loop
    Trace.apply_json_to_schedule(trace, scratch)
    refused: list[TraceRefused] = []
    try:
        scratch.trace.apply_to_schedule(sch, remove_postproc=False,
                                        decision_provider=_loop_sizes(sch, dict(map(tuple, trace[1])), refused))
    except (RuntimeError, ValueError):  # TVM passes an exception raised inside the provider on as another type
        if refused:
            raise refused[0] from None
        raise


def _check_instruction(i: int, inst) -> None:
    if not (isinstance(inst, list) and len(inst) == 4 and isinstance(inst[0], str)
            and all(isinstance(part, list) for part in inst[1:])):
        raise TraceRefused(f"instruction {i} is not [kind, inputs, attributes, outputs]")
    kind, inputs, attrs, outputs = inst
    rule = RULES.get(kind)
    if rule is None:
        raise TraceRefused(f"instruction {i}: {kind[:64]!r} is not an instruction cinn's schedules emit")
    if not all(isinstance(o, str) and _RV.fullmatch(o) for o in outputs):
        raise TraceRefused(f"instruction {i} ({kind}): outputs are not random variables")
    if kind == "Annotate":
        _check_annotation(i, inputs, attrs)
        inputs, attrs = inputs[:1], []  # checked: what remains is the annotated block or loop
    for value in (inputs, attrs):
        _check_literal(i, kind, rule, value)


def _check_annotation(i: int, inputs: list, attrs: list) -> None:
    key = attrs[0] if len(attrs) == 1 else None
    allowed = ANNOTATIONS.get(key) if isinstance(key, str) else None
    if allowed is None:
        raise TraceRefused(f"instruction {i}: annotation {str(key)[:64]!r} is not one cinn's schedules emit")
    value = inputs[1] if len(inputs) == 2 else None
    if type(value) is not int or value not in allowed:
        raise TraceRefused(f"instruction {i}: annotation {key} = {str(value)[:64]!r} is not a value cinn's schedules "
                           "give it")


def _check_literal(i: int, kind: str, rule: Rule, value) -> None:
    """Refuse a value in an instruction's inputs or attributes that its kind's rule does not allow."""
    if isinstance(value, list):
        for v in value:
            _check_literal(i, kind, rule, v)
    elif not _allowed(rule, value):
        raise TraceRefused(f"instruction {i} ({kind}): {str(value)[:64]!r} is not a value cinn's schedules give it")


def _allowed(rule: Rule, value) -> bool:
    if value is None or isinstance(value, bool):
        return True
    if isinstance(value, int):
        return value in INTS
    if isinstance(value, float):
        return rule.floats and 0.0 <= value <= 1.0
    if isinstance(value, str):
        return (bool(_RV.fullmatch(value)) or value in rule.strings or (rule.names and bool(_NAME.fullmatch(value)))
                or (rule.index_maps and _arithmetic(value)))
    return False


def _arithmetic(text: str) -> bool:
    """Whether a string is a TVM JSON object graph of integer index arithmetic only (a layout's index map)."""
    try:
        graph = json.loads(text)
    except (ValueError, RecursionError):
        return False
    return (isinstance(graph, dict) and set(graph) <= {"root_index", "nodes", "metadata"}
            and isinstance(graph.get("nodes"), list)
            and all(isinstance(n, dict) and n.get("type") in INDEX_MAP_NODES for n in graph["nodes"]))


def _check_decisions(insts: list, decisions: list) -> None:
    """Each sampling instruction has one decision of its form: a candidate's index, or positive tile factors."""
    decided: dict[int, object] = {}
    for entry in decisions:
        if not (isinstance(entry, list) and len(entry) == 2 and type(entry[0]) is int and entry[0] not in decided
                and 0 <= entry[0] < len(insts) and insts[entry[0]][0] in SAMPLING):
            raise TraceRefused(f"decision {str(entry)[:64]} is not one per sampling instruction")
        decided[entry[0]] = entry[1]
    for i, inst in enumerate(insts):
        if inst[0] in SAMPLING and not _valid_decision(inst, decided.get(i)):
            raise TraceRefused(f"instruction {i} ({inst[0]}): decision {str(decided.get(i))[:64]} is out of range")


def _valid_decision(inst: list, decision) -> bool:
    attrs = inst[2]
    if inst[0] == "SampleCategorical":
        return (len(attrs) == 2 and isinstance(attrs[0], list) and len(attrs[0]) == len(attrs[1])
                and type(decision) is int and 0 <= decision < len(attrs[0]))
    n = attrs[0] if attrs else None
    return (isinstance(decision, list) and len(decision) == n
            and all(type(f) is int and f >= 1 for f in decision) and math.prod(decision) in INTS)


def _loop_sizes(sch: Schedule, logged: Mapping[int, object], refused: list[TraceRefused]):
    """A decision provider for Trace.apply_to_schedule that refuses a loop size no schedule of cinn's gives: a tile
    whose logged factors (`logged`: decisions by instruction; TVM replaces a tile that does not fit by a sampled
    one) do not multiply to its loop's extent, a split far beyond it (a guarded loop of billions of
    steps), an unrolled loop longer than MAX_UNROLLED (a compile that never ends). The refusal is
    noted in `refused` too: TVM passes it on as another type."""

    def refuse(why: str):
        refused.append(TraceRefused(why))
        raise refused[-1]

    position = itertools.count()  # TVM asks for every instruction's decision, in order

    def provide(inst, inputs, attrs, decision):
        kind, i = inst.kind.name, next(position)
        if kind in ("SamplePerfectTile", "Split", "Unroll"):
            extent = sch.get(inputs[0]).extent
            size = int(extent) if isinstance(extent, tvm.tirx.IntImm) else None
            if kind == "SamplePerfectTile" and math.prod(logged[i]) != size:
                refuse(f"tile {logged[i]} does not multiply to its loop's extent {extent}")
            factors = math.prod(int(f) for f in inputs[1:] if isinstance(f, int | tvm.tirx.IntImm))
            if kind == "Split" and factors > max(size or 0, MAX_TILE):
                refuse(f"a split by {factors} of a loop of extent {extent}")
            if kind == "Unroll" and (size is None or size > MAX_UNROLLED):
                refuse(f"unroll of a loop of extent {extent} (at most {MAX_UNROLLED})")
        return decision

    return provide
