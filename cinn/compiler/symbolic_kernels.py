"""Symbolic kernels: a symbolic program's kernels built once, with its symbols as TIR variables, for every size.

The program is optimized and fused at three probe bindings of its symbols (two odd, one even). Where the three agree (the same nodes,
attributes, constants and kernels; every dim an affine function of one product of symbols, ``batch * seq``,
``seq + 1``), each kernel is lowered once with its dims as expressions of the symbols, which it takes as trailing int
parameters. A binding is then served by these kernels: only the buffers are planned for its sizes, nothing is built.
"""
from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from math import prod
from types import MappingProxyType
from typing import Any, TypeAlias

import numpy as np
import tvm
from tvm import tirx

from cinn.compiler.lower import LoweredGroup, lower_group, lower_program
from cinn.compiler.passes.fusion import Group
from cinn.compiler.passes.manager import PassName
from cinn.compiler.passes.pipeline import winograd_shapes
from cinn.core.cpu_model import lowering_for
from cinn.core.ir import Program, TensorType, Value
from cinn.core.ops import get_op
from cinn.core.ops.te_util import dim_at
from cinn.core.symbolic import PROBES, Binding, SymbolicProgram
from cinn.core.target import Target
from schedules.analysis import NOMINAL_SIZES

PROBE_COUNT = 2  # odd bindings the program is optimized at, which fit each dim; an even one checks the fit (a dim
# that depends on its size's parity, as (seq + 1) // 2 * 2, fits odd sizes alone)
MAX_POWER = 2  # of one symbol in a dim (seq * seq: an attention's scores)
NOMINAL_SIZE = 64  # of a symbol no shape hint names: the size its kernels' schedules are chosen for
Dim: TypeAlias = int | tvm.ir.expr.Expr


class NotSymbolic(ValueError):
    """A program whose kernels cannot be built for every size at once (the message says why)."""


@dataclass(frozen=True)
class SymbolicPlan:
    """The optimized program at the first probe, every value's dims as expressions of the symbols, and one
    symbolic kernel per fused group."""

    program: Program
    symbols: tuple[tirx.Var, ...]
    dims: Mapping[str, tuple[Dim, ...]]
    lowered: tuple[LoweredGroup, ...]
    # a kernel whose matmul has symbolic rows: those rows, and its variant in rows of one, unpadded (None: no such)
    rows: tuple[Dim | None, ...]
    unpadded: tuple[LoweredGroup | None, ...]
    tile_rows: int  # rows of a symbolic matmul's whole tiles (CpuModel.padded_rows)

    def program_at(self, binding: Binding) -> Program:
        """The optimized program with every value typed at a binding of the symbols."""
        sizes = dict(binding.sizes)
        types = {v.name: TensorType(tuple(dim_at(d, sizes) for d in self.dims[v.name]), v.dtype)
                 for v in _values(self.program)}

        def typed(v: Value) -> Value:
            return Value(v.name, types[v.name]) if v.name in types else v

        nodes = tuple(dataclasses.replace(n, inputs=tuple(map(typed, n.inputs)), outputs=tuple(map(typed, n.outputs)))
                      for n in self.program.nodes)
        return self.program.replace(inputs=tuple(map(typed, self.program.inputs)), nodes=nodes,
                                    outputs=tuple(map(typed, self.program.outputs)))

    def kernels_at(self, program: Program) -> list[tuple[Group, tuple[Value, ...]]]:
        """Each kernel's group and parameters as nodes and values of `program` (program_at's), for its flops and
        its buffers."""
        node_at = {id(n): m for n, m in zip(self.program.nodes, program.nodes, strict=True)}
        values = {v.name: v for v in [*program.inputs, *program.const_values]}
        values |= {v.name: v for n in program.nodes for v in n.outputs}

        def typed(vs: Sequence[Value]) -> tuple[Value, ...]:
            return tuple(values[v.name] for v in vs)

        return [(Group(tuple(node_at[id(n)] for n in lg.group.nodes), typed(lg.group.inputs), typed(lg.group.outputs),
                       lg.group.kind), typed(lg.params)) for lg in self.lowered]

    def unpadded_at(self, binding: Binding) -> list[bool]:
        """Per kernel: whether it takes its unpadded variant (rows of one) at a binding: where its matmul has at
        most half a tile (tile_rows) of rows, a padded tile would compute 2 to 8 times the rows there are (see
        docs/notes/matmul-blocking.md)."""
        return [r is not None and 2 * dim_at(r, dict(binding.sizes)) <= self.tile_rows for r in self.rows]

    def sizes(self, binding: Binding) -> tuple[int, ...]:
        """The kernels' trailing int arguments: the symbols' sizes."""
        return tuple(binding[s.name] for s in self.symbols)


def plan(program: SymbolicProgram, target: Target, fuse: bool = True, passes: bool = True,
         nominal: Mapping[str, int] = MappingProxyType({}), disabled: frozenset[PassName] = frozenset()
         ) -> SymbolicPlan:
    """The symbolic kernels of a program (CPU targets), without the `disabled` passes; raises NotSymbolic naming what
    stops them."""
    if target.is_cuda:
        raise NotSymbolic("symbolic kernels are built for CPU targets")
    probes = _probes(program)
    optimized = [_optimized(_static(program, p), target, fuse, passes, disabled) for p in probes]
    first, groups = optimized[0]
    for other, other_groups in optimized[1:]:
        _check_same(first, groups, other, other_groups)
    symbols, dims = _fitted([p for p, _ in optimized], program.symbols, probes)
    sizes = {n: int(nominal.get(n, NOMINAL_SIZE)) for n in program.symbols}
    rows = tuple(_matmul_rows(lg.group, dims) for lg in groups)
    tile_rows = target.model.padded_rows
    with lowering_for(target.cpu):  # the ops size their tiles by the target's CPU
        lowered = tuple(_lowered(lg.group, first, dims, symbols, sizes, tile_rows) for lg in groups)
        unpadded = tuple(None if r is None else _lowered(lg.group, first, dims, symbols, sizes, 1)
                         for lg, r in zip(groups, rows, strict=True))
    return SymbolicPlan(first, symbols, MappingProxyType(dims), lowered, rows, unpadded, tile_rows)


def symbolic_shapes(program: SymbolicProgram) -> dict[str, tuple[Dim, ...]]:
    """Every value's dims as written (before the passes), as expressions of the program's symbols (tirx.Vars named
    after them); raises NotSymbolic where a dim is no product of symbols (a ceil-mode pool of a symbolic height)."""
    probes = _probes(program)
    return _fitted([_static(program, p) for p in probes], program.symbols, probes)[1]


def _probes(program: SymbolicProgram) -> list[Binding]:
    """Two odd bindings of the symbols and an even one (twice the first)."""
    by_value = [i.name for i in program.inputs if i.by_value]
    if by_value:
        raise NotSymbolic(f"inputs {by_value} are read by value")
    names = program.symbols
    if len(names) * PROBE_COUNT > len(PROBES):
        raise NotSymbolic(f"{len(names)} symbols: at most {len(PROBES) // PROBE_COUNT}")
    sizes = [tuple(PROBES[k * len(names) + i] for i in range(len(names))) for k in range(PROBE_COUNT)]
    sizes.append(tuple(2 * p for p in sizes[0]))
    return [Binding(tuple(zip(names, s, strict=True))) for s in sizes]


def _static(program: SymbolicProgram, binding: Binding) -> Program:
    """The program at a probe binding, which must be one static program (not staged)."""
    static = program.specialize(binding)
    if not isinstance(static, Program):
        raise NotSymbolic(f"it runs in stages: the output sizes of {static.host_op_names()} are known only at run "
                          "time")
    return static


def _fitted(programs: Sequence[Program], names: Sequence[str], probes: Sequence[Binding]
            ) -> tuple[tuple[tirx.Var, ...], dict[str, tuple[Dim, ...]]]:
    """The symbols and every value's dims, fitted over the same program at each probe."""
    symbols = tuple(tirx.Var(n, "int32") for n in names)
    fit = _Fitter(symbols, [tuple(p[n] for n in names) for p in probes])
    dims: dict[str, tuple[Dim, ...]] = {}
    for values in zip(*map(_values, programs), strict=True):
        dims[values[0].name] = tuple(fit(values[0].name, [v.shape[d] for v in values])
                                     for d in range(len(values[0].shape)))
    return symbols, dims


def _optimized(static: Program, target: Target, fuse: bool, passes: bool, disabled: frozenset[PassName]
               ) -> tuple[Program, list[LoweredGroup]]:
    """A probe's optimized program and kernels. Its 3x3 convs stay direct: a Winograd conv's matmul vectorizes over
    the tiles of every image, whose count a symbolic batch makes symbolic (no vector loop of symbolic extent)."""
    direct = {shape.key: 0 for shape in winograd_shapes(static, target, disabled)} if passes else {}
    return lower_program(static, fuse, passes, False, target, direct, disabled)


def _lowered(group: Group, program: Program, dims: Mapping[str, tuple[Dim, ...]], symbols: Sequence[tirx.Var],
             nominal: Mapping[str, int], tile_rows: int) -> LoweredGroup:
    """A group's symbolic kernel, its schedule chosen at the nominal sizes (see schedules.analysis.size)."""
    try:
        lg = lower_group(group, program.constants, dims, symbols, tile_rows)
    except (TypeError, ValueError) as e:  # a compute that needs a static size
        raise NotSymbolic(f"kernel {group.name}: {e}") from None
    func: Any = lg.func
    return LoweredGroup(func.with_attr(NOMINAL_SIZES, dict(nominal)), lg.params, lg.group)


def _matmul_rows(group: Group, dims: Mapping[str, tuple[Dim, ...]]) -> Dim | None:
    """The symbolic rows of the group's matmul (None: it has none, or they are static)."""
    for node in group.nodes:
        row_panels = node.op == "matmul_packed" and node.attrs.x_panel  # whole panels of rows: never padded
        if node.op in ("matmul", "matmul_packed") and not row_panels and len(dims[node.inputs[0].name]) > 1:
            x = dims[node.inputs[0].name]
            row = x[-1] if node.attrs.trans_x else x[-2]
            if not isinstance(row, int):
                return row
    return None


def _values(program: Program) -> list[Value]:
    return [*program.inputs, *(v for n in program.nodes for v in n.outputs)]


def _check_same(a: Program, a_groups: Sequence[LoweredGroup], b: Program, b_groups: Sequence[LoweredGroup]) -> None:
    """The programs at two probes must differ in their sizes alone."""
    for x, y in itertools.zip_longest(a.nodes, b.nodes):
        if x is None or y is None or (x.op, x.name) != (y.op, y.name) or \
                (x.attrs != y.attrs and not get_op(x.op).shape_attrs) or \
                [v.name for v in (*x.inputs, *x.outputs)] != [v.name for v in (*y.inputs, *y.outputs)]:
            node = x or y
            raise NotSymbolic(f"node {node.name} ({node.op}) is optimized differently at different sizes")
    if [lg.group.name for lg in a_groups] != [lg.group.name for lg in b_groups] or \
            [[v.name for v in lg.params] for lg in a_groups] != [[v.name for v in lg.params] for lg in b_groups]:
        raise NotSymbolic("the kernels differ at different sizes")
    for name, array in a.constants.items():
        other = b.constants.get(name)
        if other is None or other.shape != array.shape or not np.array_equal(other, array, equal_nan=True):
            raise NotSymbolic(f"constant {name} depends on the sizes")


class _Fitter:
    """Fits a dim's sizes at the probes as c * m + a, m a product of symbols (each to at most MAX_POWER)."""

    def __init__(self, symbols: Sequence[tirx.Var], probes: Sequence[tuple[int, ...]]):
        self.symbols = symbols
        self.probes = probes
        powers = itertools.product(range(MAX_POWER + 1), repeat=len(symbols))
        self.monomials = sorted((p for p in powers if any(p)), key=sum)
        self.cache: dict[tuple, Dim] = {}  # one expression object per dim: computes compare dims by identity

    def __call__(self, name: str, sizes: Sequence[int]) -> Dim:
        if len(set(sizes)) == 1:
            return sizes[0]
        for powers in self.monomials:
            m = [prod(p**e for p, e in zip(probe, powers, strict=True)) for probe in self.probes]
            c = Fraction(sizes[0] - sizes[1], m[0] - m[1])
            a = sizes[0] - c * m[0]
            if c.denominator == 1 and a.denominator == 1 and all(c * mk + a == s for mk, s in zip(m, sizes, strict=True)):
                return self._expression(powers, int(c), int(a))
        raise NotSymbolic(f"value {name}: sizes {list(sizes)} at the probes are no product of symbols")

    def _expression(self, powers: tuple[int, ...], c: int, a: int) -> Dim:
        key = (powers, c, a)
        if key not in self.cache:
            expr: tvm.ir.expr.Expr = tirx.const(c, "int32")
            terms = [s for s, e in zip(self.symbols, powers, strict=True) for _ in range(e)]
            expr = terms[0] if c == 1 else expr * terms[0]
            for s in terms[1:]:
                expr = expr * s
            self.cache[key] = expr + a if a else expr
        return self.cache[key]
