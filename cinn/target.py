"""Compilation targets: the host CPU through LLVM, and CUDA."""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import tvm
from tvm.target import codegen


@dataclass(frozen=True)
class Target:
    """A parsed target: kind ('llvm' or 'cuda'), CPU model or GPU architecture, and thread count."""

    kind: str
    mcpu: str = ""
    arch: str = ""
    num_cores: int = 1

    @property
    def is_cuda(self) -> bool:
        return self.kind == "cuda"

    @property
    def vector_bits(self) -> int:
        """Width of the CPU's widest float vector registers (512 with AVX-512F, 256 with AVX2, else 128)."""
        return _vector_bits(self.mcpu)

    def tvm(self):
        """The tvm.target.Target for this target."""
        if self.is_cuda:
            return tvm.target.Target({"kind": "cuda", "arch": self.arch}, host=_llvm_dict(host_cpu(), os.cpu_count() or 1))
        return tvm.target.Target(_llvm_dict(self.mcpu, self.num_cores))

    def __str__(self) -> str:
        return f"cuda -arch={self.arch}" if self.is_cuda else f"llvm -mcpu={self.mcpu} -num-cores={self.num_cores}"


def _llvm_dict(mcpu: str, cores: int) -> dict:
    return {"kind": "llvm", "mcpu": mcpu, "num-cores": cores}


@functools.cache
def _vector_bits(mcpu: str) -> int:
    target = tvm.target.Target(_llvm_dict(mcpu, 1))
    for feature, bits in (("avx512f", 512), ("avx2", 256)):
        if codegen.target_has_features(feature, target):
            return bits
    return 128


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
        return Target("llvm", mcpu=options.get("mcpu") or host_cpu(), num_cores=int(options.get("num-cores", os.cpu_count() or 1)))
    if kind == "cuda":
        unknown = set(options) - {"arch"}
        if unknown:
            raise ValueError(f"unknown cuda target options {sorted(unknown)}")
        return Target("cuda", arch=options.get("arch", "sm_90"))
    raise ValueError(f"unknown target {spec!r}; expected 'llvm' or 'cuda'")
