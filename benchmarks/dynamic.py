"""Dynamic shapes: BERT-base with symbolic (batch, seq) compiled once, timed at many sizes against the static compile
of each size, onnxruntime and OpenVINO (each engine in its own process, given the same dynamic ONNX model).

``python -m cinn.benchmarks.dynamic --batch 1,4,8 --seq 16,64,128,384 --rounds 3 --csv dynamic.csv``
"""
from __future__ import annotations

import argparse
import csv
import enum
import functools
import itertools
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence

import numpy as np

from cinn.benchmarks.harness import RTOL, ort_session, spawn_module
from cinn.utils import SETTLE_S, median_seconds


class DynEngine(enum.StrEnum):
    """What runs the symbolic model."""

    DYNAMIC = "cinn-dynamic"  # one compile for every size
    STATIC = "cinn-static"  # a compile of each size alone
    ORT = "onnxruntime"
    OPENVINO = "openvino"


Point = tuple[int, int]  # (batch, seq)


def _cinn_runners(engine: DynEngine, points: Sequence[Point], small: bool, info: dict
                  ) -> dict[Point, Callable[[dict], list]]:
    import cinn
    from cinn.frontend.zoo import symbolic_bert_base

    program = symbolic_bert_base(small)
    with tempfile.TemporaryDirectory(prefix="cinn-dyn-cache-") as cache:  # a cold compile
        t0 = time.perf_counter()
        if engine is DynEngine.DYNAMIC:
            hints = {"batch": sorted({b for b, _ in points}), "seq": sorted({s for _, s in points})}
            exe = cinn.compile(program, cache_dir=cache, shape_hints=hints)
            info |= {"compile_s": time.perf_counter() - t0, "bindings": len(exe.bindings), "exe": exe}
            return {p: exe.run for p in points}
        runners = {}
        for b, s in points:
            runners[b, s] = cinn.compile(program.specialize(program.binding({"batch": b, "seq": s})), cache_dir=cache).run
        info["compile_s"] = time.perf_counter() - t0
        return runners


def _ort_runners(onnx_path: str, points: Sequence[Point]) -> dict[Point, Callable[[dict], list]]:
    import onnx

    sess = ort_session(onnx.load(onnx_path))
    return {p: lambda feeds: sess.run(None, feeds) for p in points}


def _openvino_runners(onnx_path: str, points: Sequence[Point]) -> dict[Point, Callable[[dict], list]]:
    import openvino as ov

    compiled = ov.Core().compile_model(onnx_path, "CPU", {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32",
                                                          "INFERENCE_NUM_THREADS": os.cpu_count() or 1})
    request = compiled.create_infer_request()

    def run(feeds: dict) -> list:
        results = request.infer(feeds, share_outputs=False)
        return [results[o] for o in compiled.outputs]

    return {p: run for p in points}


def worker(engine: DynEngine, onnx_path: str, points: Sequence[Point], small: bool, repeat: int, out_dir: str) -> dict:
    """Time one engine at every point in this process; save each point's output."""
    from cinn.frontend.zoo import bert_feeds

    info: dict = {}
    if engine in (DynEngine.DYNAMIC, DynEngine.STATIC):
        runners = _cinn_runners(engine, points, small, info)
    else:
        runners = (_ort_runners if engine is DynEngine.ORT else _openvino_runners)(onnx_path, points)
    ms = {}
    for p in points:
        feeds, run = bert_feeds(*p, small), runners[p]
        np.save(os.path.join(out_dir, f"{engine.value}_{p[0]}x{p[1]}.npy"), np.asarray(run(feeds)[0]))
        ms[f"{p[0]}x{p[1]}"] = median_seconds(functools.partial(run, feeds), repeat, 1, SETTLE_S) * 1e3
    exe = info.pop("exe", None)
    if exe is not None:
        info["built_on_demand"] = exe.built_on_demand
    return {"engine": engine.value, "ms": ms, **info}


def _points(batches: str, seqs: str) -> list[Point]:
    return list(itertools.product([int(b) for b in batches.split(",")], [int(s) for s in seqs.split(",")]))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cinn.benchmarks.dynamic", description=__doc__.splitlines()[0])
    p.add_argument("--batch", default="1,4,8", help="batch sizes (default: 1,4,8)")
    p.add_argument("--seq", default="16,64,128,384", help="sequence lengths (default: 16,64,128,384)")
    p.add_argument("--rounds", type=int, default=1, help="interleaved rounds of every engine; medians reported")
    p.add_argument("--repeat", type=int, default=5, help="timed runs per point (default: 5)")
    p.add_argument("--small", action="store_true", help="the small BERT (a smoke test)")
    p.add_argument("--csv", default=None, metavar="PATH", help="also write the table as CSV")
    p.add_argument("--worker", default=None, choices=[e.value for e in DynEngine], help=argparse.SUPPRESS)
    p.add_argument("--onnx", default=None, help=argparse.SUPPRESS)
    p.add_argument("--out-dir", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    points = _points(a.batch, a.seq)
    if a.worker:
        print(json.dumps(worker(DynEngine(a.worker), a.onnx, points, a.small, a.repeat, a.out_dir)), flush=True)
        return 0
    return _parent(a, points)


def _parent(a: argparse.Namespace, points: list[Point]) -> int:
    import importlib.util

    from cinn.benchmarks.onnx_export import save_onnx
    from cinn.frontend.zoo import symbolic_bert_base

    engines = [e for e in DynEngine if e is not DynEngine.OPENVINO or importlib.util.find_spec("openvino")]
    results: dict[DynEngine, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="cinn-dyn-") as tmp:
        onnx_path = os.path.join(tmp, "bert_base_dynamic.onnx")
        save_onnx(symbolic_bert_base(a.small), onnx_path)
        for k, engine in itertools.product(range(a.rounds), engines):
            print(f"[dynamic] round {k + 1}/{a.rounds}: {engine.value} ...", file=sys.stderr, flush=True)
            args = ["--worker", engine.value, "--onnx", onnx_path, "--out-dir", tmp, "--batch", a.batch, "--seq", a.seq,
                    "--repeat", str(a.repeat)] + (["--small"] if a.small else [])
            results.setdefault(engine, []).append(json.loads(spawn_module("cinn.benchmarks.dynamic", args, 7200)))
        errors: dict[DynEngine, float] = {e: _max_err(tmp, e, points) for e in engines if e is not DynEngine.ORT}
    rows = _table(results, points)
    _print(results, rows, errors)
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            csv.writer(f).writerows(rows)
    return 0 if all(err <= RTOL * 10 for err in errors.values()) else 1


def _max_err(tmp: str, engine: DynEngine, points: list[Point]) -> float:
    """The largest absolute difference from onnxruntime over all points."""
    def load(e: DynEngine, p: Point) -> np.ndarray:
        return np.load(os.path.join(tmp, f"{e.value}_{p[0]}x{p[1]}.npy"))

    return max(float(np.max(np.abs(load(engine, p) - load(DynEngine.ORT, p)))) for p in points)


def _table(results: dict[DynEngine, list[dict]], points: list[Point]) -> list[list]:
    engines = list(results)
    rows: list[list] = [["batch", "seq", *[f"{e.value} ms" for e in engines], "dynamic/static", "dynamic/best peer"]]
    for b, s in points:
        ms = {e: float(np.median([r["ms"][f"{b}x{s}"] for r in results[e]])) for e in engines}
        peers = [ms[e] for e in (DynEngine.ORT, DynEngine.OPENVINO) if e in ms]
        dyn = ms[DynEngine.DYNAMIC]
        rows.append([b, s, *[f"{ms[e]:.2f}" for e in engines], f"{dyn / ms[DynEngine.STATIC]:.2f}",
                     f"{dyn / min(peers):.2f}"])
    return rows


def _print(results: dict[DynEngine, list[dict]], rows: list[list], errors: dict[DynEngine, float]) -> None:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(str(c).rjust(w) for c, w in zip(r, widths, strict=True)))
    dyn = results[DynEngine.DYNAMIC][0]
    ratios = [float(r[-1]) for r in rows[1:]]
    print(f"cinn-dynamic: one compile of {dyn['bindings']} bindings in {dyn['compile_s']:.1f} s (cold cache); "
          f"{dyn['built_on_demand']} built after it; cinn-static: {results[DynEngine.STATIC][0]['compile_s']:.1f} s for "
          f"all sizes; geomean dynamic/best peer {float(np.exp(np.mean(np.log(ratios)))):.2f}")
    print("max abs difference from onnxruntime: " + ", ".join(f"{e.value} {err:.2g}" for e, err in errors.items()))


if __name__ == "__main__":
    sys.exit(main())
