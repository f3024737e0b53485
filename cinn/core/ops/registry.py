"""The op table: one OpDef per op is the single source of truth for every layer."""
from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from tvm import te

from cinn.core.ir import Attrs, NoAttrs, ShapeTooLarge, TensorType
from cinn.core.target import Target


class PatternKind(enum.IntEnum):
    """Fusion pattern kinds, ordered from most to least fusible (as CINN)."""

    ELEMENTWISE = 0
    BROADCAST = 1
    INJECTIVE = 2
    REDUCTION = 3
    OUT_FUSIBLE = 4
    NON_FUSIBLE = 5


class DtypeClass(enum.Flag):
    """Which dtype families an op accepts."""

    FLOAT = enum.auto()
    INT = enum.auto()
    BOOL = enum.auto()
    NUMBER = FLOAT | INT
    ANY = FLOAT | INT | BOOL


class TargetKind(enum.StrEnum):
    """The kinds of target that schedules are written for (the values are Target.kind's)."""

    CPU = "llvm"
    CUDA = "cuda"

    @classmethod
    def of(cls, target: Target) -> TargetKind:
        return cls(target.kind)


class RuleName(enum.Enum):
    """A schedule rule that an op may need on one kind of target (schedules.registry registers it under this name)."""

    CPU_ATTENTION = (TargetKind.CPU, "attention")
    CPU_WINOGRAD = (TargetKind.CPU, "winograd")

    @property
    def target_kind(self) -> TargetKind:
        return self.value[0]


def dtype_class(dtype: str) -> DtypeClass:
    """The family of a dtype string."""
    if dtype == "bool":
        return DtypeClass.BOOL
    return DtypeClass.FLOAT if np.dtype(dtype).kind == "f" else DtypeClass.INT


# The functions of an op take its own Attrs subclass (Any here: a Callable's parameters are contravariant, so a
# function of ConvAttrs is not a function of Attrs).
InferFn = Callable[[Sequence[TensorType], Any], Sequence[TensorType]]
# output types: TensorTypes, or in a symbolic kernel SymbolicTypes (dims that are TIR expressions of its symbols);
# Any, as the computes are written for TensorType (a Callable's parameters are contravariant)
ComputeFn = Callable[[Sequence["te.Tensor"], Any, Sequence[Any]], Sequence["te.Tensor"]]
ReferenceFn = Callable[[Sequence[np.ndarray], Any], Sequence[np.ndarray]]
# Composite ops are expanded into primitive ops by the decompose pass; the emitter is a NetBuilder.
DecomposeFn = Callable[[Any, Sequence[Any], Any], Any]
# The arithmetic an op application performs (a multiply-add counts 2), for the profiler's GFLOP/s.
FlopsFn = Callable[[Sequence[TensorType], Any, Sequence[TensorType]], int]


@dataclass(frozen=True)
class OpDef:
    """Everything the compiler knows about one op."""

    name: str
    kind: PatternKind
    infer: InferFn
    reference: ReferenceFn
    compute: ComputeFn | None = None
    decompose: DecomposeFn | None = None
    attrs: type[Attrs] = NoAttrs
    num_inputs: int | None = 1  # None: variadic (one list argument)
    dtypes: DtypeClass = DtypeClass.ANY
    doc: str = ""
    # the input holding indices into input 0 along attrs.axis: constant ones are range-checked before compiling, run-
    # time ones are clamped into the axis by the compute (negative ones count from the end, as numpy)
    index_input: int | None = None
    flops: FlopsFn | None = None  # None: one per element read or written, whichever is more
    # its attrs only say the output's shape (a reshape's target): its compute reads that from the output's type, so a
    # symbolic kernel takes the op whatever sizes its attrs hold (a Shape-computed target differs at each size)
    shape_attrs: bool = False
    # the schedule rules its kernels need (one per target kind at most), where the generic schedule would defeat the
    # op's purpose; its compute names its output block after the op, by which schedules.registry finds it in a kernel
    needs_rules: tuple[RuleName, ...] = ()

    @property
    def is_composite(self) -> bool:
        return self.decompose is not None

    def reads_gathered(self, i: int) -> bool:
        """Whether input `i` is read only where the index input points (an embedding table), not whole."""
        return self.index_input is not None and i == 0


OPS: dict[str, OpDef] = {}


def register(op: OpDef) -> OpDef:
    """Add an op to the table (names are unique)."""
    if op.name in OPS:
        raise ValueError(f"op {op.name!r} registered twice")
    if (op.compute is None) == (op.decompose is None):
        raise ValueError(f"op {op.name!r} needs exactly one of compute or decompose")
    if len({r.target_kind for r in op.needs_rules}) < len(op.needs_rules):
        raise ValueError(f"op {op.name!r} needs two schedule rules for one target kind: one would schedule it")
    OPS[op.name] = op
    return op


_A = TypeVar("_A", bound=Attrs)


def layout_variant(cls: type[_A], semantic: Attrs, **layout: Any) -> _A:
    """The attrs of a layout variant op (`cls`: the semantic op's Attrs class with layout fields added): the semantic
    op's attrs with the layout's fields."""
    return cls(**{f.name: getattr(semantic, f.name) for f in dataclasses.fields(semantic)}, **layout)


def register_semantic(variant: OpDef, name: str, attrs: type[Attrs], plain: Callable[[Any], Attrs], doc: str) -> OpDef:
    """Register the semantic op of a layout variant (conv2d of conv2d_packed, as TVM's conv2d of conv2d_NCHWc): the
    variant's functions over its attrs in the plain layout (`plain` makes them from the semantic op's), so the two
    compute alike while the semantic op's attrs hold no kernel layout."""

    def over(fn: Any) -> Any:
        return None if fn is None else lambda values, a, *rest: fn(values, plain(a), *rest)

    return register(dataclasses.replace(variant, name=name, attrs=attrs, doc=doc, infer=over(variant.infer),
                                        compute=over(variant.compute), reference=over(variant.reference),
                                        flops=over(variant.flops)))


def op_flops(op: OpDef, inputs: Sequence[TensorType], attrs: Attrs, outputs: Sequence[TensorType]) -> int:
    """The arithmetic of one application of an op (an elementwise op or a reduction: one per element)."""
    if op.flops is not None:
        return op.flops(inputs, attrs, outputs)
    read = sum(t.size for i, t in enumerate(inputs) if not op.reads_gathered(i))
    return max(read, sum(t.size for t in outputs))


def get_op(name: str, node: str = "") -> OpDef:
    """Look an op up; unknown names raise with the node that used them."""
    try:
        return OPS[name]
    except KeyError:
        where = f" (node {node!r})" if node else ""
        raise NotImplementedError(f"unknown op {name!r}{where}") from None


def check_dtypes(op: OpDef, types: Sequence[TensorType]) -> None:
    """Raise a clear error when an input dtype is outside the op's dtype classes."""
    for t in types:
        if not dtype_class(t.dtype) & op.dtypes:
            raise TypeError(f"{op.name}: dtype {t.dtype} not supported (shapes {[tuple(x.shape) for x in types]})")


def infer(op: OpDef, types: Sequence[TensorType], attrs: Attrs) -> tuple[TensorType, ...]:
    """Validated shape/dtype inference for one op application."""
    if op.num_inputs is not None and len(types) != op.num_inputs:
        raise ValueError(f"{op.name}: expects {op.num_inputs} inputs, got {len(types)}")
    check_dtypes(op, types)
    try:
        return tuple(op.infer(types, attrs))
    except ShapeTooLarge as e:
        shapes = ", ".join(str(t.shape) for t in types)
        raise ShapeTooLarge(f"{op.name}: output {e} (input shapes {shapes}, attributes {attrs})") from None
