"""Compilation targets: the host CPU through LLVM, and CUDA."""
from __future__ import annotations

import enum
import os
from dataclasses import dataclass

import tvm

from cinn.core.cpu_model import CpuModel, cpu_features, cpu_model, intel_scheduling_model, llvm_dict
from cinn.core.cpu_model import host_cpu as host_cpu

# a reduction block annotated so is compiled without LLVM's partial unrolling of its loops: on CPUs whose LLVM
# scheduling model has a large loop buffer it unrolls a register tile's reduction step twice, and the broadcasts of
# both steps, hoisted together, spill the accumulators of a tile of one vector by 9 or more rows
# (docs/notes/partial-unroll.md)
NO_PARTIAL_UNROLL = "cinn_no_partial_unroll"


class TensorCores(enum.Enum):
    """The inputs CUDA matmuls may round for tensor cores (always accumulating in fp32): none (fp32 FMA, exact as
    the graph), TF32 (10-bit mantissas), fp16 or bf16 (cast in the kernel: the graph stays fp32)."""

    OFF = "off"
    TF32 = "tf32"
    FP16 = "fp16"
    BF16 = "bf16"


@dataclass(frozen=True)
class Target:
    """A parsed target: kind ('llvm' or 'cuda'), LLVM's CPU name or the GPU architecture, thread count, and the CPU's
    hardware model (cinn.core.cpu_model: what the schedules and passes size their work by; a GPU target's host's)."""

    kind: str
    mcpu: str = ""
    arch: str = ""
    num_cores: int = 1
    cpu: CpuModel | None = None
    tensor_cores: TensorCores = TensorCores.OFF  # CUDA only (schedules.cuda_tensor_core)

    @property
    def is_cuda(self) -> bool:
        return self.kind == "cuda"

    @property
    def model(self) -> CpuModel:
        """The CPU's model (set by parse_target)."""
        if self.cpu is None:
            raise ValueError(f"target {self} has no CPU model")
        return self.cpu

    @property
    def vector_bits(self) -> int:
        return self.model.vector_bits

    @property
    def fma_bits(self) -> int:
        return self.model.fma_bits

    @property
    def has_vnni(self) -> bool:
        """Whether the CPU has AVX-512 VNNI (vpdpbusd: uint8 x int8 dot products into int32)."""
        return not self.is_cuda and self.model.vnni

    @property
    def vector_registers(self) -> int:
        return self.model.vector_registers

    @property
    def l1d_bytes(self) -> int:
        return self.model.caches.l1d

    @property
    def l2_bytes(self) -> int:
        return self.model.caches.l2

    @property
    def peak_flops(self) -> float:
        """FP32 FMA FLOP/s of the target's cores."""
        return self.model.peak_flops(self.num_cores)

    @property
    def bandwidth(self) -> float:
        """Memory bytes/s the target's cores move."""
        return self.model.bandwidth(self.num_cores)

    def tvm(self, partial_unroll: bool = True):
        """The tvm.target.Target for this target; without `partial_unroll`, LLVM schedules with a model that does not
        unroll small loops (see NO_PARTIAL_UNROLL)."""
        if self.is_cuda:
            return tvm.target.Target({"kind": "cuda", "arch": self.arch}, host=llvm_dict(host_cpu(), os.cpu_count() or 1))
        if partial_unroll:
            return tvm.target.Target(llvm_dict(self.mcpu, self.num_cores))
        return tvm.target.Target(_unrolling_off(self.mcpu, self.num_cores))

    def __str__(self) -> str:
        if not self.is_cuda:
            return f"llvm -mcpu={self.mcpu} -num-cores={self.num_cores}"
        cores = "" if self.tensor_cores is TensorCores.OFF else f" -tensor-cores={self.tensor_cores.value}"
        return f"cuda -arch={self.arch}{cores}"


def _unrolling_off(mcpu: str, cores: int) -> dict:
    """The CPU's features under an Intel core's scheduling model: LLVM partially unrolls small loops up to a CPU's
    loop buffer, whose small size in Intel's models leaves register-tiled loops alone (see
    docs/notes/partial-unroll.md)."""
    features = cpu_features(mcpu)
    return {**llvm_dict(intel_scheduling_model(features), cores), "mattr": [f"+{f}" for f in sorted(features)]}


def parse_target(spec: str | Target) -> Target:
    """Parse 'llvm', 'llvm -mcpu=X -num-cores=N', 'cuda' or 'cuda -arch=sm_80 -tensor-cores=fp16'."""
    if isinstance(spec, Target):
        return spec
    kind, *opts = spec.split()
    options = {}
    for opt in opts:
        key, sep, val = opt.lstrip("-").partition("=")
        if not sep:
            raise ValueError(f"target option {opt!r} needs a value (as in -num-cores=4)")
        options[key] = val
    if kind == "llvm":
        unknown = set(options) - {"mcpu", "num-cores"}
        if unknown:
            raise ValueError(f"unknown llvm target options {sorted(unknown)}")
        mcpu = options.get("mcpu") or host_cpu()
        return Target("llvm", mcpu=mcpu, num_cores=int(options.get("num-cores", os.cpu_count() or 1)), cpu=cpu_model(mcpu))
    if kind == "cuda":
        unknown = set(options) - {"arch", "tensor-cores"}
        if unknown:
            raise ValueError(f"unknown cuda target options {sorted(unknown)}")
        return Target("cuda", arch=options.get("arch", "sm_90"), cpu=cpu_model(host_cpu()),
                      tensor_cores=TensorCores(options.get("tensor-cores", "off")))
    raise ValueError(f"unknown target {spec!r}; expected 'llvm' or 'cuda'")
