"""cinn.quantize: post-training static int8 quantization of a Program from calibration feeds.

The activation that feeds each chosen conv or matmul becomes uint8 (one scale and zero point for the tensor, from the
values it takes over the calibration feeds), its constant weights symmetric int8 (a scale per output channel). The
result is a Program of the shape onnxruntime's QDQ models import to: quantize (divide, round, add the zero point,
clip, cast to uint8) and dequantize (cast, subtract, multiply) before the op, and weights that are int8 values times
their scales, so that plain cinn.compile turns it into the integer kernels (the integer_kernels pass) on a CPU with
VNNI and into the same arithmetic in float elsewhere.
"""
from __future__ import annotations

import enum
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType

import numpy as np

from cinn.compiler.passes.dce import dce
from cinn.compiler.passes.fold_constants import fold_constants
from cinn.compiler.passes.rewrite import Rewriter
from cinn.compiler.passes.simplify import simplify
from cinn.core.ir import Node, Program, Value
from cinn.core.ops.elementwise import CastAttrs, ClipAttrs
from cinn.core.ops.nn import Conv2dAttrs, DataFormat
from cinn.core.ops.quant import DEPTH
from cinn.facade import api
from cinn.facade.quant_calibration import (
    ActivationParams,
    CalibrationMethod,
    RangeCollector,
    WeightParams,
    weight_params,
)
from cinn.facade.quant_sensitivity import FloatLayer, choose_float_layers, switch_feed, switchable
from cinn.runtime.executable import Executable

Feed = Mapping[str, np.ndarray]
DEFAULT_PERCENTILE = 99.999
HELD_BACK_SHARE = 4  # without held-back feeds, one calibration feed in this many is held back for the report
DEFAULT_MAX_ERROR = 3e-2  # issue 53's goal: relative L2 error of the int8 outputs against float32
SEARCH_MARGIN = 0.8  # the float layers are chosen to meet this share of the budget on calibration feeds, so that
# the held-back feeds (which the choice never sees) meet the whole of it
SENSITIVITY_FEEDS = 2  # calibration feeds each run of the sensitivity analysis measures on


class OpKind(enum.Enum):
    """The ops quantize can quantize (those the integer kernels compute)."""

    CONV = "conv2d"
    MATMUL = "matmul"


@dataclass(frozen=True)
class QuantizePolicy:
    """Which ops are quantized: those of `op_kinds`, but for nodes named in `exclude_nodes` (a node's name or the
    name of its output value). Only ops an integer kernel can compute are candidates: convs with one group (NCHW), and
    matmuls of a float tensor with constant 2-D weights whose rows are a multiple of 4."""

    op_kinds: frozenset[OpKind] = frozenset(OpKind)
    exclude_nodes: frozenset[str] = frozenset()


@dataclass(frozen=True)
class OutputError:
    """How far one quantized output is from the float one over a set of feeds."""

    output: str
    relative_l2: float  # ||quantized - float|| / ||float||, over every feed of the set
    max_abs: float


@dataclass(frozen=True)
class FeedSetError:
    """The errors of every output on one set of feeds."""

    name: str
    feeds: int
    outputs: tuple[OutputError, ...]


@dataclass(frozen=True)
class AccuracyReport:
    """The quantized program's outputs against the float program's; str() is a table."""

    method: CalibrationMethod
    quantized_ops: int
    sets: tuple[FeedSetError, ...]
    max_error: float = math.inf  # the budget on the last set's worst relative L2 error (held-back if there are any)
    kept_float: tuple[FloatLayer, ...] = ()  # the layers the budget kept in float, most costly first

    def worst(self, name: str) -> float:
        """The largest relative L2 error of any output on the set called `name`."""
        return max(o.relative_l2 for s in self.sets if s.name == name for o in s.outputs)

    @property
    def error(self) -> float:
        """The error the budget holds: the worst of the last set (held-back feeds if there are any)."""
        return self.worst(self.sets[-1].name)

    @property
    def within_budget(self) -> bool:
        """Whether `error` is at most `max_error`."""
        return self.error <= self.max_error

    def __str__(self) -> str:
        rows = [(s.name, str(s.feeds), o.output, f"{o.relative_l2:.3e}", f"{o.max_abs:.3e}")
                for s in self.sets for o in s.outputs]
        header = ("feeds", "count", "output", "rel. L2 error", "max abs error")
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        ops = f"{self.quantized_ops} op{'' if self.quantized_ops == 1 else 's'}"
        lines = [f"int8 quantization ({self.method.value} calibration, {ops} quantized) vs float32"]
        lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in [header, *rows]]
        lines += [f"kept in float: {k.name} (quantized alone: {k.error_alone:.3e}; all quantized: "
                  f"{k.error_with_all:.3e})" for k in self.kept_float]
        if math.isfinite(self.max_error):
            verdict = "within" if self.within_budget else "OVER"
            lines.append(f"{verdict} the error budget: {self.error:.3e} on the {self.sets[-1].name} feeds, budget "
                         f"{self.max_error:.3e}")
        return "\n".join(lines)


@dataclass(frozen=True)
class QuantizedModel:
    """cinn.quantize's result: the quantized program, its accuracy, and each quantized activation's parameters."""

    program: Program
    report: AccuracyReport
    activations: Mapping[str, ActivationParams] = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "activations", MappingProxyType(dict(self.activations)))


@dataclass(frozen=True)
class _Site:
    """A node to quantize: its activation (input 0) and its constant weights (input 1)."""

    node: Node
    activation: Value
    weights: str


Progress = Callable[[str, int, int], None]  # (stage, done, total): "compiling float32 kernels", 3, 80


def _compile(program: Program, target: str, cache_dir: str | None, progress: Progress | None, what: str) -> Executable:
    report = None if progress is None else (lambda done, total: progress(f"compiling {what} kernels", done, total))
    return api.compile(program, target, cache_dir=cache_dir, progress=report)


def quantize(program: Program, calibration_feeds: Sequence[Feed],
             method: CalibrationMethod = CalibrationMethod.MINMAX, *, held_back_feeds: Sequence[Feed] | None = None,
             policy: QuantizePolicy = QuantizePolicy(), percentile: float = DEFAULT_PERCENTILE,
             bias_correction: bool = True, max_error: float = DEFAULT_MAX_ERROR, target: str = "llvm",
             cache_dir: str | None = None, progress: Progress | None = None) -> QuantizedModel:
    """Quantize a program's convs and matmuls (see `QuantizePolicy`) to int8 by the activations' values on the
    calibration feeds, picked by `method` (`percentile`: the per cent of the values PERCENTILE keeps);
    `bias_correction` adds to each quantized op's output what its weights' rounding takes from it on average over
    the calibration feeds (`bias_shift`). The report compares the outputs with float32 on the calibration feeds and
    on `held_back_feeds`; without those, one feed in HELD_BACK_SHARE of the calibration set is held back instead
    (when there are two or more). When the error exceeds `max_error` (math.inf: no budget), the layers that cost the
    most stay in float (quant_sensitivity), the fewest that bring it within; the report names them and says
    whether the budget holds."""
    if not isinstance(program, Program):
        raise TypeError(f"quantize: expected a static cinn Program, got {type(program).__name__}")
    calibration = [check_feed(program, f, f"calibration feed {i}") for i, f in enumerate(calibration_feeds)]
    if not calibration:
        raise ValueError("quantize: no calibration feeds")
    if held_back_feeds is None:
        count = len(calibration) // HELD_BACK_SHARE or (1 if len(calibration) > 1 else 0)
        calibration, held_back = calibration[: len(calibration) - count], calibration[len(calibration) - count :]
    else:
        held_back = [check_feed(program, f, f"held-back feed {i}") for i, f in enumerate(held_back_feeds)]
    program = folded(program)
    sites = quantization_sites(program, policy)
    observed = _observed(program, sites)
    exposed = _compile(program.replace(outputs=(*program.outputs, *observed)), target, cache_dir, progress, "float32")
    axes = {s.activation.name: _channel_axis(s.node) for s in reversed(sites)} if bias_correction else {}
    collectors = _calibrate(exposed, program, observed, _activations(sites), calibration, method, axes, progress)
    activations = {v.name: collectors[v.name].params(method, percentile) for v in _activations(sites)}
    means = {name: mean for name in axes if (mean := collectors[name].channel_mean) is not None}
    sets = (("calibration", calibration), ("held-back", held_back))

    def compile_report(chosen: Sequence[_Site]) -> tuple[Program, AccuracyReport]:
        return _report(program, insert_qdq(program, chosen, activations, means), exposed, method, len(chosen), sets,
                       target, cache_dir, progress)

    quantized, report = compile_report(sites)
    if report.error <= max_error:
        return QuantizedModel(quantized, replace(report, max_error=max_error), activations)
    switched = switchable(program, [s.node for s in sites], _QuantizedEmitter(program, sites, activations, means))
    measure = _switch_error(program, exposed, switched, calibration[:SENSITIVITY_FEEDS], target, cache_dir, progress)
    choice = choose_float_layers([layer_name(s.node) for s in sites], measure, SEARCH_MARGIN * max_error)
    kept = [s for i, s in enumerate(sites) if i not in choice.layers]
    quantized, report = compile_report(kept)
    used = {s.activation.name for s in kept}
    return QuantizedModel(quantized, replace(report, max_error=max_error, kept_float=choice.ranked),
                          {k: p for k, p in activations.items() if k in used})


def layer_name(node: Node) -> str:
    """How the report names a quantized node: its name, or its output's (as QuantizePolicy.exclude_nodes takes)."""
    return node.name or node.outputs[0].name


def _switch_error(program: Program, exposed: Executable, switched: tuple[Program, tuple[Value, ...]],
                  feeds: Sequence[dict[str, np.ndarray]], target: str, cache_dir: str | None,
                  progress: Progress | None) -> Callable[[frozenset[int]], float]:
    """The worst output's relative L2 error on `feeds` of the switchable program with some layers in float."""
    compiled = _compile(switched[0], target, cache_dir, progress, "sensitivity analysis")
    n = len(program.outputs)
    expected = [exposed.run(f)[:n] for f in feeds]
    runs, most = itertools.count(1), 2 * len(switched[1]) + 1  # choose_float_layers' runs: at most 2N + 1

    def measure(floats: frozenset[int]) -> float:
        switches = switch_feed(switched[1], floats)
        got = [compiled.run({**f, **switches}) for f in feeds]
        done = next(runs)
        if progress is not None:
            progress("sensitivity analysis: runs (at most)", done, most)
        return max(output_error(v.name, [e[i] for e in expected], [g[i] for g in got]).relative_l2
                   for i, v in enumerate(program.outputs))

    return measure


def folded(program: Program) -> Program:
    """The program with what the graph passes fold into weights folded (a batch norm after a conv scales the conv's
    weights): the quantized weights are then those the kernels multiply by, and the float epilogue the integer
    kernels' rewrite would otherwise leave behind each conv is gone."""
    return dce(fold_constants(simplify(program)))


def check_feed(program: Program, feed: Feed, what: str) -> dict[str, np.ndarray]:
    """A feed with an array of each input's shape (converted to its dtype); ValueError naming what is wrong."""
    missing = [v.name for v in program.inputs if v.name not in feed]
    if missing:
        raise ValueError(f"{what}: no array for input {missing[0]!r} (it has {sorted(feed) or 'none'})")
    out = {}
    for v in program.inputs:
        array = np.asarray(feed[v.name])
        if array.shape != v.shape:
            raise ValueError(f"{what}: input {v.name!r} has shape {array.shape}, the model takes {v.shape}")
        out[v.name] = np.ascontiguousarray(array, dtype=v.dtype)
    return out


def quantization_sites(program: Program, policy: QuantizePolicy) -> list[_Site]:
    """The nodes the policy picks whose activation and weights the integer kernels can take."""
    kinds = {k.value for k in policy.op_kinds}
    sites = []
    for node in program.nodes:
        if node.op not in kinds or policy.exclude_nodes & {node.name, *(v.name for v in node.outputs)}:
            continue
        x, w = node.inputs[:2]
        weights = program.constants.get(w.name)
        if x.name in program.constants or x.dtype != "float32" or weights is None or weights.dtype != np.float32:
            continue
        if _integer_form(node, x, weights):
            sites.append(_Site(node, x, w.name))
    return sites


def _integer_form(node: Node, x: Value, weights: np.ndarray) -> bool:
    """Whether the integer_kernels pass rewrites this conv or matmul once its operands are quantized."""
    a = node.attrs
    if node.op == OpKind.CONV.value:
        return isinstance(a, Conv2dAttrs) and a.groups == 1 and DataFormat(a.data_format) is DataFormat.NCHW
    return (not a.trans_x and a.alpha == 1.0 and weights.ndim == 2 and len(x.shape) >= 2
            and weights.shape[1 if a.trans_y else 0] % DEPTH == 0)


def _activations(sites: Sequence[_Site]) -> list[Value]:
    """The sites' activations, each once, in order."""
    return list({s.activation.name: s.activation for s in sites}.values())


def _observed(program: Program, sites: Sequence[_Site]) -> list[Value]:
    """The activations a run must expose as extra outputs (not inputs, not outputs already)."""
    shown = {v.name for v in (*program.inputs, *program.outputs)}
    return [v for v in _activations(sites) if v.name not in shown]


def _channel_axis(node: Node) -> int:
    """The axis of a quantized op's activation that its weights reduce over."""
    return 1 if node.op == OpKind.CONV.value else -1


def _calibrate(exposed: Executable, program: Program, observed: Sequence[Value], activations: Sequence[Value],
               feeds: Sequence[dict[str, np.ndarray]], method: CalibrationMethod, mean_axes: Mapping[str, int],
               progress: Progress | None) -> dict[str, RangeCollector]:
    """Each activation's values over the feeds: the extremes (and the channel means of those in `mean_axes`), then
    (but for MINMAX) a second sweep's histograms."""
    sweeps = [RangeCollector.observe_range] + ([] if method is CalibrationMethod.MINMAX else
                                                [RangeCollector.observe_histogram])
    collectors = {v.name: RangeCollector() for v in activations}
    for sweep, observe in enumerate(sweeps):
        for i, feed in enumerate(feeds):
            values = _values(exposed, program, observed, feed)
            for name, collector in collectors.items():
                observe(collector, values[name])
                if sweep == 0 and name in mean_axes:
                    collector.observe_mean(values[name], mean_axes[name])
            if progress is not None:
                progress(f"calibrating, sweep {sweep + 1} of {len(sweeps)}: samples", i + 1, len(feeds))
    return collectors


def _values(exposed: Executable, program: Program, observed: Sequence[Value], feed: Mapping[str, np.ndarray]
            ) -> dict[str, np.ndarray]:
    """Every value a run shows by name: the inputs, the outputs and the observed activations."""
    results = exposed.run(feed)
    names = [v.name for v in (*program.outputs, *observed)]
    return {**feed, **dict(zip(names, results, strict=True))}


def insert_qdq(program: Program, sites: Sequence[_Site], activations: Mapping[str, ActivationParams],
               means: Mapping[str, np.ndarray] = MappingProxyType({})) -> Program:
    """The program with each site's activation quantized to uint8 and dequantized (once per activation, shared by its
    sites) and its weights replaced by their int8 values times their scales (unused float weights dropped); a site
    whose activation has channel means in `means` gets its bias_shift added to its output."""
    rw = Rewriter(program)
    emit = _QuantizedEmitter(program, sites, activations, means)
    for node in program.nodes:
        if node.outputs[0].name not in emit.sites:
            rw.keep(node)
            continue
        kept = rw.keep(node, inputs=emit.inputs(rw, node))
        y = emit.corrected(rw, node, kept.outputs[0])
        if y is not kept.outputs[0]:
            rw.substitute(node.outputs[0], y)
    return dce(rw.finish())


class _QuantizedEmitter:
    """Emits the sites' quantized computations into a Rewriter: each activation's quantize-dequantize once, the
    weights as int8 values times their scales, the bias correction after the op."""

    def __init__(self, program: Program, sites: Sequence[_Site], activations: Mapping[str, ActivationParams],
                 means: Mapping[str, np.ndarray]):
        self.program, self.activations, self.means = program, activations, means
        self.sites = {s.node.outputs[0].name: s for s in sites}
        self._dequantized: dict[str, Value] = {}
        self._written: dict[str, np.ndarray] = {}

    def inputs(self, rw: Rewriter, node: Node) -> tuple[Value, ...]:
        """The quantized node's inputs: the dequantized activation, the rounded weights, the rest as they are."""
        site = self.sites[node.outputs[0].name]
        name = site.activation.name
        if name not in self._dequantized:
            self._dequantized[name] = _qdq(rw, rw.value(site.activation), self.activations[name])
        weights = weight_params(self.program.constants[site.weights] if node.op == OpKind.CONV.value
                                else _columns_first(node, self.program.constants[site.weights]))
        written = self._written[site.weights] = _weights_as_written(node, weights)
        return (self._dequantized[name], rw.new_constant(written, f"{site.weights}_int8"), *rw.inputs(node)[2:])

    def corrected(self, rw: Rewriter, node: Node, y: Value) -> Value:
        """The quantized node's output `y` with its bias_shift added (y itself without channel means)."""
        site = self.sites[node.outputs[0].name]
        shift = bias_shift(node, self.program.constants[site.weights], self._written[site.weights],
                           self.means.get(site.activation.name))
        if shift is None:
            return y
        (y,) = rw.emit("add", [y, rw.new_constant(shift, f"{site.weights}_bias_correction")])
        return y

    def __call__(self, rw: Rewriter, node: Node) -> Value:
        """A quantized copy of the node, beside it (quant_sensitivity.switchable's EmitQuantized)."""
        (y,) = rw.emit(node.op, self.inputs(rw, node), node.attrs)
        return self.corrected(rw, node, y)


def bias_shift(node: Node, weights: np.ndarray, quantized: np.ndarray, mean: np.ndarray | None) -> np.ndarray | None:
    """What rounding the weights takes from the op's output on average: -(quantized - weights) applied to the
    activation's channel means (a conv's window taken as all inside the input), shaped to broadcast over the output;
    None without means (or with means of another length)."""
    delta = quantized.astype(np.float64) - weights
    if node.op == OpKind.CONV.value:
        per_channel = delta.sum(axis=(2, 3))  # [O, C]
        shape: tuple[int, ...] = (-1, 1, 1)
    else:
        per_channel = delta if node.attrs.trans_y else delta.T  # [N, K]
        shape = (-1,)
    if mean is None or mean.shape != per_channel.shape[1:]:
        return None
    return (-(per_channel @ mean)).astype(np.float32).reshape(shape)


def _columns_first(node: Node, w: np.ndarray) -> np.ndarray:
    """A matmul's weights with its output columns on axis 0 (the axis weight_params scales along)."""
    return w if node.attrs.trans_y else w.T


def _weights_as_written(node: Node, weights: WeightParams) -> np.ndarray:
    """The dequantized weights in the layout the node reads."""
    w = weights.dequantized()
    return w if node.op == OpKind.CONV.value or node.attrs.trans_y else np.ascontiguousarray(w.T)


def _qdq(rw: Rewriter, x: Value, p: ActivationParams) -> Value:
    """dequantize(quantize(x)) as onnxruntime's QDQ models import: clip(round(x / s) + z, 0, 255) as uint8, then
    (float(q) - z) * s."""
    scale = rw.new_constant(np.asarray(p.scale, np.float32), f"{x.name}_scale")
    zero = rw.new_constant(np.asarray(p.zero_point, np.float32), f"{x.name}_zero_point")
    (y,) = rw.emit("divide", [x, scale])
    (y,) = rw.emit("round", [y])
    (y,) = rw.emit("add", [y, zero])
    (y,) = rw.emit("clip", [y], ClipAttrs(0.0, 255.0, keep_nan=False))
    (q,) = rw.emit("cast", [y], CastAttrs("uint8"))
    (y,) = rw.emit("cast", [q], CastAttrs("float32"))
    (y,) = rw.emit("subtract", [y, zero])
    (y,) = rw.emit("multiply", [y, scale])
    return y


def _report(program: Program, quantized: Program, exposed: Executable, method: CalibrationMethod, count: int,
            sets: Sequence[tuple[str, Sequence[dict[str, np.ndarray]]]], target: str, cache_dir: str | None,
            progress: Progress | None) -> tuple[Program, AccuracyReport]:
    """The quantized program and its outputs against the float ones (the exposing executable's first outputs) on each
    non-empty set."""
    compiled = _compile(quantized, target, cache_dir, progress, "int8")
    n = len(program.outputs)
    results = []
    for name, feeds in sets:
        if feeds:
            pairs = [(exposed.run(f)[:n], compiled.run(f)) for f in feeds]
            results.append(FeedSetError(name, len(feeds), tuple(
                output_error(v.name, [p[0][i] for p in pairs], [p[1][i] for p in pairs])
                for i, v in enumerate(program.outputs))))
    return quantized, AccuracyReport(method, count, tuple(results))


def output_error(name: str, expected: Sequence[np.ndarray], got: Sequence[np.ndarray]) -> OutputError:
    """The relative L2 error and the largest absolute error of `got` against `expected` over all feeds."""
    diff = sum(float(np.sum((g.astype(np.float64) - e) ** 2)) for e, g in zip(expected, got, strict=True))
    norm = sum(float(np.sum(e.astype(np.float64) ** 2)) for e in expected)
    worst = max(float(np.max(np.abs(g.astype(np.float64) - e), initial=0.0)) for e, g in zip(expected, got, strict=True))
    return OutputError(name, np.sqrt(diff) / np.sqrt(norm) if norm > 0 else float(np.sqrt(diff)), worst)
