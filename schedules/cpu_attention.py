"""CPU schedule of the fused attention op (cinn/core/ops/attention.py): one parallel task per (batch, head), its blocks of
query rows inside, where the heads balance the cores, else per (batch, head, block of query rows); every stage is
computed per block, so a block's scores ([keys, rows]) never leave the cache. A whole-head task first copies its head
of k and v into contiguous buffers.

Inside a task: q's rows are transposed into a small [dim, rows] buffer; the scores are a register-tiled matmul
(key rows x query vectors, reduced over dim); the max and the sum over keys are vector max/add across query lanes;
the exponentials one vector pass; the context a register-tiled matmul (query rows x value-dim vectors, reduced over
keys); the output divides by the sum as it writes [.., rows, heads * dim] in place. In a causal attention every
stage's loop over keys stops at its query block's last visible key (skip_masked_keys, a post-processor).
"""
from __future__ import annotations

from math import prod

import tvm
import tvm_ffi
from tvm import tirx
from tvm.s_tir import Schedule

from cinn.core.ops import PatternKind, RuleName, TargetKind
from cinn.core.ops.attention import CAUSAL
from cinn.core.target import Target
from schedules.analysis import blocks, extents, inline_all, is_static, size
from schedules.cpu_common import injective, lanes, register_lanes, vectorize_innermost
from schedules.cpu_matmul import balanced, vectorize_registers
from schedules.knobs import DEFAULT, Knob, Knobs, divisors
from schedules.registry import postprocessor, schedule_rule

STAGES = ("attention_qt", "attention_scores", "attention_max", "attention_exp", "attention_sum", "attention_context")
# query rows per task by preference (docs/notes/cpu-model.md)
ROW_BLOCKS = (32, 16)
SCORES_SHARE = 1 / 8  # of the L2, that a task's scores and exponentials stay within (fewer rows for long key sequences)
FLOAT_SIZE = 4
# a causal attention's loop annotations, read by skip_masked_keys
QUERY_ROWS, KEY_OFFSET, QUERY_BLOCKS, KEY_STEP = (f"cinn.causal_{k}" for k in ("rows", "offset", "blocks", "step"))


def applicable(sch: Schedule) -> bool:
    """Whether the function is the attention op's compute (its stages by name)."""
    names = {sch.get(b).name_hint for b in blocks(sch)}
    return {*STAGES, "attention"} <= names


def schedule(sch: Schedule, target: Target, knobs: Knobs = DEFAULT) -> None:
    """Tasks over (batch, head, query block) in parallel, each stage register-tiled and vectorized inside."""
    # a symbolic kernel's attention computes padded query blocks, then copies the rows there are (cinn.core.ops.attention)
    inline_all(sch, keep=lambda b: sch.get(b).name_hint in (*STAGES, "attention"))
    stage = {sch.get(b).name_hint: b for b in blocks(sch)}
    if "attention_rows" in stage:
        injective(sch, stage["attention_rows"], target)
    out = stage["attention"]
    # the keys there are (the scores may compute whole tiles of them: cinn.core.ops.attention) and the queries computed
    keys, queries = (size(sch, iv.dom.extent) for iv in sch.get(stage["attention_exp"]).iter_vars[-2:])
    value_dim = size(sch, sch.get(stage["attention_context"]).iter_vars[-2].dom.extent)
    width = lanes(str(sch.get(out).writes[0].source.dtype), target)
    *batch, seq, cols = sch.get_loops(out)
    rows = _row_block(queries, keys, target)
    static = is_static(sch, [seq])
    if static:
        rows = knobs.choose(sch, Knob.ROWS, _row_candidates(queries, keys, target), rows)
    elif rows not in ROW_BLOCKS:  # a symbolic kernel's query blocks divide its padding (cinn.core.ops.attention)
        rows = ROW_BLOCKS[-1]
    head, dim = sch.split(cols, [None, value_dim])
    block, row = sch.split(seq, [None, rows])
    sch.reorder(*batch, head, block, row, dim)
    whole_heads = _whole_heads(sch, [*batch, head], target)
    task = sch.fuse(*batch, head) if whole_heads else sch.fuse(*batch, head, block)
    for name in reversed(STAGES):  # consumers first, so each producer lands before its consumers in the task
        sch.compute_at(stage[name], block if whole_heads else task, preserve_unit_loops=True)
    sch.parallel(task)
    if whole_heads:
        _pack_keys_values(sch, stage, task, width)
    budget = target.vector_registers - 4
    _transpose(sch, stage["attention_qt"], width)
    score_keys, step, _ = _register_tile(sch, stage["attention_scores"], width, budget)
    key_loops = {score_keys: step}
    for name in ("attention_max", "attention_sum"):
        key_loops[_lane_reduction(sch, stage[name], width)] = 1
    exp_keys = _exponentials(sch, stage["attention_exp"], rows, keys, width)
    key_loops[_register_tile(sch, stage["attention_context"], width, budget)[2]] = 1
    vectorize_registers(sch, dim, value_dim, width)
    if CAUSAL in sch.get(out).annotations and exp_keys is not None and static:
        key_loops[exp_keys] = 1
        _skip_masked_keys(sch, block if whole_heads else task, (rows, queries // rows, keys - queries), key_loops)


def _skip_masked_keys(sch: Schedule, query_block, layout: tuple[int, int, int], key_loops: dict) -> None:
    """Mark a causal attention's loops for skip_masked_keys: the loop whose index modulo the blocks per head is the
    query block (with the rows per block, the blocks per head and the keys' offset), and each stage's loop over keys
    with the keys per iteration."""
    for key, value in zip((QUERY_ROWS, QUERY_BLOCKS, KEY_OFFSET), layout, strict=True):
        sch.annotate(query_block, key, value)
    for loop, step in key_loops.items():
        sch.annotate(loop, KEY_STEP, step)


@postprocessor(TargetKind.CPU)
def skip_masked_keys(mod: tvm.IRModule) -> tvm.IRModule:
    """A causal attention kernel with each stage's loop over keys cut short where a query block's keys are masked:
    block b of R rows needs keys below (b + 1) R + offset. The schedule marks the loops (_skip_masked_keys), this
    rewrites their extents (a schedule primitive cannot make an extent depend on an outer loop)."""
    func = mod["main"]
    found: list = []

    def find(node, visitor):
        if QUERY_ROWS in node.annotations:
            found.append(node)
        visitor.default_visit(node)

    tvm_ffi.structural_visit(func, [(tirx.For, find)])
    if not found:
        return mod
    loop = found[0]
    rows, offset, blocks = (int(loop.annotations[k]) for k in (QUERY_ROWS, KEY_OFFSET, QUERY_BLOCKS))
    needed = (tirx.floormod(loop.loop_var, blocks) + 1) * rows + offset

    def cut(node):
        if KEY_STEP not in node.annotations:
            return node
        step = int(node.annotations[KEY_STEP])
        extent = tirx.min(node.extent, tirx.floordiv(needed + step - 1, step))
        kept = {k: v for k, v in node.annotations.items() if k != KEY_STEP}
        return tirx.For(node.loop_var, node.min, extent, node.kind, node.body, node.thread_binding, kept, node.step)

    return tvm.IRModule({"main": tvm_ffi.structural_map(func, [(tirx.For, cut)])})


def _whole_heads(sch: Schedule, loops: list, target: Target) -> bool:
    """Whether each task takes a whole head (its query blocks inside) rather than one query block: where the heads
    keep the cores balanced."""
    return is_static(sch, loops) and balanced(prod(extents(sch, loops)), target)


def _pack_keys_values(sch: Schedule, stage: dict, task, width: int) -> None:
    """Copy the task's head of k and of v into contiguous [keys, dim] buffers before its query blocks. In place, a
    head's rows lie a whole row of every head apart, a page apart from 1024 columns on, where the hardware
    prefetchers stop: the matmul stages, which read them a row or two at a time, waited on memory for each
    (docs/notes/cpu-model.md); the copy loop keeps many rows in flight, and the blocks read them from the cache."""
    params = {p.name for p in sch.mod["main"].params}
    for name in ("attention_scores", "attention_context"):
        index = next(i for i, r in enumerate(sch.get(stage[name]).reads) if r.source.name in params)
        copy = sch.cache_read(stage[name], index, "global", consumer_blocks=[stage[name]])  # q, k, v may be one buffer
        sch.compute_at(copy, task, preserve_unit_loops=True)
        vectorize_innermost(sch, copy, width)


def _row_block(queries: int, keys: int, target: Target) -> int:
    """Query rows per task: the first of ROW_BLOCKS that divides the queries and keeps a task's scores and
    exponentials within SCORES_SHARE of the L2, else all queries (short or odd sequences: one task per head)."""
    budget = target.l2_bytes * SCORES_SHARE
    fits = [r for r in ROW_BLOCKS if queries % r == 0 and 2 * FLOAT_SIZE * r * keys <= budget]
    return fits[0] if fits else queries


def _row_candidates(queries: int, keys: int, target: Target) -> list[int]:
    """Query blocks the tuner may try: the divisors of the queries that are whole vectors, and the default."""
    return sorted({r for r in divisors(queries) if r % 16 == 0} | {_row_block(queries, keys, target)})


def _transpose(sch: Schedule, block, width: int) -> None:
    """q^T of a block's rows: vector stores along the rows."""
    rows = extents(sch, sch.get_loops(block)[-1:])[0]
    vectorize_registers(sch, sch.get_loops(block)[-1], rows, width)


def _register_tile(sch: Schedule, block, width: int, budget: int) -> tuple:
    """A matmul stage [rows, cols] reduced innermost: rows x column vectors of accumulators, the reduction outside
    them, the accumulators initialized before it. Returns the loop over row tiles, the rows per tile and the
    reduction loop."""
    write_back = sch.cache_write(block, 0, "local")  # a tile-sized accumulator buffer LLVM keeps in registers
    row, col, red = sch.get_loops(block)[-3:]
    nrows, ncols = extents(sch, [row, col])
    cols = _vector_tile(ncols, width)
    regs = max(1, cols // register_lanes(cols, width))
    # a symbolic row axis (the keys) in rows of one: a guarded last tile would make TVM size the tile wrongly
    rows = max(divisors(nrows, max(1, budget // regs))) if is_static(sch, [row]) else 1
    row_outer, row_inner = sch.split(row, [None, rows])
    col_outer, col_inner = sch.split(col, [None, cols])
    sch.reorder(row_outer, col_outer, red, row_inner, col_inner)
    sch.unroll(row_inner)
    vectorize_registers(sch, col_inner, cols, width)
    vectorize_innermost(sch, sch.decompose_reduction(block, red), width)
    sch.reverse_compute_at(write_back, col_outer)
    vectorize_innermost(sch, write_back, width)
    return row_outer, rows, red


def _vector_tile(extent: int, width: int) -> int:
    """Columns of a register tile: up to four whole vectors dividing the axis, else the whole axis."""
    fits = [c for c in (4 * width, 2 * width, width) if extent % c == 0]
    return fits[0] if fits else extent


def _exponentials(sch: Schedule, block, rows: int, keys: int, width: int):
    """The exponentials [keys, rows] in vectors along the rows where they are whole vectors, else along both axes
    fused. (Vectors of the fused axes whose rows are whole vectors index them by // and %, which TVM did not see
    through: it scalarized the whole polynomial, a branch per element for its NaN test, 45% of BERT's attention.)
    Returns the loop over keys; None where it is fused with the rows."""
    if rows % width == 0:
        *_, key, row = sch.get_loops(block)
        _vectorize(sch, row, rows, width)
        return key
    _vectorize(sch, sch.fuse(*sch.get_loops(block)[-2:]), rows * keys, width)
    return None


def _vectorize(sch: Schedule, loop, extent: int, width: int) -> None:
    """A long elementwise loop as a loop of vectors (not unrolled)."""
    reg = register_lanes(extent, width)
    if reg > 1:
        sch.vectorize(sch.split(loop, [None, reg])[1])


def _lane_reduction(sch: Schedule, block, width: int):
    """A reduction over keys of each query: keys outside, query lanes inside (one vector max/add per key). Returns
    the loop over keys."""
    row, red = sch.get_loops(block)[-2:]
    sch.reorder(red, row)
    rows = extents(sch, [row])[0]
    vectorize_registers(sch, row, rows, width)  # before decompose_reduction, as the update alone is no reduction
    init = sch.decompose_reduction(block, red)
    vectorize_registers(sch, sch.get_loops(init)[-1], rows, width)
    return red


@schedule_rule(TargetKind.CPU, 60, serves=RuleName.CPU_ATTENTION)
class Attention:
    """The attention op's stages."""

    def applicable(self, sch: Schedule, kind: PatternKind, target: Target, knobs: Knobs) -> bool:
        return kind == PatternKind.NON_FUSIBLE and applicable(sch)

    def apply(self, sch: Schedule, target: Target, knobs: Knobs) -> None:
        schedule(sch, target, knobs)
