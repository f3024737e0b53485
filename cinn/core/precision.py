"""The precision a program computes in: which op kinds multiply in bf16 (their weights stored in bf16, their inputs
rounded to bf16 where a kernel reads them, fp32 accumulation and fp32 outputs), which stay fp32 (norms, softmax,
reductions, elementwise ops: everything else). cinn.compile takes a Precision or a PrecisionPolicy; `resolve` turns
either into the policy the passes read, from the target's CpuModel alone."""
from __future__ import annotations

import enum
import warnings
from collections.abc import Iterable
from dataclasses import dataclass

from cinn.core.cpu_model import CpuModel

_REFUSED = {
    "int8": "int8 models come from cinn.quantize (a quantized program), not from a compile precision",
    "fp16": "fp16 is for GPUs and not built yet; on a CPU use precision='bf16' (AVX512_BF16) or 'fp32'",
}


class Precision(enum.StrEnum):
    """What cinn.compile computes matmuls and convs in: fp32, bf16 (a CPU with AVX512_BF16), or AUTO (bf16 where the
    target's CPU runs bf16 dot products clearly faster than FP32 FMAs, CpuModel.bf16_pays; else fp32)."""

    FP32 = "fp32"
    BF16 = "bf16"
    AUTO = "auto"

    @classmethod
    def parse(cls, value: Precision | str) -> Precision:
        """A Precision from its name; ValueError naming what to use for int8, fp16 and unknown names."""
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
    """The policy a compile for a CPU (None: a GPU) runs under; ValueError for bf16 on a CPU without AVX512_BF16 (or
    a GPU), a warning for bf16 on a CPU whose bf16 dot products run slower than its FP32 FMAs."""
    if isinstance(precision, PrecisionPolicy):
        wanted = precision
    else:
        p = Precision.parse(precision)
        if p is Precision.AUTO:
            return BF16 if cpu is not None and cpu.bf16_pays else FP32
        wanted = BF16 if p is Precision.BF16 else FP32
    if wanted.bf16 and (cpu is None or not cpu.bf16):
        where = "a GPU target" if cpu is None else f"CPU {cpu.name!r}, which has no AVX512_BF16"
        raise ValueError(f"precision bf16 needs a CPU with AVX512_BF16 (vdpbf16ps); the target is {where}: use "
                         "precision='fp32', or 'auto' for bf16 only where the CPU runs it faster")
    if wanted.bf16 and cpu is not None and cpu.bf16_slower:
        warnings.warn(f"cinn: precision bf16 on CPU {cpu.name!r}, whose bf16 dot products run at {cpu.bf16_rate:.2g} "
                      "times its FP32 FMAs' FLOP rate: expect the model to run slower than in fp32 (precision='auto' "
                      "picks fp32 here)", stacklevel=3)
    return wanted
