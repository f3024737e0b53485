"""Bounded build time: the default schedules of long signals (an audio front end's conv over 16,000 samples,
whisper's convs over 3000 positions and its attention over 1500 tokens) ask LLVM for bounded straight-line code.
The bounds are on the scheduled code's structure, not on the clock, which a busy CI machine stretches; the build
times behind them are in docs/notes/build-time-limits.md."""
from __future__ import annotations

import itertools

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from tvm.s_tir import Schedule

import cinn
import frontend
from cinn.compiler.build import element_aligned
from cinn.compiler.lower import lower_program
from cinn.core.ir import Program
from cinn.core.ops import OPS
from cinn.core.target import Target, parse_target
from frontend.onnx import load_onnx
from schedules import apply_default
from schedules.analysis import straight_line
from schedules.cpu_common import MAX_VECTORIZED, lanes
from schedules.knobs import MAX_UNROLLED

# stores counted per lane and unrolled step (StraightLine.unrolled_stores): the counts and the build times they went
# with are in docs/notes/build-time-limits.md
MAX_UNROLLED_STORES = 4096
TARGETS = ("llvm", "llvm -mcpu=znver3 -num-cores=2")  # the host (AVX-512 here) and an AVX2 CPU: other lane counts
# (input channels, output channels, positions), kernel sizes, strides: audio front ends and whisper-like encoders
CONV1D = [(shape, k, s) for shape, k, s in itertools.product([(1, 512, 16000), (80, 384, 3000), (384, 384, 1500)],
                                                              (3, 10), (1, 2, 5))]
RNG = np.random.default_rng(0)


def _conv1d(cin: int, cout: int, length: int, k: int, stride: int, groups: int = 1) -> Program:
    """conv1d (an NCHW conv2d of one row, as the ONNX importer writes it) + bias + gelu."""
    b = frontend.NetBuilder("conv1d")
    x = b.create_input("float32", (1, cin, 1, length), "x")
    w = b.create_constant((RNG.standard_normal((cout, cin // groups, 1, k)) * 0.1).astype("float32"), "w")
    bias = b.create_constant(RNG.standard_normal((cout, 1, 1)).astype("float32"), "bias")
    return b.build([b.gelu(b.add(b.conv2d(x, w, [1, stride], [0, k // 2], [1, 1], groups), bias))])


def _pool1d(length: int, k: int, stride: int, kind: str) -> Program:
    b = frontend.NetBuilder("pool1d")
    x = b.create_input("float32", (1, 32, 1, length), "x")
    return b.build([b.pool2d(x, kind, [1, k], [1, stride], [0, k // 2])])


def _attention(tokens: int, heads: int, dim: int) -> Program:
    b = frontend.NetBuilder("attention")
    q, k, v = (b.create_input("float32", (1, tokens, heads * dim), name) for name in "qkv")
    return b.build([b.attention(q, k, v, b.create_constant(np.zeros((), "float32"), "bias"), heads=heads,
                                scale=dim**-0.5)])


def _whisper_front_end(frames: int) -> onnx.ModelProto:
    """Whisper's encoder stem as its ONNX export writes it: Conv1d 80->384 k3, Gelu, Conv1d 384->384 k3 stride 2."""
    inits, nodes, x = [], [], "features"
    for n, (cin, stride) in enumerate([(80, 1), (384, 2)]):
        inits += [numpy_helper.from_array((RNG.standard_normal((384, cin, 3)) * 0.05).astype(np.float32), f"w{n}"),
                  numpy_helper.from_array(np.zeros(384, np.float32), f"b{n}")]
        nodes += [helper.make_node("Conv", [x, f"w{n}", f"b{n}"], [f"c{n}"], kernel_shape=[3], strides=[stride],
                                   pads=[1, 1]),
                  helper.make_node("Gelu", [f"c{n}"], [f"g{n}"], domain="")]
        x = f"g{n}"
    graph = helper.make_graph(nodes, "whisper_stem", [helper.make_tensor_value_info("features", TensorProto.FLOAT,
                                                                                      [1, 80, frames])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=9)


def _assert_bounded(program: Program, target: Target) -> None:
    """Every kernel's default schedule within the straight-line bounds."""
    widest = MAX_VECTORIZED * lanes("float32", target)
    for lg in lower_program(program, target=target)[1]:
        sch = Schedule(element_aligned(lg.func))
        apply_default(sch, lg.group.kind, target)
        code = straight_line(sch.mod["main"])
        assert code.widest_vector <= widest, (lg.group.name, code)
        assert code.longest_unroll <= MAX_UNROLLED, (lg.group.name, code)
        assert code.unrolled_stores <= MAX_UNROLLED_STORES, (lg.group.name, code)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(("shape", "k", "stride"), CONV1D)
def test_conv1d_over_long_signals_is_bounded(shape, k, stride, target):
    _assert_bounded(_conv1d(*shape, k, stride), parse_target(target))


@pytest.mark.parametrize(("length", "k", "stride"), list(itertools.product((1500, 3000), (3, 10), (1, 2))))
def test_depthwise_conv1d_is_bounded(length, k, stride):
    _assert_bounded(_conv1d(256, 256, length, k, stride, groups=256), parse_target("llvm"))


@pytest.mark.parametrize(("length", "k", "stride", "kind"),
                         list(itertools.product((1500, 3001, 16000), (3, 10), (1, 5), ("max", "avg"))))
def test_pool1d_over_long_signals_is_bounded(length, k, stride, kind):
    _assert_bounded(_pool1d(length, k, stride, kind), parse_target("llvm"))


@pytest.mark.parametrize(("tokens", "heads", "dim"), [(1500, 6, 64), (3000, 6, 64), (197, 12, 64)])
def test_attention_over_odd_token_counts_is_bounded(tokens, heads, dim):
    _assert_bounded(_attention(tokens, heads, dim), parse_target("llvm"))


def test_whisper_stem_from_onnx_is_bounded():
    _assert_bounded(load_onnx(_whisper_front_end(3000), {"features": (1, 80, 3000)}), parse_target("llvm"))


def _reference(program: Program, feeds: dict) -> list[np.ndarray]:
    """The program evaluated node by node with the op table's numpy references."""
    env = {**feeds, **program.constants}
    for node in program.nodes:
        outs = OPS[node.op].reference([env[v.name] for v in node.inputs], node.attrs)
        env.update((v.name, np.asarray(o, dtype=v.dtype)) for v, o in zip(node.outputs, outs, strict=True))
    return [env[v.name] for v in program.outputs]


@pytest.mark.parametrize("program", [
    pytest.param(lambda: _conv1d(1, 512, 16000, 10, 5), id="conv1d-1x512-k10s5-16000"),  # 3199 outputs: a vector tail
    pytest.param(lambda: _conv1d(64, 64, 1499, 3, 1), id="conv1d-64x64-k3-1499"),
    pytest.param(lambda: _pool1d(3001, 3, 1, "max"), id="maxpool1d-k3-3001"),  # a prime row: guarded lanes
    pytest.param(lambda: _pool1d(16000, 10, 5, "avg"), id="avgpool1d-k10s5-16000"),
])
def test_bounded_vector_loops_compute_the_same(program, tmp_cache):
    """The loops vectorize_bounded splits and partitions (whole vectors, then the rest) cover every element once."""
    prog = program()
    x = RNG.standard_normal(prog.inputs[0].shape).astype("float32")
    (got,) = cinn.compile(prog, cache_dir=tmp_cache).run({prog.inputs[0].name: x})
    np.testing.assert_allclose(got, _reference(prog, {prog.inputs[0].name: x})[0], rtol=1e-4, atol=1e-4)
