"""A NetBuilder that folds ops on constants as it goes, so importers see shape subgraphs as constants."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cinn.compiler.passes.fold_constants import fold
from cinn.core.builder import NetBuilder
from cinn.core.ir import Attrs, Value
from cinn.core.ops import get_op, infer


class FoldingBuilder(NetBuilder):
    """Ops whose inputs are all constants are evaluated with the op table's numpy reference.

    ONNX and Paddle compute shapes at run time (Shape -> Gather -> Concat -> Reshape); with static input shapes
    those subgraphs are constant, and converters need their values (a Reshape's target shape) to choose
    attributes, so they are folded here, even where the result outgrows its inputs, instead of by the later
    fold_constants pass.
    """

    def op(self, name: str, inputs: Sequence[Value], attrs: Attrs | None = None) -> tuple[Value, ...]:
        opdef = get_op(name)
        attrs = attrs if attrs is not None else opdef.attrs()
        arrays = [self.constant_of(v) for v in inputs]
        results = None
        if all(a is not None for a in arrays):
            for v in inputs:
                self._check_owned(v, f"{name}: input")
            results = fold(opdef, arrays, attrs, infer(opdef, [v.type for v in inputs], attrs), grow=True)
        if results is None:
            return super().op(name, inputs, attrs)
        return tuple(self._add_constant(r, self._names.fresh(name)) for r in results)

    def full(self, shape: Sequence[int], value: np.ndarray) -> Value:
        """A tensor of one value (a 0-d array, of the tensor's dtype): its size is checked before anything is
        allocated, and it is a constant only where it folds (MAX_FOLDED_BYTES), else broadcast at run time."""
        scalar = self.create_constant(value, dtype=str(value.dtype))  # float64 stays float64
        return self.broadcast_to(scalar, out_shape=list(shape)) if len(shape) else scalar

    def constant_of(self, v: Value | None) -> np.ndarray | None:
        """The data of a constant value (None for anything computed at run time); a zero-size value is known whatever
        computes it, having no data (an empty input folds like a constant)."""
        if v is not None and v.type.size == 0:
            return np.zeros(v.shape, v.dtype)
        return None if v is None else self._constants.get(v.name)

    def distinct(self, outputs: Sequence[Value]) -> list[Value]:
        """The outputs, each its own buffer: graph inputs and repeated outputs become copies."""
        seen: set[str] = set()
        result = []
        for out in outputs:
            v = self.identity(out) if out.name in seen or self.is_input(out) else out
            seen.add(v.name)
            result.append(v)
        return result

    def is_input(self, v: Value) -> bool:
        """True for a graph input (fed at run time)."""
        return v in self._inputs
