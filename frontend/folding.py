"""A NetBuilder that folds ops on constants as it goes, so ONNX shape subgraphs become constants."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cinn.frontend.net_builder import NetBuilder
from cinn.ir import Attrs, Value
from cinn.ops import get_op, infer
from cinn.passes.fold_constants import MAX_FOLDED_BYTES


class FoldingBuilder(NetBuilder):
    """Ops whose inputs are all constants are evaluated with the op table's numpy reference.

    ONNX computes shapes at run time (Shape -> Gather -> Concat -> Reshape); with static input shapes
    those subgraphs are constant, and converters need their values (a Reshape's target shape) to
    choose attributes, so they are folded here instead of by the later fold_constants pass.
    """

    def op(self, name: str, inputs: Sequence[Value], attrs: Attrs | None = None) -> tuple[Value, ...]:
        arrays = [self.constant_of(v) for v in inputs]
        opdef = get_op(name)
        attrs = attrs if attrs is not None else opdef.attrs()
        if any(a is None for a in arrays):
            return super().op(name, inputs, attrs)
        types = infer(opdef, [v.type for v in inputs], attrs)
        if sum(t.nbytes for t in types) > MAX_FOLDED_BYTES:
            return super().op(name, inputs, attrs)
        results = opdef.reference(arrays, attrs)
        return tuple(
            self.create_constant(np.asarray(r).astype(t.dtype).reshape(t.shape), self._fresh(name), t.dtype)
            for r, t in zip(results, types, strict=True)
        )

    def constant_of(self, v: Value | None) -> np.ndarray | None:
        """The data of a constant value (None for anything computed at run time)."""
        return None if v is None else self._constants.get(v.name)

    def is_input(self, v: Value) -> bool:
        """True for a graph input (fed at run time)."""
        return v in self._inputs
