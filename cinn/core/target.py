"""Compilation targets: the host CPU through LLVM, and CUDA."""
from __future__ import annotations

import functools
import os
import pathlib
from dataclasses import dataclass, field

import tvm
from tvm.target import codegen


@dataclass(frozen=True)
class CacheSizes:
    """Per-core data cache sizes of a CPU, in bytes."""

    l1d: int
    l2: int


KIB = 1024
DEFAULT_CACHES = CacheSizes(32 * KIB, 512 * KIB)
# per-core L1d and L2 of CPUs by LLVM's name: the host's own are read from sysfs, these serve other -mcpu targets
KNOWN_CACHES: dict[str, CacheSizes] = {
    "haswell": CacheSizes(32 * KIB, 256 * KIB),
    "broadwell": CacheSizes(32 * KIB, 256 * KIB),
    "skylake": CacheSizes(32 * KIB, 256 * KIB),
    "skylake-avx512": CacheSizes(32 * KIB, 1024 * KIB),
    "cascadelake": CacheSizes(32 * KIB, 1024 * KIB),
    "icelake-server": CacheSizes(48 * KIB, 1280 * KIB),
    "rocketlake": CacheSizes(48 * KIB, 512 * KIB),
    "sapphirerapids": CacheSizes(48 * KIB, 2048 * KIB),
    "znver2": CacheSizes(32 * KIB, 512 * KIB),
    "znver3": CacheSizes(32 * KIB, 512 * KIB),
    "znver4": CacheSizes(32 * KIB, 1024 * KIB),
    "znver5": CacheSizes(48 * KIB, 1024 * KIB),
}


# a reduction block annotated so is compiled without LLVM's partial unrolling of its loops: on AMD's Zen models it
# unrolls a register tile's reduction step twice, and the broadcasts of both steps, hoisted together, spill the
# accumulators of a tile of one vector by 9 or more rows (AVX2 znver3: squeezenet's 512->1000 1x1 on 13x13, 8 x 13,
# 5.6 -> 2.8-3.8 ms on one core; tiles of 7 rows ran 15-25% faster unrolled)
NO_PARTIAL_UNROLL = "cinn_no_partial_unroll"

# CPUs (LLVM's names) whose cores complete two full 512-bit FMAs per cycle; other AVX-512 cores split them into 256-bit
# halves (znver4) or have one 512-bit FMA port (client cores), the FMA throughput of two 256-bit units
FULL_WIDTH_AVX512 = frozenset({"znver5", "skylake-avx512", "cascadelake", "cooperlake", "icelake-server",
                               "sapphirerapids", "emeraldrapids", "graniterapids", "graniterapids-d", "diamondrapids"})


@dataclass(frozen=True)
class Target:
    """A parsed target: kind ('llvm' or 'cuda'), CPU model or GPU architecture, thread count, and the CPU's per-core
    cache sizes (which the schedules size their tiles by)."""

    kind: str
    mcpu: str = ""
    arch: str = ""
    num_cores: int = 1
    caches: CacheSizes = field(default=DEFAULT_CACHES)

    @property
    def is_cuda(self) -> bool:
        return self.kind == "cuda"

    @property
    def vector_bits(self) -> int:
        """Width of the CPU's widest float vector registers (512 with AVX-512F, 256 with AVX2, else 128)."""
        return _vector_bits(self.mcpu)

    @property
    def fma_bits(self) -> int:
        """Bits of FMA results a core completes per cycle: 1024 on full-width AVX-512 cores, else two FMAs of at
        most 256 bits."""
        return 1024 if self.mcpu in FULL_WIDTH_AVX512 else 2 * min(self.vector_bits, 256)

    @property
    def has_vnni(self) -> bool:
        """Whether the CPU has AVX-512 VNNI (vpdpbusd: uint8 x int8 dot products into int32)."""
        return not self.is_cuda and _has_feature(self.mcpu, "avx512vnni")

    @property
    def vector_registers(self) -> int:
        """Architectural vector registers: 32 with AVX-512 (zmm0-31), else 16."""
        return 32 if self.vector_bits == 512 else 16

    @property
    def l1d_bytes(self) -> int:
        return self.caches.l1d

    @property
    def l2_bytes(self) -> int:
        return self.caches.l2

    def tvm(self, partial_unroll: bool = True):
        """The tvm.target.Target for this target; without `partial_unroll`, LLVM schedules with a model that does not
        unroll small loops (see NO_PARTIAL_UNROLL)."""
        if self.is_cuda:
            return tvm.target.Target({"kind": "cuda", "arch": self.arch}, host=_llvm_dict(host_cpu(), os.cpu_count() or 1))
        if partial_unroll:
            return tvm.target.Target(_llvm_dict(self.mcpu, self.num_cores))
        return tvm.target.Target(_unrolling_off(self.mcpu, self.num_cores))

    def __str__(self) -> str:
        return f"cuda -arch={self.arch}" if self.is_cuda else f"llvm -mcpu={self.mcpu} -num-cores={self.num_cores}"


def _llvm_dict(mcpu: str, cores: int) -> dict:
    return {"kind": "llvm", "mcpu": mcpu, "num-cores": cores}


def _unrolling_off(mcpu: str, cores: int) -> dict:
    """The CPU's features under an Intel core's scheduling model: LLVM partially unrolls small loops up to a CPU's
    loop buffer, 512 micro-ops on AMD's Zen models and 50 on Intel's, which leaves register-tiled loops alone."""
    features = _cpu_features(mcpu)
    model = "skylake-avx512" if "avx512f" in features else "haswell"
    return {**_llvm_dict(model, cores), "mattr": [f"+{f}" for f in features]}


@functools.cache
def _cpu_features(mcpu: str) -> tuple[str, ...]:
    return tuple(sorted(codegen.llvm_get_cpu_features(tvm.target.Target(_llvm_dict(mcpu, 1)))))


@functools.cache
def _has_feature(mcpu: str, feature: str) -> bool:
    return bool(codegen.target_has_features(feature, tvm.target.Target(_llvm_dict(mcpu, 1))))


@functools.cache
def _vector_bits(mcpu: str) -> int:
    return next((bits for feature, bits in (("avx512f", 512), ("avx2", 256)) if _has_feature(mcpu, feature)), 128)


def cpu_caches(mcpu: str) -> CacheSizes:
    """Per-core cache sizes of a CPU: the host's from sysfs, others from KNOWN_CACHES, else DEFAULT_CACHES."""
    if mcpu == host_cpu():
        return _host_caches()
    return KNOWN_CACHES.get(mcpu, DEFAULT_CACHES)


@functools.cache
def _host_caches(root: str = "/sys/devices/system/cpu/cpu0/cache") -> CacheSizes:
    """The host's per-core L1d and L2 as Linux reports them (falling back to the table where it does not)."""
    sizes: dict[int, int] = {}
    for index in sorted(pathlib.Path(root).glob("index*")):
        try:
            level, kind, size = ((index / f).read_text().strip() for f in ("level", "type", "size"))
        except OSError:
            continue
        if kind in ("Data", "Unified") and size.endswith("K"):
            sizes.setdefault(int(level), int(size[:-1]) * KIB)
    fallback = KNOWN_CACHES.get(host_cpu(), DEFAULT_CACHES)
    return CacheSizes(sizes.get(1, fallback.l1d), sizes.get(2, fallback.l2))


@functools.cache
def host_cpu() -> str:
    """LLVM's name for the host CPU (e.g. znver3, skylake)."""
    return str(tvm.target.codegen.llvm_get_system_cpu())


def parse_target(spec: str | Target) -> Target:
    """Parse 'llvm', 'llvm -mcpu=X -num-cores=N', 'cuda' or 'cuda -arch=sm_80'."""
    if isinstance(spec, Target):
        return spec
    kind, *opts = spec.split()
    options = {}
    for opt in opts:
        key, sep, val = opt.lstrip("-").partition("=")
        if not sep:
            raise ValueError(f"target option {opt!r} needs a value (as in -mcpu=znver3)")
        options[key] = val
    if kind == "llvm":
        unknown = set(options) - {"mcpu", "num-cores"}
        if unknown:
            raise ValueError(f"unknown llvm target options {sorted(unknown)}")
        mcpu = options.get("mcpu") or host_cpu()
        return Target("llvm", mcpu=mcpu, num_cores=int(options.get("num-cores", os.cpu_count() or 1)), caches=cpu_caches(mcpu))
    if kind == "cuda":
        unknown = set(options) - {"arch"}
        if unknown:
            raise ValueError(f"unknown cuda target options {sorted(unknown)}")
        return Target("cuda", arch=options.get("arch", "sm_90"))
    raise ValueError(f"unknown target {spec!r}; expected 'llvm' or 'cuda'")
