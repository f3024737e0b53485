"""CUDA matmuls on tensor cores (WMMA), where the target allows rounding their inputs (Target.tensor_cores).

A block tile of warps x fragments of 16x16 outputs: each outer reduce step stages the operands' tiles in shared
memory, cast there to the fragments' input type (fp16/bf16; TF32 keeps fp32 and the tensor core reads its upper
bits), so the kernel takes and gives fp32 like the graph. Each warp loads its fragments, multiplies with
wmma.mma.sync into fp32 accumulators, and stores them to a shared output tile, which the block writes back through
the epilogue (bias, activation). Only GEMM forms whose rows, columns and reduction are whole fragments apply (dense
layers, weights packed in panels, 1x1 convs); anything else (3x3 convs, odd shapes, a scaled product) keeps the fp32
schedule (schedules.cuda_matmul). See docs/notes/cuda-tensor-cores.md.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import re
from dataclasses import dataclass

from tvm.s_tir import Schedule, TensorIntrin
from tvm.tirx import Var

from cinn.core.ops import PatternKind, TargetKind
from cinn.core.target import Target, TensorCores
from schedules.analysis import (
    blocks,
    inline_all,
    is_matmul,
    is_reduction,
    reverse_inline_all,
    single_reduction,
    spatial_count,
    vars_in,
)
from schedules.cuda_common import WARP, injective, is_bound
from schedules.knobs import Knobs
from schedules.registry import schedule_rule

FRAGMENT = 16  # a fragment's rows and columns (WMMA m16n16kX)
K_STEP = 32  # reduce elements staged in shared memory per step
# thread blocks that keep an H200's 132 SMs busy: smaller block tiles until a problem has as many (see
# docs/notes/cuda-tensor-cores.md)
MIN_BLOCKS = 128
BLOCK_WARPS = ((2, 2), (1, 2), (1, 1))  # warps (rows, columns) per block, tried largest first
WARP_FRAGMENTS = 2  # fragments per warp along rows and columns, where the extents allow
VECTOR = 4  # elements per thread per access of the shared-memory copies
ROW_PAD_BYTES = 16  # shared rows padded (keeps WMMA's 32-byte alignment of 16-row steps; spreads banks)
# the compute capability each input type's WMMA needs
MIN_SM = {TensorCores.FP16: 70, TensorCores.BF16: 80, TensorCores.TF32: 80}


@dataclass(frozen=True)
class Wmma:
    """One tensor-core arithmetic: the fragments' input dtype and reduce depth (m16n16kK)."""

    dtype: str
    k: int

    def names(self, layout: Layout) -> Intrinsics:
        """The names the intrinsics are registered under (registered on first use)."""
        return _registered(self, layout)


WMMA = {TensorCores.FP16: Wmma("float16", 16), TensorCores.BF16: Wmma("bfloat16", 16),
        TensorCores.TF32: Wmma("float32", 8)}


@dataclass(frozen=True)
class Layout:
    """How a GEMM block reads its operands: the column operand [k, column] or transposed [column, k], and whether the
    product names it first (a pointwise conv's pixels times weights): tensorize matches the reads in order."""

    b_transposed: bool
    b_first: bool


@dataclass(frozen=True)
class Intrinsics:
    """Registered tensor intrinsics of one Wmma: fragment loads, the multiply, accumulator fill and store."""

    load_a: str
    load_b: str
    sync: str
    fill: str
    store: str


@dataclass(frozen=True)
class Gemm:
    """A reduction block in GEMM form: how it reads its operands, which of the block's reads are the row and
    column operands, and the extents (M, N, K)."""

    layout: Layout
    a_read: int
    b_read: int
    m: int
    n: int
    k: int


@dataclass(frozen=True)
class Tiling:
    """Warps per block and fragments per warp along rows and columns, and fragments per reduce step."""

    warps: tuple[int, int]
    fragments: tuple[int, int]
    k_fragments: int

    @property
    def threads(self) -> int:
        return self.warps[0] * self.warps[1] * WARP


def wmma_for(target: Target) -> Wmma | None:
    """The tensor-core arithmetic the target allows, or None (none asked for, or an architecture without it)."""
    if not target.is_cuda or target.tensor_cores is TensorCores.OFF:
        return None
    sm = re.fullmatch(r"sm_(\d+)\w*", target.arch)
    return WMMA[target.tensor_cores] if sm and int(sm.group(1)) >= MIN_SM[target.tensor_cores] else None


def gemm_form(sch: Schedule, wmma: Wmma) -> Gemm | None:
    """The main block's GEMM form: one reduce iterator k, the last two spatial iterators (i, j), fp32 operands read
    [..., i, k] and [..., k, j] or [..., j, k] (leading indices: batch), extents in whole fragments; or None."""
    main = single_reduction(sch)
    if main is None:
        return None
    block = sch.get(main)
    n = spatial_count(sch, main)
    if n < 2 or len(block.iter_vars) != n + 1 or str(block.writes[0].source.dtype) != "float32":
        return None
    i, j, k = (iv.var for iv in block.iter_vars[n - 2:])
    reads = [(index, r) for index, r in enumerate(block.reads) if not r.source.same_as(block.writes[0].source)]
    if len(reads) != 2 or any(str(r.source.dtype) != "float32" for _, r in reads):
        return None
    last_two = [[rg.min for rg in r.region[-2:]] for _, r in reads]
    a = next((x for x, t in zip(reads, last_two, strict=True) if t[0].same_as(i) and t[1].same_as(k)), None)
    b = next((x for x, t in zip(reads, last_two, strict=True)
              if x is not a and (_same(t, (k, j)) or _same(t, (j, k)))), None)
    if a is None or b is None:
        return None
    m_, n_, k_ = (int(iv.dom.extent) for iv in block.iter_vars[n - 2:])
    if m_ % FRAGMENT or n_ % FRAGMENT or k_ % max(FRAGMENT, wmma.k):
        return None
    return Gemm(Layout(last_two[reads.index(b)][0].same_as(j), b[0] < a[0]), a[0], b[0], m_, n_, k_)


def _plain_operands(sch: Schedule, main) -> list:
    """Give each operand read by (batch, row, k) or (batch, column, k) but not as [..., i, k] / [..., k, j] (weights
    packed in column panels, a 1x1 conv's [O, C, 1, 1] kernel) a copy in that layout (sch.reindex); the copies,
    inlined into the shared-memory fetch once staged, cost nothing. Returns the copies' blocks."""
    block = sch.get(main)
    n = spatial_count(sch, main)
    if n < 2 or len(block.iter_vars) != n + 1:
        return []
    i, j, k = (iv.var for iv in block.iter_vars[n - 2:])
    copies = []
    for index, read in enumerate(block.reads):
        used = set().union(*(vars_in(rg.min) for rg in read.region))
        last_two = [rg.min for rg in read.region[-2:]]
        if k not in used or (i in used) == (j in used):
            continue  # the accumulator, or no operand of a GEMM
        plain = _same(last_two, (i, k)) if i in used else _same(last_two, (k, j)) or _same(last_two, (j, k))
        if plain:
            continue
        copy = sch.reindex(main, ("read", index))  # indexed by the block's iterators in order: [..., i|j, k]
        if j in used:
            sch.transform_layout(copy, ("write", 0), lambda *x: (*x[:-2], x[-1], x[-2]))  # [..., k, j]: coalesced
        copies.append(copy)
    return copies


def _same(got, want) -> bool:
    """Whether two index tuples are the same variables."""
    return len(got) == len(want) and all(isinstance(g, Var) and g.same_as(w) for g, w in zip(got, want, strict=True))


def plan(gemm: Gemm, wmma: Wmma, batch: int) -> Tiling:
    """The largest block tile that still makes MIN_BLOCKS blocks (else the one that makes most), dividing M and N."""
    fragments = tuple(WARP_FRAGMENTS if extent % (FRAGMENT * WARP_FRAGMENTS) == 0 else 1 for extent in (gemm.m, gemm.n))
    fitting = [w for w in BLOCK_WARPS
               if gemm.m % (w[0] * fragments[0] * FRAGMENT) == 0 and gemm.n % (w[1] * fragments[1] * FRAGMENT) == 0]
    blocks_of = {w: batch * gemm.m * gemm.n // (w[0] * w[1] * fragments[0] * fragments[1] * FRAGMENT**2)
                 for w in fitting}
    warps = next((w for w in fitting if blocks_of[w] >= MIN_BLOCKS), fitting[-1])
    k_step = K_STEP if gemm.k % K_STEP == 0 else FRAGMENT
    return Tiling(warps, (fragments[0], fragments[1]), k_step // wmma.k)


def schedule(sch: Schedule, target: Target, wmma: Wmma) -> None:
    """Tile over blocks, warps and fragments; stage and cast operands in shared memory; tensorize; fuse the
    epilogue into the block's write-back."""
    inline_all(sch)
    main = single_reduction(sch)
    if main is None:
        raise ValueError("cinn: no single reduction")
    reindexed = _plain_operands(sch, main)
    gemm = gemm_form(sch, wmma)
    if gemm is None:
        raise ValueError("cinn: not a GEMM of whole tensor-core fragments")
    if len(sch.get_producers(main)) > len(reindexed):
        raise ValueError("cinn: a producer of the matmul stays a stage")
    intrin = wmma.names(gemm.layout)
    n = spatial_count(sch, main)
    loops = sch.get_loops(main)
    batch = 1
    for loop in loops[: n - 2]:
        batch *= int(sch.get(loop).extent)
    t = plan(gemm, wmma, batch)
    i0, i1, i2, i3 = sch.split(loops[n - 2], [None, t.warps[0], t.fragments[0], FRAGMENT])
    j0, j1, j2, j3 = sch.split(loops[n - 1], [None, t.warps[1], t.fragments[1], FRAGMENT])
    k0, k1, k2 = sch.split(loops[n], [None, t.k_fragments, wmma.k])
    sch.reorder(*loops[: n - 2], i0, j0, i1, j1, k0, k1, i2, j2, i3, j3, k2)
    block_loop = sch.fuse(*loops[: n - 2], i0, j0)
    warp_loop = sch.fuse(i1, j1)
    sch.bind(block_loop, "blockIdx.x")
    sch.bind(warp_loop, "threadIdx.y")
    # the product goes accumulator fragments -> a shared tile -> (epilogue) -> the output
    out_tile = sch.cache_write(main, 0, "shared")
    accumulator = sch.cache_write(main, 0, "wmma.accumulator")
    reverse_inline_all(sch, out_tile)
    sch.reverse_compute_at(accumulator, warp_loop)
    sch.reverse_compute_at(out_tile, block_loop)
    staged = [_stage(sch, main, gemm.a_read, "wmma.matrix_a", wmma, (k0, k1)),
              _stage(sch, main, gemm.b_read, "wmma.matrix_b", wmma, (k0, k1))]
    for block in reindexed:  # the operand's own layout, read straight into the shared tile
        sch.compute_inline(block)
    init = sch.decompose_reduction(main, k0)
    b_tile = (FRAGMENT, wmma.k) if gemm.layout.b_transposed else (wmma.k, FRAGMENT)
    sch.tensorize(_fragment_loop(sch, staged[0][1], (FRAGMENT, wmma.k)), intrin.load_a)
    sch.tensorize(_fragment_loop(sch, staged[1][1], b_tile), intrin.load_b)
    sch.tensorize(_fragment_loop(sch, accumulator, (FRAGMENT, FRAGMENT)), intrin.store)
    sch.tensorize(sch.get_loops(init)[-2], intrin.fill)
    sch.tensorize(sch.get_loops(main)[-3], intrin.sync)
    for shared, _ in staged:
        _spread(sch, shared, 3, t)  # below [block, warp, k0]
        itemsize = 2 if wmma.dtype != "float32" else 4
        sch.storage_align(shared, 0, axis=-2, factor=32, offset=ROW_PAD_BYTES // itemsize)
    _spread(sch, out_tile, 1, t)
    wb = sch.get(out_tile).name_hint
    for block in blocks(sch):  # epilogues TVM would not inline into the write-back: their own kernels
        if not is_reduction(sch, block) and sch.get(block).name_hint != wb and not is_bound(sch, block):
            injective(sch, block)


def _stage(sch: Schedule, main, read: int, scope: str, wmma: Wmma, at: tuple) -> tuple:
    """An operand's tile in shared memory per outer reduce step (cast to the fragments' dtype) and its fragments per
    inner step."""
    shared = sch.cache_read(main, read, "shared")
    sch.compute_at(shared, at[0])
    if wmma.dtype != "float32":
        sch.unsafe_set_dtype(shared, 0, wmma.dtype)  # the cast in the copy; the product reads it cast back
    fragment = sch.cache_read(main, read, scope)
    sch.compute_at(fragment, at[1])
    if wmma.dtype == "float32":
        sch.unsafe_set_dtype(fragment, 0, _fragment_dtype(wmma))
    return shared, fragment


def _fragment_loop(sch: Schedule, block, shape: tuple[int, int]):
    """Split a copy's last two loops into fragments of `shape`, fragment loops outside: the loop a load/store
    intrinsic replaces."""
    rows, cols = sch.get_loops(block)[-2:]
    r0, r1 = sch.split(rows, [None, shape[0]])
    c0, c1 = sch.split(cols, [None, shape[1]])
    sch.reorder(r0, c0, r1, c1)
    return r1


def _spread(sch: Schedule, block, depth: int, t: Tiling) -> None:
    """Spread a copy's loops below `depth` over the block's warps and lanes, VECTOR elements a thread where they
    divide."""
    loops = sch.get_loops(block)[depth:]
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    extent = int(sch.get(fused).extent)
    vector = VECTOR if extent % (t.threads * VECTOR) == 0 else 1
    _, warp, lane, vec = sch.split(fused, [None, t.warps[0] * t.warps[1], WARP, vector])
    sch.bind(warp, "threadIdx.y")
    sch.bind(lane, "threadIdx.x")
    sch.vectorize(vec)


@functools.cache
def _registered(wmma: Wmma, layout: Layout) -> Intrinsics:
    """Register the WMMA intrinsics of one arithmetic and layout, from TVM's generators (imported on first use) and
    cinn's multiply and TF32 fragment loads."""
    b_transposed = layout.b_transposed
    with _shallow_frames():
        from tvm.s_tir.tensor_intrin import cuda as tc
    m = n = FRAGMENT
    k = wmma.k
    fragment = _fragment_dtype(wmma)
    loads = ((_tf32_load(False, False), _tf32_load(True, b_transposed)) if wmma.dtype == "float32" else
             (tc.get_wmma_load_intrin(m, n, k, fragment, "shared", False, False),
              tc.get_wmma_load_intrin(m, n, k, fragment, "shared", True, b_transposed)))
    made = {
        "load_a": loads[0],
        "load_b": loads[1],
        "sync": _sync(fragment, k, layout),
        "fill": tc.get_wmma_fill_intrin(m, n, k, "float32"),
        "store": tc.get_wmma_store_intrin(m, n, k, "float32", "shared"),
    }
    tag = f"cinn_wmma_{m}x{n}x{k}_{wmma.dtype}{'_tb' if b_transposed else ''}{'_bf' if layout.b_first else ''}"
    names = {}
    for role, (desc, impl) in made.items():
        names[role] = f"{tag}_{role}"
        if TensorIntrin.get(names[role], allow_missing=True) is None:
            TensorIntrin.register(names[role], desc, impl)
    return Intrinsics(**names)


def _sync(fragment: str, k: int, layout: Layout) -> tuple:
    """The multiply-accumulate of m16n16kK fragments into fp32: C += A B, or B A where the product names B first
    (TVM's own generator has A first only)."""
    from tvm.s_tir.tensor_intrin.cuda import get_wmma_fragment_index
    from tvm.script import tirx as T

    b_shape = (FRAGMENT, k) if layout.b_transposed else (k, FRAGMENT)

    def b_at(vj, vk):
        return (vj, vk) if layout.b_transposed else (vk, vj)

    def product(a, b):
        return T.Cast("float32", b) * T.Cast("float32", a) if layout.b_first else \
            T.Cast("float32", a) * T.Cast("float32", b)

    def buffers(a, b, c, strided: bool):
        strides = [T.int32() for _ in range(6)] if strided else [None] * 6
        return (T.match_buffer(a, (FRAGMENT, k), fragment, align=64, offset_factor=k, scope="wmma.matrix_a",
                               strides=strides[0:2] if strided else None),
                T.match_buffer(b, b_shape, fragment, align=64, offset_factor=b_shape[1], scope="wmma.matrix_b",
                               strides=strides[2:4] if strided else None),
                T.match_buffer(c, (FRAGMENT, FRAGMENT), "float32", align=64, offset_factor=FRAGMENT,
                               scope="wmma.accumulator", strides=strides[4:6] if strided else None))

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        A, B, C = T.meta_var(buffers(a, b, c, False))
        with T.sblock("root"):
            X, Y = T.meta_var(_in_order(A, B, layout))
            T.reads(C[0:16, 0:16], X[0 : X.shape[0], 0 : X.shape[1]], Y[0 : Y.shape[0], 0 : Y.shape[1]])
            T.writes(C[0:16, 0:16])
            for i, j, kk in T.grid(FRAGMENT, FRAGMENT, k):
                with T.sblock(""):
                    vi, vj, vk = T.axis.remap("SSR", [i, j, kk])
                    C[vi, vj] = C[vi, vj] + product(A[vi, vk], B[b_at(vj, vk)])

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        A, B, C = T.meta_var(buffers(a, b, c, True))
        with T.sblock("root"):
            X, Y = T.meta_var(_in_order(A, B, layout))
            T.reads(C[0:16, 0:16], X[0 : X.shape[0], 0 : X.shape[1]], Y[0 : Y.shape[0], 0 : Y.shape[1]])
            T.writes(C[0:16, 0:16])
            T.evaluate(T.tvm_mma_sync(
                C.data, get_wmma_fragment_index(C, C.strides[0], FRAGMENT, FRAGMENT),
                A.data, get_wmma_fragment_index(A, A.strides[0], FRAGMENT, k),
                B.data, get_wmma_fragment_index(B, B.strides[0], *b_shape),
                C.data, get_wmma_fragment_index(C, C.strides[0], FRAGMENT, FRAGMENT), dtype="void"))

    return desc, impl


def _in_order(a, b, layout: Layout) -> tuple:
    """The operands in the order the product reads them."""
    return (b, a) if layout.b_first else (a, b)


def _fragment_dtype(wmma: Wmma) -> str:
    """The dtype TIR gives the input fragments. TVM's CUDA codegen declares no fp32 (TF32) input fragments: TF32's
    are fp16 in TIR, loaded from fp32 tiles with a cast (TF32 keeps fp16's 10-bit mantissa), and
    cinn.runtime.cuda_module.fixed_source declares them TF32 (m16n16k8 exists for TF32 alone)."""
    return "float16" if wmma.dtype == "float32" else wmma.dtype


def _tf32_load(is_b: bool, col_major: bool) -> tuple:
    """A TF32 fragment load (m16n16k8): fp32 shared tile -> input fragment (fp16 in TIR, see _fragment_dtype)."""
    from tvm.s_tir.tensor_intrin.cuda import get_wmma_fragment_index
    from tvm.script import tirx as T

    rows, cols = (8, FRAGMENT) if is_b else (FRAGMENT, 8)
    if col_major:
        rows, cols = cols, rows
    scope = f"wmma.matrix_{'b' if is_b else 'a'}"
    layout = "col_major" if col_major else "row_major"

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (rows, cols), "float32", align=64, offset_factor=cols, scope="shared")
        C = T.match_buffer(c, (rows, cols), "float16", align=64, offset_factor=cols, scope=scope)
        with T.sblock("root"):
            T.reads(A[0:rows, 0:cols])
            T.writes(C[0:rows, 0:cols])
            for i, j in T.grid(rows, cols):
                with T.sblock("load"):
                    vi, vj = T.axis.remap("SS", [i, j])
                    C[vi, vj] = T.Cast("float16", A[vi, vj])

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, c: T.handle) -> None:
        s1, s0, d1, d0 = T.int32(), T.int32(), T.int32(), T.int32()
        A = T.match_buffer(a, (rows, cols), "float32", align=64, offset_factor=cols, scope="shared",
                           strides=[s1, s0])
        C = T.match_buffer(c, (rows, cols), "float16", align=64, offset_factor=cols, scope=scope,
                           strides=[d1, d0])
        with T.sblock("root"):
            T.reads(A[0:rows, 0:cols])
            T.writes(C[0:rows, 0:cols])
            T.evaluate(T.tvm_load_matrix_sync(C.data, FRAGMENT, FRAGMENT, 8,
                                              get_wmma_fragment_index(C, d1, rows, cols),
                                              A.access_ptr("r", ptr_type="float32"), s1, layout, dtype="void"))

    return desc, impl


@contextlib.contextmanager
def _shallow_frames():
    """TVMScript reads the caller's frames through inspect, which by default also reads their source lines: TVM's
    intrinsic module parses ~100 functions so; without the lines it imports in well under half the time (see
    docs/notes/cuda-tensor-cores.md)."""
    stack, outer = inspect.stack, inspect.getouterframes
    inspect.stack = lambda context=1: stack(0)
    inspect.getouterframes = lambda frame, context=1: outer(frame, 0)
    try:
        yield
    finally:
        inspect.stack, inspect.getouterframes = stack, outer


@schedule_rule(TargetKind.CUDA, 40)
class CudaTensorCore:
    """A matmul in GEMM form of whole fragments with its epilogue, where the target allows tensor cores."""

    def applicable(self, sch: Schedule, kind: PatternKind, target: Target, knobs: Knobs) -> bool:
        wmma = wmma_for(target)
        if wmma is None or kind != PatternKind.OUT_FUSIBLE or not is_matmul(sch):
            return False
        trial = sch.copy()  # a kernel TVM will not tensorize keeps the fp32 schedule
        try:
            schedule(trial, target, wmma)
        except Exception:  # ScheduleError, TVMError from tensorize, ValueError from the checks above
            return False
        return True

    def apply(self, sch: Schedule, target: Target, knobs: Knobs) -> None:
        wmma = wmma_for(target)
        assert wmma is not None
        schedule(sch, target, wmma)
