"""The default pass pipeline run by cinn.compile before fusion."""
from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from cinn.compiler.passes.attention import fold_attention_slices, fuse_attention, mark_causal
from cinn.compiler.passes.channels_last import channels_last
from cinn.compiler.passes.conv_forms import conv_forms
from cinn.compiler.passes.cse import cse
from cinn.compiler.passes.dce import dce
from cinn.compiler.passes.decompose import decompose
from cinn.compiler.passes.fold_constants import fold_constants
from cinn.compiler.passes.integer_kernels import integer_kernels
from cinn.compiler.passes.pack_weights import pack_weights
from cinn.compiler.passes.simplify import simplify
from cinn.compiler.passes.sink_transposes import sink_transposes
from cinn.compiler.passes.winograd import ConvShape, conv_shapes, winograd
from cinn.core.ir import Program
from cinn.core.target import Target


def optimize(program: Program, passes: bool = True, target: Target | None = None,
             winograd_choices: Mapping[str, int] = MappingProxyType({})) -> Program:
    """Decompose composite ops; with `passes`, also simplify (batch norm folding needs the composite ops), fuse
    attention subgraphs into one op (the softmax is still one node) reading q, k and v sliced from one tensor in place
    (fold_attention_slices), decompose, simplify what the expansions emit, rewrite convs into denser forms
    (conv_forms), then fold constant subgraphs, mark the attention whose folded bias is causal (mark_causal), merge
    common subexpressions, drop what no output needs and store constant weights as the kernels read them. The
    target's rewrites (none without one): on a CPU with VNNI, matmuls and convs of quantized tensors and weights
    first become integer kernels (integer_kernels), whose channels-last layout then carries from one conv to the next
    (sink_transposes); on a CPU, stride-1 3x3 convs become Winograd convs
    where that gains (winograd: by the measured `winograd_choices`, else by its estimate), and depthwise convs with
    narrow rows and the 1x1 convs around them compute channels last (channels_last)."""
    if not passes:
        return decompose(program)
    program = _simplified(program, target)
    if target is None or target.is_cuda:
        return dce(pack_weights(program))
    program = winograd(program, winograd_choices, target.fma_bits, target.vector_registers)
    program = channels_last(program, target.vector_bits // 32, target.vector_registers)
    return dce(pack_weights(program, target.vector_bits // 32, target.vector_registers))


def winograd_shapes(program: Program, target: Target) -> list[ConvShape]:
    """The shapes of the convs whose algorithm `optimize` chooses for this target (none on a GPU)."""
    return [] if target.is_cuda else conv_shapes(_simplified(program, target))


def _simplified(program: Program, target: Target | None) -> Program:
    """The target-independent rewrites (and a VNNI CPU's integer kernels), up to the choice of conv algorithms."""
    program = _integer(program) if target is not None and target.has_vnni else program
    program = fold_attention_slices(fuse_attention(simplify(program)))
    return dce(cse(mark_causal(fold_constants(conv_forms(simplify(decompose(program)))))))


def _integer(program: Program) -> Program:
    """integer_kernels, then sink_transposes where it made integer convs (a float model's graph stays as it is)."""
    rewritten = integer_kernels(program)
    return sink_transposes(rewritten) if any(n.op == "conv2d_u8i8" for n in rewritten.nodes) else rewritten
