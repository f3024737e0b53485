"""Dynamic shapes: a model with symbolic dims compiled once for many sizes, timed at each against the static compile
of that size, onnxruntime and OpenVINO (each engine in its own process, the peers given the same dynamic ONNX model).

``python -m benchmarks.dynamic [MODEL] [--size SYMBOL=N1,N2,...]... [--rounds 3] [--csv dynamic.csv]``: MODEL
is ``bert_base`` (default: the built-in BERT-base over symbolic batch and seq, sizes batch=1,4,8 seq=16,64,128,384)
or an ONNX file with symbolic dims (each symbol needs --size). cinn runs it three ways: one compile with the sizes
hinted (kernels specialized to each), one compile with no hints (every size on the symbolic kernels), and a compile
of each size alone.
"""
from __future__ import annotations

import argparse
import csv
import enum
import functools
import importlib.util
import itertools
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence

import numpy as np
import onnx

import cinn
from benchmarks.harness import RTOL, openvino_runner, ort_session, spawn_module
from benchmarks.onnx_export import save_onnx
from cinn.core.ir import TensorType, Value
from cinn.core.symbolic import Binding, SymbolicProgram, bindings_of
from cinn.core.utils import SETTLE_S, median_seconds, random_feeds
from cinn.runtime.worker_pool import die_with_spawner
from frontend.loading import load_model, parse_input_shapes
from frontend.zoo import bert_feeds, symbolic_bert_base

BERT = "bert_base"
BERT_SIZES = {"batch": (1, 4, 8), "seq": (16, 64, 128, 384)}


class DynEngine(enum.StrEnum):
    """What runs the symbolic model."""

    DYNAMIC = "cinn-dynamic"  # one compile for every size: kernels specialized to each hinted size
    SYMBOLIC = "cinn-symbolic"  # one compile, no hints: every size on kernels built once for all sizes
    STATIC = "cinn-static"  # a compile of each size alone
    ORT = "onnxruntime"
    OPENVINO = "openvino"


Runner = Callable[[dict], list]


def _symbolic(model: str, small: bool) -> SymbolicProgram:
    """The symbolic program of the built-in BERT or of a model file."""
    program = symbolic_bert_base(small) if model == BERT else load_model(model)
    if not isinstance(program, SymbolicProgram):
        raise ValueError(f"{model}: no symbolic dims (a dynamic-shape benchmark needs some)")
    return program


def _feeds(model: str, program: SymbolicProgram, binding: Binding, small: bool) -> dict[str, np.ndarray]:
    """Seeded inputs at one binding: BERT's tokens, mask and positions, or random data of a file's input types."""
    if model == BERT:
        return bert_feeds(binding["batch"], binding["seq"], small)
    return random_feeds([Value(i.name, TensorType(i.shape_at(binding), i.dtype)) for i in program.inputs], seed=0)


def _cinn_runners(engine: DynEngine, program: SymbolicProgram, bindings: list[Binding], info: dict) -> list[Runner]:
    t0 = time.perf_counter()
    if engine is DynEngine.STATIC:  # the same kernels as the dynamic build: the default cache saves building them again
        return [cinn.compile(program.specialize(b)).run for b in bindings]
    with tempfile.TemporaryDirectory(prefix="cinn-dyn-cache-") as cache:  # a cold compile
        hints = {s: sorted({b[s] for b in bindings}) for s in program.symbols}
        exe = cinn.compile(program, cache_dir=cache, shape_hints=hints if engine is DynEngine.DYNAMIC else None)
    info |= {"compile_s": time.perf_counter() - t0, "bindings": len(exe.bindings), "exe": exe}
    return [exe.run] * len(bindings)


def _peer_runner(engine: DynEngine, onnx_path: str) -> Runner:
    if engine is DynEngine.OPENVINO:
        return openvino_runner(onnx_path)
    sess = ort_session(onnx.load(onnx_path))
    return lambda feeds: sess.run(None, feeds)


def worker(engine: DynEngine, model: str, onnx_path: str, sizes: dict[str, tuple[int, ...]], small: bool, repeat: int,
           out_dir: str) -> dict:
    """Time one engine at every binding in this process; save each binding's first output."""
    program = _symbolic(model, small)
    bindings = bindings_of(program, sizes)
    info: dict = {}
    if engine in (DynEngine.DYNAMIC, DynEngine.SYMBOLIC, DynEngine.STATIC):
        runners = _cinn_runners(engine, program, bindings, info)
    else:
        runners = [_peer_runner(engine, onnx_path)] * len(bindings)
    ms = {}
    for k, (b, run) in enumerate(zip(bindings, runners, strict=True)):
        feeds = _feeds(model, program, b, small)
        np.save(os.path.join(out_dir, f"{engine.value}_{k}.npy"), np.asarray(run(feeds)[0]))
        ms[str(b)] = median_seconds(functools.partial(run, feeds), repeat, 1, SETTLE_S) * 1e3
    exe = info.pop("exe", None)
    if exe is not None:
        info |= {"built_on_demand": exe.built_on_demand, "served_symbolic": exe.served_symbolic}
    return {"engine": engine.value, "ms": ms, **info}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.dynamic", description=__doc__.splitlines()[0])
    p.add_argument("model", nargs="?", default=BERT, help="bert_base (default) or an ONNX file with symbolic dims")
    p.add_argument("--size", action="append", default=[], metavar="SYMBOL=N1,N2,...",
                   help="sizes of a symbol (repeatable; bert_base: batch=1,4,8 seq=16,64,128,384)")
    p.add_argument("--rounds", type=int, default=1, help="interleaved rounds of every engine; medians reported")
    p.add_argument("--repeat", type=int, default=5, help="timed runs per size (default: 5)")
    p.add_argument("--small", action="store_true", help="the small BERT (a smoke test)")
    p.add_argument("--csv", default=None, metavar="PATH", help="also write the table as CSV")
    p.add_argument("--worker", default=None, choices=[e.value for e in DynEngine], help=argparse.SUPPRESS)
    p.add_argument("--onnx", default=None, help=argparse.SUPPRESS)
    p.add_argument("--out-dir", default=None, help=argparse.SUPPRESS)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    sizes = dict(parse_input_shapes(a.size)) or (BERT_SIZES if a.model == BERT else {})
    if a.worker:
        result = worker(DynEngine(a.worker), a.model, a.onnx, sizes, a.small, a.repeat, a.out_dir)
        print(json.dumps(result), flush=True)
        return 0
    try:
        return _parent(a, sizes)
    except (ValueError, OSError) as err:
        print(f"cinn-dynamic: {err}", file=sys.stderr)
        return 2


def _parent(a: argparse.Namespace, sizes: dict[str, tuple[int, ...]]) -> int:
    program = _symbolic(a.model, a.small)
    bindings = bindings_of(program, sizes)  # bad sizes are refused before any worker starts
    engines = [e for e in DynEngine if e is not DynEngine.OPENVINO or importlib.util.find_spec("openvino")]
    results: dict[DynEngine, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="cinn-dyn-") as tmp:
        onnx_path = a.model
        if a.model == BERT:
            onnx_path = os.path.join(tmp, "bert_base_dynamic.onnx")
            save_onnx(program, onnx_path)
        for k, engine in itertools.product(range(a.rounds), engines):
            print(f"[dynamic] round {k + 1}/{a.rounds}: {engine.value} ...", file=sys.stderr, flush=True)
            args = ["--worker", engine.value, a.model, "--onnx", onnx_path, "--out-dir", tmp, "--repeat", str(a.repeat),
                    *[f"--size={s}={','.join(map(str, n))}" for s, n in sizes.items()]] + (["--small"] if a.small else [])
            results.setdefault(engine, []).append(json.loads(spawn_module("benchmarks.dynamic", args, 7200)))
        errors: dict[DynEngine, float] = {e: _max_err(tmp, e, len(bindings)) for e in engines if e is not DynEngine.ORT}
    rows = _table(results, program.symbols, bindings)
    _print(results, rows, errors)
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            csv.writer(f).writerows(rows)
    return 0 if all(err <= RTOL * 10 for err in errors.values()) else 1


def _max_err(tmp: str, engine: DynEngine, n: int) -> float:
    """The largest absolute difference from onnxruntime over all bindings."""
    def load(e: DynEngine, k: int) -> np.ndarray:
        return np.load(os.path.join(tmp, f"{e.value}_{k}.npy"))

    return max(float(np.max(np.abs(load(engine, k).astype(np.float64) - load(DynEngine.ORT, k)))) for k in range(n))


def _table(results: dict[DynEngine, list[dict]], symbols: tuple[str, ...], bindings: list) -> list[list]:
    engines = list(results)
    ours = (DynEngine.DYNAMIC, DynEngine.SYMBOLIC)
    rows: list[list] = [[*symbols, *[f"{e.value} ms" for e in engines],
                         *[f"{e.value[5:]}/{d}" for e in ours for d in ("static", "best peer")]]]
    for b in bindings:
        ms = {e: float(np.median([r["ms"][str(b)] for r in results[e]])) for e in engines}
        peer = min(ms[e] for e in (DynEngine.ORT, DynEngine.OPENVINO) if e in ms)
        rows.append([*(b[s] for s in symbols), *[f"{ms[e]:.2f}" for e in engines],
                     *[f"{ms[e] / d:.2f}" for e in ours for d in (ms[DynEngine.STATIC], peer)]])
    return rows


def _print(results: dict[DynEngine, list[dict]], rows: list[list], errors: dict[DynEngine, float]) -> None:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(str(c).rjust(w) for c, w in zip(r, widths, strict=True)))
    for k, engine in enumerate((DynEngine.DYNAMIC, DynEngine.SYMBOLIC)):
        run = results[engine][0]
        ratios = [float(r[-3 + 2 * k]) for r in rows[1:]]
        print(f"{engine.value}: one compile ({run['bindings']} bindings specialized) in {run['compile_s']:.1f} s (cold "
              f"cache); {run['built_on_demand']} built after it, {run['served_symbolic']} sizes on its symbolic "
              f"kernels; geomean {engine.value[5:]}/best peer {float(np.exp(np.mean(np.log(ratios)))):.2f}")
    print("max abs difference from onnxruntime: " + ", ".join(f"{e.value} {err:.2g}" for e, err in errors.items()))


if __name__ == "__main__":
    die_with_spawner()
    sys.exit(main())
