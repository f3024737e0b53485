"""Targets: parsing, and the hardware facts (vector width and registers, cache sizes) the schedules size tiles by."""
from __future__ import annotations

import dataclasses

import pytest

from cinn.core.cpu_model import DEFAULT_CACHES, KIB, KNOWN_CPUS, MAX_PANEL_BYTES, UNKNOWN_CPU, CacheSizes, host_caches
from cinn.core.target import host_cpu, parse_target
from schedules import cpu_matmul


@pytest.mark.parametrize("mcpu, bits, registers, l1d, l2", [
    ("znver3", 256, 16, 32 * KIB, 512 * KIB),
    ("znver5", 512, 32, 48 * KIB, 1024 * KIB),
    ("skylake-avx512", 512, 32, 32 * KIB, 1024 * KIB),
    ("haswell", 256, 16, 32 * KIB, 256 * KIB),
])
def test_known_cpus(mcpu, bits, registers, l1d, l2):
    t = parse_target(f"llvm -mcpu={mcpu} -num-cores=2")
    if mcpu == host_cpu():
        pytest.skip("the host's caches come from sysfs")
    assert (t.vector_bits, t.vector_registers, t.l1d_bytes, t.l2_bytes) == (bits, registers, l1d, l2)


def test_unknown_cpu_gets_default_caches():
    t = parse_target("llvm -mcpu=x86-64 -num-cores=1")
    assert t.model.caches == DEFAULT_CACHES and t.vector_bits == 128 and t.vector_registers == 16


def test_host_caches_come_from_sysfs(tmp_path):
    for i, (level, kind, size) in enumerate([(1, "Data", "48K"), (1, "Instruction", "32K"), (2, "Unified", "2048K"),
                                            (3, "Unified", "32768K")]):
        d = tmp_path / f"index{i}"
        d.mkdir()
        for name, text in (("level", level), ("type", kind), ("size", size)):
            (d / name).write_text(f"{text}\n")
    assert host_caches.__wrapped__(str(tmp_path)) == CacheSizes(48 * KIB, 2048 * KIB, 32768 * KIB)
    fallback = KNOWN_CPUS.get(host_cpu(), UNKNOWN_CPU).caches
    assert host_caches.__wrapped__(str(tmp_path / "missing")) == fallback


def test_register_tile_follows_the_vector_registers():
    avx512, avx2 = parse_target("llvm -mcpu=znver5"), parse_target("llvm -mcpu=znver3")
    assert cpu_matmul.tile_elems(avx512) == 16 * 16  # 16 of 32 zmm hold fp32 accumulators
    assert cpu_matmul.tile_elems(avx2) == 12 * 8  # 12 of 16 ymm


def test_weight_panel_follows_the_l2():
    t = parse_target("llvm -mcpu=znver3")
    small = _with_caches(t, CacheSizes(32 * KIB, 128 * KIB))
    big = _with_caches(t, CacheSizes(48 * KIB, 4096 * KIB))
    assert cpu_matmul.panel_bytes(t) == 384 * KIB  # three quarters of znver3's 512 KiB L2
    assert cpu_matmul.panel_bytes(small) == 96 * KIB
    assert cpu_matmul.panel_bytes(big) == MAX_PANEL_BYTES
    # a 128-channel 3x3 conv: 8-wide vectors of 1152 reduction elements, 36 KB each
    assert cpu_matmul._channel_vectors(128, 1152, 8, 8, "float32", t) == [1, 2, 4, 8]
    assert cpu_matmul._channel_vectors(128, 1152, 8, 8, "float32", small) == [1, 2]


def test_targets_that_schedule_differently_do_not_share_cache_entries():
    from cinn.compiler.build import KernelSpec, cache_key
    from cinn.core.ops import PatternKind

    t = parse_target("llvm -mcpu=znver3")
    spec = KernelSpec("w", None, PatternKind.OUT_FUSIBLE, None)
    assert cache_key(spec, t) != cache_key(spec, _with_caches(t, CacheSizes(32 * KIB, 128 * KIB)))
    assert str(t) == "llvm -mcpu=znver3 -num-cores=" + str(t.num_cores)  # the log's target string is unchanged


@pytest.mark.parametrize("mcpu, model, feature", [("znver3", "haswell", "+avx2"), ("znver4", "skylake-avx512", "+avx512vnni")])
def test_kernels_without_partial_unrolling_keep_the_cpus_features_under_an_intel_model(mcpu, model, feature):
    target = parse_target(f"llvm -mcpu={mcpu} -num-cores=2")
    assert str(target.tvm().attrs["mcpu"]) == mcpu
    plain = target.tvm(partial_unroll=False)
    assert str(plain.attrs["mcpu"]) == model and feature in [str(f) for f in plain.attrs["mattr"]]
    assert int(plain.attrs["num-cores"]) == 2


def _with_caches(target, caches):
    return dataclasses.replace(target, cpu=dataclasses.replace(target.model, caches=caches))
