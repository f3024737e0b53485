"""Symbolic input dims: a program over named sizes (``batch``, ``seq``), made static for each binding of them.

A SymbolicProgram holds its inputs' dims (ints and symbol names) and a shape function: input shapes -> the static
Program of those shapes (an importer run again, or a NetBuilder program re-inferred). cinn.compile builds the
bindings named ahead of time and the runtime picks one by the fed shapes.

Sizes known only at run time (NonZero's count) are symbols too: a StagedProgram runs a static head, then host ops
(cinn.core.host_ops) on its outputs, whose sizes bind the symbols of its tail, a SymbolicProgram.
"""
from __future__ import annotations

import itertools
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from cinn.core.host_ops import HostOp
from cinn.core.ir import Node, Program, TensorType, Value
from cinn.core.ops import get_op, infer

Dim = int | str
# sizes a builder's symbolic dims take while the program is written: distinct primes, unlikely to equal a model's own
# sizes by chance, small enough that no tensor passes the element limit
PROBES = (17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73, 79)


class ShapeBindingError(ValueError):
    """Fed shapes that do not fit a symbolic program's inputs."""


def symbol_name(text: str) -> str:
    """A model's name for a dim (an ONNX dim_param, an input's name) as a symbol: an identifier ("seq+1" -> "seq_1")."""
    name = re.sub(r"\W", "_", text)
    return name if name.isidentifier() else f"d_{name}"


def symbolic_dims(dims: object, what: str) -> tuple[Dim, ...]:
    """A shape whose dims are ints or symbol names (identifiers); anything else raises naming `what`."""
    if isinstance(dims, (str, bytes)) or not hasattr(dims, "__iter__"):
        raise TypeError(f"{what}: shape must be a sequence of ints and symbol names, got {dims!r}")
    out: list[Dim] = []
    for d in tuple(dims):
        if isinstance(d, str) and d.isidentifier():
            out.append(d)
        elif isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0:
            out.append(int(d))
        else:
            raise TypeError(f"{what}: dim {d!r} of {tuple(dims)!r} is neither a size nor a symbol name")
    return tuple(out)


@dataclass(frozen=True)
class SymbolicInput:
    """A graph input whose dims may be symbols; `by_value`: a shape, axes or pads argument read at run time, so the
    program is specialized to each value fed (a small integer tensor)."""

    name: str
    dtype: str
    dims: tuple[Dim, ...]
    by_value: bool = False

    def shape_at(self, binding: Binding) -> tuple[int, ...]:
        """The static shape at a binding of the symbols."""
        return tuple(binding[d] if isinstance(d, str) else d for d in self.dims)

    def __str__(self) -> str:
        return f"%{self.name}:{self.dtype}[{', '.join(map(str, self.dims))}]" + (" (by value)" if self.by_value else "")


@dataclass(frozen=True)
class Binding:
    """Sizes of a program's symbols and the values of its by-value inputs (hashable: executables are kept per
    binding)."""

    sizes: tuple[tuple[str, int], ...]
    values: tuple[tuple[str, tuple[float, ...]], ...] = ()  # by-value input -> its elements (ints stay ints), flattened

    def __getitem__(self, symbol: str) -> int:
        return dict(self.sizes)[symbol]

    @property
    def has_zero(self) -> bool:
        """Whether a symbol is 0: the program then holds zero-size tensors, which its static compile folds away."""
        return any(n == 0 for _, n in self.sizes)

    def __str__(self) -> str:
        return ", ".join([f"{s}={n}" for s, n in self.sizes] + [f"{k}={list(v)}" for k, v in self.values])


@dataclass(frozen=True, eq=False)
class SymbolicProgram:
    """A program whose input dims include symbols; specialize() gives the static Program of a binding."""

    name: str
    inputs: tuple[SymbolicInput, ...]
    # input shapes and the by-value inputs' arrays -> the static program (staged where a size is known only at
    # run time)
    shape_function: Callable[[Mapping[str, tuple[int, ...]], Mapping[str, np.ndarray]], Program | StagedProgram]

    @property
    def symbols(self) -> tuple[str, ...]:
        """The symbol names in order of first use."""
        return tuple(dict.fromkeys(d for i in self.inputs for d in i.dims if isinstance(d, str)))

    def binding(self, sizes: Mapping[str, int]) -> Binding:
        """A binding from symbol sizes; every symbol must be given, each an int >= 0 (0: zero-size tensors, a cache
        of past length 0)."""
        missing = [s for s in self.symbols if s not in sizes]
        unknown = sorted(set(sizes) - set(self.symbols))
        if missing or unknown:
            raise ShapeBindingError(f"{self.name}: symbols are {list(self.symbols)}; "
                                    + (f"missing {missing}" if missing else f"unknown {unknown}"))
        for s in self.symbols:
            size = sizes[s]
            if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 0:
                raise ShapeBindingError(f"{self.name}: symbol {s} = {size!r} must be a non-negative int")
        return Binding(tuple((s, int(sizes[s])) for s in self.symbols))

    def bind(self, shapes: Mapping[str, Sequence[int]], values: Mapping[str, np.ndarray] | None = None) -> Binding:
        """The binding that fed shapes (and the by-value inputs' arrays) give; a shape that breaks a fixed dim or a
        symbol's other use raises."""
        sizes: dict[str, tuple[int, str]] = {}  # symbol -> (size, where it was read)
        for inp in self.inputs:
            if inp.name not in shapes:
                raise ShapeBindingError(f"{self.name}: missing input {inp.name!r}")
            shape = tuple(shapes[inp.name])
            if len(shape) != len(inp.dims):
                raise ShapeBindingError(f"input {inp.name!r}: shape {shape} has rank {len(shape)}, the program's "
                                        f"input {inp} has rank {len(inp.dims)}")
            for k, (d, n) in enumerate(zip(inp.dims, shape, strict=True)):
                where = f"input {inp.name!r} dim {k}"
                if isinstance(d, int) and n != d:
                    raise ShapeBindingError(f"{where} is {n}, the program's input {inp} fixes it to {d}")
                if isinstance(d, str):
                    seen, at = sizes.setdefault(d, (n, where))
                    if seen != n:
                        raise ShapeBindingError(f"{where} is {d} = {n}, but {at} gave {d} = {seen}")
        binding = self.binding({s: n for s, (n, _) in sizes.items()})
        return Binding(binding.sizes, self._values(values or {}))

    def _values(self, values: Mapping[str, np.ndarray]) -> tuple[tuple[str, tuple[float, ...]], ...]:
        missing = [i.name for i in self.inputs if i.by_value and i.name not in values]
        if missing:
            raise ShapeBindingError(f"{self.name}: missing the values of by-value inputs {missing}")
        return tuple((i.name, tuple(np.asarray(values[i.name], i.dtype).reshape(-1).tolist()))
                     for i in self.inputs if i.by_value)

    def specialize(self, binding: Binding) -> Program | StagedProgram:
        """The static Program at a binding (a StagedProgram where an op's output size is known only at run time); a
        model that cannot take those sizes raises naming them."""
        shapes = {i.name: i.shape_at(binding) for i in self.inputs}
        by_name = {i.name: i for i in self.inputs}
        values = {k: np.array(v, by_name[k].dtype).reshape(shapes[k]) for k, v in binding.values}
        try:
            return self.shape_function(shapes, values)
        except (ValueError, TypeError, NotImplementedError) as e:
            if not binding.sizes and not binding.values:  # a static program: the error says all there is
                raise
            raise type(e)(f"{self.name} at {binding}: {e}", *e.args[1:]) from None

    def static_or_probed(self) -> Program | StagedProgram | SymbolicProgram:
        """An importer's result: the static Program when there are no symbols, else this program once its shape
        function has run at the probe sizes (so that a model's errors show at import, not at its first run)."""
        if any(i.by_value for i in self.inputs):
            return self  # no values to try it with
        if not self.symbols:
            return self.specialize(Binding(()))
        self.specialize(self.probe())
        return self

    def probe(self) -> Binding:
        """A binding of distinct sizes (see PROBES) to try the shape function with."""
        if len(self.symbols) > len(PROBES):
            raise ValueError(f"{self.name}: at most {len(PROBES)} symbols, got {len(self.symbols)}")
        return Binding(tuple(zip(self.symbols, PROBES, strict=False)))

    def __str__(self) -> str:
        return f"symbolic program {self.name}({', '.join(map(str, self.inputs))})"


@dataclass(frozen=True, eq=False)
class StagedProgram:
    """A static program cut after the ops whose output size is known only at run time.

    The head runs first; its outputs are known by the names `links` (model value names). The host ops then run on
    the host over those, and the tail, a SymbolicProgram over the links and the host ops' outputs (whose run-time
    sizes are its symbols), computes the program's outputs: each run binds the tail to the sizes the host ops gave.
    A tail may be staged again at a binding (NonMaxSuppression over boxes that NonZero selected).
    """

    name: str
    head: Program
    links: tuple[str, ...]  # the head's outputs, in order, as the host ops and the tail name them
    host_ops: tuple[HostOp, ...]
    tail: SymbolicProgram

    @property
    def inputs(self) -> tuple[Value, ...]:
        """The graph inputs: the head's."""
        return self.head.inputs

    def host_op_names(self, shown: int = 3) -> str:
        """The host ops' names for messages: the first `shown`, then how many more."""
        names = [op.name or op.kind.value for op in self.host_ops]
        more = f" and {len(names) - shown} more" if len(names) > shown else ""
        return ", ".join(names[:shown]) + more

    def __str__(self) -> str:
        kinds = Counter(op.kind.value for op in self.host_ops)
        ops = ", ".join(f"{n} {kind}" for kind, n in kinds.items())
        return (f"staged program {self.name}: head of {len(self.head.nodes)} nodes; on the host: {ops}; then a tail "
                f"over {len(self.tail.inputs)} inputs, symbolic in {len(self.tail.symbols)} run-time sizes")


def bindings_of(program: SymbolicProgram, hints: Mapping[str, Iterable[int]]) -> list[Binding]:
    """Every combination of the hinted sizes (each symbol needs at least one)."""
    by_value = [i.name for i in program.inputs if i.by_value]
    if by_value:
        raise ShapeBindingError(f"{program.name}: inputs {by_value} are read by value: their executables are built "
                                "at run time, for each value fed (shape hints cannot name them)")
    unknown = sorted(set(hints) - set(program.symbols))
    if unknown:
        raise ShapeBindingError(f"{program.name}: symbols are {list(program.symbols)}; unknown {unknown}")
    sizes = [list(dict.fromkeys(hints.get(s, ()))) for s in program.symbols]  # each hint read once: any iterable
    missing = [s for s, n in zip(program.symbols, sizes, strict=True) if not n]
    if missing:
        raise ShapeBindingError(f"{program.name}: shape hints name no sizes for symbols {missing}")
    return [program.binding(dict(zip(program.symbols, combo, strict=True))) for combo in itertools.product(*sizes)]


def reinfer(program: Program, shapes: Mapping[str, tuple[int, ...]]) -> Program:
    """The program with new input shapes: each node's outputs inferred again, in order, from the same attributes."""
    types = {v.name: v.type for v in program.const_values}
    types |= {v.name: TensorType(shapes[v.name], v.dtype) for v in program.inputs}

    def typed(v: Value) -> Value:
        return Value(v.name, types[v.name])

    nodes = []
    for n in program.nodes:
        inputs = tuple(map(typed, n.inputs))
        try:
            out_types = infer(get_op(n.op, n.name), [v.type for v in inputs], n.attrs)
        except (ValueError, TypeError) as e:
            raise type(e)(f"node {n.name} ({n.op}): {e}") from None
        types |= {v.name: t for v, t in zip(n.outputs, out_types, strict=True)}
        nodes.append(Node(n.op, inputs, tuple(map(typed, n.outputs)), n.attrs, n.name))
    return program.replace(inputs=tuple(map(typed, program.inputs)), nodes=tuple(nodes),
                           outputs=tuple(map(typed, program.outputs)))


def require_static(program: Program | StagedProgram | SymbolicProgram, how: str) -> Program:
    """The program itself when its shapes are static; a symbolic one raises naming its symbolic inputs and `how`, a
    staged one naming its host ops."""
    if isinstance(program, Program):
        return program
    if isinstance(program, StagedProgram):
        raise ShapeBindingError(f"{program.name}: the output sizes of {program.host_op_names()} are known only at "
                                "run time: the program runs in stages (cinn.compile gives a StagedExecutable)")
    inputs = ", ".join(str(i) for i in program.inputs if any(isinstance(d, str) for d in i.dims))
    raise ShapeBindingError(f"{program.name}: inputs {inputs} have symbolic dims; {how}")
