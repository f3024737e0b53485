"""Shape (injective) ops: each output element is one input element picked by an index map."""
from __future__ import annotations

import enum
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tvm
from tvm import te, tirx, topi

from cinn.core.ir import DTYPES, Attrs, TensorType
from cinn.core.ops.common import normalize_axes, normalize_axis, same_dtype
from cinn.core.ops.registry import OpDef, PatternKind, register
from cinn.core.ops.te_util import cast, const, dims

Shape = tuple[int, ...]
IndexMap = Callable[[Sequence], Sequence]  # output index exprs -> input index exprs


# -- TE helpers -------------------------------------------------------------------------------
def _map_compute(name: str, x: te.Tensor, out_shape: Shape, in_index: IndexMap) -> te.Tensor:
    """A new tensor whose element at idx is x[in_index(idx)] (a fresh compute even for a pure view)."""
    def body(*idx):
        # simplify under the loop bounds so the kernel (and the tuner's features) see plain indices
        analyzer = tvm.sym.Analyzer()
        for var, extent in zip(idx, out_shape, strict=True):
            analyzer.bind(var, tvm.ir.Range(0, extent))
        return x(*(analyzer.simplify(e) for e in in_index(idx)))

    return te.compute(out_shape, body, name=name, tag="injective")



def _ravel(idx: Sequence, shape: Shape):
    """Row-major linear offset of an index."""
    linear = 0
    for i, d in zip(idx, shape, strict=True):
        linear = linear * d + i
    return linear


def _unravel(linear, shape: Shape) -> list:
    """Row-major index of a linear offset."""
    out = []
    for d in reversed(shape):
        out.append(linear % d)
        linear = linear // d
    return out[::-1]


def _reshape_reference(out_shape: Callable[[Shape, Any], Shape]):
    """Reference of an op that only changes the shape: numpy's reshape to `out_shape(x.shape, attrs)`."""
    return lambda xs, a: [xs[0].reshape(out_shape(xs[0].shape, a))]


def _reshape_compute(name: str):
    """Compute of an op that reinterprets x's elements in row-major order with the output shape."""

    def compute(tensors, _attrs, out_types):
        (x,) = tensors
        in_shape = dims(x)
        out_shape = out_types[0].shape
        return [_map_compute(name, x, out_shape, lambda idx: _unravel(_ravel(idx, out_shape), in_shape))]

    return compute


def _scalar(value, dtype: str):
    """A TIR constant of `dtype` holding `value` converted as numpy would (0.5 -> 0 for ints)."""
    return const(np.asarray(value).astype(dtype).item(), dtype)


# -- shared inference helpers ------------------------------------------------------------------
def _fmt(*shapes: Shape) -> str:
    return " and ".join(str(tuple(s)) for s in shapes)


def _register(name: str, attrs: type[Attrs], out_shape: Callable[[Shape, Any], Shape], reference, compute, doc: str,
              kind: PatternKind = PatternKind.INJECTIVE, shape_attrs: bool = False) -> OpDef:
    """Register a one-input op whose output has x's dtype and the shape `out_shape(x.shape, attrs)`."""

    def infer(types: Sequence[TensorType], a: Any) -> list[TensorType]:
        return [TensorType(out_shape(types[0].shape, a), types[0].dtype)]

    return register(OpDef(name=name, kind=kind, infer=infer, reference=reference, compute=compute, attrs=attrs,
                          doc=doc, shape_attrs=shape_attrs))


# -- reshape / flatten ---------------------------------------------------------------------------
@dataclass(frozen=True)
class ReshapeAttrs(Attrs):
    """Target shape; a 0 keeps the input's dim at that position, one dim may be -1 (inferred from the element count)."""

    shape: tuple[int, ...]


def _reshape_shape(shape: Shape, a: ReshapeAttrs) -> Shape:
    size, target, op = math.prod(shape), a.shape, "reshape"
    if sum(d == -1 for d in target) > 1 or any(d < -1 for d in target):
        raise ValueError(f"{op}: invalid target shape {tuple(target)} for input {tuple(shape)} (at most one -1)")
    if any(d == 0 and k >= len(shape) for k, d in enumerate(target)):
        raise ValueError(f"{op}: target shape {tuple(target)} keeps (0) a dim that input {tuple(shape)} lacks")
    target = tuple(shape[k] if d == 0 else d for k, d in enumerate(target))
    known = math.prod(d for d in target if d != -1)
    if -1 in target:
        if known == 0 or size % known:
            raise ValueError(f"{op}: cannot reshape {tuple(shape)} ({size} elements) to {tuple(target)}")
        target = tuple(size // known if d == -1 else d for d in target)
    if math.prod(target) != size:
        raise ValueError(f"{op}: cannot reshape {tuple(shape)} ({size} elements) to {tuple(target)}")
    return tuple(target)


_register("reshape", ReshapeAttrs, _reshape_shape, _reshape_reference(_reshape_shape), _reshape_compute("reshape"),
          "Reshape x (row-major); a 0 keeps the input's dim, one dim may be -1.", shape_attrs=True)


@dataclass(frozen=True)
class FlattenAttrs(Attrs):
    """Dims start_axis..stop_axis (inclusive) are merged into one."""

    start_axis: int = 1
    stop_axis: int = -1


def _flatten_shape(shape: Shape, a: FlattenAttrs) -> Shape:
    start, stop = (normalize_axis("flatten", ax, len(shape)) for ax in (a.start_axis, a.stop_axis))
    if start > stop:
        raise ValueError(f"flatten: start_axis {a.start_axis} after stop_axis {a.stop_axis} for shape {tuple(shape)}")
    return shape[:start] + (math.prod(shape[start : stop + 1]),) + shape[stop + 1 :]


_register("flatten", FlattenAttrs, _flatten_shape, _reshape_reference(_flatten_shape), _reshape_compute("flatten"),
          "Merge dims start_axis..stop_axis into one (Paddle's flatten).")


# -- transpose -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class TransposeAttrs(Attrs):
    """Output dim i is input dim axis[i]."""

    axis: tuple[int, ...]


def _perm(shape: Shape, a: TransposeAttrs) -> tuple[int, ...]:
    perm = tuple(normalize_axis("transpose", ax, len(shape)) for ax in a.axis)
    if sorted(perm) != list(range(len(shape))):
        raise ValueError(f"transpose: axis {tuple(a.axis)} is not a permutation for shape {tuple(shape)}")
    return perm


def _transpose_compute(tensors, a, out_types):
    (x,) = tensors
    inverse = np.argsort(_perm(dims(x), a))
    return [_map_compute("transpose", x, out_types[0].shape, lambda idx: [idx[k] for k in inverse])]


_register("transpose", TransposeAttrs, lambda s, a: tuple(s[p] for p in _perm(s, a)),
          lambda xs, a: [np.transpose(xs[0], _perm(xs[0].shape, a))], _transpose_compute, "Permute dims.")


# -- slice ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SliceAttrs(Attrs):
    """Per listed axis: start, end, stride (numpy/ONNX semantics: negative indices, clamped ends)."""

    axes: tuple[int, ...]
    starts: tuple[int, ...]
    ends: tuple[int, ...]
    strides: tuple[int, ...] | None = None


def slice_ranges(shape: Shape, a: SliceAttrs) -> list[range]:
    """The input indices read along each dim of x."""
    strides = a.strides if a.strides is not None else (1,) * len(a.axes)
    if not len(a.axes) == len(a.starts) == len(a.ends) == len(strides):
        raise ValueError(f"slice: axes {a.axes}, starts {a.starts}, ends {a.ends}, strides {a.strides} differ in length"
                         f" (shape {tuple(shape)})")
    axes = [normalize_axis("slice", ax, len(shape)) for ax in a.axes]
    if len(set(axes)) != len(axes):
        raise ValueError(f"slice: repeated axes {tuple(a.axes)} for shape {tuple(shape)}")
    if 0 in strides:
        raise ValueError(f"slice: zero stride in {tuple(strides)} for shape {tuple(shape)}")
    out = [range(d) for d in shape]
    for ax, start, end, step in zip(axes, a.starts, a.ends, strides, strict=False):
        out[ax] = range(*slice(start, end, step).indices(shape[ax]))
    return out


def _slice_shape(shape: Shape, a: SliceAttrs) -> Shape:
    # an empty range gives a zero-size result (ONNX's Shape -> Slice[2:] of a 2-D tensor): passes.zero_size folds it
    return tuple(len(r) for r in slice_ranges(shape, a))


def _slice_compute(tensors, a, out_types):
    (x,) = tensors
    shape = dims(x)
    sliced = {normalize_axis("slice", ax, len(shape)) for ax in a.axes}
    # a dim not sliced is read whole, whatever its size (a symbolic kernel's batch): ranges of one element give it
    # start 0 and step 1
    ranges = slice_ranges(tuple(d if k in sliced else 1 for k, d in enumerate(shape)), a)
    return [_map_compute("slice", x, out_types[0].shape,
                         lambda idx: [r.start + i * r.step for r, i in zip(ranges, idx, strict=True)])]


_register("slice", SliceAttrs, _slice_shape, lambda xs, a: [xs[0][np.ix_(*slice_ranges(xs[0].shape, a))]], _slice_compute,
          "Strided slice of some axes (numpy semantics).")


# -- concat / split ------------------------------------------------------------------------------
@dataclass(frozen=True)
class AxisAttrs(Attrs):
    """One axis (may be negative)."""

    axis: int = 0


def _concat_infer(types: Sequence[TensorType], a: AxisAttrs) -> list[TensorType]:
    shapes = [t.shape for t in types]
    if not types:
        raise ValueError("concat: needs at least one input")
    dtype = same_dtype("concat", types)
    rank = len(shapes[0])
    if rank == 0 or any(len(s) != rank for s in shapes):
        raise ValueError(f"concat: inputs need one common rank >= 1, got shapes {_fmt(*shapes)}")
    ax = normalize_axis("concat", a.axis, rank)
    if any(s[:ax] + s[ax + 1 :] != shapes[0][:ax] + shapes[0][ax + 1 :] for s in shapes):
        raise ValueError(f"concat: shapes {_fmt(*shapes)} differ outside axis {a.axis}")
    return [TensorType(shapes[0][:ax] + (sum(s[ax] for s in shapes),) + shapes[0][ax + 1 :], dtype)]


def _concat_compute(tensors, a, out_types):
    return [topi.concatenate(list(tensors), normalize_axis("concat", a.axis, len(out_types[0].shape)))]


register(OpDef(name="concat", kind=PatternKind.INJECTIVE, infer=_concat_infer, compute=_concat_compute,
               reference=lambda xs, a: [np.concatenate(xs, axis=a.axis)], attrs=AxisAttrs, num_inputs=None,
               doc="Join tensors along an existing axis."))


@dataclass(frozen=True)
class SplitAttrs(Attrs):
    """A number of equal parts, or the section sizes (one may be -1) along axis."""

    num_or_sections: int | tuple[int, ...]
    axis: int = 0


def _sections(shape: Shape, a: SplitAttrs) -> tuple[int, tuple[int, ...]]:
    """The normalized axis and the size of every section."""
    ax = normalize_axis("split", a.axis, len(shape))
    dim, spec = shape[ax], a.num_or_sections
    if isinstance(spec, int):
        if spec <= 0 or dim % spec:
            raise ValueError(f"split: axis {a.axis} of shape {tuple(shape)} does not split into {spec} equal parts")
        return ax, (dim // spec,) * spec
    known = sum(s for s in spec if s != -1)
    if spec.count(-1) == 1:
        spec = tuple(dim - known if s == -1 else s for s in spec)
    if not spec or any(s < 0 for s in spec) or sum(spec) != dim:
        raise ValueError(f"split: sections {tuple(spec)} do not split axis {a.axis} of {tuple(shape)}")
    return ax, tuple(spec)


def _split_infer(types: Sequence[TensorType], a: SplitAttrs) -> list[TensorType]:
    shape = types[0].shape
    ax, secs = _sections(shape, a)
    return [TensorType(shape[:ax] + (s,) + shape[ax + 1 :], types[0].dtype) for s in secs]


def _split_reference(xs, a):
    ax, secs = _sections(xs[0].shape, a)
    return np.split(xs[0], np.cumsum(secs)[:-1], axis=ax)


def _split_compute(tensors, a, out_types):
    (x,) = tensors
    ax, secs = _sections(dims(x), a)
    offsets = np.cumsum((0,) + secs[:-1])

    def shifted(off: int) -> IndexMap:
        return lambda idx: [i + off if k == ax else i for k, i in enumerate(idx)]

    return [_map_compute(f"split_{n}", x, t.shape, shifted(int(off)))
            for n, (t, off) in enumerate(zip(out_types, offsets, strict=True))]


register(OpDef(name="split", kind=PatternKind.INJECTIVE, infer=_split_infer, compute=_split_compute,
               reference=_split_reference, attrs=SplitAttrs, doc="Split along an axis into several outputs."))


# -- squeeze / expand_dims -----------------------------------------------------------------------
@dataclass(frozen=True)
class AxesAttrs(Attrs):
    """A list of axes (may be negative)."""

    axes: tuple[int, ...] = ()


def _squeeze_shape(shape: Shape, a: AxesAttrs) -> Shape:
    """Drop the listed size-1 dims (listed dims of other sizes stay, as in Paddle), or all size-1 dims."""
    axes = normalize_axes("squeeze", a.axes, len(shape)) if a.axes else range(len(shape))
    return tuple(d for k, d in enumerate(shape) if not (k in axes and d == 1))


_register("squeeze", AxesAttrs, _squeeze_shape, _reshape_reference(_squeeze_shape), _reshape_compute("squeeze"),
          "Remove size-1 dims (the listed ones, or all).")


def _expand_dims_shape(shape: Shape, a: AxesAttrs) -> Shape:
    """Size-1 dims inserted at the given output positions."""
    rank = len(shape) + len(a.axes)
    new = normalize_axes("expand_dims", a.axes, rank)
    if len(new) != len(a.axes):
        raise ValueError(f"expand_dims: repeated axes {tuple(a.axes)} for shape {tuple(shape)}")
    it = iter(shape)
    return tuple(1 if k in new else next(it) for k in range(rank))


_register("expand_dims", AxesAttrs, _expand_dims_shape, _reshape_reference(_expand_dims_shape),
          _reshape_compute("expand_dims"), "Insert size-1 dims at the given output positions.")


# -- broadcast_to --------------------------------------------------------------------------------
@dataclass(frozen=True)
class BroadcastToAttrs(Attrs):
    """Output shape; broadcast_axes[i] is the output axis of input dim i (None: numpy trailing alignment)."""

    out_shape: tuple[int, ...]
    broadcast_axes: tuple[int, ...] | None = None


def _mapped_axes(shape: Shape, a: BroadcastToAttrs) -> tuple[int, ...]:
    """The output axis of each input dim, checked against the output shape."""
    out, rank = tuple(a.out_shape), len(a.out_shape)
    if a.broadcast_axes is None:
        axes = tuple(range(rank - len(shape), rank))
    else:
        axes = tuple(normalize_axis("broadcast_to", ax, rank) for ax in a.broadcast_axes)
    if len(axes) != len(shape) or list(axes) != sorted(set(axes)) or any(
        d not in (1, out[ax]) for ax, d in zip(axes, shape, strict=False)
    ):
        raise ValueError(f"broadcast_to: cannot broadcast {tuple(shape)} to {out} (broadcast_axes {a.broadcast_axes})")
    return axes


def _broadcast_shape(shape: Shape, a: BroadcastToAttrs) -> Shape:
    _mapped_axes(shape, a)
    return tuple(a.out_shape)


def _broadcast_reference(xs, a):
    x = xs[0]
    aligned = [1] * len(a.out_shape)
    for ax, d in zip(_mapped_axes(x.shape, a), x.shape, strict=True):
        aligned[ax] = d
    return [np.broadcast_to(x.reshape(aligned), a.out_shape).copy()]


def _broadcast_to_compute(tensors, a, out_types):
    (x,) = tensors
    shape = dims(x)
    axes = _mapped_axes(shape, a)
    # a size-1 input dim is read at 0 (it may meet a larger output dim)
    return [_map_compute("broadcast_to", x, out_types[0].shape,
                         lambda idx: [0 if d == 1 else idx[ax] for ax, d in zip(axes, shape, strict=True)])]


_register("broadcast_to", BroadcastToAttrs, _broadcast_shape, _broadcast_reference, _broadcast_to_compute,
          "Broadcast to a shape (numpy alignment, or CINN's broadcast_axes).", PatternKind.BROADCAST)


# -- tile / reverse ------------------------------------------------------------------------------
@dataclass(frozen=True)
class TileAttrs(Attrs):
    """Repeats per dim (numpy's tile: the shorter of shape and repeat_times is padded with leading 1s)."""

    repeat_times: tuple[int, ...]


def _tile_dims(shape: Shape, a: TileAttrs) -> tuple[Shape, tuple[int, ...]]:
    """x's shape and the repeats, both at the output rank."""
    if any(r < 1 for r in a.repeat_times):
        raise ValueError(f"tile: repeat_times {tuple(a.repeat_times)} must be >= 1 (shape {tuple(shape)})")
    rank = max(len(shape), len(a.repeat_times))
    return (1,) * (rank - len(shape)) + tuple(shape), (1,) * (rank - len(a.repeat_times)) + tuple(a.repeat_times)


def _tile_shape(shape: Shape, a: TileAttrs) -> Shape:
    sizes, reps = _tile_dims(shape, a)
    return tuple(d * r for d, r in zip(sizes, reps, strict=False))


def _tile_compute(tensors, a, out_types):
    (x,) = tensors
    lead = len(out_types[0].shape) - x.ndim
    shape = dims(x)
    return [_map_compute("tile", x, out_types[0].shape, lambda idx: [i % d for i, d in zip(idx[lead:], shape, strict=True)])]


_register("tile", TileAttrs, _tile_shape, lambda xs, a: [np.tile(xs[0], a.repeat_times)], _tile_compute,
          "Repeat x along each dim.")


@dataclass(frozen=True)
class ReverseAttrs(Attrs):
    """The axes to reverse."""

    axis: tuple[int, ...]


def _reverse_compute(tensors, a, out_types):
    (x,) = tensors
    shape = dims(x)
    axes = normalize_axes("reverse", a.axis, len(shape))
    return [_map_compute("reverse", x, shape,
                         lambda idx: [d - 1 - i if k in axes else i for k, (i, d) in enumerate(zip(idx, shape, strict=True))])]


def _reverse_shape(shape: Shape, a: ReverseAttrs) -> Shape:
    normalize_axes("reverse", a.axis, len(shape))  # validates the axes
    return shape


_register("reverse", ReverseAttrs, _reverse_shape,
          lambda xs, a: [np.flip(xs[0], normalize_axes("reverse", a.axis, xs[0].ndim)).copy()], _reverse_compute,
          "Reverse the order of elements along some axes.")


# -- pad -----------------------------------------------------------------------------------------
class PadMode(enum.Enum):
    """How pad fills the border (numpy's np.pad mode names)."""

    CONSTANT = "constant"
    REFLECT = "reflect"
    EDGE = "edge"
    WRAP = "wrap"


@dataclass(frozen=True)
class PadAttrs(Attrs):
    """(before, after) per dim, the fill value of constant mode, and the mode."""

    paddings: tuple[tuple[int, int], ...]
    pad_value: float = 0.0
    mode: PadMode = PadMode.CONSTANT

    def __post_init__(self):
        super().__post_init__()
        try:
            object.__setattr__(self, "mode", PadMode(self.mode))
        except ValueError:
            raise ValueError(f"pad: mode {self.mode!r} not one of {[m.value for m in PadMode]}") from None


def _pad_shape(shape: Shape, a: PadAttrs) -> Shape:
    pads = a.paddings
    if len(pads) != len(shape) or any(len(p) != 2 or min(p) < 0 for p in pads):
        raise ValueError(f"pad: paddings {pads} need one non-negative (before, after) per dim of {tuple(shape)}")
    if a.mode == PadMode.REFLECT and any(max(p) >= d for p, d in zip(pads, shape, strict=False)):
        raise ValueError(f"pad: reflect paddings {pads} must be smaller than the dims of {tuple(shape)}")
    return tuple(d + b + e for d, (b, e) in zip(shape, pads, strict=False))


def _pad_reference(xs, a):
    extra = {"constant_values": np.asarray(a.pad_value).astype(xs[0].dtype)} if a.mode == PadMode.CONSTANT else {}
    return [np.pad(xs[0], a.paddings, mode=a.mode.value, **extra)]


def _pad_source(i, pads: tuple[int, int], d: int, mode: PadMode):
    """The input index read for output index i along one dim (any index in bounds for constant-mode borders)."""
    before, after = pads
    if not before and not after:
        return i  # the bare iterator: the schedules vectorize along unpadded inner axes (cpu_common._vector_suffix)
    j = i - before
    if mode == PadMode.REFLECT:
        j = (d - 1) - tirx.abs((d - 1) - tirx.abs(j))
    elif mode == PadMode.WRAP:
        j = tirx.floormod(j, d)
    return tirx.max(tirx.min(j, d - 1), 0)  # clamped: edge mode's value, and in bounds for the others


def _pad_compute(tensors, a, out_types):
    (x,) = tensors
    shape = dims(x)
    fill = _scalar(a.pad_value, out_types[0].dtype)

    def body(*idx):
        value = x(*(_pad_source(i, p, d, a.mode) for i, p, d in zip(idx, a.paddings, shape, strict=False)))
        if a.mode != PadMode.CONSTANT:
            return value
        inside = [cond for i, (b, e), d in zip(idx, a.paddings, shape, strict=False)
                  for cond, needed in ((i >= b, b), (i < b + d, e)) if needed]
        if not inside:
            return value
        # loaded outside the Select, which evaluates both sides: TVM simplifies a clamp away under a Select's (or an
        # if_then_else's) condition, so a load there read past the input at the borders (a depth pad a whole plane
        # before and after it); an if_then_else would keep the load inside but scalarize a vectorized loop
        loaded = tirx.Var("loaded", out_types[0].dtype)
        return tirx.Let(loaded, value, tirx.Select(tirx.all(*inside), loaded, fill))

    return [te.compute(out_types[0].shape, body, name="pad", tag="injective")]


_register("pad", PadAttrs, _pad_shape, _pad_reference, _pad_compute, "Pad each dim (constant, reflect, edge or wrap).")


# -- gather --------------------------------------------------------------------------------------
def _gather_infer(types: Sequence[TensorType], a: AxisAttrs) -> list[TensorType]:
    x, index = types
    if index.dtype not in ("int32", "int64"):
        raise TypeError(f"gather: index must be int32 or int64, got {index.dtype}"
                        f" (shapes {_fmt(x.shape, index.shape)})")
    if not x.shape:
        raise ValueError(f"gather: x must have rank >= 1 (shapes {_fmt(x.shape, index.shape)})")
    ax = normalize_axis("gather", a.axis, len(x.shape))
    return [TensorType(x.shape[:ax] + index.shape + x.shape[ax + 1 :], x.dtype)]


def _clamped(i, n: int, dtype: str):
    """A run-time index into an axis of n: -n..-1 count from the end (numpy); anything else outside the axis is
    clamped to it, so a bad index reads the edge element instead of faulting or wrapping to another one."""
    i = tirx.Select(i < tirx.const(0, dtype), i + tirx.const(n, dtype), i)
    return tirx.max(tirx.min(i, tirx.const(n - 1, dtype)), tirx.const(0, dtype))


def _gather_compute(tensors, a, out_types):
    x, index = tensors
    ax, k = normalize_axis("gather", a.axis, x.ndim), len(index.shape)
    n = dims(x)[ax]

    def body(*idx):
        return x(*idx[:ax], _clamped(index(*idx[ax : ax + k]), n, index.dtype), *idx[ax + k :])

    return [te.compute(out_types[0].shape, body, name="gather", tag="injective")]


register(OpDef(name="gather", kind=PatternKind.INJECTIVE, infer=_gather_infer, compute=_gather_compute,
               reference=lambda xs, a: [np.take(xs[0], xs[1], axis=a.axis)], attrs=AxisAttrs, num_inputs=2,
               index_input=1, doc="Take slices of x along axis at the given indices (numpy's take)."))


# -- gather_elements -------------------------------------------------------------------------------
def _gather_elements_infer(types: Sequence[TensorType], a: AxisAttrs) -> list[TensorType]:
    x, index = types
    shapes = _fmt(x.shape, index.shape)
    if index.dtype not in ("int32", "int64"):
        raise TypeError(f"gather_elements: index must be int32 or int64, got {index.dtype} (shapes {shapes})")
    if not x.shape or len(index.shape) != len(x.shape):
        raise ValueError(f"gather_elements: x and index need one common rank >= 1 (shapes {shapes})")
    ax = normalize_axis("gather_elements", a.axis, len(x.shape))
    if any(i > d for k, (i, d) in enumerate(zip(index.shape, x.shape, strict=False)) if k != ax):
        raise ValueError(f"gather_elements: index dims must not exceed x's outside axis {a.axis} (shapes {shapes})")
    return [TensorType(index.shape, x.dtype)]


def _gather_elements_compute(tensors, a, out_types):
    x, index = tensors
    ax = normalize_axis("gather_elements", a.axis, x.ndim)
    n = dims(x)[ax]

    def body(*idx):
        picked = _clamped(index(*idx), n, index.dtype)
        return x(*(picked if k == ax else i for k, i in enumerate(idx)))

    return [te.compute(out_types[0].shape, body, name="gather_elements", tag="injective")]


def _gather_elements_reference(xs, a):
    x, index = xs
    ax = normalize_axis("gather_elements", a.axis, x.ndim)
    grid = list(np.indices(index.shape, sparse=True))
    grid[ax] = np.where(index < 0, index + x.shape[ax], index)
    return [x[tuple(grid)]]


register(OpDef(name="gather_elements", kind=PatternKind.INJECTIVE, infer=_gather_elements_infer,
               compute=_gather_elements_compute, reference=_gather_elements_reference, attrs=AxisAttrs,
               num_inputs=2, index_input=1, doc="out[i] = x[i with i[axis] replaced by index[i]] (numpy's take_along_axis)."))


# -- arange --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ArangeAttrs(Attrs):
    """Values start, start + step, ... below end (above it for a negative step)."""

    start: float
    end: float
    step: float = 1.0
    dtype: str = "float32"


def _arange_type(a: ArangeAttrs) -> TensorType:
    if a.dtype not in DTYPES or a.dtype == "bool":
        raise TypeError(f"arange: dtype {a.dtype!r} not supported")
    if a.step == 0 or not all(map(math.isfinite, (a.start, a.end, a.step))):
        raise ValueError(f"arange: start, end and step must be finite, step nonzero (start={a.start} end={a.end} "
                         f"step={a.step})")
    return TensorType((max(math.ceil((a.end - a.start) / a.step), 0),), a.dtype)  # an empty range: size 0


def _arange_reference(_xs, a):
    n = _arange_type(a).shape[0]
    return [(a.start + np.arange(n, dtype="float64") * a.step).astype(a.dtype)]


def _arange_compute(_tensors, a, out_types):
    # computed in float64, then cast: the same rounding as the reference for every dtype
    def body(i):
        return cast(const(a.start, "float64") + cast(i, "float64") * const(a.step, "float64"), a.dtype)

    return [te.compute(out_types[0].shape, body, name="arange", tag="injective")]


register(OpDef(name="arange", kind=PatternKind.INJECTIVE, infer=lambda _types, a: [_arange_type(a)],
               compute=_arange_compute, reference=_arange_reference, attrs=ArangeAttrs, num_inputs=0,
               doc="A 1-D range of values (no tensor inputs)."))
