"""Default CPU schedules: every path builds and matches numpy on small PrimFuncs; unusual funcs fall back."""
from __future__ import annotations

import math

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")
from tvm import te, topi  # noqa: E402
from tvm.s_tir import Schedule  # noqa: E402

from cinn.compiler.build import OutOfBounds, check_in_bounds  # noqa: E402
from cinn.compiler.lower import lower_program  # noqa: E402
from cinn.core.builder import NetBuilder  # noqa: E402
from cinn.core.ir import TensorType  # noqa: E402
from cinn.core.ops import PatternKind as K  # noqa: E402
from cinn.core.ops import get_op, infer  # noqa: E402
from cinn.core.target import parse_target  # noqa: E402
from schedules import apply_default, cpu_matmul, cpu_tiling  # noqa: E402
from schedules.analysis import blocks, extents, is_matmul, is_row_reduction, single_reduction  # noqa: E402
from schedules.cpu_common import lanes  # noqa: E402
from schedules.cuda_common import unbound_blocks  # noqa: E402
from schedules.knobs import DefaultKnobs, Knob  # noqa: E402
from schedules.registry import pick  # noqa: E402

TARGET = parse_target("llvm")
LANES = lanes("float32", TARGET)  # float32 lanes of the host's vectors: AVX-512 16, AVX2 8
RNG = np.random.default_rng(0)


def schedule_of(tensors) -> Schedule:
    func = te.create_prim_func(tensors).with_attr("global_symbol", "main")
    return Schedule(tvm.IRModule({"main": func}))


def check(inputs, outputs, kind, expected, rtol=1e-4, atol=1e-4) -> Schedule:
    """Schedule with the default schedule, build, run and compare each output with numpy."""
    sch = schedule_of([*inputs, *outputs])
    check_schedule(sch, kind, len(inputs), expected, rtol, atol)
    return sch


def check_schedule(sch: Schedule, kind, n_inputs: int, expected, rtol=1e-4, atol=1e-4) -> None:
    """Schedule a PrimFunc (its first n_inputs parameters are inputs) with the default schedule, build, run it on
    random inputs and compare each output with numpy."""
    apply_default(sch, kind, TARGET)
    ex = tvm.compile(sch.mod, target=TARGET.tvm())
    dev = tvm.cpu()
    func = sch.mod["main"]
    shapes = [([int(d) for d in p.shape], str(p.dtype)) for p in func.params]
    arrays = [RNG.standard_normal(shape).astype(dtype) for shape, dtype in shapes[:n_inputs]]
    outs = [tvm.runtime.empty(shape, dtype, dev) for shape, dtype in shapes[n_inputs:]]
    ex["main"](*[tvm.runtime.tensor(a, dev) for a in arrays], *outs)
    for got, want in zip(outs, expected(*arrays), strict=True):
        np.testing.assert_allclose(got.numpy(), want, rtol=rtol, atol=atol)


def matmul(shape_a, shape_b, trans_y=False, epilogue=True):
    """C = A @ B (B given transposed when trans_y), then + bias and relu when epilogue."""
    a = te.placeholder(shape_a, name="A")
    b = te.placeholder(shape_b, name="B")
    k = te.reduce_axis((0, shape_a[-1]), name="k")
    n = shape_b[-2] if trans_y else shape_b[-1]

    def body(*idx):
        *batch, i, j = idx
        return te.sum(a(*batch, i, k) * (b(*batch, j, k) if trans_y else b(*batch, k, j)), axis=k)

    c = te.compute((*shape_a[:-1], n), body, name="C")
    if not epilogue:
        return [a, b], c, lambda x, y: [x @ (np.swapaxes(y, -1, -2) if trans_y else y)]
    bias = te.placeholder((n,), name="bias")
    d = te.compute(c.shape, lambda *i: c(*i) + bias(i[-1]), name="D")
    e = te.compute(c.shape, lambda *i: te.max(d(*i), 0.0), name="E")
    return [a, b, bias], e, lambda x, y, z: [np.maximum(x @ (np.swapaxes(y, -1, -2) if trans_y else y) + z, 0)]


@pytest.mark.parametrize(
    "shape_a, shape_b, trans_y, epilogue",
    [
        ((8, 16), (16, 128), False, True),  # packed panels, epilogue in the write-back
        ((16, 24), (24, 32), False, False),  # no epilogue
        ((7, 13), (13, 10), False, True),  # awkward sizes
        ((5, 3), (3, 1), False, True),  # a single column
        ((2, 8, 16), (2, 16, 24), False, True),  # batched
        ((2, 8, 16), (2, 40, 16), True, False),  # batched, B transposed
    ],
)
def test_matmul(shape_a, shape_b, trans_y, epilogue):
    inputs, out, ref = matmul(shape_a, shape_b, trans_y, epilogue)
    sch = schedule_of([*inputs, out])
    assert is_matmul(sch)
    check(inputs, [out], K.OUT_FUSIBLE, ref)


def conv_ref(x, w, stride, pad, groups):
    """Direct NCHW/OIHW convolution in numpy."""
    n, _, h, wd = x.shape
    o, cg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = (h + 2 * pad - kh) // stride + 1, (wd + 2 * pad - kw) // stride + 1
    out = np.zeros((n, o, oh, ow), "float32")
    per = o // groups
    for f in range(o):
        g = f // per
        for ry in range(kh):
            for rx in range(kw):
                patch = xp[:, g * cg : (g + 1) * cg, ry : ry + stride * oh : stride, rx : rx + stride * ow : stride]
                out[:, f] += np.einsum("nchw,c->nhw", patch, w[f, :, ry, rx])
    return out


@pytest.mark.parametrize(
    "c, o, hw, stride, groups, channels_vectorized",
    [(4, 16, 32, 1, 1, False), (3, 6, 9, 2, 1, False), (8, 8, 10, 1, 8, False), (8, 16, 14, 1, 1, True),
     (4, 16, 12, 2, 1, True)],
    ids=["conv", "stride2", "depthwise", "channels", "channels-stride2"],
)
def test_conv_epilogue(c, o, hw, stride, groups, channels_vectorized):
    x = te.placeholder((1, c, hw, hw), name="x")
    w = te.placeholder((o, c // groups, 3, 3), name="w")
    scale = te.placeholder((o,), name="scale")
    shift = te.placeholder((o,), name="shift")
    y = topi.nn.group_conv2d_nchw(x, w, stride, 1, 1, groups) if groups > 1 else topi.nn.conv2d_nchw(x, w, stride, 1, 1)
    z = te.compute(y.shape, lambda n, f, i, j: te.max(y[n, f, i, j] * scale[f] + shift[f], 0.0), name="z")

    def ref(xa, wa, sa, ha):
        conv = conv_ref(xa, wa, stride, 1, groups)
        return [np.maximum(conv * sa[:, None, None] + ha[:, None, None], 0)]

    assert is_matmul(schedule_of([x, w, scale, shift, z]))
    sch = check([x, w, scale, shift], [z], K.OUT_FUSIBLE, ref)
    # output rows that are not a whole number of vectors: vectorized over output channels, accumulated channels-last
    # (a depthwise conv's rows of 10 too where its 8 channels are whole vectors: AVX2's 8 lanes, not AVX-512's 16)
    ow = (hw + 2 - 3) // stride + 1
    channels_vectorized = channels_vectorized or (groups == c and c % LANES == 0)
    assert (f"T.sblock_alloc_buffer((1, {ow}, {ow}, {o}))" in sch.mod.script()) == channels_vectorized
    # the padding is computed per parallel tile, into a buffer of the tile's input alone (a depthwise conv over
    # channels pads within its per-tile copy of the input)
    if not (groups > 1 and channels_vectorized):
        assert sch.get(sch.get_loops(sch.get_sblock("pad_temp"))[0]).kind == tvm.tirx.ForKind.PARALLEL


def test_conv_with_parallel_row_tiles_packs_its_weights_once():
    # one vector of output channels is one channel tile, so the row tiles run in parallel and there is no serial
    # loop to pack a weight panel at: the weights are transposed once, before the parallel loop, and the inner loop
    # reads contiguous weight vectors instead of gathering them with a stride of c*kh*kw
    x = te.placeholder((1, 8, 14, 14), name="x")
    w = te.placeholder((LANES, 8, 3, 3), name="w")
    sch = check([x, w], [topi.nn.conv2d_nchw(x, w, 1, 1, 1)], K.OUT_FUSIBLE, lambda xa, wa: [conv_ref(xa, wa, 1, 1, 1)])
    (panel,) = [b for b in sch.get_child_blocks(sch.get_sblock("root")) if sch.get(b).name_hint == "w_global"]
    assert [tuple(int(d) for d in r.source.shape) for r in sch.get(panel).writes] == [(8, 3, 3, LANES)]
    update = sch.get_sblock("conv2d_nchw_update")
    assert not sch.get(sch.get_loops(panel)[0]).same_as(sch.get(sch.get_loops(update)[0]))  # before the tile loop
    assert "w" not in [r.source.name for r in sch.get(update).reads]


def test_conv_register_tile_spans_output_rows():
    # AVX2, a 56-wide 3x3 conv: 4 channels x 2 output rows x one vector of columns loads 2 input vectors and
    # broadcasts 4 weights for 8 FMAs; 8 channels x 1 row would need 9 loads for 8 FMAs
    x = te.placeholder((1, 64, 56, 56), name="x")
    w = te.placeholder((64, 64, 3, 3), name="w")
    sch = schedule_of([x, w, topi.nn.conv2d_nchw(x, w, 1, 1, 1)])
    t = cpu_matmul.plan(sch, single_reduction(sch), parse_target("llvm -mcpu=znver3 -num-cores=2"))
    assert (t.col, t.cols, t.row, t.rows, t.row2, t.rows2) == (3, 8, 1, 4, 2, 2)


def test_register_tile_trades_vectors_for_rows():
    # 16 channels over a 14x14 output (the weight does not depend on output rows): 2 weight vectors x 2x2 pixels
    # = 8 FMAs per 6 loads, where one row of pixels gives at best 7 per 8 (1 x 7) or 4 per 4 (2 x 2)
    assert cpu_matmul._register_tile([1, 2], [1, 2, 7, 14], [1, 2, 7, 14], 8, row2_in_vector=False) == (2, 2, 2)
    # a matmul-like tile: no second row axis
    assert cpu_matmul._register_tile([4], [1, 2, 3], [1], 12, row2_in_vector=True) == (4, 3, 1)


def softmax(shape):
    x = te.placeholder(shape, name="x")
    m = topi.max(x, axis=-1, keepdims=True)
    e = te.compute(shape, lambda b, i, j: te.exp(x[b, i, j] - m[b, i, 0]), name="e")
    s = topi.sum(e, axis=-1, keepdims=True)
    y = te.compute(shape, lambda b, i, j: e[b, i, j] / s[b, i, 0], name="y")

    def ref(a):
        z = np.exp(a - a.max(-1, keepdims=True))
        return [z / z.sum(-1, keepdims=True)]

    return [x], y, ref


def layer_norm_gelu(rows, cols):
    x = te.placeholder((rows, cols), name="x")
    gamma = te.placeholder((cols,), name="gamma")
    beta = te.placeholder((cols,), name="beta")
    mean = te.compute((rows, 1), lambda i, _: topi.sum(x, axis=-1, keepdims=True)[i, 0] / cols, name="mean")
    d = te.compute((rows, cols), lambda i, j: x[i, j] - mean[i, 0], name="d")
    var = topi.sum(te.compute((rows, cols), lambda i, j: d[i, j] * d[i, j], name="sq"), axis=-1, keepdims=True)
    r = te.compute((rows, 1), lambda i, j: te.rsqrt(var[i, j] / cols + 1e-5), name="r")
    y = te.compute((rows, cols), lambda i, j: d[i, j] * r[i, 0] * gamma[j] + beta[j], name="y")
    z = te.compute((rows, cols), lambda i, j: 0.5 * y[i, j] * (1 + te.tanh(y[i, j] * 0.7978845608)), name="z")

    def ref(a, g, b):
        mu = a.mean(-1, keepdims=True)
        yy = (a - mu) / np.sqrt(((a - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * g + b
        return [0.5 * yy * (1 + np.tanh(yy * math.sqrt(2 / math.pi)))]

    return [x, gamma, beta], z, ref


@pytest.mark.parametrize("make", [lambda: softmax((2, 4, 16)), lambda: layer_norm_gelu(4, 40), lambda: softmax((3, 5, 6))])
def test_row_reduction(make):
    inputs, out, ref = make()
    assert is_row_reduction(schedule_of([*inputs, out]))
    check(inputs, [out], K.REDUCTION, ref)


def _two_norms():
    """Two layer norms in one kernel, as fusion groups a NetBuilder program: both read their shared epsilon, a scalar
    block without loops."""
    width = 2 * LANES  # two vectors per row: every reduction is rfactored over the lanes
    b = NetBuilder("two_norms")
    x, gamma, beta = (b.create_input("float32", shape, name) for name, shape in
                      (("x", (4, width)), ("gamma", (width,)), ("beta", (width,))))
    y = b.layer_norm(b.layer_norm(x, gamma, beta, begin_norm_axis=1), gamma, beta, begin_norm_axis=1)
    _, (lowered,) = lower_program(b.build([y]))
    assert lowered.group.kind == K.REDUCTION
    assert [v.name for v in lowered.params[:3]] == ["x", "gamma", "beta"]  # then the output
    return Schedule(tvm.IRModule({"main": lowered.func}))


def _no_scalar_stage(sch: Schedule) -> bool:
    """Whether every block writes a buffer with dims (the shared scalar was inlined, not kept as a stage)."""
    return all(len(sch.get(block).writes[0].source.shape) for block in blocks(sch))


def test_row_reduction_inlines_a_scalar_that_two_blocks_read():
    """The row schedule inlines the scalar: kept as a stage outside every loop, it made rfactor fail inside TVM
    (`block_realize == old_block_realize_`, issue 52)."""
    sch = _two_norms()
    assert pick(sch, K.REDUCTION, TARGET).name == "RowReduction"

    def ref(a, g, c):
        for _ in range(2):
            centered = a - a.mean(-1, keepdims=True)
            a = centered / np.sqrt((centered**2).mean(-1, keepdims=True) + 1e-5) * g + c
        return [a]

    check_schedule(sch, K.REDUCTION, 3, ref)
    assert _no_scalar_stage(sch)


def test_cuda_row_reduction_inlines_a_scalar_that_two_blocks_read():
    """On CUDA too: the scalar is not a shared-memory stage that one thread of each block writes."""
    sch, cuda = _two_norms(), parse_target("cuda -arch=sm_80")
    assert pick(sch, K.REDUCTION, cuda).name == "CudaRowReduction"
    apply_default(sch, K.REDUCTION, cuda)
    assert _no_scalar_stage(sch) and unbound_blocks(sch) == []


@pytest.mark.parametrize("shape, axes", [((4, 2 * LANES), (1,)), ((2 * LANES, 3), (0,)), ((2, 3, 5, 5), (2, 3))])
def test_a_reduction_reading_a_0d_scalar(shape, axes):
    """A 0-d operand (a scalar input broadcast into the reduced product) indexes no axis: the rules that look at the
    innermost index of each operand must not fail on it."""
    x, s = te.placeholder(shape, name="x"), te.placeholder((), name="s")
    red = [te.reduce_axis((0, shape[a]), name=f"r{a}") for a in axes]
    keep = [d for d in range(len(shape)) if d not in axes]

    def body(*idx):
        it, full = iter(red), []
        for d in range(len(shape)):
            full.append(next(it) if d in axes else idx[keep.index(d)])
        return te.sum(x[tuple(full)] * s[()], axis=red)

    y = te.compute([shape[d] for d in keep], body, name="y")
    check([x, s], [y], K.REDUCTION, lambda a, c: [(a * c).sum(axis=axes)])


def test_plain_reduction_output():
    x = te.placeholder((6, 32), name="x")
    s = topi.sum(x, axis=1)
    assert is_row_reduction(schedule_of([x, s]))
    check([x], [s], K.REDUCTION, lambda a: [a.sum(1)])


def test_elementwise_multi_output():
    x = te.placeholder((16, 40), name="x")
    y = te.placeholder((40,), name="y")
    s = te.compute(x.shape, lambda i, j: x[i, j] + y[j], name="s")
    a = te.compute(x.shape, lambda i, j: te.max(s[i, j], 0.0), name="a")
    b = te.compute(x.shape, lambda i, j: s[i, j] * 2.0, name="b")
    check([x, y], [a, b], K.ELEMENTWISE, lambda xa, ya: [np.maximum(xa + ya, 0), (xa + ya) * 2])


def test_chained_polynomials_stay_stages_instead_of_growing_exponentially():
    """Three tanh-GELUs in a row, each reading its input 9 times: inlined, one expression of 9^3 copies (192 s to
    build); the large producers stay stages."""
    x = te.placeholder((4, 64), "float32", name="x")
    y = x
    for _ in range(3):
        y = topi.multiply(y, topi.add(1.0, topi.fast_tanh(topi.multiply(y, 0.79788456))))
    sch = check([x], [y], K.ELEMENTWISE, lambda a: [_gelu_chain(a, 3)])
    assert len(sch.get_child_blocks(sch.get_sblock("root"))) > 1


def _gelu_chain(a: np.ndarray, n: int) -> np.ndarray:
    for _ in range(n):
        a = a * (1 + np.tanh(a * 0.79788456))
    return a


def test_fallbacks():
    """Funcs the specialised schedules do not fit (a column reduction, two matmuls) take the generic path."""
    x = te.placeholder((12, 8), name="x")
    col = topi.sum(x, axis=0, keepdims=True)
    out = te.compute(x.shape, lambda i, j: x[i, j] - col[0, j], name="out")
    assert not is_row_reduction(schedule_of([x, out]))
    check([x], [out], K.REDUCTION, lambda a: [a - a.sum(0, keepdims=True)])

    inputs, c, _ = matmul((4, 6), (6, 8), epilogue=False)
    k = te.reduce_axis((0, 8), name="k2")
    d = te.compute((4, 4), lambda i, j: te.sum(c[i, k] * c[j, k], axis=k), name="D")
    assert not is_matmul(schedule_of([*inputs, d]))
    check(inputs, [d], K.OUT_FUSIBLE, lambda a, b: [(a @ b) @ (a @ b).T])


def _pool(shape, **attrs):
    """cinn's max pool2d compute on an NCHW placeholder, and its numpy reference."""
    op = get_op("pool2d")
    a = op.attrs(pooling_type="max", ksize=[3, 3], **attrs)
    x = te.placeholder(shape, name="x")
    (out_type,) = infer(op, [TensorType(shape, "float32")], a)
    return x, op.compute([x], a, [out_type])[0], lambda xa: op.reference([xa], a)


@pytest.mark.parametrize("strides, paddings, shape", [([2, 2], [0, 0, 1, 1], (1, 8, 17, 16)),
                                                   ([1, 1], [1, 1], (1, 8, 14, 14)), ([1, 1], [0, 0, 1, 1], (1, 8, 9, 7))])
def test_pooling_windows_are_vectorized_over_output_columns(strides, paddings, shape):
    # a padded window reads its input padded per channel (deinterleaved when strided, the odd 17 columns padded to
    # 18), so each output row is one vector (8, 14 or 7 lanes) of contiguous loads with no bounds test
    x, y, ref = _pool(shape, strides=strides, paddings=paddings)
    sch = check([x], [y], K.NON_FUSIBLE, ref)
    script = sch.mod.script()
    assert "T.vectorized" in script
    window = script[script.index('T.sblock("pool2d_update")'):]
    assert "if_then_else" not in window and ("v_rw % 2" in window) == (strides == [2, 2])


def _chain(x, *ops):
    """Apply cinn ops (name, attrs) in turn to a placeholder."""
    y = x
    for op, attrs in ops:
        a = get_op(op).attrs(**attrs)
        (t,) = infer(get_op(op), [TensorType(tuple(int(d) for d in y.shape), "float32")], a)
        (y,) = get_op(op).compute([y], a, [t])
    return y


@pytest.mark.parametrize("channels", [1000, 24])
def test_mean_over_channels_last_pixels_is_vectorized_over_channels(channels):
    # a global average pool after a channels-last conv reads its channels contiguously: vectors of channels, each
    # pixel one vector add, instead of one strided element per channel and pixel
    x = te.placeholder((1, 13, 13, channels), name="x")
    y = _chain(x, ("transpose", {"axis": (0, 3, 1, 2)}), ("reduce_mean", {"dim": (2, 3), "keep_dim": True}))
    sch = check([x], [y], K.REDUCTION, lambda xa: [xa.transpose(0, 3, 1, 2).mean(axis=(2, 3), keepdims=True)],
                rtol=1e-5)
    loops = sch.get_loops(sch.get_sblock("transpose_red_update"))
    kinds = [sch.get(lp).kind for lp in loops]
    assert kinds[0] == tvm.tirx.ForKind.PARALLEL and kinds[-1] == tvm.tirx.ForKind.VECTORIZED
    assert extents(sch, loops[-3:]) == [13, 13, min(LANES, channels & -channels)]  # the pixels outside the lanes


def test_channel_shuffle_lanes_stay_within_one_channel():
    # a channel shuffle computes its input channel from the output's: 4-lane vectors over a channel's 14x14 pixels
    # (196 = 49 x 4) instead of 16 lanes straddling channels, each load a gather
    x = te.placeholder((1, 8, 14, 14), name="x")
    y = _chain(x, ("reshape", {"shape": (1, 2, 4, 14, 14)}), ("transpose", {"axis": (0, 2, 1, 3, 4)}),
               ("reshape", {"shape": (1, 8, 14, 14)}))
    ref = lambda xa: [xa.reshape(1, 2, 4, 14, 14).transpose(0, 2, 1, 3, 4).reshape(1, 8, 14, 14)]
    sch = check([x], [y], K.INJECTIVE, ref)
    (out,) = sch.get_child_blocks(sch.get_sblock("root"))
    assert extents(sch, sch.get_loops(out)[-1:]) == [4]


def test_concat_lanes_stay_within_one_channel():
    # 3 x 28 x 28 per channel is a whole number of vectors: the vector loop runs over a channel's pixels, so the
    # concat's select on the channel is one branch per vector instead of a gather per lane
    a, b = te.placeholder((1, 3, 28, 28), name="a"), te.placeholder((1, 5, 28, 28), name="b")
    y = topi.concatenate([a, b], axis=1)
    sch = check([a, b], [y], K.INJECTIVE, lambda xa, xb: [np.concatenate([xa, xb], axis=1)])
    loops = sch.get_loops(sch.get_child_blocks(sch.get_sblock("root"))[0])
    assert [sch.get(lp).kind for lp in loops] == [tvm.tirx.ForKind.PARALLEL, tvm.tirx.ForKind.VECTORIZED]
    assert int(sch.get(loops[0]).extent) == 8 * 28 * 28 // int(sch.get(loops[1]).extent)


def test_concat_channels_are_the_parallel_loop_when_they_make_enough_tasks():
    # 80 channels: each task one channel, its vectors a serial loop, so the concat's select is loop-invariant
    # (shufflenet's concat + bias + relu + channel shuffle of 272x14x14: 0.054 -> 0.028 ms)
    a, b = te.placeholder((1, 40, 14, 14), name="a"), te.placeholder((1, 40, 14, 14), name="b")
    y = topi.concatenate([a, b], axis=1)
    sch = check([a, b], [y], K.INJECTIVE, lambda xa, xb: [np.concatenate([xa, xb], axis=1)])
    loops = [sch.get(lp) for lp in sch.get_loops(sch.get_child_blocks(sch.get_sblock("root"))[0])]
    assert [(lp.kind, int(lp.extent)) for lp in loops] == [
        (tvm.tirx.ForKind.PARALLEL, 80), (tvm.tirx.ForKind.SERIAL, 49), (tvm.tirx.ForKind.VECTORIZED, 4)]


@pytest.mark.parametrize("dtype", ["float32", "uint8"])
def test_transposing_copies_run_in_tiles(dtype):
    """NHWC -> NCHW: tiles of 16 input rows (channels) x one vector of output columns, the vector along the output
    (a 64x112x112 float copy: 0.37 -> 0.07 ms); the unit batch dim is read at a constant index."""
    x = te.placeholder((1, 10, 32, 48), name="x", dtype=dtype)
    y = topi.transpose(x, [0, 3, 1, 2])
    sch = check([x], [y], K.INJECTIVE, lambda xa: [xa.transpose(0, 3, 1, 2)])
    loops = [sch.get(lp) for lp in sch.get_loops(sch.get_child_blocks(sch.get_sblock("root"))[0])]
    from schedules.cpu_common import lanes as vector_lanes

    width = vector_lanes(dtype, TARGET)  # the widest vector (of 1, 1/2, 1/4 register) that divides the 32 columns
    lanes = next(w for w in (width, width // 2, width // 4) if 32 % w == 0)
    assert [(lp.kind, int(lp.extent)) for lp in loops[-2:]] == [(tvm.tirx.ForKind.SERIAL, 16),
                                                                (tvm.tirx.ForKind.VECTORIZED, lanes)]
    assert loops[0].kind == tvm.tirx.ForKind.PARALLEL and int(loops[0].extent) == 10 * 3 * (32 // lanes)


@pytest.mark.parametrize(("width", "lanes"), [(37, {16: 37, 8: 8}), (111, {16: 37, 8: 8}), (13, {16: 13, 8: 13}),
                                              (67, {16: 16, 8: 8})])
def test_transposes_of_odd_widths_take_a_divisor_or_a_partial_tile(width, lanes):
    """111 columns: tiles of 37 (a 64x111x111 copy 0.24 -> 0.08 ms) where that is at most 4 vectors (AVX-512);
    67 (prime): tiles of one vector, the last partial."""
    lanes = lanes[LANES]
    x = te.placeholder((1, 3, width, 24), name="x")
    y = topi.transpose(x, [0, 3, 1, 2])
    sch = check([x], [y], K.INJECTIVE, lambda xa: [xa.transpose(0, 3, 1, 2)])
    loops = [sch.get(lp) for lp in sch.get_loops(sch.get_child_blocks(sch.get_sblock("root"))[0])]
    assert (loops[-1].kind, int(loops[-1].extent)) == (tvm.tirx.ForKind.VECTORIZED, lanes)


def test_per_channel_scale_lanes_stay_within_one_channel():
    # a batch norm + relu: the scale and shift are one value per channel, so the vectors run over a channel's pixels
    # and load them once, not gather them per lane (densenet's 256x56x56 BN + ReLU: 0.37 -> 0.07 ms)
    x, s, t = (te.placeholder(shape, name=n) for shape, n in (((1, 96, 8, 8), "x"), ((96, 1, 1), "s"), ((96, 1, 1), "t")))
    y = te.compute(x.shape, lambda n, c, h, w: te.max(x[n, c, h, w] * s[c, 0, 0] + t[c, 0, 0], 0.0), name="y")
    sch = check([x, s, t], [y], K.ELEMENTWISE, lambda xa, sa, ta: [np.maximum(xa * sa + ta, 0)])
    loops = [sch.get(lp) for lp in sch.get_loops(sch.get_child_blocks(sch.get_sblock("root"))[0])]
    assert [(lp.kind, int(lp.extent)) for lp in loops[:1]] == [(tvm.tirx.ForKind.PARALLEL, 96)]
    assert loops[-1].kind == tvm.tirx.ForKind.VECTORIZED and math.prod(int(lp.extent) for lp in loops[1:]) == 64


@pytest.mark.parametrize("c, o, hw, k, stride, want", [
    (3, 64, 28, 7, 2, (1, 32, 3, 7)),   # a strided stem: output channels, not gathered input columns
    (64, 1000, 13, 1, 1, (1, 8, 3, 13)),  # 1000 classes: 8-lane registers x 13 columns
    (64, 256, 13, 3, 1, (1, 16, 3, 13)),  # 13 columns: 1 vector x 13, not 2 x 1
    (256, 256, 14, 1, 1, (1, 32, 3, 14)),  # a 1x1 conv: 2 vectors x 14 columns (AVX-512)
])
def test_channel_tiles(c, o, hw, k, stride, want):
    x = te.placeholder((1, c, hw, hw), name="x")
    w = te.placeholder((c, k, k, o), name="w")  # IHWO, as pack_weights stores constant weights
    y = topi.nn.conv2d_nchw(x, topi.transpose(w, (3, 0, 1, 2)), stride, k // 2, 1)
    sch = schedule_of([x, w, y])
    target = parse_target("llvm -mcpu=skylake-avx512 -num-cores=2")
    t = cpu_matmul.plan(sch, single_reduction(sch), target)
    assert (t.col, t.cols, t.row, t.rows) == want


def test_stem_conv_output_rows_run_in_parallel_when_a_channel_tile_outgrows_l2():
    # 3->64 3x3/2 on 224x224: each 32-channel tile's 111x111 outputs (1.6 MB) would leave L2 before the write-back
    # transposes them, so output rows are the parallel loop and each row is written back while hot
    x = te.placeholder((1, 3, 224, 224), name="x")
    w = te.placeholder((3, 3, 3, 64), name="w")
    y = topi.nn.conv2d_nchw(x, topi.transpose(w, (3, 0, 1, 2)), 2, 0, 1)
    sch = schedule_of([x, w, y])
    apply_default(sch, K.OUT_FUSIBLE, parse_target("llvm -mcpu=skylake-avx512 -num-cores=2"))
    loops = [sch.get(lp) for lp in sch.get_loops(sch.get_sblock("conv2d_nchw_update"))]
    assert (loops[0].kind, int(loops[0].extent)) == (tvm.tirx.ForKind.PARALLEL, 111)


@pytest.mark.parametrize("c, hw, rows_parallel", [(16, 55, True), (16, 27, False)])
def test_wide_1x1_channel_tiles_write_back_rows_while_hot(c, hw, rows_parallel):
    """squeezenet's 16->64 1x1 on 55x55 (vectorized over channels: 55 columns are no whole vectors): each channel
    tile's output, 387 KB, is over a quarter of L2, so output rows run in parallel, each transposed back while hot
    (0.062 -> 0.040 ms); on 27x27 (93 KB a tile) the channel tiles stay the parallel loop."""
    x = te.placeholder((1, c, hw, hw), name="x")
    w = te.placeholder((c, 1, 1, 64), name="w")
    y = topi.nn.conv2d_nchw(x, topi.transpose(w, (3, 0, 1, 2)), 1, 0, 1)
    sch = schedule_of([x, w, y])
    apply_default(sch, K.OUT_FUSIBLE, parse_target("llvm -mcpu=skylake-avx512 -num-cores=2"))
    loops = [sch.get(lp) for lp in sch.get_loops(sch.get_sblock("conv2d_nchw_update"))]
    assert loops[0].kind == tvm.tirx.ForKind.PARALLEL
    assert (int(loops[0].extent) % hw == 0) == rows_parallel  # the output rows are in the parallel loop, or not


@pytest.mark.parametrize("mcpu, hw, want", [
    ("skylake-avx512", 112, (3, 112, 2, 2)),  # 7 zmm registers per output row, 2 rows
    ("skylake-avx512", 56, (3, 56, 2, 2)),  # 7 ymm registers
    ("skylake-avx512", 14, (3, 14, 2, 2)),  # 2-lane registers are too narrow: the default column tile (also 14)
    ("znver3", 56, (3, 56, 2, 1)),  # AVX2: 7 of the 12 accumulator registers, 1 row
    ("znver3", 112, (3, 16, 2, 4)),  # 14 registers would not fit: 2-register column tiles
])
def test_depthwise_tiles_span_whole_output_rows(mcpu, hw, want):
    # no operand is reused across a depthwise conv's rows: whole rows keep every task's reads and writes contiguous
    x = te.placeholder((1, 8, hw, hw), name="x")
    w = te.placeholder((8, 1, 3, 3), name="w")
    y = topi.nn.group_conv2d_nchw(x, w, 1, 1, 1, 8)
    sch = schedule_of([x, w, y])
    t = cpu_matmul.plan(sch, single_reduction(sch), parse_target(f"llvm -mcpu={mcpu} -num-cores=2"))
    assert (t.col, t.cols, t.row, t.rows) == want
    check([x, w], [y], K.OUT_FUSIBLE, lambda xa, wa: [conv_ref(xa, wa, 1, 1, 8)])


@pytest.mark.parametrize("hw, stride, channel_vectors", [(7, 1, True), (14, 2, True), (28, 1, True), (56, 1, False),
                                                       (56, 2, False)])
def test_depthwise_convs_on_narrow_rows_vectorize_over_channels(hw, stride, channel_vectors):
    # rows of 7 or 14 fill no vector register: the input is copied per 32-channel tile channels last and the tile is
    # 2 vectors of channels x output columns; rows of 56 keep whole-row tiles, and so do strided rows of 28 (7 xmm
    # registers), whose input is deinterleaved
    x = te.placeholder((1, 32, hw, hw), name="x")
    w = te.placeholder((1, 3, 3, 32), name="w")  # IHWO, as pack_weights stores constant weights
    y = topi.nn.group_conv2d_nchw(x, topi.transpose(w, (3, 0, 1, 2)), stride, 1, 1, 32)
    sch = schedule_of([x, w, y])
    t = cpu_matmul.plan(sch, single_reduction(sch), parse_target("llvm -mcpu=skylake-avx512 -num-cores=2"))
    assert (t.col, t.per_tile) == ((1, True) if channel_vectors else (3, False))
    ref = lambda xa, wa: [conv_ref(xa, wa.transpose(3, 0, 1, 2), stride, 1, 32)]
    check([x, w], [y], K.OUT_FUSIBLE, ref)


@pytest.mark.parametrize("hw, pad", [(32, 1), (31, 1), (32, 3)])
def test_strided_depthwise_input_is_deinterleaved(hw, pad):
    # a 3x3/2 depthwise conv vectorized over output columns reads its padded input phase by phase ([..., w % 2,
    # w // 2]): contiguous vector loads; the copy's columns between the padded ones are a loop of their own, where
    # the lowering drops the bounds test
    # (4 channels, whole vectors on no host: 8 would be AVX2's, whose narrow rows then vectorize over channels)
    x = te.placeholder((1, 4, hw, hw), name="x")
    w = te.placeholder((4, 1, 3, 3), name="w")
    y = topi.nn.group_conv2d_nchw(x, w, 2, pad, 1, 4)
    sch = check([x, w], [y], K.OUT_FUSIBLE, lambda xa, wa: [conv_ref(xa, wa, 2, pad, 4)])
    script = sch.mod.script()
    padded = hw + 2 * pad
    phased = padded % 2 == 0  # an odd padded width (topi's pad here) is not split in phases
    assert (f"T.sblock_alloc_buffer((1, 4, {padded}, 2, {padded // 2}))" in script) == phased
    assert ('_ax21_partition")' in script) == phased  # first, middle and last columns


def test_cinn_conv_pads_rows_to_whole_strides_so_they_deinterleave():
    # cinn's conv2d pads 31 + 2 columns to 34 (the extra one never read), so a 3x3/2 depthwise conv still reads its
    # input in phases
    op = get_op("conv2d")
    a = op.attrs(strides=[2, 2], paddings=[1, 1], groups=8)
    x, w = te.placeholder((1, 8, 31, 31), name="x"), te.placeholder((8, 1, 3, 3), name="w")
    (out_type,) = infer(op, [TensorType((1, 8, 31, 31), "float32"), TensorType((8, 1, 3, 3), "float32")], a)
    y = op.compute([x, w], a, [out_type])[0]
    sch = check([x, w], [y], K.OUT_FUSIBLE, lambda xa, wa: [conv_ref(xa, wa, 2, 1, 8)])
    assert "T.sblock_alloc_buffer((1, 8, 33, 2, 17))" in sch.mod.script()


def test_channels_last_depthwise_tasks_run_channel_tiles_outermost():
    # each core takes whole channel tiles, the channels a channels-last 1x1 conv before it (parallel over its channel
    # tiles) left in that core's cache; rows of every channel had each core read half its input from the other's
    op = get_op("conv2d_packed")
    a = op.attrs(paddings=[1, 1], groups=64, data_format="NHWC", weight_layout="IHWO")
    types = [TensorType((1, 14, 14, 64), "float32"), TensorType((1, 3, 3, 64), "float32")]
    x, w = te.placeholder(types[0].shape, name="x"), te.placeholder(types[1].shape, name="w")
    y = op.compute([x, w], a, infer(op, types, a))[0]

    def ref(xa, wa):
        return [conv_ref(xa.transpose(0, 3, 1, 2), wa.transpose(3, 0, 1, 2), 1, 1, 64).transpose(0, 2, 3, 1)]
    sch = check([x, w], [y], K.OUT_FUSIBLE, ref)
    (par,) = [lp for lp in sch.get_loops(sch.get_sblock("conv2d_update")) if sch.get(lp).kind == tvm.tirx.ForKind.PARALLEL]
    assert str(sch.get(par).loop_var).startswith("i3")  # the channel tiles, then the images and rows


def _depthwise_nhwc(c: int, hw: int, k: int, stride: int):
    """A channels-last depthwise conv over IHWO weights, as channels_last and pack_weights emit it, and its numpy
    reference."""
    op = get_op("conv2d_packed")
    a = op.attrs(strides=[stride, stride], paddings=[k // 2, k // 2], groups=c, data_format="NHWC", weight_layout="IHWO")
    types = [TensorType((1, hw, hw, c), "float32"), TensorType((1, k, k, c), "float32")]
    x, w = te.placeholder(types[0].shape, name="x"), te.placeholder(types[1].shape, name="w")
    y = op.compute([x, w], a, infer(op, types, a))[0]

    def ref(xa, wa):
        return [conv_ref(xa.transpose(0, 3, 1, 2), wa.transpose(3, 0, 1, 2), stride, k // 2, c).transpose(0, 2, 3, 1)]
    return x, w, y, ref


@pytest.mark.parametrize("c, hw, k, stride, want", [
    (144, 56, 5, 2, (16, 7)),  # a 5x5/2 over 59 input columns: two registers' window (38 KB) outgrows half of L1
    (672, 14, 3, 1, (32, 2)),  # 16 input columns: two registers' window (6 KB) fits
    (960, 7, 5, 1, (32, 7)),  # 7 columns have no divisor up to half the accumulators: all 7
    (40, 28, 3, 2, (8, 7)),  # 40 channels: no whole 16-lane register, 8-lane ones
])
def test_channels_last_depthwise_tile_keeps_its_input_window_in_l1(c, hw, k, stride, want):
    """A channels-last depthwise conv's channel tile is two registers where the input window its task copies for an
    output row fits in half of L1, else one (not all its channels: 144 of them read that window from L2); its
    columns fill up to half the accumulators (each FMA loads its own input vector). The output is numpy's, and the
    padded window is copied a register at a time (a row of 9 registers was copied lane by lane)."""
    x, w, y, ref = _depthwise_nhwc(c, hw, k, stride)
    sch = schedule_of([x, w, y])
    t = cpu_matmul.plan(sch, single_reduction(sch), parse_target("llvm -mcpu=skylake-avx512 -num-cores=2"))
    assert (t.col, t.cols, t.rows) == (3, *want)
    sch = check([x, w], [y], K.OUT_FUSIBLE, ref)
    *_, inner = sch.get_loops(sch.get_sblock("pad"))
    assert sch.get(inner).kind == tvm.tirx.ForKind.VECTORIZED and int(sch.get(inner).extent) <= LANES


@pytest.mark.parametrize("c, hw, k, stride", [(20, 9, 3, 1), (72, 14, 5, 2), (96, 7, 3, 2)])
def test_channels_last_depthwise_convs_of_ragged_channels(c, hw, k, stride):
    """Channels that fill no whole register (20, 72) or whole ones at any stride: the output is numpy's."""
    x, w, y, ref = _depthwise_nhwc(c, hw, k, stride)
    check([x, w], [y], K.OUT_FUSIBLE, ref)


def _pointwise_nhwc_7x7():
    """A channels-last 64->64 1x1 conv on 7x7 pixels (its input, IHWO32 weights and output)."""
    op = get_op("conv2d_packed")
    a = op.attrs(data_format="NHWC", weight_layout="IHWO32")
    x, w = te.placeholder((1, 7, 7, 64), name="x"), te.placeholder((2, 64, 1, 1, 32), name="w")
    (out_type,) = infer(op, [TensorType((1, 7, 7, 64), "float32"), TensorType((2, 64, 1, 1, 32), "float32")], a)
    return x, w, op.compute([x, w], a, [out_type])[0]


def test_channels_last_pointwise_conv_takes_whole_tiles_past_its_pixels():
    # a 7x7 map's 49 pixels as 50 rows (PIXEL_TILE): AVX2 tiles of 2 vectors x 5 rows, where rows of 7 took 1 x 7;
    # the view back to NHWC, with the epilogue, writes the accumulators back (49 rows), and the output is numpy's
    x, w, y = _pointwise_nhwc_7x7()
    z = te.compute(y.shape, lambda *i: te.max(y(*i), 0.0), name="z")
    sch = schedule_of([x, w, z])
    t = cpu_matmul.plan(sch, single_reduction(sch), parse_target("llvm -mcpu=znver3 -num-cores=2"))
    assert (t.cols, t.rows) == (16, 5)

    def ref(xa, wa):
        weights = wa[:, :, 0, 0, :].transpose(1, 0, 2).reshape(64, 64)  # [I, O]
        return [np.maximum(xa.reshape(49, 64) @ weights, 0).reshape(1, 7, 7, 64)]

    sch = check([x, w], [z], K.OUT_FUSIBLE, ref)
    script = sch.mod.script()
    assert "T.sblock_alloc_buffer((1, 50, 64))" in script and "conv2d_global" not in script


@pytest.mark.parametrize("groups", [1, 2])
def test_nchw_conv_over_columns_without_a_tile_divisor_takes_whole_tiles_past_them(groups):
    # 26 output columns (2 x 13) computed as 30: AVX2 tiles of 2 vectors x 5 columns, where 26 took 2 x 2 (alexnet's
    # 2-group 5x5 conv); the view back to 26 columns writes the accumulators back, and the output is numpy's
    op = get_op("conv2d_packed")
    layout = "GIHWO" if groups > 1 else "IHWO"
    w_shape = (groups, 8 // groups, 5, 5, 32 // groups) if groups > 1 else (8, 5, 5, 32)
    a = op.attrs(paddings=(2, 2), groups=groups, weight_layout=layout)
    x, w = te.placeholder((1, 8, 6, 26), name="x"), te.placeholder(w_shape, name="w")
    (out_type,) = infer(op, [TensorType((1, 8, 6, 26), "float32"), TensorType(w_shape, "float32")], a)
    (y,) = op.compute([x, w], a, [out_type])
    sch = schedule_of([x, w, y])
    t = cpu_matmul.plan(sch, single_reduction(sch), parse_target("llvm -mcpu=znver3 -num-cores=2"))
    assert (t.cols, t.rows) == (16, 5)
    sch = check([x, w], [y], K.OUT_FUSIBLE, lambda xa, wa: op.reference([xa, wa], a))
    assert ", 6, 30, " in sch.mod.script()  # the conv's buffer: 6 rows of 30 columns


def test_an_epilogue_reading_the_conv_output_runs_in_its_write_back_tile():
    # an LRN's square of a conv's relu, a second output: computed in each parallel tile after its write-back, while
    # the tile's outputs are hot, not in a pass of its own over the whole output
    x = te.placeholder((1, 8, 14, 14), name="x")
    w = te.placeholder((16, 8, 3, 3), name="w")
    relu = topi.nn.relu(topi.nn.conv2d_nchw(x, w, 1, 1, 1))
    square = te.compute(relu.shape, lambda *i: relu(*i) * relu(*i), name="square")

    def ref(xa, wa):
        r = np.maximum(conv_ref(xa, wa, 1, 1, 1), 0)
        return [r, r * r]

    sch = check([x, w], [relu, square], K.OUT_FUSIBLE, ref)
    par = sch.get(sch.get_loops(sch.get_sblock("square"))[0])
    assert par.kind == tvm.tirx.ForKind.PARALLEL
    assert par.same_as(sch.get(sch.get_loops(sch.get_sblock("conv2d_nchw_update"))[0]))


class _GenericTiling(DefaultKnobs):
    """The defaults, but the generic SSRSRS sketch wherever the schedule offers it; records the knobs asked."""

    def __init__(self):
        self.asked: set[Knob] = set()

    def choose(self, sch, knob, candidates, default):
        self.asked.add(knob)
        return 1 if knob is Knob.SKETCH else default


def test_the_generic_sketch_is_not_offered_over_a_padded_view():
    # its cache_write write-back would store the 50 rows of a 7x7 channels-last conv into the view's 49 (a tuning
    # candidate that corrupted the worker's heap)
    x, w, y = _pointwise_nhwc_7x7()
    knobs = _GenericTiling()
    sch = schedule_of([x, w, y])
    apply_default(sch, K.OUT_FUSIBLE, TARGET, knobs)
    assert Knob.SKETCH not in knobs.asked
    check_in_bounds(sch, "conv")
    tiled = schedule_of([x, w, y])  # a trace of it (an older log's) is refused where compile or the tuner applies it
    cpu_tiling.schedule(tiled, TARGET, knobs)
    with pytest.raises(OutOfBounds, match="writes conv2d_nhwc out of its bounds"):
        check_in_bounds(tiled, "conv")
    inputs, out, _ = matmul((8, 16), (16, 32))
    apply_default(schedule_of([*inputs, out]), K.OUT_FUSIBLE, TARGET, knobs)
    assert Knob.SKETCH in knobs.asked


def test_grouped_pointwise_conv_is_not_taken_for_depthwise():
    # shufflenet's 112 -> 112 1x1 in 4 groups reads every operand per output channel too, but reduces 28 channels
    x = te.placeholder((1, 112, 28, 28), name="x")
    w = te.placeholder((112, 28, 1, 1), name="w")
    y = topi.nn.group_conv2d_nchw(x, w, 1, 0, 1, 4)
    sch = schedule_of([x, w, y])
    t = cpu_matmul.plan(sch, single_reduction(sch), parse_target("llvm -mcpu=skylake-avx512 -num-cores=2"))
    assert not t.per_tile
    check([x, w], [y], K.OUT_FUSIBLE, lambda xa, wa: [conv_ref(xa, wa, 1, 0, 4)])


@pytest.mark.parametrize("rows, want", [(34, 17), (38, 19), (100, 10), (128, 16)])
def test_rows_that_share_an_operand_may_take_the_registers_the_loads_leave(rows, want):
    # AVX-512, one vector of columns: 16 accumulators by default, but 34 rows would then be tiles of 2; 17 accumulators
    # still fit beside the loaded vector and a broadcast. Rows that fill at least half the budget keep it.
    a = te.placeholder((rows, 24), name="A")
    b = te.placeholder((24, 16), name="B")
    k = te.reduce_axis((0, 24), name="k")
    c = te.compute((rows, 16), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    sch = schedule_of([a, b, c])
    t = cpu_matmul.plan(sch, single_reduction(sch), parse_target("llvm -mcpu=skylake-avx512 -num-cores=2"))
    assert (t.cols, t.rows) == (16, want)


def test_a_tile_that_would_leave_a_core_idle_is_split_and_not_packed():
    # a batch-32 MLP's 1024 -> 10 classifier: one 32-row x 10-column tile would run on one core, after copying x^T
    # into a panel that it reads once; two 16-row tiles read x in place
    a = te.placeholder((32, 1024), name="A")
    b = te.placeholder((1024, 10), name="B")
    k = te.reduce_axis((0, 1024), name="k")
    c = te.compute((32, 10), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    sch = schedule_of([a, b, c])
    t = cpu_matmul.plan(sch, single_reduction(sch), parse_target("llvm -mcpu=skylake-avx512 -num-cores=2"))
    assert (t.col, t.cols, t.row, t.rows, t.pack) == (0, 16, 1, 10, None)
    check([a, b], [c], K.OUT_FUSIBLE, lambda x, y: [x @ y], rtol=1e-4, atol=1e-3)


def _panel_matmul(rows: int, k: int, n: int, panel: int, batch: int = 0):
    """[batch,] rows x k times weights packed in [n / panel, k, panel] panels (as pack_weights stores a constant
    matmul's), + bias + residual: BERT's FFN-down."""
    lead = (batch,) if batch else ()
    a = te.placeholder((*lead, rows, k), name="A")
    b = te.placeholder((n // panel, k, panel), name="B")
    bias, res = te.placeholder((n,), name="bias"), te.placeholder((*lead, rows, n), name="res")
    r = te.reduce_axis((0, k), name="k")
    c = te.compute((*lead, rows, n), lambda *ij: te.sum(a[(*ij[:-1], r)] * b[ij[-1] // panel, r, ij[-1] % panel], axis=r),
                   name="C")
    out = te.compute(c.shape, lambda *ij: c[ij] + bias[ij[-1]] + res[ij], name="D")

    def ref(x, y, z, w):
        return [x @ y.transpose(1, 0, 2).reshape(k, n) + z + w]
    return [a, b, bias, res], out, ref


S, P = tvm.tirx.ForKind.SERIAL, tvm.tirx.ForKind.PARALLEL


@pytest.mark.parametrize("mcpu, batch, rows, k, want", [
    ("znver3", 0, 128, 3072, [(S, 4), (P, None)]),  # 4 chunks of 768 steps (393 KB of rows) outside
    ("znver4", 0, 128, 3072, [(S, 2), (P, None)]),  # 1 MiB of L2: 2 chunks of 1536
    ("znver3", 0, 32, 3072, [(P, None)]),  # 393 KB of rows fit: the reduction stays inside the tiles
    ("znver3", 8, 128, 768, [(S, 8), (P, None)]),  # batch 8: one batch's rows at a time
    ("znver3", 8, 128, 3072, [(S, 8), (S, 4), (P, None)]),  # and chunks of each
])
def test_matmul_whose_rows_outgrow_l2_runs_batches_and_reduction_chunks_outside_the_tiles(mcpu, batch, rows, k, want):
    """BERT-base's FFN-down, [128, 3072] x [3072, 768]: its 1.5 MB of rows outgrow a 512 KiB L2 (znver3), so the
    reduction runs in chunks of 768 outside the parallel column tiles, each chunk a matmul whose rows stay in L2
    (znver3: 5.6-6.1 -> 5.0-5.5 ms); batch 8 runs one batch's rows at a time."""
    inputs, out, _ = _panel_matmul(rows, k, 768, 48, batch)
    sch = schedule_of([*inputs, out])
    apply_default(sch, K.OUT_FUSIBLE, parse_target(f"llvm -mcpu={mcpu} -num-cores=2"))
    loops = [sch.get(lp) for lp in sch.get_loops(sch.get_sblock("C_update"))]
    got = [(lp.kind, int(lp.extent) if kind is S else None) for lp, (kind, _) in zip(loops[: len(want)], want, strict=True)]
    assert got == want


@pytest.mark.parametrize("batch", [0, 3])
def test_matmul_in_reduction_chunks_matches_numpy(batch):
    # 256 rows x 1536 (1.5 MB): chunked on hosts with up to 1 MiB of L2; the epilogue follows the last chunk
    inputs, out, ref = _panel_matmul(256, 1536, 96, 48, batch)
    check(inputs, [out], K.OUT_FUSIBLE, ref, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("hw, marked", [(13, True), (14, False)])
def test_tiles_of_one_vector_by_many_rows_are_compiled_without_partial_unrolling(hw, marked):
    """AVX2, a 512->1000 1x1 conv on 13x13: 8 channels x 13 columns a tile, 13 broadcasts a step; LLVM's Zen model
    unrolled the step twice and spilled the accumulators (5.6 -> 2.8-3.8 ms on one core without). 14x14 takes 7
    columns, which ran faster unrolled."""
    from cinn.core.target import NO_PARTIAL_UNROLL
    from schedules.analysis import blocks

    x = te.placeholder((1, 512, hw, hw), name="x")
    w = te.placeholder((512, 1, 1, 1000), name="w")
    y = topi.nn.conv2d_nchw(x, topi.transpose(w, (3, 0, 1, 2)), 1, 0, 1)
    sch = schedule_of([x, w, y])
    apply_default(sch, K.OUT_FUSIBLE, parse_target("llvm -mcpu=znver3 -num-cores=2"))
    assert any(NO_PARTIAL_UNROLL in sch.get(b).annotations for b in blocks(sch)) == marked


def test_kernel_compiled_without_partial_unrolling_matches_numpy(tmp_path):
    import cinn
    from cinn.core.builder import NetBuilder

    b = NetBuilder("conv13")
    x = b.create_input("float32", (1, 64, 13, 13), "x")
    w = b.create_constant(RNG.standard_normal((48, 64, 1, 1)).astype("float32"), "w")
    prog = b.build([b.relu(b.conv2d(x, w))])
    feed = RNG.standard_normal((1, 64, 13, 13)).astype("float32")
    (got,) = cinn.compile(prog, cache_dir=tmp_path).run({"x": feed})
    want = np.maximum(np.einsum("chw,oc->ohw", feed[0], np.asarray(prog.constants["w"])[:, :, 0, 0]), 0)[None]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)



def test_attention_exponentials_are_vectors_along_the_query_rows():
    """A task's exponentials [keys, rows] are vectors along its query rows where those are whole vectors: vectors of
    the fused axes index the rows by // and %, which TVM scalarized (a branch per element for the NaN test, half of
    BERT's attention time). Checked against numpy."""
    op = get_op("attention")
    a = op.attrs(heads=2, scale=0.125)
    shapes = [(1, 128, 128), (1, 128, 128), (1, 128, 128), (1, 1, 1, 128)]
    tensors = [te.placeholder(s, "float32", name=n) for n, s in zip("qkvm", shapes, strict=True)]
    (out,) = op.compute(tensors, a, infer(op, [TensorType(s, "float32") for s in shapes], a))
    sch = check(tensors, [out], K.NON_FUSIBLE, lambda *arrays: op.reference(list(arrays), a))
    exp = sch.get_sblock("attention_exp")
    inner = sch.get(sch.get_loops(exp)[-1])
    assert inner.kind == tvm.tirx.ForKind.VECTORIZED and int(inner.extent) == LANES
    script = sch.mod["main"].script()
    bindings = script[script.index('T.sblock("attention_exp")'):script.index("T.reads", script.index(
        'T.sblock("attention_exp")'))]
    lane = inner.loop_var.name
    assert lane in bindings and f"{lane}) //" not in bindings and f"{lane}) %" not in bindings


@pytest.mark.parametrize("extra", [0, 1])
def test_attention_tasks_take_whole_heads_where_they_balance_the_cores(extra):
    """Where the heads balance the cores (2 per core), each task takes a whole head, its query blocks inside, after
    copying the head's k and v into contiguous buffers (in place a head's rows lie a row of every head apart: BERT at
    batch 8 waited on memory for each); where they would not (one more than the cores), tasks stay query blocks, with
    no copies. Checked against numpy."""
    cores = TARGET.num_cores
    if extra and cores < 2:
        pytest.skip("one core: every head count balances it")
    heads = cores + 1 if extra else 2 * cores
    op = get_op("attention")
    a = op.attrs(heads=heads, scale=0.125)
    shapes = [(1, 64, heads * 32)] * 3 + [(1, 1, 1, 64)]
    tensors = [te.placeholder(s, "float32", name=n) for n, s in zip("qkvm", shapes, strict=True)]
    (out,) = op.compute(tensors, a, infer(op, [TensorType(s, "float32") for s in shapes], a))
    sch = check(tensors, [out], K.NON_FUSIBLE, lambda *arrays: op.reference(list(arrays), a))
    (par,) = [lp for lp in sch.get_loops(sch.get_sblock("attention")) if sch.get(lp).kind == tvm.tirx.ForKind.PARALLEL]
    assert int(sch.get(par).extent) == (heads * 2 if extra else heads)  # 64 queries: two blocks of 32
    copies = [b for b in blocks(sch) if sch.get(b).name_hint in ("k_global", "v_global")]
    assert len(copies) == (0 if extra else 2)


@pytest.mark.parametrize(("layout", "hw"), [("NHWC", 14), ("NCHW", 28), ("NCHW", 14)])
def test_squeeze_excite_kernel_vectorizes_each_stage(layout, hw):
    """A squeeze-excite kernel (tests/test_fusion.py checks its numbers): the pool of channels-last pixels vectorized
    over its channels, of NCHW rows over lane-wise partial sums (rfactor; 4 lanes over 14x14's 196 pixels); each gate
    conv over its output channels;
    the vectors read many times (the means, the hidden activation, the gate) computed once, as stages; the scale in
    parallel."""
    import cinn
    from cinn.compiler.lower import lower_program
    from schedules.registry import pick

    b = cinn.NetBuilder("se")
    nhwc = layout == "NHWC"
    x = b.create_input("float32", (1, hw, hw, 64) if nhwc else (1, 64, hw, hw), "x")
    pooled = b.reduce_mean(x, [1, 2] if nhwc else [2, 3], keep_dim=True)
    conv = lambda v, o, c: b.conv2d(v, b.create_constant(RNG.standard_normal((o, c, 1, 1)).astype("float32")),
                                    data_format=layout)
    g = b.hard_sigmoid(conv(b.relu(conv(pooled, 16, 64)), 64, 16))
    (lowered,) = lower_program(b.build([b.multiply(x, g)]), target=TARGET)[1]
    sch = Schedule(tvm.IRModule({"main": lowered.func}))
    rule = pick(sch, lowered.group.kind, TARGET)
    assert rule.name == "SqueezeExcite"
    rule.rule.apply(sch, TARGET, DefaultKnobs())
    names = {sch.get(blk).name_hint: blk for blk in blocks(sch)}
    assert {"relu", "hard_sigmoid"} <= set(names)  # the vectors read by a conv or the scale stay stages
    assert any("_rf" in name for name in names) != nhwc  # NCHW rows: lane-wise partial sums
    for name in ("conv2d_update", "conv2d_1_update", "multiply"):
        *_, inner = sch.get_loops(names[name])
        assert sch.get(inner).kind == tvm.tirx.ForKind.VECTORIZED, name
    assert sch.get(sch.get_loops(names["multiply"])[0]).kind == tvm.tirx.ForKind.PARALLEL
    tvm.compile(sch.mod, target=TARGET.tvm())
