"""Winograd convolution: the transform matrices, the pass's choice of convs and tile sizes, and compiled Winograd
convs against the direct conv (numpy) on odd sizes, batches, asymmetric paddings and fused epilogues."""
from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

import cinn
from autotune.algorithms import ROUNDS, select_winograd, winograd_choices
from autotune.database import FailureKind, Record, append_records, read_records
from autotune.measure import MeasureResult
from cinn.compiler.lower import lower_program
from cinn.compiler.passes.pipeline import winograd_shapes
from cinn.compiler.passes.winograd import ALGORITHM_FAMILY, ALGORITHM_PREFIX, DIRECT, ConvShape, choose_tile
from cinn.core.ir import TensorType
from cinn.core.ops import get_op, infer
from cinn.core.ops.winograd import POINTS, WinogradInputAttrs, transforms, weight_transform
from cinn.core.target import parse_target
from tests.test_passes import evaluate

RNG = np.random.default_rng(0)
CPU = parse_target("llvm")
FULL_WIDTH = parse_target("llvm -mcpu=znver5 -num-cores=2")  # the FMA width choose_tile's rates were measured at
HALF_WIDTH = parse_target("llvm -mcpu=znver4 -num-cores=2")  # AVX-512 on 256-bit FMA units
ROW_PANEL = FULL_WIDTH.model.row_panel
# measured largest error over the direct conv, relative to the output's largest magnitude: F(2x2) ~1e-6, F(4x4)
# ~1e-5 (its transforms multiply by up to 25 before the products cancel)
TOLERANCE = {2: 1e-5, 4: 5e-5}


def _batched_matmul(optimized):
    """The Winograd conv's batched matmul: a matmul_packed over row panels, or a plain matmul."""
    (matmul,) = [node for node in optimized.nodes if node.op in ("matmul", "matmul_packed")]
    return matmul


def _row_panel(matmul) -> int:
    return matmul.attrs.x_panel if matmul.op == "matmul_packed" else 0


@pytest.mark.parametrize("m", sorted(POINTS))
def test_transforms_compute_the_correlation_exactly(m):
    at, g, bt = transforms(m)
    kernel, data = RNG.standard_normal(3), RNG.standard_normal(m + 2)
    expected = np.correlate(data, kernel, mode="valid")
    np.testing.assert_allclose(at @ ((g @ kernel) * (bt @ data)), expected, rtol=1e-12, atol=1e-12)


def test_weight_transform_is_g_w_gt_per_channel_pair():
    w = RNG.standard_normal((5, 3, 3, 3)).astype("float32")
    u = weight_transform(w, 2)
    g = transforms(2)[1]
    assert u.shape == (16, 5, 3) and u.dtype == np.float32
    np.testing.assert_allclose(u[:, 4, 2].reshape(4, 4), g @ w[4, 2] @ g.T, rtol=1e-6)


@pytest.mark.parametrize(("shape", "tile"), [
    ((1, 64, 64, (56, 56)), 4),  # resnet50's first stage
    ((1, 128, 128, (28, 28)), 4),
    ((1, 256, 256, (14, 14)), 2),  # 16 tiles of 4x4 (6 of them mostly padding) against 49 of 2x2
    ((1, 512, 512, (7, 7)), None),  # 16 tiles: the transformed weights (16 MB) outweigh the saved products
    ((1, 64, 64, (224, 224)), None),  # 29 MB of transformed input for 64 channels: memory-bound
    ((1, 128, 128, (112, 112)), 4),
    ((1, 16, 64, (56, 56)), None),  # too few input channels
    ((1, 128, 32, (56, 56)), None),  # too few output channels: densenet's 128->32
    ((1, 96, 128, (27, 27)), 4),  # inception_v1: 7x7 tiles of 4, the last ones overhanging 27x27
    ((1, 48, 192, (13, 13)), None),  # squeezenet: 48 channels make a slow matmul over 16 tiles
])
def test_tile_choice(shape, tile):
    assert choose_tile(*shape, FULL_WIDTH) == tile


@pytest.mark.parametrize(("shape", "tile"), [
    ((1, 128, 32, (28, 28)), 4),  # densenet's 128->32: 0.22 against 0.28 ms direct (2-core znver4)
    ((1, 128, 32, (7, 7)), None),  # 0.06 against 0.03
    # 16 tiles of 2x2: 0.78 against 1.11 ms; 4 tiles of 4x4 stream 37.7 MB of weights (1.21-1.27 ms inside runs)
    ((1, 512, 512, (7, 7)), 2),
    ((1, 128, 256, (13, 13)), 4),
    # squeezenet's thin convs, whose direct form runs at 72-83% of the peak: 0.23 against 0.33 ms, 0.18 against 0.27
    ((1, 16, 64, (55, 55)), 4),
    ((1, 32, 128, (27, 27)), 4),
    ((1, 48, 192, (13, 13)), 4),  # 0.103 against 0.136 ms (row-paneled weights)
    ((1, 48, 192, (27, 27)), 4),  # 0.33 against 0.61 ms
    ((1, 160, 320, (6, 6)), 2),  # 9 tiles of 2x2: 0.14 against 0.31 ms (inception_v1)
    ((1, 128, 32, (56, 56)), 4),  # densenet's 128->32: 0.56-0.64 against 1.15 ms
    ((1, 64, 64, (224, 224)), 4),  # 29 MB of transformed input, but 12.5 against 17.8 ms (vgg19 0.96x)
])
def test_tile_choice_at_half_the_fma_width(shape, tile):
    """znver4 and AVX2 cores complete half the FMA bits per cycle of the machine the rates were measured on: the
    direct conv and the matmul take twice as long, the transforms about as long."""
    assert choose_tile(*shape, HALF_WIDTH) == tile
    assert HALF_WIDTH.model.fma_share * 2 == FULL_WIDTH.model.fma_share == 1


def _conv_program(n, c, k, size, pads, epilogue: bool):
    b = cinn.NetBuilder("conv3x3")
    x = b.create_input("float32", (n, c, *size), "x")
    w = b.create_constant(RNG.standard_normal((k, c, 3, 3)).astype("float32") / np.sqrt(9 * c), "w")
    y = b.conv2d(x, w, paddings=list(pads))
    if epilogue:
        bias = b.create_constant(RNG.standard_normal((k, 1, 1)).astype("float32"), "bias")
        y = b.relu(b.add(b.add(y, bias), b.create_input("float32", y.shape, "residual")))
    return b.build([y])


@pytest.mark.parametrize(("n", "c", "k", "size", "pads", "tile"), [
    (1, 64, 64, (24, 24), (1, 1), 4),
    (2, 64, 64, (27, 22), (1, 1), 4),  # the last tiles overhang the output; two images share the matmul
    (1, 96, 96, (14, 14), (1, 0, 1, 2), 2),  # asymmetric padding (top, left, bottom, right); 16 tiles of 4 too few
    (1, 64, 64, (34, 34), (0, 0), 4),  # no padding
    (1, 64, 72, (28, 28), (1, 1), 4),  # output channels that are no whole row panels: weights stored [t, K, C]
])
def test_winograd_conv_matches_the_direct_conv(n, c, k, size, pads, tile, tmp_cache):
    program = _conv_program(n, c, k, size, pads, epilogue=True)
    feeds = {v.name: RNG.standard_normal(v.shape).astype("float32") for v in program.inputs}
    optimized, lowered = lower_program(program, target=FULL_WIDTH)
    ops = Counter(node.op for node in optimized.nodes)
    assert ops["winograd_input"] == ops["winograd_output"] == 1 and ops["conv2d"] == ops["conv2d_packed"] == 0
    assert next(node.attrs.tile for node in optimized.nodes if node.op == "winograd_input") == tile
    matmul = _batched_matmul(optimized)
    assert _row_panel(matmul) == (ROW_PANEL if k % ROW_PANEL == 0 else 0)
    # the input transform, the batched matmul, the output transform with the epilogue
    assert [lg.group.name for lg in lowered[:2]] == ["winograd_input", matmul.op]
    # the transformed input leads the matmul's arguments: the tuner times it with the weights' caches flushed
    assert [v.name in optimized.constants for v in lowered[1].params] == [False, True, False]
    assert lowered[2].group.name.startswith("fused_winograd_output_add")
    (expected,) = evaluate(program, feeds)
    (got,) = cinn.compile(program, cache_dir=tmp_cache).run(feeds)
    assert got.shape == expected.shape
    assert np.abs(got - expected).max() <= TOLERANCE[tile] * np.abs(expected).max()


def test_avx2_matmul_reads_row_panels_of_six_output_channels(tmp_cache):
    """With 16 vector registers, a batched matmul over 16 tiles (two vectors) takes 6 rows of output channels: the
    transformed weights are row panels of 6, the 64 channels padded to 66 rows of zero weights, which the output
    transform does not read."""
    program = _conv_program(1, 64, 64, (14, 14), (1, 1), epilogue=True)
    avx2 = parse_target("llvm -mcpu=znver3 -num-cores=2")
    (shape,) = winograd_shapes(program, avx2)
    optimized, _ = lower_program(program, target=avx2, winograd_choices={shape.key: 4})
    matmul = _batched_matmul(optimized)
    assert _row_panel(matmul) == 6 and matmul.outputs[0].shape == (36, 66, 16)
    (y,) = [node for node in optimized.nodes if node.op == "winograd_output"]
    assert y.attrs.channels == 64
    feeds = {v.name: RNG.standard_normal(v.shape).astype("float32") for v in program.inputs}
    (expected,) = evaluate(program, feeds)
    (got,) = cinn.compile(optimized, avx2, cache_dir=tmp_cache, passes=False).run(feeds)
    assert np.abs(got - expected).max() <= TOLERANCE[4] * np.abs(expected).max()


@pytest.mark.parametrize("channels, columns", [(16, 208), (64, 196)])
def test_avx2_tiles_are_padded_to_whole_vectors_unless_their_rows_alias(channels, columns, tmp_cache):
    """With 16 vector registers, 55x55's 196 tiles of F(4x4) pad to 208 columns (13 vectors of 16), so the matmul
    takes 2 x 6 register tiles over them; with 64 channels V's rows would be 4 KiB apart and stay unpadded."""
    program = _conv_program(1, channels, 64, (55, 55), (1, 1), epilogue=True)
    avx2 = parse_target("llvm -mcpu=znver3 -num-cores=2")
    (shape,) = winograd_shapes(program, avx2)
    optimized, _ = lower_program(program, target=avx2, winograd_choices={shape.key: 4})
    matmul = _batched_matmul(optimized)
    assert matmul.outputs[0].shape[2] == columns and (_row_panel(matmul) == 6) == (columns % 16 == 0)
    feeds = {v.name: RNG.standard_normal(v.shape).astype("float32") for v in program.inputs}
    (expected,) = evaluate(program, feeds)
    (got,) = cinn.compile(optimized, avx2, cache_dir=tmp_cache, passes=False).run(feeds)
    assert np.abs(got - expected).max() <= TOLERANCE[4] * np.abs(expected).max()


def test_avx2_matmul_computes_whole_register_tiles_of_columns(tmp_cache):
    """28x28's 49 tiles of F(4x4) have no divisor from 4 to 6: over 16-channel row panels the matmul computes 50
    columns (the last tile read again), in 5 x 2-vector register tiles where 7 x 1 vector were 7 accumulators a step
    (resnet50's 128->128 3x3 on 28x28: 0.48 -> 0.36 ms a matmul); the extra column never reaches the output."""
    program = _conv_program(1, 64, 64, (28, 28), (1, 1), epilogue=True)
    avx2 = parse_target("llvm -mcpu=znver3 -num-cores=2")
    (shape,) = winograd_shapes(program, avx2)
    optimized, _ = lower_program(program, target=avx2, winograd_choices={shape.key: 4})
    matmul = _batched_matmul(optimized)
    assert _row_panel(matmul) == ROW_PANEL and matmul.outputs[0].shape == (36, 64, 49)
    exe = cinn.compile(optimized, avx2, cache_dir=tmp_cache, passes=False)
    (source,) = [src for k, src in zip(exe._kernels, exe.kernel_sources(), strict=True) if k.name == "matmul_packed"]
    assert "T.sblock_alloc_buffer((36, 50, 64))" in source
    feeds = {v.name: RNG.standard_normal(v.shape).astype("float32") for v in program.inputs}
    (expected,) = evaluate(program, feeds)
    (got,) = exe.run(feeds)
    assert np.abs(got - expected).max() <= TOLERANCE[4] * np.abs(expected).max()


def test_padded_columns_need_one_image():
    with pytest.raises(ValueError, match=r"columns 64 .* one image"):
        infer(get_op("winograd_input"), [TensorType((2, 3, 14, 14), "float32")],
              WinogradInputAttrs(tile=4, columns=64))


def test_convs_that_do_not_gain_stay_direct():
    for program in (_conv_program(1, 8, 8, (32, 32), (1, 1), False),  # few channels
                    _conv_program(1, 512, 512, (7, 7), (1, 1), False)):  # few tiles
        ops = Counter(node.op for node in lower_program(program, target=FULL_WIDTH)[0].nodes)
        assert ops["conv2d_packed"] == 1 and ops["winograd_input"] == 0


def test_no_winograd_without_a_cpu_target():
    program = _conv_program(1, 64, 64, (56, 56), (1, 1), False)
    for target in (None, parse_target("cuda")):
        assert "winograd_input" not in [n.op for n in lower_program(program, target=target)[0].nodes]


def test_a_nan_spreads_over_its_tile():
    """Documented: a non-finite input value makes its whole output tile NaN (the transforms add and subtract it),
    where the direct conv makes only the outputs whose window holds it non-finite; finite outputs elsewhere are
    unchanged."""
    program = _conv_program(1, 64, 64, (24, 24), (1, 1), False)
    x = RNG.standard_normal((1, 64, 24, 24)).astype("float32")
    x[0, 3, 0, 0] = np.nan
    (got,) = cinn.compile(program).run({"x": x})
    assert np.isnan(got[:, :, :2, :2]).all()  # the direct conv's NaNs: the windows holding (0, 0)
    assert np.isnan(got[:, :, :4, :4]).all() and np.isfinite(got[:, :, 4:, :]).all() \
        and np.isfinite(got[:, :, :, 4:]).all()  # the rest of the first 4x4 tile, and nothing beyond it


def _ops(program, choices=None):
    return Counter(node.op for node in lower_program(program, target=CPU, winograd_choices=choices or {})[0].nodes)


def test_measured_choices_overrule_the_estimate(tmp_cache):
    thin = _conv_program(1, 8, 64, (20, 20), (1, 1), False)  # too few input channels for the estimate
    (shape,) = winograd_shapes(thin, CPU)
    assert shape == ConvShape(1, 8, 64, (20, 20), (1, 1, 1, 1)) and shape.out_size == (20, 20)
    assert _ops(thin)["winograd_input"] == 0 and _ops(thin, {shape.key: 4})["winograd_input"] == 1
    wide = _conv_program(1, 64, 64, (56, 56), (1, 1), False)  # the estimate's F(4x4)
    (key,) = (s.key for s in winograd_shapes(wide, CPU))
    assert _ops(wide)["winograd_input"] == 1 and _ops(wide, {key: DIRECT})["conv2d_packed"] == 1


class _AlgorithmRunner:
    """The direct conv's kernel 1e-4 s, each Winograd kernel 1e-5 s; F(2x2)'s kernels (every third call) fail."""

    def __init__(self):
        self.calls = 0

    def measure(self, inputs, target):
        self.calls += 1
        if self.calls % 3 == 0:
            return [MeasureResult((), FailureKind.BUILD_ERROR, "boom") for _ in inputs]
        return [MeasureResult((1e-4 if "conv2d" in i.task.name else 1e-5,) * 3) for i in inputs]

    def close(self):
        pass


def test_select_winograd_logs_each_algorithm_and_compile_applies_the_choice(tmp_path, tmp_cache):
    program = _conv_program(1, 16, 64, (20, 20), (1, 1), False)
    log = tmp_path / "log.jsonl"
    runner = _AlgorithmRunner()
    seen = []
    choices = select_winograd([program, program], CPU, log, runner, progress=lambda *a: seen.append(a))
    (shape,) = winograd_shapes(program, CPU)
    # direct: one conv kernel (1e-4 s); F(4x4): three kernels (3e-5 s); F(2x2): failed
    assert choices == {shape.key: 4} and seen == [(1, 1, shape, 4)]
    records = [r for r in read_records(log) if r.workload == shape.key]
    assert [json.loads(r.trace)["winograd_tile"] for r in records] == [DIRECT, 4, 2] * ROUNDS  # rounds interleaved
    assert records[0].costs == pytest.approx((1e-4,) * 3) and records[1].costs == pytest.approx((3e-5,) * 3)
    assert records[2].failure is FailureKind.BUILD_ERROR and records[2].error == "boom"
    assert select_winograd([program], CPU, log, runner, resume=True) == choices
    assert runner.calls == 3 * ROUNDS  # resumed: the log's shapes are not measured again
    ops = Counter(n.op for n in cinn.compile(program, tuning_log=log, cache_dir=tmp_cache).program.nodes)
    assert ops["winograd_input"] == 1 and ops["conv2d"] == 0


def test_algorithm_choice_keeps_the_direct_conv_on_a_tie_and_skips_bad_records(tmp_path):
    program = _conv_program(1, 16, 64, (20, 20), (1, 1), False)
    (shape,) = winograd_shapes(program, CPU)
    log = tmp_path / "log.jsonl"

    def record(trace, cost):
        return Record(shape.key, str(CPU), trace, (cost,))
    append_records(log, [record('{"winograd_tile": 0}', 1.0), record('{"winograd_tile": 4}', 0.97),
                         record('{"winograd_tile": 3}', 0.1), record("not json", 0.1)])
    with pytest.warns(UserWarning, match="algorithm record"):
        assert winograd_choices(read_records(log), CPU) == {shape.key: DIRECT}  # 3% faster is inside the noise
    other = parse_target(f"llvm -mcpu={'skylake' if CPU.mcpu == 'znver3' else 'znver3'}")
    assert winograd_choices(read_records(log), other) == {}  # another target's measurements
    disturbed = tmp_path / "disturbed.jsonl"  # one round of three slow for F(4x4): the medians decide
    append_records(disturbed, [record(f'{{"winograd_tile": {t}}}', c) for t, c in
                               [(0, 1.0), (4, 5.0), (0, 1.0), (4, 0.7), (0, 1.0), (4, 0.7)]])
    assert winograd_choices(read_records(disturbed), CPU) == {shape.key: 4}


def test_algorithm_records_of_earlier_winograd_kernels_are_ignored_with_a_warning(tmp_path):
    """A log measured before the Winograd kernels' revision changed no longer decides: the estimate does."""
    (shape,) = winograd_shapes(_conv_program(1, 16, 64, (20, 20), (1, 1), False), CPU)
    earlier = shape.key.replace(ALGORITHM_PREFIX, ALGORITHM_FAMILY)  # the key format of revision 1
    log = tmp_path / "log.jsonl"
    append_records(log, [Record(earlier, str(CPU), f'{{"winograd_tile": {t}}}', (c,)) for t, c in ((0, 1.0), (4, 0.5))])
    with pytest.warns(UserWarning, match="2 conv algorithm records .* earlier Winograd kernels"):
        assert winograd_choices(read_records(log), CPU) == {}
    append_records(log, [Record(shape.key, str(CPU), f'{{"winograd_tile": {t}}}', (c,)) for t, c in ((0, 1.0), (2, 0.5))])
    with pytest.warns(UserWarning, match="earlier Winograd kernels"):
        assert winograd_choices(read_records(log), CPU) == {shape.key: 2}
