"""The hardware model of a CPU: the one place that states what a CPU has and can do.

A CpuModel holds the facts the schedules, passes and ops size their work by: the vector width and registers, the FMA
width and ports, the cache sizes, VNNI / BF16 / AMX, the bf16 dot products' FLOP rate against the FP32 FMAs', and the
FP32 FMA peak and memory bandwidth per core count.
The facts come from LLVM (its name for the CPU and that CPU's features), from sysfs for the host's caches, and from
KNOWN_CPUS for other -mcpu targets. The peaks are measured once per machine by `cinn-calibrate` (or by the first
`cinn-run --profile`) and cached as JSON (calibration_path); where none is measured they are an estimate (a nominal
clock and per-core bandwidth), and the model says so (`calibrated`). The kernel geometry derived from these facts
(register-tile rows, weight panels) is stated here too, so that nothing else holds a hardware number.

Ops read the model of the target being lowered (`lowering_for`, `lowering_model`); passes and schedules read
`Target.cpu`.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import json
import math
import os
import pathlib
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import tvm
from tvm.target import codegen

KIB = 1024
FLOAT_BITS = 32


@dataclass(frozen=True)
class CacheSizes:
    """Data cache sizes in bytes: a core's L1d and L2, and the L3 all cores share (0 where unknown)."""

    l1d: int
    l2: int
    l3: int = 0


DEFAULT_CACHES = CacheSizes(32 * KIB, 512 * KIB)


@dataclass(frozen=True)
class KnownCpu:
    """What LLVM's features do not say about a CPU: its caches, whether its cores complete two full 512-bit FMAs a
    cycle (other AVX-512 cores split them into 256-bit halves, as znver4, or have one 512-bit FMA port, as client
    cores: the FMA throughput of two 256-bit units), and on a CPU with AVX512_BF16 the FLOP rate of its vdpbf16ps
    against that of its FP32 FMAs (0: not known)."""

    caches: CacheSizes = DEFAULT_CACHES
    full_width: bool = False
    bf16_rate: float = 0.0


# vdpbf16ps's FLOP rate against the FP32 FMAs' (a vdpbf16ps zmm does 64 FLOP, an FMA zmm 32). Intel's Sapphire,
# Emerald and Granite Rapids cores: one vdpbf16ps zmm every two cycles against two FMAs a cycle (measured on an
# Emerald Rapids VM: 1.34 G vdpbf16ps/s against 5.6 G FMA/s on one core, docs/notes/bf16-kernels.md; OpenVINO's bf16
# kernels are slower than its float32 ones there too); Granite Rapids is taken to keep its predecessors' port layout
# (not measured). AMD Zen 4 and Zen 5: a vdpbf16ps zmm at the throughput of an FMA zmm, twice its FLOP (Zen 4 runs
# both on its 256-bit pipes as two halves, Zen 5 both full width: the rate issue 53 states from AMD's instruction
# tables for families 19h and 1Ah, not measured here nor checked against the tables; OpenVINO's bf16 was measured
# 1.7-2.1x faster than cinn's float32 on them, issue 53). cooperlake and diamondrapids have AVX512_BF16 at a rate
# not known here: 0
INTEL_BF16_RATE = 0.5
AMD_BF16_RATE = 2.0
# CPUs by LLVM's name: the host's caches are read from sysfs and its FMA width measured, these serve other -mcpu targets
KNOWN_CPUS: Mapping[str, KnownCpu] = {
    "haswell": KnownCpu(CacheSizes(32 * KIB, 256 * KIB)),
    "broadwell": KnownCpu(CacheSizes(32 * KIB, 256 * KIB)),
    "skylake": KnownCpu(CacheSizes(32 * KIB, 256 * KIB)),
    "skylake-avx512": KnownCpu(CacheSizes(32 * KIB, 1024 * KIB), full_width=True),
    "cascadelake": KnownCpu(CacheSizes(32 * KIB, 1024 * KIB), full_width=True),
    "cooperlake": KnownCpu(full_width=True),
    "icelake-server": KnownCpu(CacheSizes(48 * KIB, 1280 * KIB), full_width=True),
    "rocketlake": KnownCpu(CacheSizes(48 * KIB, 512 * KIB)),
    "sapphirerapids": KnownCpu(CacheSizes(48 * KIB, 2048 * KIB), full_width=True, bf16_rate=INTEL_BF16_RATE),
    "emeraldrapids": KnownCpu(full_width=True, bf16_rate=INTEL_BF16_RATE),
    "graniterapids": KnownCpu(full_width=True, bf16_rate=INTEL_BF16_RATE),
    "graniterapids-d": KnownCpu(full_width=True, bf16_rate=INTEL_BF16_RATE),
    "diamondrapids": KnownCpu(full_width=True),
    "znver2": KnownCpu(CacheSizes(32 * KIB, 512 * KIB)),
    "znver3": KnownCpu(CacheSizes(32 * KIB, 512 * KIB)),
    "znver4": KnownCpu(CacheSizes(32 * KIB, 1024 * KIB), bf16_rate=AMD_BF16_RATE),
    "znver5": KnownCpu(CacheSizes(48 * KIB, 1024 * KIB), full_width=True, bf16_rate=AMD_BF16_RATE),
}
UNKNOWN_CPU = KnownCpu()
# LLVM's Intel scheduling models, by vector width: they partially unroll small loops only up to a small loop buffer
INTEL_SCHEDULING_MODELS = {512: "skylake-avx512", 256: "haswell"}

# estimates for a CPU whose peaks were not measured: a core's FMAs at this clock, and this memory bandwidth per core.
# With them the rates the passes decide by reproduce the ones measured on 2 full-width AVX-512 cores at 480 GFLOP/s
# (docs/notes/cpu-model.md); `cinn-calibrate` replaces both with the machine's own
NOMINAL_CLOCK_HZ = 3.75e9
NOMINAL_CORE_BANDWIDTH = 9e9
WIDEST_FMA_BITS = 1024  # two 512-bit FMAs a cycle: the FMA throughput of the widest x86 cores
MANY_REGISTERS = 32  # AVX-512's zmm0-31; fewer (AVX2's 16) leave a register tile fewer accumulators
# kernel geometry: fp32 columns of a register tile's row over pixels or tiles (one AVX-512 vector, two AVX2 ones),
# output channels per conv weight panel (two AVX-512 vectors, four AVX2 ones: a conv kernel's channel tile), rows of
# a row panel (a register tile of 16 rows streams one panel), and rows of a channels-last conv's pixel tile (2
# vectors x 5 rows fit AVX2's 16 registers with the weights; 6 spilled: docs/notes/cpu-model.md)
TILE_COLUMN_BITS = 512
CONV_PANEL_BITS = 1024
ROW_PANEL = 16
PIXEL_TILE = 5
MATMUL_PANEL_WIDTHS = (32, 64, 16)  # column panels of a matmul's constant weights after three vectors, by preference
PADDED_ROWS = 8  # a symbolic matmul's rows in whole tiles of these: a multiple of AVX-512's 8 and AVX2's 4 tile rows
INT8_COLUMNS = range(4, 9)  # output columns an int8 conv's register tile takes (rows of none tile flat pixels)
MIN_LANES = 128 // FLOAT_BITS  # fp32 lanes of the narrowest vector registers worth using (xmm)
TRANSPOSE_ROWS = 16  # input rows per tile of a transposing copy: 16 rows of one vector stay in L1
L1_ALIAS_BYTES = 4096  # addresses this far apart share their L1d sets (its sets x its lines on x86 cores)
CHANNEL_VECTORS = 2  # weight vectors of a conv's register tile over output channels (docs/notes/cpu-model.md)
MAX_PANEL_BYTES = 1 << 20  # the largest packed weight panel that kept its speed within L2 (docs/notes/cpu-model.md)
# precision="auto" computes in bf16 only where vdpbf16ps's FLOP rate is at least this many times the FMAs': bf16 costs
# accuracy (relative errors up to 1e-2 on the outputs) and a rounding stage per kernel input, which a kernel of equal
# rate does not win back; the bf16 kernels reach about the rate of the float32 ones of the same instruction rate
# (docs/notes/bf16-kernels.md), so half again is a clear gain, and a calibration's noise around 1 is not one
BF16_AUTO_RATE = 1.5


@dataclass(frozen=True)
class Peak:
    """What `cores` cores do together: FP32 FMA FLOP/s and memory bytes/s (a copy's reads plus writes)."""

    cores: int
    flops: float
    bandwidth: float


@dataclass(frozen=True)
class CpuModel:
    """A CPU's facts (see the module doc). `peaks` holds one Peak per core count measured (or the estimate for one
    core where `calibrated` is False); other core counts scale the nearest one."""

    name: str
    vector_bits: int
    vector_registers: int
    fma_width: int  # bits of the results one FMA port completes per cycle
    fma_ports: int
    caches: CacheSizes
    vnni: bool
    bf16: bool
    amx: bool
    peaks: tuple[Peak, ...]
    calibrated: bool = False
    bf16_rate: float = 0.0  # vdpbf16ps's FLOP rate against the FP32 FMAs' (0: no AVX512_BF16, or not known)

    @property
    def bf16_pays(self) -> bool:
        """Whether bf16 dot products run clearly faster than FP32 FMAs here (BF16_AUTO_RATE): precision='auto'."""
        return self.bf16 and self.bf16_rate >= BF16_AUTO_RATE

    @property
    def bf16_slower(self) -> bool:
        """Whether bf16 dot products are known to run slower than FP32 FMAs here."""
        return self.bf16 and 0 < self.bf16_rate < 1

    @property
    def fma_bits(self) -> int:
        """Bits of FMA results a core completes per cycle."""
        return self.fma_width * self.fma_ports

    @property
    def fma_share(self) -> float:
        """The core's FMA throughput as a share of the widest (WIDEST_FMA_BITS)."""
        return self.fma_bits / WIDEST_FMA_BITS

    @property
    def lanes(self) -> int:
        """fp32 lanes of a vector register."""
        return self.vector_bits // FLOAT_BITS

    @property
    def few_registers(self) -> bool:
        """Whether a register tile has fewer accumulators than MANY_REGISTERS allow (AVX2's 16 registers)."""
        return self.vector_registers < MANY_REGISTERS

    @property
    def accumulators(self) -> int:
        """Registers of the default register tile's accumulators: half of 32, 12 of 16 (the rest hold operands)."""
        return self.vector_registers // 2 if not self.few_registers else self.vector_registers * 3 // 4

    @property
    def row_tile(self) -> int:
        """Rows of a register tile two vectors wide (with few registers: 2 x 6, 12 accumulators)."""
        return self.accumulators // 2

    @property
    def tile_columns(self) -> int:
        """fp32 columns a register tile's row covers over flat pixels or Winograd tiles (TILE_COLUMN_BITS)."""
        return TILE_COLUMN_BITS // FLOAT_BITS

    @property
    def conv_panel(self) -> int:
        """Output channels per panel of a conv's packed weights (CONV_PANEL_BITS)."""
        return CONV_PANEL_BITS // FLOAT_BITS

    @property
    def row_panel(self) -> int:
        return ROW_PANEL

    @property
    def padded_rows(self) -> int:
        return PADDED_ROWS

    @property
    def int8_columns(self) -> range:
        return INT8_COLUMNS

    @property
    def transpose_rows(self) -> int:
        return TRANSPOSE_ROWS

    @property
    def l1_alias_bytes(self) -> int:
        return L1_ALIAS_BYTES

    @property
    def channel_vectors(self) -> int:
        return CHANNEL_VECTORS

    @property
    def panel_bytes(self) -> int:
        """A packed weight panel read again for every pixel tile stays in L2: at most three quarters of it (the rest
        holds the tiles' inputs), and at most MAX_PANEL_BYTES."""
        return min(MAX_PANEL_BYTES, self.caches.l2 * 3 // 4)

    @property
    def pixel_tile(self) -> int:
        return PIXEL_TILE

    @property
    def matmul_panels(self) -> tuple[int, ...]:
        """Column panel widths of a matmul's constant weights by preference: three vectors first (one panel row per
        step of the default register tile), then MATMUL_PANEL_WIDTHS."""
        return (3 * self.lanes, *(w for w in MATMUL_PANEL_WIDTHS if w != 3 * self.lanes))

    def peak_flops(self, cores: int) -> float:
        """FP32 FLOP/s of `cores` cores' FMAs."""
        point = self._nearest(cores)
        return point.flops * cores / point.cores

    def bandwidth(self, cores: int) -> float:
        """Memory bytes/s that `cores` cores move."""
        point = self._nearest(cores)
        return point.bandwidth * cores / point.cores

    def cycles(self, cores: int) -> float:
        """Core cycles per second of `cores` cores together, as their FMA peak implies (fma_bits / 32 lanes x 2 FLOP
        a cycle): what their loads and stores run at."""
        return self.peak_flops(cores) / (self.fma_bits / FLOAT_BITS * 2)

    def _nearest(self, cores: int) -> Peak:
        return min(self.peaks, key=lambda p: (abs(p.cores - cores), -p.cores))


# ---------------------------------------------------------------------------------------------
# detection


@functools.cache
def host_cpu() -> str:
    """LLVM's name for the host CPU."""
    return str(codegen.llvm_get_system_cpu())


def llvm_dict(mcpu: str, cores: int) -> dict:
    """The tvm.target.Target dict of an LLVM CPU target."""
    return {"kind": "llvm", "mcpu": mcpu, "num-cores": cores}


@functools.cache
def cpu_features(mcpu: str) -> frozenset[str]:
    """LLVM's features of a CPU (avx2, avx512f, avx512vnni, ...)."""
    return frozenset(str(f) for f in codegen.llvm_get_cpu_features(tvm.target.Target(llvm_dict(mcpu, 1))))


def vector_bits(features: frozenset[str]) -> int:
    """Width of the widest float vector registers: 512 with AVX-512F, 256 with AVX2, else 128."""
    return next((bits for feature, bits in (("avx512f", 512), ("avx2", 256)) if feature in features), 128)


def intel_scheduling_model(features: frozenset[str]) -> str:
    """The LLVM Intel scheduling model of a CPU's vector width (AVX2's for narrower ones)."""
    return INTEL_SCHEDULING_MODELS[max(vector_bits(features), min(INTEL_SCHEDULING_MODELS))]


def estimated_peak(fma_bits: int) -> Peak:
    """One core's peaks where none was measured: its FMAs at NOMINAL_CLOCK_HZ, NOMINAL_CORE_BANDWIDTH."""
    return Peak(1, fma_bits / FLOAT_BITS * 2 * NOMINAL_CLOCK_HZ, NOMINAL_CORE_BANDWIDTH)


def cpu_model(mcpu: str) -> CpuModel:
    """The model of a CPU by LLVM's name: the host's with its sysfs caches and its calibration where there is one,
    another from its LLVM features and KNOWN_CPUS."""
    if mcpu == host_cpu():
        return host_model(calibration_path(mcpu))
    return _described(mcpu, KNOWN_CPUS.get(mcpu, UNKNOWN_CPU).caches)


@functools.cache
def _described(mcpu: str, caches: CacheSizes) -> CpuModel:
    """A CPU's model from LLVM's features and KNOWN_CPUS, with these caches and estimated peaks."""
    features = cpu_features(mcpu)
    bits = vector_bits(features)
    known = KNOWN_CPUS.get(mcpu, UNKNOWN_CPU)
    width = 512 if known.full_width else min(bits, 256)
    bf16 = "avx512bf16" in features
    return CpuModel(mcpu, bits, MANY_REGISTERS if "avx512f" in features else MANY_REGISTERS // 2, width, 2, caches,
                    "avx512vnni" in features, bf16, "amx-tile" in features, (estimated_peak(2 * width),),
                    bf16_rate=known.bf16_rate if bf16 else 0.0)


@functools.cache
def host_model(path: pathlib.Path) -> CpuModel:
    """The host's model: LLVM's description, the caches sysfs reports, the extensions /proc/cpuinfo lists (a VM may
    hide some of its CPU's), and the calibration at `path` if valid."""
    model = _described(host_cpu(), host_caches())
    flags = host_flags()
    if flags:
        bf16 = model.bf16 and "avx512_bf16" in flags
        model = dataclasses.replace(model, vnni=model.vnni and "avx512_vnni" in flags, bf16=bf16,
                                    amx=model.amx and "amx_tile" in flags, bf16_rate=model.bf16_rate if bf16 else 0.0)
    calibration = read_calibration(path, model.name)
    return model if calibration is None else calibrated(model, calibration)


@functools.cache
def host_flags(path: str = "/proc/cpuinfo") -> frozenset[str]:
    """The first CPU's flags in /proc/cpuinfo (none where it cannot be read)."""
    try:
        with open(path) as f:
            line = next((row for row in f if row.startswith("flags")), "")
    except OSError:
        return frozenset()
    return frozenset(line.partition(":")[2].split())


def calibrated(model: CpuModel, calibration: Calibration) -> CpuModel:
    """The model with the calibration's measured peaks (and FMA width and bf16 rate, where they were measured)."""
    width = calibration.fma_width or model.fma_width
    rate = (calibration.bf16_rate or model.bf16_rate) if model.bf16 else 0.0
    return dataclasses.replace(model, fma_width=width, peaks=calibration.peaks, calibrated=True, bf16_rate=rate)


@functools.cache
def host_caches(root: str = "/sys/devices/system/cpu/cpu0/cache") -> CacheSizes:
    """The host's L1d, L2 and L3 as Linux reports them (the table's, or defaults, where it does not)."""
    sizes: dict[int, int] = {}
    for index in sorted(pathlib.Path(root).glob("index*")):
        try:
            level, kind, size = ((index / f).read_text().strip() for f in ("level", "type", "size"))
        except OSError:
            continue
        if kind in ("Data", "Unified") and size.endswith("K") and size[:-1].isdigit():
            sizes.setdefault(int(level), int(size[:-1]) * KIB)
    fallback = KNOWN_CPUS.get(host_cpu(), UNKNOWN_CPU).caches
    return CacheSizes(sizes.get(1, fallback.l1d), sizes.get(2, fallback.l2), sizes.get(3, fallback.l3))


# ---------------------------------------------------------------------------------------------
# the ops' model: that of the target being lowered

_LOWERING: contextvars.ContextVar[CpuModel | None] = contextvars.ContextVar("cinn_lowering_cpu", default=None)


@contextlib.contextmanager
def lowering_for(model: CpuModel | None) -> Iterator[None]:
    """Lower kernels for this CPU (None: keep the current one): the ops' computes size their tiles by it."""
    token = _LOWERING.set(model or _LOWERING.get())
    try:
        yield
    finally:
        _LOWERING.reset(token)


def lowering_model() -> CpuModel:
    """The model of the CPU kernels are being lowered for (`lowering_for`); the host's outside any."""
    return _LOWERING.get() or cpu_model(host_cpu())


# ---------------------------------------------------------------------------------------------
# calibration: the measured peaks, cached as JSON


CALIBRATION_FORMAT, CALIBRATION_VERSION = "cinn-calibration", 1
CACHE_ENV = "CINN_CACHE_DIR"
FMA_WIDTHS = (128, 256, 512)
# plausible ranges of what a calibration file states: a value outside is a bad file, not a machine
MAX_CORES = 4096
FLOPS_RANGE = (1e8, 1e15)  # per core count measured
BANDWIDTH_RANGE = (1e7, 1e13)
BF16_RATE_RANGE = (0.05, 16.0)  # or 0: not measured


@dataclass(frozen=True)
class Calibration:
    """A CPU's measured peaks, one per core count, and its FMA width and bf16 rate (CpuModel.bf16_rate) where
    measured (0: not measured)."""

    cpu: str
    peaks: tuple[Peak, ...]
    fma_width: int = 0
    notes: Mapping[str, float] = field(default_factory=dict)  # other measurements, for the record (not read back)
    bf16_rate: float = 0.0


def default_cache_dir() -> pathlib.Path:
    """$CINN_CACHE_DIR, else ~/.cache/cinn."""
    return pathlib.Path(os.environ.get(CACHE_ENV) or pathlib.Path.home() / ".cache" / "cinn")


def calibration_path(mcpu: str, cache_dir: pathlib.Path | None = None) -> pathlib.Path:
    """Where the calibration of a CPU (LLVM's name) is cached."""
    return (cache_dir or default_cache_dir()) / f"calibration-{mcpu}.json"


def read_calibration(path: pathlib.Path, mcpu: str) -> Calibration | None:
    """The calibration cached at `path` for CPU `mcpu`; None where there is none, and for a file that is not a valid
    one (with a warning: the model then keeps its estimates)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as err:
        warnings.warn(f"cinn: cannot read the calibration {path}: {err}; using estimated peaks", stacklevel=2)
        return None
    try:
        return _parsed(json.loads(text), mcpu)
    except (ValueError, TypeError, KeyError, AttributeError) as err:
        warnings.warn(f"cinn: ignoring the calibration {path}: {err}; using estimated peaks "
                      "(run cinn-calibrate to measure again)", stacklevel=2)
        return None


def _parsed(doc: object, mcpu: str) -> Calibration:
    """A calibration document's contents, every field checked for its type and range."""
    if not isinstance(doc, dict) or doc.get("format") != CALIBRATION_FORMAT:
        raise ValueError("not a cinn calibration")
    if doc.get("version") != CALIBRATION_VERSION:
        raise ValueError(f"version {doc.get('version')!r}, expected {CALIBRATION_VERSION}")
    if doc.get("cpu") != mcpu:
        raise ValueError(f"measured on {doc.get('cpu')!r}, not {mcpu!r}")
    cores = doc["cores"]
    if not isinstance(cores, dict) or not cores:
        raise ValueError("no measured core counts")
    peaks = tuple(sorted((_peak(k, v) for k, v in cores.items()), key=lambda p: p.cores))
    width = doc.get("fma_width", 0)
    if width not in (0, *FMA_WIDTHS) or isinstance(width, bool):
        raise ValueError(f"fma_width {width!r} is none of {FMA_WIDTHS}")
    rate = doc.get("bf16_rate", 0)  # a file written before the rate was measured has none
    if isinstance(rate, bool) or rate != 0:
        rate = _in_range(rate, BF16_RATE_RANGE, "bf16_rate")
    return Calibration(mcpu, peaks, width, bf16_rate=float(rate))


def _peak(cores: object, values: object) -> Peak:
    if not (isinstance(cores, str) and cores.isdigit() and 1 <= int(cores) <= MAX_CORES):
        raise ValueError(f"core count {cores!r} is not a number from 1 to {MAX_CORES}")
    if not isinstance(values, dict):
        raise ValueError(f"{cores} cores: expected flops and bandwidth")
    n = int(cores)
    return Peak(n, _in_range(values["flops"], FLOPS_RANGE, "flops"), _in_range(values["bandwidth"], BANDWIDTH_RANGE,
                                                                                  "bandwidth"))


def _in_range(value: object, bounds: tuple[float, float], name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or not bounds[0] <= value <= bounds[1]:
        raise ValueError(f"{name} {value!r} is not a number from {bounds[0]:g} to {bounds[1]:g}")
    return float(value)


def calibration_json(calibration: Calibration) -> str:
    """The document read_calibration reads back."""
    doc = {"format": CALIBRATION_FORMAT, "version": CALIBRATION_VERSION, "cpu": calibration.cpu,
           "cores": {str(p.cores): {"flops": p.flops, "bandwidth": p.bandwidth} for p in calibration.peaks},
           "fma_width": calibration.fma_width, "bf16_rate": calibration.bf16_rate, "notes": dict(calibration.notes)}
    return json.dumps(doc, indent=1) + "\n"


def merged(old: Calibration | None, new: Calibration) -> Calibration:
    """`new` with the core counts, FMA width and bf16 rate only `old` measured."""
    if old is None:
        return new
    peaks = {p.cores: p for p in old.peaks} | {p.cores: p for p in new.peaks}
    return Calibration(new.cpu, tuple(peaks[c] for c in sorted(peaks)), new.fma_width or old.fma_width,
                       {**old.notes, **new.notes}, new.bf16_rate or old.bf16_rate)
