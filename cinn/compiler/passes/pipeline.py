"""The default pass pipelines run by cinn.compile before fusion, declared as named passes (see manager)."""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType

from cinn.compiler.passes import manager
from cinn.compiler.passes.attention import fold_attention_slices, fuse_attention, mark_causal
from cinn.compiler.passes.channels_last import channels_last
from cinn.compiler.passes.conv_forms import conv_forms
from cinn.compiler.passes.cse import cse
from cinn.compiler.passes.dce import dce
from cinn.compiler.passes.decompose import decompose
from cinn.compiler.passes.fold_constants import fold_constants
from cinn.compiler.passes.integer_kernels import integer_kernels
from cinn.compiler.passes.manager import Instrument, Pass, PassContext, PassName, Pipeline, PipelineName
from cinn.compiler.passes.pack_weights import pack_weights
from cinn.compiler.passes.simplify import simplify
from cinn.compiler.passes.sink_transposes import sink_transposes
from cinn.compiler.passes.winograd import ConvShape, conv_shapes, winograd
from cinn.compiler.passes.zero_size import zero_size
from cinn.core.ir import Program
from cinn.core.precision import FP32, PrecisionPolicy
from cinn.core.target import Target, parse_target


def _cpu(context: PassContext) -> Target:
    """The CPU target a CPU pass runs for."""
    if context.target is None or context.target.is_cuda:
        raise ValueError(f"a CPU pass given the target {context.target}")
    return context.target


# the one place that turns the context into the target-dependent passes' arguments
def _integer_kernels(program: Program, context: PassContext) -> Program:
    return integer_kernels(program, _cpu(context).model)


def _winograd(program: Program, context: PassContext) -> Program:
    return winograd(program, _cpu(context), context.winograd_choices)


def _channels_last(program: Program, context: PassContext) -> Program:
    return channels_last(program, _cpu(context))


def _pack_weights(program: Program, context: PassContext) -> Program:
    target = context.target or parse_target("llvm")
    return pack_weights(program, target.model, pad_rows=not target.is_cuda, precision=context.precision)


def _sink_transposes(program: Program, context: PassContext) -> Program:
    """sink_transposes where there are channels-last integer or bf16 convs (a float model's graph stays as it is)."""
    return sink_transposes(program) if any(n.op in ("conv2d_u8i8", "conv2d_bf16") for n in program.nodes) else program


def _plain(rewrite: Callable[[Program], Program]) -> Callable[[Program, PassContext], Program]:
    """A pass that reads nothing but the program."""
    return lambda program, context: rewrite(program)


ZERO_SIZE = Pass(PassName.ZERO_SIZE, _plain(zero_size), required="zero-size tensors have no kernels")
INTEGER_KERNELS = Pass(PassName.INTEGER_KERNELS, _integer_kernels)
SINK_TRANSPOSES = Pass(PassName.SINK_TRANSPOSES, _sink_transposes)
SIMPLIFY = Pass(PassName.SIMPLIFY, _plain(simplify))
FUSE_ATTENTION = Pass(PassName.FUSE_ATTENTION, _plain(fuse_attention))
FOLD_ATTENTION_SLICES = Pass(PassName.FOLD_ATTENTION_SLICES, _plain(fold_attention_slices))
DECOMPOSE = Pass(PassName.DECOMPOSE, _plain(decompose), required="composite ops have no kernel of their own")
CONV_FORMS = Pass(PassName.CONV_FORMS, _plain(conv_forms))
FOLD_CONSTANTS = Pass(PassName.FOLD_CONSTANTS, _plain(fold_constants))
MARK_CAUSAL = Pass(PassName.MARK_CAUSAL, _plain(mark_causal))
CSE = Pass(PassName.CSE, _plain(cse))
DCE = Pass(PassName.DCE, _plain(dce))
WINOGRAD = Pass(PassName.WINOGRAD, _winograd)
CHANNELS_LAST = Pass(PassName.CHANNELS_LAST, _channels_last)
PACK_WEIGHTS = Pass(PassName.PACK_WEIGHTS, _pack_weights)
PASSES = (ZERO_SIZE, INTEGER_KERNELS, SINK_TRANSPOSES, SIMPLIFY, FUSE_ATTENTION, FOLD_ATTENTION_SLICES, DECOMPOSE,
          CONV_FORMS, FOLD_CONSTANTS, MARK_CAUSAL, CSE, DCE, WINOGRAD, CHANNELS_LAST, PACK_WEIGHTS)

# zero-size values become constants before anything else reads the program (every pipeline starts so); simplify
# before decompose (batch norm folding needs the composite ops); fuse attention subgraphs into one op (the softmax is
# still one node) reading q, k and v sliced from one tensor in place; decompose, simplify what the expansions emit,
# rewrite convs into denser forms, fold constant subgraphs, mark the attention whose folded bias is causal, merge
# common subexpressions and drop what no output needs
_GRAPH = (SIMPLIFY, FUSE_ATTENTION, FOLD_ATTENTION_SLICES, DECOMPOSE, SIMPLIFY, CONV_FORMS, FOLD_CONSTANTS, MARK_CAUSAL,
          CSE, DCE)
TARGET_INDEPENDENT = Pipeline(PipelineName.TARGET_INDEPENDENT, (ZERO_SIZE, *_GRAPH))
# on a CPU with VNNI, matmuls and convs of quantized tensors and weights become integer kernels first, whose
# channels-last layout then carries from one conv to the next
VNNI = Pipeline(PipelineName.VNNI, (INTEGER_KERNELS, SINK_TRANSPOSES))
# stride-1 3x3 convs become Winograd convs where that gains, depthwise convs with narrow rows and the 1x1 convs around
# them compute channels last, constant weights are stored as the kernels read them (bf16 convs compute channels last:
# the transposes between them cancel)
_CPU = (WINOGRAD, CHANNELS_LAST, PACK_WEIGHTS, SINK_TRANSPOSES, DCE)
CPU = Pipeline(PipelineName.CPU, (*TARGET_INDEPENDENT.passes, *_CPU))
CPU_VNNI = Pipeline(PipelineName.CPU_VNNI, (ZERO_SIZE, *VNNI.passes, *_GRAPH, *_CPU))
CUDA = Pipeline(PipelineName.CUDA, (*TARGET_INDEPENDENT.passes, PACK_WEIGHTS, DCE))
# passes=False: every op reaches a kernel as written, composite ops decomposed
UNOPTIMIZED = Pipeline(PipelineName.UNOPTIMIZED, (ZERO_SIZE, DECOMPOSE))
PIPELINES = (TARGET_INDEPENDENT, VNNI, CPU, CPU_VNNI, CUDA, UNOPTIMIZED)


def pipeline_for(target: Target | None, passes: bool = True) -> Pipeline:
    """The pipeline `optimize` runs for a target (None: no target's rewrites, as on a GPU)."""
    if not passes:
        return UNOPTIMIZED
    if target is None or target.is_cuda:
        return CUDA
    return CPU_VNNI if target.has_vnni else CPU


def disabled_passes(names: Iterable[str | PassName], where: str = "disabled_passes") -> frozenset[PassName]:
    """The passes named to be skipped; ValueError for an unknown name or a pass that lowering needs."""
    return manager.disabled(names, PASSES, where)


def optimize(program: Program, passes: bool = True, target: Target | None = None,
             winograd_choices: Mapping[str, int] = MappingProxyType({}),
             disabled: frozenset[PassName] = frozenset(), instruments: Sequence[Instrument] = (),
             precision: PrecisionPolicy = FP32) -> Program:
    """Run the target's pipeline (pipeline_for) but the `disabled` passes, with `instruments` and the printer that
    $CINN_PRINT_IR_AFTER asks for; winograd picks by the measured `winograd_choices`, else by its estimate; the ops
    `precision` puts in bf16 are rewritten so by pack_weights."""
    printer = manager.ir_printer()
    return manager.run(pipeline_for(target, passes), program, PassContext(target, winograd_choices, precision), disabled,
                       (*instruments, *([printer] if printer is not None else [])))


def winograd_shapes(program: Program, target: Target, disabled: frozenset[PassName] = frozenset()) -> list[ConvShape]:
    """The shapes of the convs whose algorithm `optimize` chooses for this target (none on a GPU)."""
    if target.is_cuda:
        return []
    return conv_shapes(manager.run(pipeline_for(target).before(PassName.WINOGRAD), program, PassContext(target),
                                   disabled))
