"""Lowering: one fused group -> one TVM PrimFunc built from the op table's TE computes."""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np
from tvm import te, tirx

from cinn.compiler.passes.fusion import Group, unfused
from cinn.compiler.passes.fusion import fuse as fuse_groups
from cinn.compiler.passes.manager import Instrument, PassName
from cinn.compiler.passes.pipeline import optimize
from cinn.compiler.passes.verify import verify
from cinn.core.cpu_model import lowering_for
from cinn.core.ir import Program, SymbolicType, Value
from cinn.core.ops import get_op
from cinn.core.ops.te_util import const
from cinn.core.precision import FP32, PrecisionPolicy
from cinn.core.target import Target
from cinn.core.views import find_views, kernelless

FOLDED_WITH_ZERO = frozenset({"multiply", "add"})  # ops whose float zero operand TVM's simplifier folds away


@dataclass(frozen=True)
class LoweredGroup:
    """A group's PrimFunc and the values bound to its parameters, in order."""

    func: object  # tvm.tirx.PrimFunc
    params: tuple[Value, ...]
    group: Group


def lower_group(group: Group, constants: Mapping[str, np.ndarray], shapes: Mapping[str, tuple] = MappingProxyType({}),
                symbols: Sequence[tirx.Var] = (), tile_rows: int = 8) -> LoweredGroup:
    """Build the group's TE graph and turn it into a PrimFunc (inputs, then outputs). A symbolic kernel gives its
    values' dims as TIR expressions of `symbols` (`shapes`), which it takes as trailing int parameters, and the rows
    of its matmuls' whole tiles (SymbolicType.tile_rows)."""
    tensors: dict[str, te.Tensor] = {}
    args: list[Value] = []
    for v in group.inputs:
        if v.name in constants and _inlined(constants[v.name], {n.op for n in group.nodes if v in n.inputs}):
            # scalar constants are folded into the kernel instead of being passed as buffers
            tensors[v.name] = te.compute(v.shape, _filled(constants[v.name].reshape(()).item(), v.dtype), name=_ident(v.name))
        else:
            tensors[v.name] = te.placeholder(shapes.get(v.name, v.shape), v.dtype, name=_ident(v.name))
            args.append(v)
    for node in group.nodes:
        compute = get_op(node.op, node.name).compute
        if compute is None:  # the pipeline decomposes composite ops before fusion
            raise RuntimeError(f"cinn: composite op {node.op!r} (node {node.name!r}) reached lowering undecomposed")
        types = [SymbolicType(shapes[v.name], v.dtype, tile_rows) if v.name in shapes else v.type for v in node.outputs]
        outs = compute([tensors[v.name] for v in node.inputs], node.attrs, types)
        for v, t in zip(node.outputs, outs, strict=True):
            tensors[v.name] = t
    params = tuple(_hot_first(args, constants)) + group.outputs
    func = te.create_prim_func([tensors[v.name] for v in params] + list(symbols))
    return LoweredGroup(func.with_attr("global_symbol", "main"), params, group)


def _hot_first(args: list[Value], constants: Mapping[str, np.ndarray]) -> list[Value]:
    """The arguments with a computed input first where a constant leads (the Winograd matmul's weights): the tuner
    times kernels with the caches of all arguments but the first flushed, as a kernel finds them inside a run (its
    input just written, its weights in memory); a leading constant stayed cached, so such a kernel measured about half
    its time inside a model's runs (see docs/notes/measurement-noise.md)."""
    hot = next((i for i, v in enumerate(args) if v.name not in constants), 0)
    return [*args[hot : hot + 1], *args[:hot], *args[hot + 1 :]]


def _inlined(array: np.ndarray, consumers: set[str]) -> bool:
    """A scalar constant is folded into the kernel, except a float zero that a product or a sum takes: TVM's
    simplifier would fold x * 0 to 0 and x + 0 to x, as if x could not be NaN, inf or -0.0 (max(x, 0), relu6's
    clip, stays folded: passed as a buffer it slowed mobilenet_v2; see docs/notes/graph-rewrites.md)."""
    if array.size != 1:
        return False
    zero = array.dtype.kind == "f" and array.reshape(()) == 0
    return not (zero and consumers & FOLDED_WITH_ZERO)


def _filled(scalar, dtype: str):
    """The fcompute of a tensor filled with one scalar (TE rejects keyword-default lambdas)."""
    return lambda *_: const(scalar, dtype)


def _ident(name: str) -> str:
    return re.sub(r"\W", "_", name)


def lower_program(program: Program, fuse: bool = True, passes: bool = True, in_place: bool = True,
                  target: Target | None = None, winograd_choices: Mapping[str, int] = MappingProxyType({}),
                  disabled: frozenset[PassName] = frozenset(), instruments: Sequence[Instrument] = (),
                  precision: PrecisionPolicy = FP32) -> tuple[Program, list[LoweredGroup]]:
    """Verify, optimize (`winograd_choices`, `disabled`, `instruments` and `precision` as
    cinn.compiler.passes.pipeline.optimize takes them) and fuse a Program; returns the optimized Program and one
    PrimFunc per kernel, in order. With fusion and `in_place`, the concats and slices of find_views(program) take no
    kernel: their values are views of other values' buffers."""
    verify(program)
    program = optimize(program, passes, target, winograd_choices, disabled, instruments, precision)
    skipped = kernelless(program, find_views(program)) if in_place else frozenset()
    groups = fuse_groups(program, skipped) if fuse else unfused(program)
    with lowering_for(None if target is None else target.cpu):  # the ops size their tiles by the target's CPU
        return program, [lower_group(g, program.constants) for g in groups]
