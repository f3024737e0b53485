"""Elementwise (unary and broadcasting binary) ops."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cinn.ir import Attrs
from cinn.ops.common import register_elementwise
from cinn.ops.registry import DtypeClass as D


def _tir():
    import tvm

    return tvm.tirx


@dataclass(frozen=True)
class ScaleAttrs(Attrs):
    """scale(x) = x * scale + bias (bias_after_scale) or (x + bias) * scale."""

    scale: float = 1.0
    bias: float = 0.0
    bias_after_scale: bool = True


def _scale_te(x, a: ScaleAttrs):
    s, b = _c(a.scale, x), _c(a.bias, x)
    return x * s + b if a.bias_after_scale else (x + b) * s


def _scale_np(x, a: ScaleAttrs):
    s, b = np.asarray(a.scale, x.dtype), np.asarray(a.bias, x.dtype)
    return x * s + b if a.bias_after_scale else (x + b) * s


def _c(value, like):
    """A constant with the dtype of an expression."""
    from cinn.ops.te_util import dtype_of

    return _tir().const(value, dtype_of(like))


register_elementwise("relu", lambda x: _tir().max(x, _c(0, x)), lambda x: np.maximum(x, 0), dtypes=D.NUMBER)
register_elementwise("exp", lambda x: _tir().exp(x), np.exp)
register_elementwise("sqrt", lambda x: _tir().sqrt(x), np.sqrt)
register_elementwise("scale", _scale_te, _scale_np, attrs=ScaleAttrs, dtypes=D.NUMBER)
register_elementwise("add", lambda x, y: x + y, np.add, arity=2, dtypes=D.NUMBER)
register_elementwise("subtract", lambda x, y: x - y, np.subtract, arity=2, dtypes=D.NUMBER)
register_elementwise("multiply", lambda x, y: x * y, np.multiply, arity=2, dtypes=D.NUMBER)
register_elementwise("max", lambda x, y: _tir().max(x, y), np.maximum, arity=2, dtypes=D.NUMBER)
