"""The special-purpose features (fused attention, Winograd convolutions, integer and bf16 kernels), each with its parts in
every layer listed in one place: its ops, the rewrite passes that bring them in, its schedule rules and
post-processors, the modules above the compiler that take part (converters, tuning) and its docs. See
docs/features.md; tests/test_schedule_rules.py checks every part exists and is registered."""
from __future__ import annotations

from dataclasses import dataclass

from cinn.compiler.passes.manager import PassName
from cinn.core.ops import OpDef, get_op
from schedules import cpu_attention, cpu_bf16, cpu_int8, cpu_winograd
from schedules.registry import PostProcessor, ScheduleRule


@dataclass(frozen=True)
class Feature:
    """One feature's parts, layer by layer."""

    name: str
    ops: tuple[OpDef, ...]
    passes: tuple[PassName, ...]  # the rewrites that bring its ops into a program (disabled_passes takes them)
    rules: tuple[type[ScheduleRule], ...]  # registered by their modules (schedules.registry)
    postprocessors: tuple[PostProcessor, ...]
    # its parts above the compiler layer, which cannot be imported here: module names
    modules: tuple[str, ...]
    docs: tuple[str, ...]  # pages that describe it, from the repository root


ATTENTION = Feature(
    name="attention",
    ops=(get_op("attention"),),
    passes=(PassName.FUSE_ATTENTION, PassName.FOLD_ATTENTION_SLICES, PassName.MARK_CAUSAL),
    rules=(cpu_attention.Attention,),
    postprocessors=(cpu_attention.skip_masked_keys,),
    modules=("frontend.onnx.ops_attention", "frontend.onnx.ops_contrib"),  # ONNX's and onnxruntime's Attention
    docs=("docs/architecture.md", "docs/api.md"),
)
WINOGRAD = Feature(
    name="winograd",
    ops=(get_op("winograd_input"), get_op("winograd_output")),
    passes=(PassName.WINOGRAD,),
    rules=(cpu_winograd.Winograd,),
    postprocessors=(),
    modules=("autotune.algorithms",),  # measures each conv shape's algorithms (cinn-tune)
    docs=("docs/architecture.md",),
)
INT8 = Feature(
    name="int8",
    ops=(get_op("matmul_u8i8"), get_op("conv2d_u8i8")),
    passes=(PassName.INTEGER_KERNELS, PassName.SINK_TRANSPOSES),
    rules=(cpu_int8.Int8,),
    postprocessors=(),
    modules=("frontend.onnx.ops_quant",),  # the quantized models' ops, whose dequantized matmuls and convs it rewrites
    docs=("docs/architecture.md", "docs/api.md"),
)
BF16 = Feature(
    name="bf16",
    ops=(get_op("matmul_bf16"), get_op("conv2d_bf16")),
    passes=(PassName.PACK_WEIGHTS, PassName.SINK_TRANSPOSES),  # under a bf16 PrecisionPolicy
    rules=(cpu_bf16.Bf16,),
    postprocessors=(),
    modules=("benchmarks.precision_accuracy",),  # the accuracy table against fp32
    docs=("docs/api.md", "docs/notes/bf16-kernels.md"),
)
FEATURES = (ATTENTION, WINOGRAD, INT8, BF16)
