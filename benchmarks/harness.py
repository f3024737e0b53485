"""Benchmark harness: each engine runs a model in its own worker process, timed in rounds the parent interleaves.

onnxruntime's spinning threads slow TVM's parallel kernels when both live in one process, so every
(engine, model) pair lives in its own interpreter: ``python -m benchmarks.harness --worker ENGINE MODEL``. The
worker prepares its engine (imports, compiles, saves the outputs), says so in one JSON line, then times one round per
line it reads on stdin. The parent keeps all engines' workers of a model alive and asks each in turn for a round, so
a change of machine speed (on a shared VM, 2x for stretches of seconds) hits all engines alike, and each round's
ratios compare engines timed a moment apart. A baseline (another install of cinn, `--baseline`) is one more worker,
started by that install's Python as its own worker module, and Paddle Inference, for Paddle models, one more in a
Python that has paddle (`benchmarks.paddle_worker`, which imports nothing of cinn): the protocol is the same
(`benchmarks.worker_protocol`).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import enum
import importlib.util
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

import cinn
from benchmarks.onnx_export import to_onnx
from benchmarks.paddle_export import PADDLE_EXTRA
from benchmarks.worker_protocol import load_feeds, load_outputs, round_ms, save_feeds, save_outputs, work
from cinn.facade.command import USER_ERRORS, ExitStatus
from cinn.runtime.worker_pool import die_with_spawner, spawner_env
from frontend.loading import PADDLE_SUFFIXES, PROGRAM_SUFFIX, parse_input_shapes
from frontend.zoo import BenchModel, get_model, is_model_name, model_label

RTOL = ATOL = 1e-3
QUANTIZED_MEAN_ERR = 0.01  # a quantized model's outputs: mean |error| within 1% of the output's largest magnitude
BF16_REL_L2 = 1e-2  # an engine computing in bf16 (--precision, OpenVINO's default): relative L2 error of each output


class Engine(enum.StrEnum):
    """What runs the model."""

    FUSED = "cinn-fused"
    BASELINE = "cinn@baseline"  # the fused build of another install's cinn (--baseline), in that install's worker
    UNFUSED = "cinn-unfused"
    TUNED = "cinn-tuned"
    ORT = "onnxruntime"
    OPENVINO = "openvino"
    OPENVINO_DEFAULT = "openvino-default"  # at its default precision (bf16 on a CPU with AVX512_BF16): --precision
    PADDLE = "paddle-inference"  # Paddle models only, in a Python that has paddle (--paddle-python)


PEERS = (Engine.ORT, Engine.OPENVINO, Engine.OPENVINO_DEFAULT, Engine.PADDLE)
ONNX_PEERS = (Engine.ORT, Engine.OPENVINO, Engine.OPENVINO_DEFAULT)
# compared with the reference's outputs: Paddle Inference's for a Paddle model, else onnxruntime's
CHECKED = (Engine.FUSED, Engine.BASELINE, Engine.TUNED, Engine.OPENVINO, Engine.OPENVINO_DEFAULT, Engine.ORT)
WORKER = "benchmarks.harness"  # this install's worker module
PADDLE_WORKER = "benchmarks.paddle_worker"

# run by the baseline's Python: where its cinn is, and which of its modules is the worker (it moved out of cinn/ when
# the folders became top-level packages; parent and worker still speak the same protocol)
_BASELINE_PROBE = """
import importlib.util, json, os, sys
try:
    import cinn
except ImportError as err:
    sys.exit(f"no cinn there ({err})")
for module in ("benchmarks.harness", "cinn.benchmarks.harness"):
    try:
        found = importlib.util.find_spec(module) is not None
    except ImportError:
        found = False
    if found:
        print(json.dumps({"cinn": os.path.dirname(cinn.__file__), "worker": module}))
        break
else:
    sys.exit("its cinn has no cinn-bench worker (benchmarks.harness)")
"""


@dataclass(frozen=True)
class Baseline:
    """Another install of cinn, timed beside this one: its Python, its cinn package's folder and its worker module."""

    python: str
    cinn_dir: str
    worker: str

    def command(self) -> list[str]:
        """How to start its worker. -P: the current directory is not put first on sys.path, where a checkout of this
        cinn would shadow the baseline's own."""
        return [self.python, "-P", "-m", self.worker]


def _probe(python: str, code: str, timeout: float, missing: str = "") -> tuple[str, dict]:
    """Run `code` in the Python `python` (a path, or a name on PATH) within `timeout` seconds: the interpreter's path
    and the JSON object its last line prints; ValueError saying why not (`missing` added where the probe exits)."""
    exe = shutil.which(python)
    if exe is None:
        raise ValueError(f"{python}: no such Python interpreter")
    try:
        proc = subprocess.run([exe, "-P", "-c", code], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise ValueError(f"{python}: cannot run it ({err})") from None
    if proc.returncode != 0:
        why = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        raise ValueError(f"{python}: {why}{missing}")
    try:
        info = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):  # /bin/true, /bin/echo: not a Python
        raise ValueError(f"{python}: not a Python interpreter") from None
    if not isinstance(info, dict):
        raise ValueError(f"{python}: not a Python interpreter")
    return exe, info


def find_baseline(python: str, timeout: float) -> Baseline:
    """Ask the Python `python` for its cinn, within `timeout` seconds (cinn-bench's bound on a worker getting ready);
    ValueError saying why it cannot be a baseline."""
    exe, info = _probe(python, _BASELINE_PROBE, timeout)
    try:
        return Baseline(exe, info["cinn"], info["worker"])
    except KeyError:
        raise ValueError(f"{python}: not a Python interpreter") from None


# run by the --paddle-python interpreter: its paddle's version
_PADDLE_PROBE = """
import json, sys
try:
    import paddle
except ImportError as err:
    sys.exit(f"no paddle there ({err})")
print(json.dumps({"paddle": paddle.__version__}))
"""


@dataclass(frozen=True)
class PaddlePeer:
    """A Python that has paddle, which runs Paddle Inference's worker, and its paddle's version."""

    python: str
    version: str

    def command(self) -> list[str]:
        """How to start Paddle Inference's worker (with package_path on PYTHONPATH)."""
        return [self.python, "-P", "-m", PADDLE_WORKER]


def find_paddle(python: str, timeout: float) -> PaddlePeer:
    """Ask the Python `python` for its paddle, within `timeout` seconds; ValueError saying why it cannot run Paddle
    Inference, and how to install paddle."""
    exe, info = _probe(python, _PADDLE_PROBE, timeout, f"; Paddle Inference needs paddlepaddle: {PADDLE_EXTRA}, or "
                       "name a Python that has it with --paddle-python")
    try:
        return PaddlePeer(exe, info["paddle"])
    except KeyError:
        raise ValueError(f"{python}: not a Python interpreter") from None


@dataclass(frozen=True)
class ModelRef:
    """A model to benchmark: a built-in model's name or a model file, how reports name it, and what a Paddle model
    set (`benchmarks.paddle_models`) gives with it: the inputs to feed and the ONNX file of the ONNX peers."""

    model: str
    label: str = ""
    feeds: str | None = None  # an .npz of the named inputs; else seeded random ones
    onnx: str | None = None  # the file onnxruntime and OpenVINO run (paddle2onnx's export)
    paddle_set: bool = False  # from a set: the ONNX peers run its ONNX file or nothing, never cinn's export
    input_shapes: tuple[tuple[str, tuple[int, ...]], ...] | None = None  # its own, not the config's (a zoo's model)

    @property
    def name(self) -> str:
        return self.label or model_label(self.model)

    @property
    def is_paddle(self) -> bool:
        """Whether Paddle Inference can run it: a Paddle model file or directory."""
        return is_model_name(self.model) and (self.model.endswith(PADDLE_SUFFIXES) or os.path.isdir(self.model))


def as_model_ref(model: str | ModelRef) -> ModelRef:
    return model if isinstance(model, ModelRef) else ModelRef(model)


@dataclass(frozen=True)
class BenchConfig:
    """Settings shared by every worker."""

    target: str = "llvm"
    repeat: int = 20
    warmup: int = 3
    rounds: int = 1  # every engine times one round in turn, rounds interleaved; the median over rounds is reported
    tuning_log: str | None = None
    small: bool = False
    timeout: float = 1800.0
    input_shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()  # fixed shapes of a model file's symbolic inputs
    baseline: Baseline | None = None  # another install of cinn whose fused build is timed too
    unfused: bool = True  # time the unfused build (one compile more per model)
    paddle: PaddlePeer | None = None  # the Python that runs Paddle Inference on Paddle models
    precision: str = "fp32"  # cinn.compile's precision for cinn's builds; not fp32: OpenVINO at its default too

    @property
    def is_cuda(self) -> bool:
        # read from the target string: the ORT worker must not import cinn (and with it TVM's runtime)
        return self.target.split()[0] == "cuda"

    def engines(self) -> tuple[Engine, ...]:
        """The engines to run: the baseline's build only when one is given, the unfused build unless left out, the
        tuned build only when a schedule log is given, OpenVINO (a CPU peer) where it is installed and the target is a
        CPU."""
        baseline = (Engine.BASELINE,) if self.baseline else ()
        unfused = (Engine.UNFUSED,) if self.unfused else ()
        tuned = (Engine.TUNED,) if self.tuning_log else ()
        openvino = (Engine.OPENVINO, *((Engine.OPENVINO_DEFAULT,) if self.precision != "fp32" else ())) \
            if not self.is_cuda and importlib.util.find_spec("openvino") else ()
        return (Engine.FUSED, *baseline, *unfused, *tuned, Engine.ORT, *openvino)

    def model_engines(self, model: ModelRef) -> tuple[Engine, ...]:
        """The engines to run on one model: Paddle Inference too on a Paddle model (given a Python with paddle); no
        ONNX peer on a set's model that paddle2onnx could not convert, nor on a .cinn program (cinn-quantize's: its
        peers run the ONNX file it came from, given as a model of its own)."""
        engines = self.engines()
        if (model.paddle_set and model.onnx is None) or model.model.endswith(PROGRAM_SUFFIX):
            engines = tuple(e for e in engines if e not in ONNX_PEERS)
        return engines + ((Engine.PADDLE,) if self.paddle and model.is_paddle else ())

    def worker_command(self, engine: Engine) -> list[str]:
        """How to start an engine's worker: the baseline's in its own Python, Paddle Inference's in the Python that has
        paddle, the others in this one."""
        if engine is Engine.BASELINE:
            assert self.baseline is not None
            return self.baseline.command()
        if engine is Engine.PADDLE:
            assert self.paddle is not None
            return self.paddle.command()
        return [sys.executable, "-m", WORKER]


@dataclass(frozen=True)
class EngineResult:
    """What one worker measured: the median over its rounds of each round's median."""

    engine: Engine
    model: str
    median_ms: float
    runs: int
    num_kernels: int | None = None
    compile_cold_s: float | None = None
    compile_cached_s: float | None = None
    rounds_ms: tuple[float, ...] = ()  # each round's median, in the order the rounds ran


@dataclass(frozen=True)
class Check:
    """Agreement of one engine's outputs with onnxruntime's."""

    engine: Engine
    ok: bool
    max_abs_err: float


@dataclass(frozen=True)
class ModelResult:
    """All engines' results for one model; failed engines are absent and named in `errors`."""

    model: str
    results: Mapping[Engine, EngineResult]
    checks: tuple[Check, ...] = ()
    errors: Mapping[Engine, str] = dataclasses.field(default_factory=dict)

    def ms(self, engine: Engine) -> float | None:
        r = self.results.get(engine)
        return r.median_ms if r else None

    def best_peer_ms(self) -> float | None:
        """The faster of onnxruntime and OpenVINO."""
        times = [t for e in PEERS if (t := self.ms(e)) is not None]
        return min(times, default=None)

    def paired_vs_best_peer(self, engine: Engine) -> float | None:
        """The median over rounds of the engine's time over the faster peer's in the same round: robust to the
        machine changing speed between rounds, which the ratio of the medians is not."""
        return self._paired(engine, PEERS)

    def paired(self, engine: Engine, reference: Engine) -> float | None:
        """The median over rounds of the engine's time over the reference engine's in the same round."""
        return self._paired(engine, (reference,))

    def _paired(self, engine: Engine, references: Sequence[Engine]) -> float | None:
        """The median over rounds of the engine's time over the fastest of the references in that round."""
        mine = self.results.get(engine)
        others = [r.rounds_ms for e in references if (r := self.results.get(e)) and r.rounds_ms]
        if mine is None or not mine.rounds_ms or not others:
            return None
        best = [min(times) for times in zip(*others, strict=True)]
        return float(np.median([m / b for m, b in zip(mine.rounds_ms, best, strict=True)]))

    @property
    def failed(self) -> bool:
        return bool(self.errors) or not all(c.ok for c in self.checks)


# ---------------------------------------------------------------------------------------------
# worker side


def _timed_compile(program, config: BenchConfig, fuse: bool, tuning_log: str | None, cache_dir: str | None):
    t0 = time.perf_counter()
    exe = cinn.compile(program, target=config.target, fuse=fuse, tuning_log=tuning_log, cache_dir=cache_dir,
                       precision=config.precision)
    return exe, time.perf_counter() - t0


@dataclass(frozen=True)
class Prepared:
    """An engine ready to be timed: one run of the model, and what preparing it measured."""

    run: Callable[[], list[np.ndarray]]
    num_kernels: int | None = None
    compile_cold_s: float | None = None
    compile_cached_s: float | None = None

    def facts(self) -> dict[str, Any]:
        """What the parent's EngineResult takes from the preparation."""
        return {"num_kernels": self.num_kernels, "compile_cold_s": self.compile_cold_s,
                "compile_cached_s": self.compile_cached_s}


def _prepare_cinn(engine: Engine, model: BenchModel, config: BenchConfig) -> Prepared:
    """Compile a cinn executable (cold and cached, for the fused and tuned builds)."""
    cold = cached = None
    if engine is Engine.UNFUSED:
        exe, _ = _timed_compile(model.program, config, False, None, None)
    else:
        log = config.tuning_log if engine is Engine.TUNED else None
        with tempfile.TemporaryDirectory(prefix="cinn-bench-cache-") as cache_dir:
            _, cold = _timed_compile(model.program, config, True, log, cache_dir)
            exe, cached = _timed_compile(model.program, config, True, log, cache_dir)
    feeds = dict(model.feeds)
    return Prepared(lambda: exe.run(feeds), exe.num_kernels, cold, cached)


def ort_session(onnx_model, cuda: bool = False):
    """An onnxruntime session with the harness's settings: all cores, sequential, all graph optimizations; on the
    CUDA provider for a cuda target (onnxruntime-gpu), else on the CPU."""
    import onnxruntime as ort  # an optional extra (bench): only the onnxruntime worker needs it

    provider = "CUDAExecutionProvider" if cuda else "CPUExecutionProvider"
    if provider not in ort.get_available_providers():
        raise RuntimeError(f"onnxruntime has no {provider} here (install onnxruntime-gpu for a cuda target)")
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = os.cpu_count() or 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.log_severity_level = 3  # errors only: its warnings are about the file (paddle2onnx's: a line per unused constant)
    return ort.InferenceSession(onnx_model.SerializeToString(), opts, providers=[provider])


OnnxSource = str | onnx.ModelProto  # an ONNX file, or a model exported in memory


def _prepare_ort(source: OnnxSource, feeds: Mapping[str, np.ndarray], config: BenchConfig) -> Prepared:
    sess = ort_session(onnx.load(source) if isinstance(source, str) else source, cuda=config.is_cuda)
    feeds = dict(feeds)
    return Prepared(lambda: sess.run(None, feeds))


def openvino_runner(onnx_path: str, f32: bool = True) -> Callable[[Mapping[str, np.ndarray]], list[np.ndarray]]:
    """OpenVINO on the CPU with all cores, the latency hint and float32 precision (its default may be bf16 where the
    CPU has it, which would not compute the same model; without `f32`, its default): a function of the feeds giving
    the outputs."""
    import openvino as ov  # an optional extra (bench): only the OpenVINO worker needs it

    hints = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": os.cpu_count() or 1}
    compiled = ov.Core().compile_model(onnx_path, "CPU", {**hints, **({"INFERENCE_PRECISION_HINT": "f32"} if f32 else {})})
    request = compiled.create_infer_request()

    def run(feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        results = request.infer(feeds, share_outputs=False)
        return [results[o] for o in compiled.outputs]

    return run


def _prepare_openvino(source: OnnxSource, feeds: Mapping[str, np.ndarray], f32: bool) -> Prepared:
    if isinstance(source, str):
        run = openvino_runner(source, f32)
    else:
        with tempfile.TemporaryDirectory(prefix="cinn-bench-ov-") as tmp:
            onnx.save(source, os.path.join(tmp, "model.onnx"))
            run = openvino_runner(os.path.join(tmp, "model.onnx"), f32)
    feeds = dict(feeds)
    return Prepared(lambda: run(feeds))


def _bench_model(model_name: str, config: BenchConfig, feeds_path: str | None) -> BenchModel:
    """A model as cinn imports it, fed the inputs saved in `feeds_path` or seeded random ones."""
    model = get_model(model_name, config.small, dict(config.input_shapes))
    return dataclasses.replace(model, feeds=load_feeds(feeds_path)) if feeds_path else model


def _onnx_peer_input(model_name: str, config: BenchConfig, feeds_path: str | None,
                     onnx_path: str | None) -> tuple[OnnxSource, Mapping[str, np.ndarray]]:
    """What an ONNX peer runs, on which inputs: a set's ONNX file as it is, without importing the model into cinn
    (cinn may not read it); an imported ONNX file as it is (onnxruntime optimizes the original graph, not our export
    of it); else cinn's export of the model."""
    if onnx_path and feeds_path:
        return onnx_path, load_feeds(feeds_path)
    model = _bench_model(model_name, config, feeds_path)
    return model.onnx_path or to_onnx(model.program), model.feeds


def prepare(engine: Engine, model_name: str, config: BenchConfig, feeds_path: str | None = None,
            onnx_path: str | None = None) -> Prepared:
    """Get one engine ready to time one model in this process, on the inputs saved in `feeds_path` (else seeded random
    ones); the ONNX peers run `onnx_path` where given."""
    if engine in ONNX_PEERS:
        source, feeds = _onnx_peer_input(model_name, config, feeds_path, onnx_path)
        if engine is Engine.ORT:
            return _prepare_ort(source, feeds, config)
        return _prepare_openvino(source, feeds, f32=engine is Engine.OPENVINO)
    return _prepare_cinn(engine, _bench_model(model_name, config, feeds_path), config)


def run_worker(engine: Engine, model_name: str, config: BenchConfig, outputs_path: str | None) -> EngineResult:
    """Measure one engine on one model in this process, one round; optionally save a first run's outputs (.npz)."""
    prepared = prepare(engine, model_name, config)
    if outputs_path:
        save_outputs(outputs_path, prepared.run())
    ms = round_ms(prepared.run, config.repeat, config.warmup, first=True)
    return EngineResult(engine, model_label(model_name), ms, config.repeat, **prepared.facts(), rounds_ms=(ms,))


# ---------------------------------------------------------------------------------------------
# parent side


def _progress(msg: str) -> None:
    print(f"[cinn-bench] {msg}", file=sys.stderr, flush=True)


def _paddle_model_file(path: str) -> str:
    """The model file Paddle Inference loads: the file itself, or the one in a model directory."""
    from frontend.paddle.loader import resolve_model_path  # the parent's alone: workers need not load the importer

    return resolve_model_path(path)


def _worker_args(engine: Engine, model: ModelRef, config: BenchConfig, outputs_path: str) -> list[str]:
    timing = ["--repeat", str(config.repeat), "--warmup", str(config.warmup), "--outputs", outputs_path]
    if engine is Engine.PADDLE:  # benchmarks.paddle_worker's arguments
        assert model.feeds is not None
        return [_paddle_model_file(model.model), "--feeds", model.feeds, *timing]
    # the baseline's worker builds its own install's fused cinn
    args = ["--worker", (Engine.FUSED if engine is Engine.BASELINE else engine).value, model.model]
    args += ["--target", config.target, *timing]
    if model.feeds:
        args += ["--feeds", model.feeds]
    if model.onnx and engine in ONNX_PEERS:
        args += ["--onnx", model.onnx]
    if config.tuning_log:
        args += ["--log", config.tuning_log]
    if config.small:
        args.append("--small")
    if engine is not Engine.BASELINE and config.precision != "fp32":  # (the baseline's cinn may not take it)
        args += ["--precision", config.precision]
    for name, shape in config.input_shapes:
        args += ["--input-shape", f"{name}={','.join(map(str, shape))}"]
    return args


def spawn_module(module: str, args: Sequence[str], timeout: float, env: Mapping[str, str] | None = None,
                 unset: Sequence[str] = ()) -> str:
    """Run `python -m module args` in a fresh interpreter; its stderr passes through, its last stdout line is returned.

    `env` adds variables to the environment (e.g. thread counts that must be set before a runtime starts); `unset`
    removes some.
    """
    full_env = {k: v for k, v in dict(os.environ, **(env or {})).items() if k not in unset}
    proc = subprocess.run([sys.executable, "-m", module, *args], stdout=subprocess.PIPE, text=True, timeout=timeout,
                          env=spawner_env(full_env))
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"worker {module} exited with status {proc.returncode}")
    return lines[-1]


def package_path(folder: str) -> str:
    """`folder`, holding a link to this install's benchmarks package and nothing else: what another Python puts on its
    PYTHONPATH to run a worker module of it (Paddle Inference's) without this environment's other packages."""
    os.symlink(os.path.dirname(os.path.abspath(__file__)), os.path.join(folder, "benchmarks"))
    return folder


class Worker:
    """One engine's worker process, kept alive over a model's rounds: started, it prepares its engine; each
    `time_round` asks it for one round. (Paddle Inference's worker cannot ask to die with cinn-bench, as the others do:
    it ends at the end of its input.)"""

    def __init__(self, engine: Engine, model: str | ModelRef, config: BenchConfig, outputs_path: str):
        self.engine, self.timeout = engine, config.timeout
        args = _worker_args(engine, as_model_ref(model), config, outputs_path)
        env = spawner_env()
        self._path = tempfile.TemporaryDirectory(prefix="cinn-bench-path-") if engine is Engine.PADDLE else None
        if self._path is not None:
            env["PYTHONPATH"] = package_path(self._path.name)
        self.proc = subprocess.Popen([*config.worker_command(engine), *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)
        try:
            self.facts = json.loads(self._reply())
        except BaseException:  # an error, Ctrl-C: a worker still preparing would finish its compile first
            self.proc.kill()
            self.proc.wait()
            self._remove_path()
            raise

    def _reply(self) -> str:
        """The worker's next line, within the timeout."""
        assert self.proc.stdout is not None
        if not select.select([self.proc.stdout], [], [], self.timeout)[0]:
            self.proc.kill()  # hung: it would not read the end of its input either
            self.proc.wait()
            raise subprocess.TimeoutExpired(self.proc.args, self.timeout)
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.engine.value} worker exited with status {self.proc.wait()}")
        return line

    def time_round(self) -> float:
        """One round's median milliseconds."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("time\n")
        self.proc.stdin.flush()
        return float(json.loads(self._reply())["ms"])

    def close(self) -> None:
        """End the worker (end of its input), killing it if it does not exit."""
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.close()
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self._remove_path()

    def _remove_path(self) -> None:
        if self._path is not None:
            self._path.cleanup()

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def compare(engine: Engine, got: Sequence[np.ndarray], want: Sequence[np.ndarray], quantized: bool = False,
            bf16: bool = False) -> Check:
    """Check an engine's outputs against the reference: rtol/atol 1e-3; for a quantized model, whose engines may
    round an intermediate value to the neighbouring step (each such flip moves what follows), a mean absolute error
    within QUANTIZED_MEAN_ERR of the output's magnitude; for an engine computing in bf16, a relative L2 error within
    BF16_REL_L2."""
    if len(got) != len(want) or any(g.shape != w.shape for g, w in zip(got, want, strict=True)):
        return Check(engine, False, float("inf"))
    pairs = [(g.astype(np.float64), w.astype(np.float64)) for g, w in zip(got, want, strict=True)]
    err = max((float(np.max(np.abs(g - w), initial=0.0)) for g, w in pairs), default=0.0)
    if bf16:
        ok = all(np.linalg.norm(g - w) <= BF16_REL_L2 * np.linalg.norm(w) for g, w in pairs)
    elif quantized:
        ok = all(np.mean(np.abs(g - w)) <= QUANTIZED_MEAN_ERR * max(float(np.max(np.abs(w), initial=0.0)), 1e-6)
                 for g, w in pairs if w.size)
    else:
        ok = all(np.allclose(g, w, rtol=RTOL, atol=ATOL) for g, w in pairs)
    return Check(engine, ok, err)


def is_quantized(model: str) -> bool:
    """Whether a model file holds quantization ops (QDQ pairs, QOperator or dynamic quantization)."""
    if not model.endswith(".onnx"):
        return False
    ops = {n.op_type for n in onnx.load(model, load_external_data=False).graph.node}
    return bool(ops & {"QuantizeLinear", "DynamicQuantizeLinear", "QLinearConv", "QLinearMatMul", "MatMulInteger",
                       "ConvInteger"})


WORKER_ERRORS = (RuntimeError, subprocess.TimeoutExpired, OSError, ValueError)


def _write_feeds(model: ModelRef, config: BenchConfig, folder: str) -> str:
    """Save the seeded random inputs cinn's workers make for a model file, for a worker that cannot make them."""
    path = os.path.join(folder, "feeds.npz")
    save_feeds(path, get_model(model.model, config.small, dict(config.input_shapes)).feeds)
    return path


def bench_model(model: str | ModelRef, config: BenchConfig) -> ModelResult:
    """Run every engine on one model (each in its own worker process, kept for `config.rounds` rounds that visit the
    engines in a rotating order; the median over rounds reported) and cross-check the outputs with the reference's:
    Paddle Inference's for a Paddle model, else onnxruntime's."""
    ref = as_model_ref(model)
    if ref.input_shapes is not None:
        config = dataclasses.replace(config, input_shapes=ref.input_shapes)
    name = ref.name
    engines = config.model_engines(ref)
    errors: dict[Engine, str] = {}
    outputs: dict[Engine, list[np.ndarray]] = {}
    times: dict[Engine, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="cinn-bench-") as tmp, contextlib.ExitStack() as stack:
        if Engine.PADDLE in engines and ref.feeds is None:
            ref = dataclasses.replace(ref, feeds=_write_feeds(ref, config, tmp))
        workers: dict[Engine, Worker] = {}
        for engine in engines:
            _progress(f"{name}: {engine.value} preparing ...")
            path = os.path.join(tmp, f"{engine.value}.npz")
            try:
                workers[engine] = stack.enter_context(Worker(engine, ref, config, path))
                outputs[engine] = load_outputs(path)
            except WORKER_ERRORS as err:
                errors[engine] = str(err)
                _progress(f"{name}: {engine.value} FAILED: {err}")
        for k in range(config.rounds):
            for engine in _rotated(list(workers), k):
                if engine in errors:
                    continue
                label = f"{name}: {engine.value}" + (f" (round {k + 1}/{config.rounds})" if config.rounds > 1 else "")
                try:
                    times.setdefault(engine, []).append(workers[engine].time_round())
                except WORKER_ERRORS as err:
                    errors[engine] = str(err)
                    workers[engine].close()
                    _progress(f"{label} FAILED: {err}")
                    continue
                _progress(f"{label} {times[engine][-1]:.3f} ms")
    results = {e: _result(e, name, workers[e].facts, ts, config) for e, ts in times.items() if e not in errors}
    reference = Engine.PADDLE if Engine.PADDLE in outputs else Engine.ORT
    checked = [e for e in outputs if e in CHECKED and e is not reference] if reference in outputs else []
    quantized = is_quantized(ref.model)
    bf16 = {Engine.OPENVINO_DEFAULT, *((Engine.FUSED, Engine.UNFUSED, Engine.TUNED) if config.precision != "fp32" else ())}
    checks = tuple(compare(e, outputs[e], outputs[reference], quantized, e in bf16) for e in checked)
    tolerance = f"mean abs err {QUANTIZED_MEAN_ERR:.0%} of the output's magnitude" if quantized else f"rtol/atol {RTOL}"
    for c in checks:
        if not c.ok:
            _progress(f"!!! MISMATCH {name}: {c.engine.value} differs from {reference.value} (max abs err "
                      f"{c.max_abs_err:.3g}, {tolerance})")
    return ModelResult(name, results, checks, errors)


def _rotated(engines: list[Engine], k: int) -> list[Engine]:
    """Round k's order: each engine in turn goes first, so none always follows the same one."""
    k %= max(len(engines), 1)
    return engines[k:] + engines[:k]


def _result(engine: Engine, model: str, facts: Mapping[str, Any], rounds_ms: list[float], config: BenchConfig) -> EngineResult:
    """One engine's result over rounds: the median of the rounds' medians, with what preparing it measured."""
    return EngineResult(engine, model, float(np.median(rounds_ms)), config.repeat * len(rounds_ms), **facts,
                        rounds_ms=tuple(rounds_ms))


def run_benchmarks(models: Sequence[str | ModelRef], config: BenchConfig) -> list[ModelResult]:
    """Benchmark each model in turn."""
    return [bench_model(m, config) for m in models]


def _worker_main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=f"python -m {WORKER}",
                                description="Prepare one engine on one model, then time a round per line read on stdin "
                                "(a cinn-bench worker).")
    p.add_argument("--worker", required=True, choices=[e.value for e in Engine if e not in (Engine.BASELINE, Engine.PADDLE)],
                   help="engine to run")
    p.add_argument("model", help="built-in model name or model file")
    p.add_argument("--target", default="llvm")
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--log", default=None, help="schedule log for the tuned engine")
    p.add_argument("--small", action="store_true", help="small model sizes (tests)")
    p.add_argument("--input-shape", action="append", default=[], metavar="NAME=D0,D1,...")
    p.add_argument("--outputs", default=None, help="save the outputs to this .npz file")
    p.add_argument("--feeds", default=None, help="feed the named inputs saved in this .npz file (else seeded random ones)")
    p.add_argument("--onnx", default=None, help="the ONNX file onnxruntime and OpenVINO run (with --feeds)")
    p.add_argument("--precision", default="fp32", help="cinn.compile's precision")
    a = p.parse_args(argv)
    shapes = tuple(parse_input_shapes(a.input_shape).items())
    config = BenchConfig(target=a.target, repeat=a.repeat, warmup=a.warmup, tuning_log=a.log, small=a.small, input_shapes=shapes,
                         precision=a.precision)

    def ready() -> tuple[Callable[[], list[np.ndarray]], dict[str, Any]]:
        prepared = prepare(Engine(a.worker), a.model, config, a.feeds, a.onnx)
        return prepared.run, prepared.facts()

    # no CUDA device, a model that cannot be imported: one line
    return work(ready, a.repeat, a.warmup, a.outputs, (RuntimeError, *USER_ERRORS), f"{a.model}: {a.worker}")


if __name__ == "__main__":
    die_with_spawner()
    try:
        sys.exit(_worker_main())
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group: cinn-bench itself says so, once
        sys.exit(ExitStatus.INTERRUPTED)
