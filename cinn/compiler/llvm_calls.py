"""Intrinsics TVM's LLVM codegen cannot call, called anyway: a schedule calls a stand-in, an intrinsic with operands
of the same widths in types TIR has (one cinn emits nowhere else), and the built module's LLVM IR has each call of it
replaced by bitcasts of its operands to the types the wanted intrinsic takes, a call of that intrinsic and a bitcast
of its result back; the IR is then compiled again (tvm.runtime.load_module of the text).

vdpbf16ps takes `<32 x bfloat>`, which TVM 0.27 cannot emit: a bf16 dtype in TIR is computed as float32 and stored
as uint16, and `call_llvm_pure_intrin` on `<32 x i16>` fails LLVM's verifier. The call sites are rewritten, not
the declaration made a defined wrapper: a function defined in the text is not inlined when TVM compiles it again.
"""
from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass

import tvm

from schedules.cpu_bf16 import STAND_IN as DPBF16_STAND_IN


@dataclass(frozen=True)
class Intrinsic:
    """A stand-in intrinsic (`stand_in`, taking `operands` and returning `result`) and the one it becomes (`name`,
    taking `wanted` and returning `wanted_result`): each operand and the result are bitcast between them."""

    stand_in: str
    result: str
    operands: tuple[str, ...]
    name: str
    wanted_result: str
    wanted: tuple[str, ...]

    @property
    def declaration(self) -> str:
        return f"declare {self.wanted_result} @{self.name}({', '.join(self.wanted)})"


DPBF16 = Intrinsic(DPBF16_STAND_IN, "<16 x i32>", ("<16 x i32>", "<32 x i16>", "<32 x i16>"),
                   "llvm.x86.avx512bf16.dpbf16ps.512", "<16 x float>", ("<16 x float>", "<32 x bfloat>", "<32 x bfloat>"))
INTRINSICS = (DPBF16,)
_VALUE = r"([%@][\w.$-]+|zeroinitializer|undef|poison)"


class UnresolvedCall(RuntimeError):
    """A stand-in call the rewrite did not recognise: the kernel would compute the stand-in's arithmetic."""


def resolved(ex):
    """The compiled CPU kernel `ex` (a tvm.runtime.Executable) with its stand-in calls made calls of the wanted
    intrinsics; `ex` itself where it has none."""
    ll = ex.mod.inspect_source("ll")
    used = [i for i in INTRINSICS if f"@{i.stand_in}(" in ll]
    if not used:
        return ex
    for intrinsic in used:
        ll = rewritten(ll, intrinsic)
    with tempfile.NamedTemporaryFile("w", suffix=".ll", prefix="cinn-kernel-") as f:
        f.write(ll)
        f.flush()
        return tvm.runtime.Executable(tvm.runtime.load_module(f.name))


def rewritten(ll: str, i: Intrinsic) -> str:
    """LLVM IR text with every call of i.stand_in a call of i.name, the stand-in's declaration the intrinsic's;
    UnresolvedCall where any call of the stand-in is left."""
    operands = ", ".join(f"{re.escape(t)} {_VALUE}" for t in i.operands)
    site = re.compile(rf"^(\s*)(%[\w.$-]+) = ((?:tail |notail |musttail )?)call {re.escape(i.result)} "
                      rf"@{re.escape(i.stand_in)}\({operands}\)(.*)$", re.M)
    count = 0

    def call(m: re.Match) -> str:
        nonlocal count
        count += 1
        indent, name, tail, *args, rest = m.groups()
        temp = f"%{i.name}.{count}"
        lines = [f"{temp}.{k} = bitcast {t} {a} to {w}" for k, (t, a, w) in enumerate(zip(i.operands, args, i.wanted,
                                                                                            strict=True))]
        wanted = ", ".join(f"{w} {temp}.{k}" for k, w in enumerate(i.wanted))
        lines.append(f"{temp}.r = {tail}call {i.wanted_result} @{i.name}({wanted}){rest}")
        lines.append(f"{name} = bitcast {i.wanted_result} {temp}.r to {i.result}")
        return "\n".join(indent + line for line in lines)

    ll = site.sub(call, ll)
    declaration = re.compile(rf"^declare [^\n]*@{re.escape(i.stand_in)}\([^\n]*$", re.M)
    ll = declaration.sub(i.declaration, ll, count=1)
    left = [line.strip() for line in ll.splitlines() if f"@{i.stand_in}" in line]
    if left:
        raise UnresolvedCall(f"cinn: {len(left)} calls of the stand-in {i.stand_in} could not be made calls of "
                             f"{i.name} (first: {left[0][:200]!r})")
    return ll
