"""A Paddle model set for cinn-bench: paddle.vision CNNs and paddle.nn text models, randomly initialized from a fixed
seed, saved as inference models in both formats with Paddle Inference's outputs as references, and as ONNX files by
paddle2onnx (for onnxruntime and OpenVINO) where it converts them.

    python -m benchmarks.paddle_models export DIR [MODEL ...] [--small]

writes, for each model, `DIR/NAME/{pir,legacy}/inference.*` and `reference.npz` (Paddle Inference's outputs on the
CPU), `DIR/NAME/inputs.npz` (the inputs of the references) and `DIR/NAME/model.onnx`, and `DIR/manifest.json`, which
names them with the inputs' and outputs' names, shapes and dtypes and every step that failed; `cinn-bench --paddle-set
DIR` runs the set. It needs paddlepaddle and paddle2onnx (`pip install cinn[paddle]`), not cinn's own dependencies:
this module imports paddle only in the child processes that save each format (FLAGS_enable_pir_api is read when
paddle is imported), so cinn-bench reads manifests without paddle.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import pathlib
import shutil
import sys
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from benchmarks.paddle_export import (
    PADDLE_EXTRA,
    InputDef,
    InputKind,
    PaddleFormat,
    PaddleInference,
    params_path,
    patch_legacy_apis,
    save_layer,
    spawn_in_format,
)
from benchmarks.worker_protocol import load_outputs, save_feeds, save_outputs

SEED = 0
MANIFEST = "manifest.json"
MANIFEST_VERSION = 1
INPUTS_FILE = "inputs.npz"
REFERENCE_FILE = "reference.npz"
ONNX_FILE = "model.onnx"
RESULT_FILE = "result.json"  # what a format's child process reports for one model, merged into the manifest
ONNX_OPSET = 17
CALIBRATION_BATCHES, CALIBRATION_BATCH = 3, 4  # batch norm's running statistics: the mean over these batches
SENSITIVITY = 1e-4  # a model whose outputs on two inputs differ by less than this (relative) is refused
FORMATS_AGREE = 1e-4  # rtol and atol of the two formats' references

log = logging.getLogger("benchmarks.paddle_models")


# ---------------------------------------------------------------------------------------------
# the models


@dataclass(frozen=True)
class SetModel:
    """A model of the set: a factory of its paddle Layer (given paddle and whether to make the small size) and its
    inputs (at batch 1)."""

    name: str
    build: Callable[[Any, bool], Any]
    inputs: Callable[[bool], tuple[InputDef, ...]]


def _image(small: bool) -> tuple[InputDef, ...]:
    side = 64 if small else 224
    return (InputDef("x", (1, 3, side, side), (1, 3, side, side)),)


def _vision(name: str) -> SetModel:
    def build(paddle: Any, small: bool) -> Any:
        return getattr(paddle.vision.models, name)()

    return SetModel(name, build, _image)


def _googlenet(paddle: Any, small: bool) -> Any:
    """GoogLeNet as deployed: paddle's returns the auxiliary classifiers' outputs too, which inference drops."""

    class Main(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.net = paddle.vision.models.googlenet()

        def forward(self, x):
            return self.net(x)[0]

    return Main()


@dataclass(frozen=True)
class TextSizes:
    """A text model's sizes."""

    vocab: int
    seq: int
    hidden: int
    heads: int
    ffn: int
    layers: int
    classes: int = 2


TRANSFORMER = {False: TextSizes(0, 64, 256, 4, 1024, 4), True: TextSizes(0, 8, 32, 2, 64, 2)}
ERNIE = {False: TextSizes(40000, 128, 384, 12, 1536, 6), True: TextSizes(100, 16, 32, 2, 64, 2)}  # ERNIE 3.0 mini
LSTM = {False: TextSizes(10000, 64, 256, 0, 128, 2, classes=4), True: TextSizes(100, 8, 16, 0, 16, 2, classes=4)}


def _transformer_encoder(paddle: Any, small: bool) -> Any:
    s = TRANSFORMER[small]
    layer = paddle.nn.TransformerEncoderLayer(s.hidden, s.heads, s.ffn, dropout=0.1)
    return paddle.nn.TransformerEncoder(layer, s.layers)


def _ernie_encoder(paddle: Any, small: bool) -> Any:
    """An ERNIE-style classifier: word, position and token-type embeddings, a post-norm GELU encoder whose attention
    masks the padding (id 0, the mask computed from the ids), a tanh pooler on the first token and a classifier."""
    nn: Any = paddle.nn
    s = ERNIE[small]

    class Ernie(nn.Layer):
        def __init__(self):
            super().__init__()
            self.word = nn.Embedding(s.vocab, s.hidden, padding_idx=0)
            self.position = nn.Embedding(512, s.hidden)
            self.token_type = nn.Embedding(2, s.hidden)
            self.norm = nn.LayerNorm(s.hidden)
            self.dropout = nn.Dropout(0.1)
            layer = nn.TransformerEncoderLayer(s.hidden, s.heads, s.ffn, dropout=0.1, activation="gelu")
            self.encoder = nn.TransformerEncoder(layer, s.layers)
            self.pooler = nn.Linear(s.hidden, s.hidden)
            self.classifier = nn.Linear(s.hidden, s.classes)

        def forward(self, input_ids, token_type_ids):
            positions = paddle.arange(input_ids.shape[1], dtype="int64").unsqueeze(0)
            h = self.word(input_ids) + self.position(positions) + self.token_type(token_type_ids)
            h = self.dropout(self.norm(h))
            keep = paddle.cast(input_ids != 0, "float32")
            mask = paddle.unsqueeze((keep - 1.0) * 1e4, [1, 2])  # -1e4 on the padding, added to the scores
            h = self.encoder(h, mask)
            return self.classifier(paddle.tanh(self.pooler(h[:, 0])))

    return Ernie()


def _lstm_classifier(paddle: Any, small: bool) -> Any:
    """Embedding, a 2-layer bidirectional LSTM and a classifier on the last layer's final states of both directions."""
    nn: Any = paddle.nn
    s = LSTM[small]

    class LSTMClassifier(nn.Layer):
        def __init__(self):
            super().__init__()
            self.embedding = nn.Embedding(s.vocab, s.ffn, padding_idx=0)
            self.lstm = nn.LSTM(s.ffn, s.hidden, num_layers=s.layers, direction="bidirect")
            self.classifier = nn.Linear(2 * s.hidden, s.classes)

        def forward(self, input_ids):
            _, (h, _) = self.lstm(self.embedding(input_ids))
            return self.classifier(paddle.concat([h[-2], h[-1]], axis=-1))

    return LSTMClassifier()


def _tokens(sizes: Mapping[bool, TextSizes], *names: str) -> Callable[[bool], tuple[InputDef, ...]]:
    def inputs(small: bool) -> tuple[InputDef, ...]:
        s = sizes[small]
        vocabs = {"input_ids": s.vocab, "token_type_ids": 2}
        return tuple(InputDef(n, (1, s.seq), (1, s.seq), InputKind.TOKENS, vocabs[n]) for n in names)

    return inputs


def _sequence(small: bool) -> tuple[InputDef, ...]:
    s = TRANSFORMER[small]
    return (InputDef("x", (1, s.seq, s.hidden), (1, s.seq, s.hidden)),)


VISION = ("resnet50", "mobilenet_v2", "mobilenet_v3_large", "shufflenet_v2_x1_0", "vgg16", "squeezenet1_1",
          "densenet121")
MODELS: dict[str, SetModel] = {name: _vision(name) for name in VISION}
MODELS["googlenet"] = SetModel("googlenet", _googlenet, _image)
MODELS["transformer_encoder"] = SetModel("transformer_encoder", _transformer_encoder, _sequence)
MODELS["ernie_encoder"] = SetModel("ernie_encoder", _ernie_encoder, _tokens(ERNIE, "input_ids", "token_type_ids"))
MODELS["lstm_classifier"] = SetModel("lstm_classifier", _lstm_classifier, _tokens(LSTM, "input_ids"))


# ---------------------------------------------------------------------------------------------
# the manifest


@dataclass(frozen=True)
class TensorInfo:
    """A model input's or output's name, shape and dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> TensorInfo:
        return TensorInfo(str(d["name"]), tuple(int(x) for x in d["shape"]), str(d["dtype"]))


@dataclass(frozen=True)
class SetEntry:
    """One model of a saved set: its tensors and files (relative to the manifest's folder), and the steps that failed
    (a format or "onnx": why)."""

    name: str
    inputs: tuple[TensorInfo, ...] = ()
    outputs: tuple[TensorInfo, ...] = ()
    inputs_file: str | None = None
    models: Mapping[PaddleFormat, str] = field(default_factory=dict)
    references: Mapping[PaddleFormat, str] = field(default_factory=dict)
    onnx: str | None = None
    errors: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"inputs": [t.to_json() for t in self.inputs], "outputs": [t.to_json() for t in self.outputs],
                "inputs_file": self.inputs_file, "formats": {f.value: {"model": m, "reference": self.references[f]}
                                                             for f, m in self.models.items()},
                "onnx": self.onnx, "errors": dict(self.errors)}

    @staticmethod
    def from_json(name: str, d: Mapping[str, Any]) -> SetEntry:
        formats = {PaddleFormat(f): v for f, v in d.get("formats", {}).items()}
        return SetEntry(name, tuple(TensorInfo.from_json(t) for t in d.get("inputs", ())),
                        tuple(TensorInfo.from_json(t) for t in d.get("outputs", ())), d.get("inputs_file"),
                        {f: str(v["model"]) for f, v in formats.items()},
                        {f: str(v["reference"]) for f, v in formats.items()}, d.get("onnx"),
                        {str(k): str(v) for k, v in d.get("errors", {}).items()})


@dataclass(frozen=True)
class Manifest:
    """A saved model set: its folder, the versions that made it, and its models."""

    directory: pathlib.Path
    paddle: str
    paddle2onnx: str | None
    small: bool
    models: tuple[SetEntry, ...]

    def path(self, relative: str) -> pathlib.Path:
        return self.directory / relative

    def entry(self, name: str) -> SetEntry | None:
        return next((e for e in self.models if e.name == name), None)

    def to_json(self) -> dict[str, Any]:
        return {"version": MANIFEST_VERSION, "seed": SEED, "paddle": self.paddle, "paddle2onnx": self.paddle2onnx,
                "small": self.small, "models": {e.name: e.to_json() for e in self.models}}

    def write(self) -> pathlib.Path:
        path = self.directory / MANIFEST
        path.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        return path


def read_manifest(path: str | os.PathLike) -> Manifest:
    """A set's manifest, from its folder or its manifest.json; ValueError saying what is wrong."""
    file = pathlib.Path(path)
    if file.is_dir():
        file = file / MANIFEST
    try:
        d = json.loads(file.read_text())
        if d.get("version") != MANIFEST_VERSION:
            raise ValueError(f"version {d.get('version')!r}, expected {MANIFEST_VERSION}")
        models = tuple(SetEntry.from_json(name, e) for name, e in d["models"].items())
        return Manifest(file.parent, str(d["paddle"]), d.get("paddle2onnx"), bool(d.get("small", False)), models)
    except FileNotFoundError:
        raise ValueError(f"{path}: no {MANIFEST} (write one with python -m benchmarks.paddle_models export)") from None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise ValueError(f"{file}: not a Paddle model set manifest ({type(err).__name__}: {err})") from None


# ---------------------------------------------------------------------------------------------
# export: one child process per format


class Refused(Exception):
    """A model whose saved form cannot serve as a benchmark (outputs that ignore the input, or are not finite)."""


class Progress:
    """A line per model: redrawn in place as its steps go on a terminal, a log record when it ends elsewhere."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()

    def step(self, msg: str) -> None:
        if self.tty:
            print(f"\r\033[K{msg}", end="", file=sys.stderr, flush=True)

    def done(self, msg: str, failed: bool = False) -> None:
        if self.tty:
            print(f"\r\033[K{msg}", file=sys.stderr, flush=True)
        else:
            (log.warning if failed else log.info)(msg)


def _seed(name: str) -> int:
    """Each model's seed: the same in every process, for the weights, the calibration batches and the inputs."""
    return SEED + zlib.crc32(name.encode())


def _calibrate(paddle: Any, layer: Any, inputs: Sequence[InputDef], rng: np.random.Generator) -> None:
    """Set batch norm's running statistics to their mean over random batches (the model in train mode), so that the
    outputs depend on the input rather than on the initial statistics."""
    norms = [s for s in layer.sublayers() if isinstance(s, paddle.nn.layer.norm._BatchNormBase)]
    if not norms:
        return
    momentum = [n._momentum for n in norms]
    layer.train()
    with paddle.no_grad():
        for k in range(CALIBRATION_BATCHES):
            for n in norms:
                n._momentum = k / (k + 1)  # running = k/(k+1) running + 1/(k+1) batch: the mean of the batches so far
            batch = [InputDef(i.name, i.spec, (CALIBRATION_BATCH, *i.sample[1:]), i.kind, i.vocab).draw(rng) for i in inputs]
            layer(*[paddle.to_tensor(a) for a in batch])
    for n, m in zip(norms, momentum, strict=True):
        n._momentum = m


def _check_sensitive(outputs: Sequence[np.ndarray], others: Sequence[np.ndarray]) -> None:
    """Refuse outputs that are not finite or do not change with the input."""
    for k, (a, b) in enumerate(zip(outputs, others, strict=True)):
        if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
            raise Refused(f"output {k} is not finite")
        scale = max(float(np.max(np.abs(a), initial=0.0)), 1e-30)
        if float(np.max(np.abs(a.astype(np.float64) - b), initial=0.0)) <= SENSITIVITY * scale:
            raise Refused(f"output {k} does not change with the input")


def _export_onnx(model_file: pathlib.Path, target: pathlib.Path) -> None:
    """paddle2onnx's export of a PIR model (without its Polygraphy folding, which would pip-install packages)."""
    import paddle2onnx  # an optional extra (paddle), like paddle

    paddle2onnx.export(str(model_file), params_path(model_file), str(target), opset_version=ONNX_OPSET,
                       enable_onnx_checker=True, optimize_tool="none")


def _save_model(paddle: Any, model: SetModel, fmt: PaddleFormat, out: pathlib.Path, small: bool,
                progress: Progress, label: str) -> dict[str, Any]:
    """Build, calibrate, save and check one model in this process's format; what the manifest takes from it."""
    rng = np.random.default_rng(_seed(model.name))
    paddle.seed(_seed(model.name))
    inputs = model.inputs(small)
    progress.step(f"{label}: building")
    layer = model.build(paddle, small)
    progress.step(f"{label}: batch norm statistics")
    _calibrate(paddle, layer, inputs, rng)
    layer.eval()
    folder = out / model.name / fmt.value
    shutil.rmtree(folder, ignore_errors=True)
    progress.step(f"{label}: saving")
    save_layer(paddle, layer, inputs, folder)
    model_file = fmt.model_file(folder)
    progress.step(f"{label}: Paddle Inference reference")
    predictor = PaddleInference(model_file, os.cpu_count() or 1)
    feeds = {i.name: i.draw(rng) for i in inputs}
    outputs = predictor.run(feeds)
    _check_sensitive(outputs, predictor.run({i.name: i.draw(rng) for i in inputs}))
    save_outputs(str(folder / REFERENCE_FILE), outputs)
    save_feeds(str(out / model.name / INPUTS_FILE), feeds)
    result: dict[str, Any] = {
        "inputs": [TensorInfo(i.name, i.sample, i.dtype).to_json() for i in inputs],
        "outputs": [TensorInfo(n, o.shape, str(o.dtype)).to_json() for n, o in zip(predictor.output_names, outputs,
                                                                                 strict=True)],
        "model": model_file.relative_to(out).as_posix(), "reference": (folder / REFERENCE_FILE).relative_to(out).as_posix()}
    if fmt is PaddleFormat.PIR:
        progress.step(f"{label}: paddle2onnx")
        try:
            _export_onnx(model_file, out / model.name / ONNX_FILE)
            result["onnx"] = f"{model.name}/{ONNX_FILE}"
        except Exception as err:  # paddle2onnx raises anything, or exits via its C++ part's errors
            result["onnx_error"] = _why(err)
    return result


def _why(err: Exception) -> str:
    """An error in one line: paddle's messages end with the operator check that failed, after the traced code."""
    lines = [line.strip() for line in f"{type(err).__name__}: {err}".splitlines() if line.strip()]
    return next((line for line in reversed(lines) if "Error" in line), lines[0])


def _child(fmt: PaddleFormat, out: pathlib.Path, names: Sequence[str], small: bool) -> None:
    """Save the models in one format (FLAGS_enable_pir_api set by the parent), each model's result in its folder."""
    import paddle

    paddle.set_device("cpu")
    if fmt is PaddleFormat.LEGACY:
        patch_legacy_apis(paddle)
    progress = Progress()
    for k, name in enumerate(names):
        label = f"[{k + 1}/{len(names)}] {name} ({fmt.value})"
        try:
            result = _save_model(paddle, MODELS[name], fmt, out, small, progress, label)
        except Exception as err:  # any model's failure is recorded, and the others still saved
            result = {"error": _why(err)}
            shutil.rmtree(out / name / fmt.value, ignore_errors=True)
        (out / name).mkdir(parents=True, exist_ok=True)
        (out / name / f"{fmt.value}-{RESULT_FILE}").write_text(json.dumps(result))
        failed = "error" in result
        status = f"FAILED: {result['error']}" if failed else "saved" + (
            "" if fmt is not PaddleFormat.PIR else ", ONNX" if "onnx" in result else ", no ONNX")
        progress.done(f"{label}: {status}", failed)


def _entry(out: pathlib.Path, name: str) -> SetEntry:
    """Merge the formats' results for one model; the formats' references must agree."""
    results = {f: json.loads((out / name / f"{f.value}-{RESULT_FILE}").read_text()) for f in PaddleFormat}
    errors = {f.value: r["error"] for f, r in results.items() if "error" in r}
    saved = {f: r for f, r in results.items() if "error" not in r}
    if PaddleFormat.PIR in saved and "onnx_error" in saved[PaddleFormat.PIR]:
        errors["onnx"] = saved[PaddleFormat.PIR]["onnx_error"]
    if len(saved) == 2:
        pir, legacy = (load_outputs(str(out / saved[f]["reference"])) for f in PaddleFormat)
        if not all(np.allclose(a, b, rtol=FORMATS_AGREE, atol=FORMATS_AGREE) for a, b in zip(pir, legacy, strict=True)):
            errors["legacy"] = "its reference differs from the PIR model's"
            del saved[PaddleFormat.LEGACY]
    for f in PaddleFormat:
        (out / name / f"{f.value}-{RESULT_FILE}").unlink()
    first: dict[str, Any] = next(iter(saved.values()), {})
    return SetEntry(name, tuple(TensorInfo.from_json(t) for t in first.get("inputs", ())),
                    tuple(TensorInfo.from_json(t) for t in first.get("outputs", ())),
                    f"{name}/{INPUTS_FILE}" if saved else None, {f: r["model"] for f, r in saved.items()},
                    {f: r["reference"] for f, r in saved.items()}, first.get("onnx"), errors)


def _versions() -> tuple[str, str | None]:
    """paddle's and paddle2onnx's versions, from their installed metadata (importing paddle here would fix the
    format this process saves)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        p2o = version("paddle2onnx")
    except PackageNotFoundError:
        p2o = None
    return version("paddlepaddle"), p2o


def export(out: pathlib.Path, names: Sequence[str], small: bool) -> Manifest:
    """Save the named models in both formats (a child process each) and write the manifest."""
    out.mkdir(parents=True, exist_ok=True)
    for fmt in PaddleFormat:
        command = [sys.executable, "-m", "benchmarks.paddle_models", "export", str(out), *names, "--child", fmt.value]
        spawn_in_format(fmt, command + (["--small"] if small else []))
    paddle_version, p2o = _versions()
    try:  # a set exported model by model: the models of an earlier export of the same sizes stay
        earlier = read_manifest(out)
        kept = tuple(e for e in earlier.models if e.name not in names) if earlier.small == small else ()
    except ValueError:
        kept = ()
    manifest = Manifest(out, paddle_version, p2o, small, kept + tuple(_entry(out, n) for n in names))
    manifest.write()
    return manifest


def _summary(manifest: Manifest) -> str:
    lines = []
    for e in manifest.models:
        saved = ", ".join(f.value for f in e.models) or "nothing"
        failed = "; ".join(f"{step}: {why}" for step, why in e.errors.items())
        lines.append(f"{e.name}: {saved}{', onnx' if e.onnx else ''}" + (f" (failed: {failed})" if failed else ""))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.paddle_models", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    e = sub.add_parser("export", help="save the models, their references and the manifest in DIR")
    e.add_argument("directory", type=pathlib.Path, metavar="DIR")
    e.add_argument("models", nargs="*", metavar="MODEL", help=f"which models (default: all): {', '.join(MODELS)}")
    e.add_argument("--small", action="store_true", help="small sizes (images 64x64, small text models): tests")
    e.add_argument("--child", choices=[f.value for f in PaddleFormat], help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    unknown = [m for m in a.models if m not in MODELS]
    if unknown:
        p.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS)}")
    if importlib.util.find_spec("paddle") is None:
        p.error(f"paddle is not installed for {sys.executable}: {PADDLE_EXTRA}")
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    names = list(dict.fromkeys(a.models)) or list(MODELS)
    if a.child:
        _child(PaddleFormat(a.child), a.directory, names, a.small)
        return 0
    manifest = export(a.directory, names, a.small)
    print(_summary(manifest))
    print(f"wrote {manifest.directory / MANIFEST}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
