"""The precision a program computes in: which op kinds multiply in bf16 (their weights stored in bf16, their inputs
rounded to bf16 where a kernel reads them, fp32 accumulation and fp32 outputs), which stay fp32 (norms, softmax,
reductions, elementwise ops: everything else). cinn.compile takes a Precision or a PrecisionPolicy; `resolve` turns
either into the policy the passes read, from the target's CpuModel alone. On a GPU the graph stays fp32 and the
precision picks the tensor cores that CUDA matmuls round their inputs for (`cuda_target`)."""
from __future__ import annotations

import dataclasses
import enum
import warnings
from collections.abc import Iterable
from dataclasses import dataclass

from cinn.core.cpu_model import CpuModel
from cinn.core.target import Target, TensorCores

_REFUSED = {
    "int8": "int8 models come from cinn.quantize (a quantized program), not from a compile precision",
}
GPU_ONLY = "is a GPU tensor-core precision; on a CPU use precision='bf16' (AVX512_BF16), 'fp32' or 'auto'"


class Precision(enum.StrEnum):
    """What cinn.compile computes matmuls and convs in: fp32, bf16 (a CPU with AVX512_BF16, or a GPU's tensor cores),
    fp16 and tf32 (a GPU's tensor cores), or AUTO (on a CPU bf16 where it runs bf16 dot products clearly faster than
    FP32 FMAs, CpuModel.bf16_pays, else fp32; on a GPU tf32)."""

    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"
    TF32 = "tf32"
    AUTO = "auto"

    @classmethod
    def parse(cls, value: Precision | str) -> Precision:
        """A Precision from its name; ValueError naming what to use for int8 and unknown names."""
        if isinstance(value, Precision):
            return value
        name = str(value).lower()
        if name in _REFUSED:
            raise ValueError(f"precision={value!r}: {_REFUSED[name]}")
        try:
            return cls(name)
        except ValueError:
            raise ValueError(f"precision={value!r}: expected one of {[p.value for p in cls]}") from None


class OpKind(enum.StrEnum):
    """The op kinds that may compute in bf16: matmuls with constant weights (dense layers), convs, and stem convs
    (a conv reading a program input: a first conv some models keep in fp32)."""

    MATMUL = "matmul"
    CONV = "conv"
    STEM_CONV = "stem_conv"


@dataclass(frozen=True)
class PrecisionPolicy:
    """The op kinds computed in bf16; every other op computes in fp32."""

    bf16: frozenset[OpKind] = frozenset()

    @classmethod
    def bf16_except(cls, keep_fp32: Iterable[OpKind | str] = ()) -> PrecisionPolicy:
        """bf16 for every OpKind but those kept in fp32 (e.g. `keep_fp32=["stem_conv"]`)."""
        kept = {OpKind(k) for k in keep_fp32}
        return cls(frozenset(OpKind) - kept)

    def computes_bf16(self, kind: OpKind) -> bool:
        return kind in self.bf16

    @property
    def key(self) -> str:
        """A stable text for cache keys: compiles under different policies never share an entry."""
        return "bf16:" + ",".join(sorted(self.bf16)) if self.bf16 else "fp32"


FP32 = PrecisionPolicy()
BF16 = PrecisionPolicy.bf16_except()


def resolve(precision: Precision | str | PrecisionPolicy, cpu: CpuModel | None) -> PrecisionPolicy:
    """The policy a compile for a CPU (None: a GPU, whose graph stays fp32) runs under; ValueError for bf16 on a CPU
    without AVX512_BF16, or a PrecisionPolicy with bf16 ops on a GPU, and for fp16 or tf32 on a CPU; a warning for
    bf16 on a CPU whose bf16 dot products run slower than its FP32 FMAs."""
    if isinstance(precision, PrecisionPolicy):
        wanted = precision
    else:
        p = Precision.parse(precision)
        if cpu is None:  # a GPU: the graph stays fp32, the tensor cores round (cuda_target)
            return FP32
        if p in (Precision.FP16, Precision.TF32):
            raise ValueError(f"precision={p.value!r} {GPU_ONLY}")
        if p is Precision.AUTO:
            return BF16 if cpu is not None and cpu.bf16_pays else FP32
        wanted = BF16 if p is Precision.BF16 else FP32
    if cpu is None:
        if wanted.bf16:
            raise ValueError("a PrecisionPolicy with bf16 ops is for CPUs: on a GPU pass precision='bf16', 'fp16' or "
                             "'tf32' (tensor cores)")
        return wanted
    if wanted.bf16 and not cpu.bf16:
        raise ValueError(f"precision bf16 needs a CPU with AVX512_BF16 (vdpbf16ps); the target is CPU {cpu.name!r}, "
                         "which has no AVX512_BF16: use precision='fp32', or 'auto' for bf16 only where the CPU runs "
                         "it faster")
    if wanted.bf16 and cpu.bf16_slower:
        warnings.warn(f"cinn: precision bf16 on CPU {cpu.name!r}, whose bf16 dot products run at {cpu.bf16_rate:.2g} "
                      "times its FP32 FMAs' FLOP rate: expect the model to run slower than in fp32 (precision='auto' "
                      "picks fp32 here)", stacklevel=3)
    return wanted


# the tensor cores each precision picks on a GPU: AUTO takes TF32, fp32's range with 10-bit mantissas (what cuBLAS
# and PyTorch offer as their fast fp32), rather than fp16, whose range an fp32 model's activations may exceed
CUDA_TENSOR_CORES = {Precision.FP32: TensorCores.OFF, Precision.BF16: TensorCores.BF16, Precision.FP16: TensorCores.FP16,
                     Precision.TF32: TensorCores.TF32, Precision.AUTO: TensorCores.TF32}


def cuda_target(precision: Precision | str | PrecisionPolicy, target: Target) -> Target:
    """A CUDA target with the tensor cores the precision picks, unless its target string names some; a CPU target as
    it is. A shape or architecture without those tensor cores keeps the fp32 schedules (schedules.cuda_tensor_core)."""
    if not target.is_cuda or target.tensor_cores is not TensorCores.OFF or isinstance(precision, PrecisionPolicy):
        return target
    return dataclasses.replace(target, tensor_cores=CUDA_TENSOR_CORES[Precision.parse(precision)])
