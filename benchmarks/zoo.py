"""The zoo in files: torchvision and transformers models with seeded random weights, exported to ONNX.

Each model is built from its library's constructor (torchvision with weights=None, transformers from a Config set
explicitly): nothing is downloaded. torch.onnx writes opset 17, with the dynamo exporter where its file is right
(opset 17, onnx's full check, onnxruntime agreeing with torch), else the TorchScript one; the manifest
(`benchmarks.zoo_manifest`) records which, and why. ``python -m benchmarks.zoo export DIR [MODEL ...]`` runs where
the zoo extra is installed (``pip install cinn[zoo]``); cinn itself is not imported. Not `frontend.zoo`: that one
holds cinn's built-in NetBuilder models.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import enum
import functools
import gc
import importlib.metadata
import math
import os
import pathlib
import sys
import tempfile
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import torch
import torchvision
import transformers

from benchmarks.zoo_manifest import (
    OPSET,
    RTOL,
    SEED,
    Exporter,
    Fill,
    Manifest,
    Source,
    ZooEntry,
    ZooInput,
    changes,
    error_line,
    manifest_path,
    random_feeds,
    read_manifest,
    relative_difference,
    write_manifest,
)

IMAGE = 224
TOKENS = 128
CALIBRATION_BATCH = 8  # random inputs that BatchNorm statistics are measured on (a batch: 1x1 maps need more than one)
# every package whose version decides the files, recorded in the manifest
TOOLS = ("torch", "torchvision", "transformers", "onnx", "onnxscript", "onnxruntime", "numpy")


class Library(enum.StrEnum):
    """Where a model's code comes from."""

    TORCH = "torch"  # a module written with torch.nn
    TORCHVISION = "torchvision"
    TRANSFORMERS = "transformers"

    @property
    def version(self) -> str:
        return importlib.metadata.version(self.value)


class ZooRefused(ValueError):
    """A model the zoo does not export: its output does not depend on its input, or no exporter wrote it right."""


Call = Callable[..., Sequence[torch.Tensor]]


@dataclass(frozen=True)
class ZooModel:
    """How to build, call and feed one zoo model."""

    name: str
    library: Library
    constructor: str  # the constructor call, as the manifest records it
    build: Callable[[], torch.nn.Module]
    call: Call  # (model, *inputs in order) -> the outputs
    inputs: tuple[ZooInput, ...]  # str dims are dynamic axes
    outputs: tuple[str, ...]
    bindings: tuple[Mapping[str, int], ...] = ({},)  # of a dynamic model: the export's sizes first


class _Exported(torch.nn.Module):
    """A model with its inputs in order and its outputs as a tuple of tensors, as the exporters take it."""

    def __init__(self, model: torch.nn.Module, call: Call):
        super().__init__()
        self.model, self._call = model, call

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(self._call(self.model, *args))


# ---------------------------------------------------------------------------------------------
# the models


def _image(name: str = "image", size: int = IMAGE, batch: int | str = 1) -> ZooInput:
    return ZooInput(name, (batch, 3, size, size), "float32", Fill.NORMAL)


def _text(vocab: int, batch: int | str = 1, seq: int | str = TOKENS) -> tuple[ZooInput, ...]:
    """Token ids and an attention mask of ones."""
    return (ZooInput("input_ids", (batch, seq), "int64", Fill.TOKENS, vocab),
            ZooInput("attention_mask", (batch, seq), "int64", Fill.ONES))


def _positional(model: torch.nn.Module, *args: torch.Tensor) -> tuple[torch.Tensor]:
    return (model(*args),)


def _detections(model: torch.nn.Module, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """A torchvision detector on a batch of one image: its boxes, scores and labels (as many as it finds)."""
    found = model(list(images))[0]
    return found["boxes"], found["scores"], found["labels"]


def _by_name(inputs: Sequence[str], outputs: Sequence[str], model: torch.nn.Module, *args: torch.Tensor) -> Sequence[torch.Tensor]:
    """A transformers model called with its inputs by name; the outputs named."""
    found = model(**dict(zip(inputs, args, strict=True)))
    return [found[name] for name in outputs]


def torchvision_model(name: str, inputs: tuple[ZooInput, ...] = (_image(),), outputs: tuple[str, ...] = ("logits",),
                      call: Call = _positional, model_name: str | None = None,
                      bindings: tuple[Mapping[str, int], ...] = ({},), **kwargs: Any) -> ZooModel:
    """A torchvision model with random weights: models.NAME(weights=None, **kwargs)."""
    fn = model_name or name
    args = ", ".join(f"{k}={v!r}" for k, v in {"weights": None, **kwargs}.items())
    return ZooModel(name, Library.TORCHVISION, f"torchvision.models.{fn}({args})",
                    functools.partial(torchvision.models.get_model, fn, weights=None, **kwargs), call, inputs, outputs,
                    bindings)


def _build_transformers(model_class: str, config_class: str, config: Mapping[str, Any], part: str | None) -> torch.nn.Module:
    cfg = getattr(transformers, config_class)(**config)
    model = getattr(transformers, model_class)(cfg)
    return getattr(model, part)() if part else model


def transformers_model(name: str, model_class: str, config_class: str, config: Mapping[str, Any],
                       inputs: tuple[ZooInput, ...], outputs: tuple[str, ...], part: str | None = None,
                       bindings: tuple[Mapping[str, int], ...] = ({},)) -> ZooModel:
    """A transformers model with random weights from a Config set explicitly, attention written out (eager) as ONNX
    files usually have it; `part`: a method giving the part exported (the encoder)."""
    config = {**config, "attn_implementation": "eager"}
    args = ", ".join(f"{k}={v!r}" for k, v in config.items())
    constructor = f"transformers.{model_class}({config_class}({args}))" + (f".{part}()" if part else "")
    call = functools.partial(_by_name, tuple(i.name for i in inputs), outputs)
    return ZooModel(name, Library.TRANSFORMERS, constructor,
                    functools.partial(_build_transformers, model_class, config_class, config, part), call, inputs, outputs,
                    bindings)


BERT_BASE = {"vocab_size": 30522, "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
             "intermediate_size": 3072, "max_position_embeddings": 512}
CLASSIFIERS = ("vit_b_16", "mobilenet_v3_large", "efficientnet_b0", "mnasnet1_0", "regnet_y_800mf", "shufflenet_v2_x1_0",
               "resnet18", "convnext_tiny", "swin_t")

MODELS: dict[str, ZooModel] = {m.name: m for m in (
    *(torchvision_model(name) for name in CLASSIFIERS),
    # no auxiliary classifiers (eval mode never runs them); init_weights: the model's own init, said explicitly
    torchvision_model("googlenet", aux_logits=False, init_weights=True),
    # data-dependent shapes: the boxes that survive the score threshold and NMS; the model fixes 320x320. The 20
    # best: of the 300 by default, the last have scores a rounding error apart, which engines may order differently
    torchvision_model("ssdlite320_mobilenet_v3_large", (_image(size=320),), ("boxes", "scores", "labels"), _detections,
                      weights_backbone=None, detections_per_img=20),
    torchvision_model("resnet18_dynamic", (_image(batch="batch"),), model_name="resnet18",
                      bindings=({"batch": 2}, {"batch": 1})),  # torch.export takes a size of 1 for a constant: 2 first
    transformers_model("hf_vit_base", "ViTModel", "ViTConfig",
                       {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072,
                        "image_size": IMAGE, "patch_size": 16, "num_channels": 3},
                       (_image("pixel_values"),), ("last_hidden_state", "pooler_output")),
    transformers_model("hf_gpt2", "GPT2LMHeadModel", "GPT2Config",
                       {"vocab_size": 50257, "n_positions": 1024, "n_embd": 768, "n_layer": 12, "n_head": 12, "use_cache": False},
                       _text(50257), ("logits",)),  # with a mask: without, transformers calls aten::diff
    transformers_model("hf_bert_base", "BertModel", "BertConfig", BERT_BASE, _text(30522),
                       ("last_hidden_state", "pooler_output")),
    transformers_model("hf_bert_base_dynamic", "BertModel", "BertConfig", BERT_BASE, _text(30522, "batch", "seq"),
                       ("last_hidden_state", "pooler_output"),
                       bindings=({"batch": 2, "seq": 64}, {"batch": 1, "seq": TOKENS})),
    transformers_model("hf_t5_small_encoder", "T5EncoderModel", "T5Config",
                       {"vocab_size": 32128, "d_model": 512, "d_kv": 64, "d_ff": 2048, "num_layers": 6, "num_heads": 8,
                        "feed_forward_proj": "relu", "use_cache": False},
                       _text(32128), ("last_hidden_state",)),
    transformers_model("hf_distilbert", "DistilBertModel", "DistilBertConfig",
                       {"vocab_size": 30522, "dim": 768, "n_layers": 6, "n_heads": 12, "hidden_dim": 3072,
                        "max_position_embeddings": 512},
                       _text(30522), ("last_hidden_state",)),
    # 30 s of audio: the encoder takes exactly 2 * max_source_positions frames
    transformers_model("hf_whisper_tiny_encoder", "WhisperModel", "WhisperConfig",
                       {"vocab_size": 51865, "num_mel_bins": 80, "d_model": 384, "encoder_layers": 4,
                        "encoder_attention_heads": 6, "encoder_ffn_dim": 1536, "decoder_layers": 4,
                        "decoder_attention_heads": 6, "decoder_ffn_dim": 1536, "max_source_positions": 1500, "use_cache": False},
                       (ZooInput("input_features", (1, 80, 3000), "float32", Fill.NORMAL),), ("last_hidden_state",),
                       part="get_encoder"),
    # one second of 16 kHz audio
    transformers_model("hf_wav2vec2_base", "Wav2Vec2Model", "Wav2Vec2Config",
                       {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072},
                       (ZooInput("input_values", (1, 16000), "float32", Fill.NORMAL),), ("last_hidden_state",)),
)}


# ---------------------------------------------------------------------------------------------
# export


def reseed_zero_weights(model: torch.nn.Module) -> tuple[str, ...]:
    """Draw at random (scaled by 1/sqrt(fan-in)) each weight matrix that the library initializes to all zeros (a
    classifier head, such as torchvision ViT's): with it, the output would not depend on the input. Their names."""
    names = []
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2 and not p.any():
                p.normal_(0.0, 1.0 / math.sqrt(p[0].numel()))
                names.append(name)
    return tuple(names)


def calibrate_batchnorms(spec: ZooModel, module: torch.nn.Module) -> int:
    """Measure the running statistics of every BatchNorm layer on a batch of random inputs, as training would have
    left them: a fresh layer's mean 0 and variance 1 normalize nothing, and activations vanish through deep nets
    (MobileNetV3's logits are ~1e-9, EfficientNet's ~1e-14, SSDLite's last features ~1e-26). How many there were."""
    norms = [m for m in module.modules() if isinstance(m, torch.nn.BatchNorm1d | torch.nn.BatchNorm2d | torch.nn.BatchNorm3d)]
    if not norms:
        return 0
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # a plain average over what it sees
        m.train()
    batch = tuple(dataclasses.replace(i, shape=(CALIBRATION_BATCH, *i.shape[1:])) for i in spec.inputs)
    torch_outputs(module, random_feeds(batch, SEED + 2, spec.bindings[0]))
    for m in norms:
        m.eval()
    return len(norms)


def torch_outputs(module: torch.nn.Module, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """The module's outputs on numpy feeds (in order)."""
    with torch.no_grad():
        return [t.numpy() for t in module(*(torch.from_numpy(a) for a in feeds.values()))]


def check_input_dependence(spec: ZooModel, module: torch.nn.Module) -> None:
    """Refuse a model whose outputs are the same for two random inputs: no comparison of engines would test it."""
    a, b = (torch_outputs(module, random_feeds(spec.inputs, seed, spec.bindings[0])) for seed in (SEED, SEED + 1))
    if not changes(a, b):
        raise ZooRefused(f"{spec.name}: its output does not change with its input (relative change "
                         f"{relative_difference(b, a):.2g} between two random inputs, at most {RTOL}); nothing exported")


def _dynamic_axes(inputs: Sequence[ZooInput]) -> dict[str, dict[int, str]]:
    axes = {i.name: {k: d for k, d in enumerate(i.shape) if isinstance(d, str)} for i in inputs}
    return {name: a for name, a in axes.items() if a}


def _write(exporter: Exporter, spec: ZooModel, module: torch.nn.Module, path: str) -> None:
    """Export with one of torch.onnx's exporters, its progress lines on stderr."""
    feeds = random_feeds(spec.inputs, SEED, spec.bindings[0])
    args = tuple(torch.from_numpy(a) for a in feeds.values())
    common = {"input_names": [i.name for i in spec.inputs], "output_names": list(spec.outputs), "opset_version": OPSET}
    axes = _dynamic_axes(spec.inputs)
    with contextlib.redirect_stdout(sys.stderr), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the TorchScript exporter's: chosen knowingly
        if exporter is Exporter.DYNAMO:
            dims = {s: torch.export.Dim(s, min=1) for a in axes.values() for s in a.values()}  # one per symbol
            shapes = {"args": tuple({k: dims[s] for k, s in axes.get(i.name, {}).items()} for i in spec.inputs)}
            torch.onnx.export(module, args, path, dynamo=True, external_data=False, verbose=False,
                              dynamic_shapes=shapes if axes else None, **common)
        else:
            torch.onnx.export(module, args, path, dynamo=False, dynamic_axes=axes or None, **common)


def _opset(model: onnx.ModelProto) -> int:
    return max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)


def validate(spec: ZooModel, module: torch.nn.Module, path: str) -> None:
    """ValueError unless the file is opset 17, passes onnx's full check, and onnxruntime computes what torch does at
    every binding (within RTOL)."""
    import onnxruntime as ort  # only the exporter needs it here

    model = onnx.load(path)
    if _opset(model) != OPSET:
        raise ValueError(f"opset {_opset(model)}, not {OPSET} (the exporter's version conversion failed)")
    onnx.checker.check_model(model, full_check=True)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for binding in spec.bindings:
        feeds = random_feeds(spec.inputs, SEED, binding)
        err = relative_difference(session.run(None, feeds), torch_outputs(module, feeds))
        if err > RTOL:
            raise ValueError(f"onnxruntime differs from torch by {err:.2g} (relative) at {dict(binding) or 'its shapes'}")


def _entry(spec: ZooModel, exporter: Exporter, note: str, reseeded: tuple[str, ...], calibrated: int,
           path: pathlib.Path) -> ZooEntry:
    """The manifest entry of a written file: its inputs as the file has them (the exporter names the dynamic axes)."""
    graph = onnx.load(str(path), load_external_data=False).graph
    initialized = {t.name for t in graph.initializer}
    by_name = {i.name: i for i in spec.inputs}
    symbols: dict[str, str] = {}  # the spec's symbol -> the file's
    inputs = []
    for vi in (i for i in graph.input if i.name not in initialized):
        want = by_name[vi.name]
        tt = vi.type.tensor_type
        shape: list[int | str] = []
        for k, (d, w) in enumerate(zip(tt.shape.dim, want.shape, strict=True)):
            if d.HasField("dim_value"):
                shape.append(d.dim_value)
                continue
            symbol = d.dim_param or (w if isinstance(w, str) else f"{vi.name}_{k}")  # unnamed: named here
            if isinstance(w, str):
                symbols[w] = symbol
            shape.append(symbol)
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type).name
        inputs.append(ZooInput(vi.name, tuple(shape), dtype, want.fill, want.high))
    bindings = tuple({symbols[s]: n for s, n in b.items()} for b in spec.bindings)
    return ZooEntry(spec.name, path.name, Source(spec.library.value, spec.library.version, spec.constructor), exporter,
                    tuple(inputs), tuple(o.name for o in graph.output), bindings, note, reseeded, calibrated)


def export_model(spec: ZooModel, directory: pathlib.Path) -> ZooEntry:
    """Build the model with seeded random weights, check that its output depends on its input, and write
    DIR/NAME.onnx with the first exporter whose file validates; its manifest entry. ZooRefused says why not."""
    torch.manual_seed(SEED)
    try:
        model = spec.build().eval()
        reseeded = reseed_zero_weights(model)
        module = _Exported(model, spec.call).eval()
        calibrated = calibrate_batchnorms(spec, module)
        check_input_dependence(spec, module)
    except ZooRefused:
        raise
    except Exception as err:  # a library's error, of any kind: this model is not exported, the others still are
        raise ZooRefused(f"{spec.name}: cannot build and run it in torch ({error_line(err, innermost=True)}); nothing exported") from err
    notes: list[str] = []
    for exporter in Exporter:
        with tempfile.TemporaryDirectory(dir=directory, prefix=f".{spec.name}-") as tmp:
            path = os.path.join(tmp, f"{spec.name}.onnx")
            try:
                _write(exporter, spec, module, path)
                validate(spec, module, path)
            except Exception as err:  # exporters fail in every way there is: each way means "try the next one"
                notes.append(f"{exporter.value}: {error_line(err, innermost=True)}")
                print(f"[zoo] {spec.name}: not the {exporter.value} exporter's file: {notes[-1]}", file=sys.stderr)
                continue
            final = directory / f"{spec.name}.onnx"
            os.replace(path, final)
        return _entry(spec, exporter, "; ".join(notes), reseeded, calibrated, final)
    raise ZooRefused(f"{spec.name}: no exporter wrote a valid file ({'; '.join(notes)}); nothing exported")


def versions() -> dict[str, str]:
    """The versions of the packages that made the files."""
    found = {}
    for tool in TOOLS:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            found[tool] = importlib.metadata.version(tool)
    return found


def export(directory: pathlib.Path, names: Sequence[str], models: Mapping[str, ZooModel] = MODELS) -> list[str]:
    """Export the named models into DIR, updating its manifest after each; the messages of those refused."""
    directory.mkdir(parents=True, exist_ok=True)
    manifest = read_manifest(directory) if manifest_path(directory).exists() else Manifest(())
    refused = []
    for name in names:
        print(f"[zoo] {name} ...", file=sys.stderr, flush=True)
        try:
            entry = export_model(models[name], directory)
        except ZooRefused as err:
            refused.append(str(err))
            print(f"[zoo] REFUSED {err}", file=sys.stderr, flush=True)
            continue
        finally:
            gc.collect()  # a model's weights and export graphs: up to a few GB
        manifest = manifest.merged([entry], versions())
        write_manifest(directory, manifest)
        print(directory / entry.file, flush=True)
    return refused


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.zoo", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    e = sub.add_parser("export", help="write DIR/NAME.onnx for each model and DIR/manifest.json")
    e.add_argument("directory", type=pathlib.Path)
    e.add_argument("models", nargs="*", metavar="MODEL", help=f"which models (default: all): {', '.join(MODELS)}")
    sub.add_parser("list", help="the models' names and constructors")
    a = p.parse_args(argv)
    if a.command == "list":
        for spec in MODELS.values():
            print(f"{spec.name}: {spec.constructor}")
        return 0
    unknown = [m for m in a.models if m not in MODELS]
    if unknown:
        p.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS)}")
    refused = export(a.directory, a.models or list(MODELS))
    for message in refused:
        print(f"python -m benchmarks.zoo: {message}", file=sys.stderr)
    return 1 if refused else 0


if __name__ == "__main__":
    sys.exit(main())
