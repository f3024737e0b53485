"""Build the Paddle importer's test fixtures with real paddlepaddle (run with a venv that has it).

Each model is saved in both inference formats, PIR (`inference.json`) and legacy
(`inference.pdmodel`), next to its `.pdiparams`, plus one `data.npz` holding the inputs
(`in_<name>`) and Paddle's outputs (`out_<k>`):

    tests/fixtures/paddle/<model>/{pir,legacy}/inference.*   tests/fixtures/paddle/<model>/data.npz

The format is chosen by FLAGS_enable_pir_api, which paddle reads at import time, so each format is
saved by a child process (`--format`); the parent checks both formats reproduce the eager outputs. The saving is
benchmarks.paddle_export's, which the Paddle model set of cinn-bench uses too (a Python with paddle needs none of
cinn's dependencies for it).

    /work/paddle_venv/bin/python tools/make_paddle_fixtures.py [--out tests/fixtures/paddle]
"""
from __future__ import annotations

import argparse
import pathlib
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the checkout's benchmarks package, in a Python where cinn is not installed

from benchmarks.paddle_export import PREFIX, InputDef, InputKind, PaddleFormat, as_list, patch_legacy_apis, save_layer, spawn_in_format  # noqa: E402

DEFAULT_OUT = ROOT / "tests" / "fixtures" / "paddle"


@dataclass(frozen=True)
class ModelDef:
    """A fixture model: a factory of its paddle Layer and its inputs."""

    name: str
    make: Callable[[], object]
    inputs: tuple[InputDef, ...]


def _models(paddle) -> list[ModelDef]:
    """The fixture models (defined here because paddle is imported only in the child processes)."""
    nn, F = paddle.nn, paddle.nn.functional

    class MLP(nn.Layer):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2, self.fc3 = nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 8)

        def forward(self, x):
            h = F.gelu(self.fc1(x))
            h = F.relu(self.fc2(h))
            return F.log_softmax(self.fc3(h), axis=-1)

    class CNN(nn.Layer):
        def __init__(self):
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2D(3, 8, 3, padding=1), nn.BatchNorm2D(8)
            self.conv2, self.bn2 = nn.Conv2D(8, 8, 3, padding=1, bias_attr=False), nn.BatchNorm2D(8)
            self.pool = nn.MaxPool2D(2, 2)
            self.dw = nn.Conv2D(8, 8, 3, padding=1, groups=8)
            self.gap = nn.AdaptiveAvgPool2D(2)
            self.fc = nn.Linear(32, 10)

        def forward(self, x):
            h = F.relu(self.bn1(self.conv1(x)))
            h = F.relu(h + self.bn2(self.conv2(h)))
            h = F.hardswish(self.dw(self.pool(h)))
            return self.fc(paddle.flatten(self.gap(h), 1))

    class Encoder(nn.Layer):
        """A transformer encoder layer and a head whose reshape reads the dynamic batch size."""

        def __init__(self):
            super().__init__()
            self.layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.1, activation="gelu")
            self.head = nn.Linear(8 * 16, 4)

        def forward(self, x):
            h = self.layer(x)
            return F.sigmoid(self.head(paddle.reshape(h, [x.shape[0], -1])))

    class Ops(nn.Layer):
        """Shape and elementwise ops the other models do not use; two outputs."""

        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(12, 12)

        def forward(self, x):
            a, b, c = paddle.split(x, [4, 4, 4], axis=-1)
            s = paddle.stack([a, b * c], axis=1)
            t = paddle.transpose(s, [0, 2, 1, 3])
            u = paddle.unsqueeze(paddle.concat([a - c, b / (c * c + 1.0)], axis=-1), 1)
            v = paddle.squeeze(u, 1)[:, 1:3, ::2]
            w = paddle.scale(v, 2.0, 0.5) + paddle.full([1], 0.25, "float32")
            y = paddle.nn.functional.softmax(self.fc(x), axis=1)
            y = paddle.concat(paddle.split(y, 2, axis=-1)[::-1], axis=-1)  # halves swapped
            z = paddle.assign(paddle.cast(paddle.cast(w * 3.0, "int32"), "float32"))
            return paddle.reshape(paddle.maximum(t, t * 0.5), [0, 0, 8]) + paddle.tanh(y[:, :, :8]), z

    return [
        ModelDef("mlp", MLP, (InputDef("x", (4, 16), (4, 16)),)),
        ModelDef("cnn", CNN, (InputDef("x", (2, 3, 8, 8), (2, 3, 8, 8)),)),
        ModelDef("encoder", Encoder, (InputDef("x", (-1, 8, 16), (2, 8, 16)),)),
        ModelDef("ops", Ops, (InputDef("x", (-1, 5, 12), (3, 5, 12)),)),
        # the final norm fuses with the last layer's norm (their shared epsilon crashed rfactor: issue 52); 32 wide, so
        # each norm's reduction is two or more vectors and is rfactored on AVX2 and AVX-512 alike
        ModelDef("encoder_norm", lambda: nn.TransformerEncoder(nn.TransformerEncoderLayer(32, 2, 8), 1, nn.LayerNorm(32)),
                 (InputDef("x", (1, 8, 32), (1, 8, 32)),)),
        *_rnn_models(paddle),
    ]


def _rnn_models(paddle) -> list[ModelDef]:
    """paddle.nn.SimpleRNN, GRU and LSTM (the rnn op): layers, directions, initial states, sequence lengths."""
    nn = paddle.nn

    class Recurrent(nn.Layer):
        """One recurrent layer returning its outputs and final states; initial states and lengths as inputs."""

        def __init__(self, make, states: int = 0, lengths: bool = False):
            super().__init__()
            self.rnn, self.states, self.lengths = make(), states, lengths

        def forward(self, x, first=None, second=None):  # jit.save's input specs fill named parameters only
            initial = {0: None, 1: first, 2: (first, second)}[self.states]
            y, final = self.rnn(x, initial, first if self.lengths else None)
            return (y, *final) if isinstance(final, tuple) else (y, final)

    class Classifier(nn.Layer):
        """A text classifier's body after its embedding: a 2-layer bidirectional LSTM, its last layer's final
        states side by side, a linear head."""

        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(6, 8, num_layers=2, direction="bidirect")
            self.fc = nn.Linear(16, 3)

        def forward(self, x, lengths):
            _, (h, _) = self.lstm(x, sequence_length=lengths)
            return self.fc(paddle.concat([h[-2], h[-1]], axis=-1))

    x = InputDef("x", (3, 5, 4), (3, 5, 4))
    x_time_major = InputDef("x", (5, 3, 4), (5, 3, 4))
    lengths = InputDef("lengths", (3,), (3,), InputKind.FIXED, values=(5, 2, 4))

    def state(layers: int, name: str = "h0") -> InputDef:
        return InputDef(name, (layers, 3, 8), (layers, 3, 8))

    return [
        ModelDef("rnn_lstm", lambda: Recurrent(lambda: nn.LSTM(4, 8)), (x,)),
        ModelDef("rnn_lstm_bi2_states", lambda: Recurrent(lambda: nn.LSTM(4, 8, 2, "bidirect"), states=2),
                 (x, state(4), state(4, "c0"))),
        ModelDef("rnn_lstm_bi2_lengths", lambda: Recurrent(lambda: nn.LSTM(4, 8, 2, "bidirect"), lengths=True),
                 (x, lengths)),
        ModelDef("rnn_gru_bi_time_major", lambda: Recurrent(lambda: nn.GRU(4, 8, direction="bidirect",
                                                                            time_major=True), states=1),
                 (x_time_major, state(2))),
        ModelDef("rnn_gru2_lengths", lambda: Recurrent(lambda: nn.GRU(4, 8, 2), lengths=True), (x, lengths)),
        ModelDef("rnn_simple_tanh2", lambda: Recurrent(lambda: nn.SimpleRNN(4, 8, 2)), (x,)),
        ModelDef("rnn_simple_relu_bi", lambda: Recurrent(lambda: nn.SimpleRNN(4, 8, direction="bidirect",
                                                                               activation="relu"), states=1),
                 (x, state(2))),
        ModelDef("rnn_classifier", Classifier, (InputDef("x", (-1, 6, 6), (2, 6, 6)),
                                                InputDef("lengths", (-1,), (2,), InputKind.FIXED, values=(6, 3)))),
    ]


def _initialize(paddle, layer, rng: np.random.Generator) -> None:
    """Deterministic weights (the same in both child processes), batch-norm statistics included."""
    for p in layer.parameters():
        p.set_value(rng.uniform(-0.5, 0.5, p.shape).astype("float32"))
    for sub in layer.sublayers():
        if isinstance(sub, paddle.nn.BatchNorm2D):
            sub._mean.set_value(rng.uniform(-0.2, 0.2, sub._mean.shape).astype("float32"))
            sub._variance.set_value(rng.uniform(0.5, 1.5, sub._variance.shape).astype("float32"))


def _save_one(paddle, model: ModelDef, work: pathlib.Path) -> None:
    """Save one model in the current process's format, with its inputs and eager and reloaded outputs."""
    rng = np.random.default_rng(sum(map(ord, model.name)))
    layer = model.make()
    _initialize(paddle, layer, rng)
    layer.eval()
    feeds = {i.name: i.draw(rng) for i in model.inputs}
    eager = as_list(layer(*[paddle.to_tensor(a) for a in feeds.values()]))
    save_layer(paddle, layer, model.inputs, work / model.name)
    arrays = {f"in_{k}": v for k, v in feeds.items()}
    arrays |= {f"out_{k}": t.numpy() for k, t in enumerate(eager)}
    arrays |= {f"reloaded_{k}": a for k, a in enumerate(_reload(paddle, work / model.name / PREFIX, feeds))}
    np.savez(work / model.name / "data.npz", **arrays)


def _reload(paddle, prefix: pathlib.Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The saved model's outputs: by jit.load (PIR), or the legacy program by the static executor (jit.load
    cannot run a legacy rnn op)."""
    if paddle.framework.use_pir_api():
        return [t.numpy() for t in as_list(paddle.jit.load(str(prefix))(*map(paddle.to_tensor, feeds.values())))]
    paddle.enable_static()
    try:
        exe = paddle.static.Executor(paddle.CPUPlace())
        program, _, fetches = paddle.static.load_inference_model(str(prefix), exe)
        return exe.run(program, feed=feeds, fetch_list=fetches)
    finally:
        paddle.disable_static()


def _child(fmt: PaddleFormat, work: pathlib.Path) -> None:
    """Save every model in one format (FLAGS_enable_pir_api is already set by the parent)."""
    import paddle

    paddle.set_device("cpu")
    if fmt is PaddleFormat.LEGACY:
        patch_legacy_apis(paddle)
    for model in _models(paddle):
        _save_one(paddle, model, work)
    print(f"saved {fmt} models under {work}")


def _check_and_collect(model: str, works: dict[PaddleFormat, pathlib.Path], out: pathlib.Path) -> None:
    """Both formats must reproduce the eager outputs; copy the model files and one data.npz."""
    data = {fmt: dict(np.load(w / model / "data.npz")) for fmt, w in works.items()}
    first = data[PaddleFormat.PIR]
    for fmt, arrays in data.items():
        for key in (k for k in arrays if k.startswith("reloaded_")):
            np.testing.assert_allclose(arrays[key], first[key.replace("reloaded_", "out_")], rtol=1e-5, atol=1e-6,
                                       err_msg=f"{model} ({fmt}): the saved model differs from the eager layer")
        for key in (k for k in arrays if not k.startswith("reloaded_")):
            np.testing.assert_array_equal(arrays[key], first[key], err_msg=f"{model}: {fmt} and pir differ")
    target = out / model
    shutil.rmtree(target, ignore_errors=True)
    for fmt, w in works.items():
        (target / fmt).mkdir(parents=True)
        for f in (w / model).glob(f"{PREFIX}.*"):
            if f.suffix != ".info":  # the pickled name map is not needed by the importer
                shutil.copy(f, target / fmt / f.name)
    np.savez_compressed(target / "data.npz", **{k: v for k, v in first.items() if not k.startswith("reloaded_")})


def _parent(out: pathlib.Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        works = {}
        for fmt in PaddleFormat:
            works[fmt] = pathlib.Path(tmp) / fmt
            spawn_in_format(fmt, [sys.executable, __file__, "--format", fmt, "--work", str(works[fmt])])
        models = sorted(p.name for p in works[PaddleFormat.PIR].iterdir())
        for model in models:
            _check_and_collect(model, works, out)
    total = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"wrote {len(models)} models to {out} ({total / 1024:.1f} KiB)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT, help="fixture folder")
    p.add_argument("--format", type=PaddleFormat, help=argparse.SUPPRESS)  # child process
    p.add_argument("--work", type=pathlib.Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.format:
        _child(args.format, args.work)
    else:
        _parent(args.out)


if __name__ == "__main__":
    main()
