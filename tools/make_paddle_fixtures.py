"""Build the Paddle importer's test fixtures with real paddlepaddle (run with a venv that has it).

Each model is saved in both inference formats, PIR (`inference.json`) and legacy
(`inference.pdmodel`, the ops' call stacks dropped), next to its `.pdiparams`, plus one `data.npz`
holding two sets of inputs (`in_<name>`, `in2_<name>`) and Paddle's outputs for each (`out_<k>`,
`out2_<k>`):

    tests/fixtures/paddle/<model>/{pir,legacy}/inference.*   tests/fixtures/paddle/<model>/data.npz

The format is chosen by FLAGS_enable_pir_api, which paddle reads at import time, so each format is
saved by a child process (`--format`); the parent checks both formats reproduce the eager outputs.
The saving is benchmarks.paddle_export's, which cinn-bench's Paddle model set uses too.
paddle 3 traces some APIs only to PIR: in legacy mode they append the ops Paddle 2 wrote. `--models
mobilenet_v2` (any paddle.vision.models constructor) saves that model at full size, for tests that
make it on the spot; those are never committed.

    /work/paddle_venv/bin/python tools/make_paddle_fixtures.py [--out tests/fixtures/paddle] [--models a,b]
"""
from __future__ import annotations

import argparse
import importlib
import math
import pathlib
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the checkout's benchmarks package, in a Python where cinn is not installed

from benchmarks.paddle_export import PREFIX, PaddleFormat, as_list, patch_legacy_apis, save_layer, spawn_in_format  # noqa: E402

DEFAULT_OUT = ROOT / "tests" / "fixtures" / "paddle"


@dataclass(frozen=True)
class InputDef:
    """One model input: its name, the InputSpec shape (-1 = dynamic), the shape of the saved sample, its dtype, and
    for integers the bound of its values (below `high`; distinct where there are no more of them than values) or the
    values themselves (sequence lengths)."""

    name: str
    spec: tuple[int, ...]
    sample: tuple[int, ...]
    dtype: str = "float32"
    high: int = 0
    values: tuple[int, ...] = ()


@dataclass(frozen=True)
class ModelDef:
    """A fixture model: a factory of its paddle Layer and its inputs. Committed ones are small and get random
    weights; the others (paddle.vision's models at full size, named with --models) keep Paddle's initialization."""

    name: str
    make: Callable[[], object]
    inputs: tuple[InputDef, ...]
    committed: bool = True
    formats: tuple[PaddleFormat, ...] = tuple(PaddleFormat)  # paddle 3 saves some APIs only as PIR


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
        *_op_set_models(paddle),
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
    lengths = InputDef("lengths", (3,), (3,), "int64", values=(5, 2, 4))

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
                                                InputDef("lengths", (-1,), (2,), "int64", values=(6, 3)))),
    ]


def _vision_model(paddle, name: str) -> ModelDef:
    """A paddle.vision model at full size, by its constructor's name (not committed: made by the tests that need
    them); inception_v3 takes 299 x 299 images."""
    side = 299 if name.startswith("inception") else 224
    make = getattr(importlib.import_module("paddle.vision.models"), name)
    return ModelDef(name, make, (InputDef("x", (-1, 3, side, side), (1, 3, side, side)),), committed=False)


def _op_set_models(paddle) -> list[ModelDef]:
    """Models covering Paddle's op set beyond the basic ones: activations, indexing, reductions and shapes, vision
    ops, mobile blocks of paddle.vision, and an ERNIE-style encoder with dynamic batch and sequence."""
    nn, F = paddle.nn, paddle.nn.functional

    class Activations(nn.Layer):
        """Activations and elementwise functions, concatenated along the last axis."""

        def __init__(self):
            super().__init__()
            self.prelu, self.prelu_one = nn.PReLU(4), nn.PReLU()

        def forward(self, x):
            acts = [F.relu6(x * 8.0), F.hardswish(x * 4.0), F.hardsigmoid(x * 4.0), F.swish(x), F.silu(x), F.mish(x),
                    F.gelu(x, approximate=True), F.gelu(x), F.leaky_relu(x, 0.1), F.elu(x, 0.5), F.selu(x),
                    F.celu(x, 1.5), F.softplus(x, 2.0, 1.0), F.softsign(x), F.hardtanh(x, -0.5, 0.7),
                    F.log_sigmoid(x), F.tanhshrink(x), F.hardshrink(x, 0.3), F.softshrink(x, 0.3),
                    F.thresholded_relu(x, 0.2), self.prelu(x), self.prelu_one(x), paddle.square(x),
                    paddle.expm1(x), paddle.log1p(paddle.abs(x)), paddle.round(x * 3.0), paddle.trunc(x * 3.0),
                    paddle.clip(x, -0.5, 0.3), paddle.pow(paddle.abs(x), 1.5), F.log_softmax(x, 1), F.sigmoid(x),
                    paddle.tanh(x), paddle.sign(x), paddle.floor(x * 2.0), paddle.rsqrt(paddle.abs(x) + 1.0)]
            return paddle.concat(acts, axis=-1), F.maxout(x.unsqueeze(-1), 2, 1)

    class Indexing(nn.Layer):
        """Gathers, scatters, sorts, prefix sums and slice assignment, with indices fed at run time."""

        def forward(self, x, ids):
            rows = paddle.gather(x, ids)
            twice = paddle.concat([ids, ids[:1]])
            sv = x * 1.0
            sv[:, 1] = 0.5
            sv[1:3, ::2] = rows[:2, :3]
            values, where = paddle.topk(x, 2, axis=1)
            return (rows, paddle.index_select(x, ids, axis=1), paddle.gather_nd(x, paddle.stack([ids, ids + 1], -1)),
                    paddle.scatter(x, ids, rows * 2.0),
                    paddle.scatter(x, twice, paddle.concat([rows, rows[:1]]), overwrite=False),
                    paddle.scatter_nd_add(x, ids.unsqueeze(-1), rows), paddle.index_add(x, ids, 0, rows),
                    paddle.put_along_axis(x, paddle.argmax(x, 1, keepdim=True), 9.0, 1),
                    paddle.take_along_axis(x, paddle.argsort(x, axis=1), 1), paddle.where(x > 0, x, x * 0.1),
                    paddle.masked_fill(x, x < -0.5, 2.0), paddle.cumsum(x, 1), paddle.cumprod(x, 0), values, where,
                    paddle.sort(x, 0, descending=True), paddle.argmax(x, 1), paddle.argmin(x, 0, keepdim=True),
                    paddle.flip(x, [0, 1]), paddle.roll(x, [1, -2], [0, 1]), paddle.tril(x, 1), paddle.triu(x), sv)

    class Reductions(nn.Layer):
        """Reductions, norms, broadcasting, padding, creation ops and comparisons."""

        def forward(self, x):
            n = paddle.shape(x)[0]
            steps = paddle.arange(0, paddle.shape(x)[2], dtype="int64").astype("float32")
            parts = paddle.unbind(x, axis=1)
            return (paddle.sum(x, [1, 2]), paddle.mean(x, -1, keepdim=True), paddle.max(x, 1), paddle.min(x),
                    paddle.prod(x, 2), paddle.all(x > -0.9, 1), paddle.any(x > 0.9, [1, 2]),
                    paddle.logsumexp(x, 2), paddle.norm(x, 2, 2), paddle.norm(x, 1, 1), paddle.std(x, 2),
                    paddle.einsum("nij,nkj->nik", x, x), paddle.expand(x[:, :1], [-1, 3, 4]),
                    paddle.expand_as(x[:1], x), paddle.tile(x, [1, 2, 1]), parts[0] + parts[2] * 2.0,
                    paddle.stack(parts, axis=-1), paddle.flatten(x, 1, 2), paddle.unsqueeze(x, [0, 3]).squeeze(0),
                    F.one_hot(paddle.argmax(x, -1), 4), paddle.full_like(x, 2.0) * x, x + steps,
                    paddle.full([n, 2], 1.5) + x[:, 0, :2], F.pad(x, [1, 2], value=0.5, data_format="NCL"),
                    F.pad(x, [2, 1], mode="reflect", data_format="NCL"), F.pad(x, [1, 1], mode="replicate", data_format="NCL"),
                    F.pad(x, [1, 2], mode="circular", data_format="NCL"), paddle.logical_and(x > 0, x < 0.5),
                    paddle.logical_xor(x > 0, x > 0.5), x % 0.3, paddle.floor_divide(x, paddle.full_like(x, 0.3)),
                    paddle.cast(paddle.cast(x * 5.0, "int32"), "float32"), paddle.maximum(x, x * -1.0),
                    paddle.kthvalue(x, 2, 2)[0], paddle.cummax(x, 1)[0])

    class VisionOps(nn.Layer):
        """Transposed convolution, group and instance norm, interpolation, pixel shuffle, pooling relatives (max pooling's
        mask unpooled)."""

        def __init__(self):
            super().__init__()
            self.up = nn.Conv2DTranspose(4, 3, 3, stride=2, padding=1, output_padding=1)
            self.dw = nn.Conv2DTranspose(4, 4, 3, groups=4)
            self.gn, self.inorm = nn.GroupNorm(2, 4), nn.InstanceNorm2D(4)

        def forward(self, x):
            pooled, mask = F.max_pool2d(x, 2, 2, return_mask=True)
            _, ceil_mask = F.max_pool2d(x, 3, 2, padding=1, ceil_mode=True, return_mask=True)
            return (self.up(x), self.dw(x), self.gn(x), self.inorm(x), ceil_mask,
                    F.max_unpool2d(pooled, mask, 2, 2, output_size=x.shape[2:]),
                    F.interpolate(x, scale_factor=2, mode="nearest"),
                    F.interpolate(x, size=[9, 5], mode="bilinear", align_corners=True),
                    F.interpolate(x, size=[9, 5], mode="bilinear"),
                    F.interpolate(x, scale_factor=1.5, mode="bilinear", align_mode=1),
                    F.interpolate(x, size=[8, 7], mode="bicubic"), F.pixel_shuffle(paddle.tile(x, [1, 1, 1, 1]), 2),
                    F.adaptive_max_pool2d(x, 2), F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, exclusive=False),
                    F.unfold(x, 2), F.adaptive_avg_pool2d(x, [3, 2]))

    class Mobile(nn.Layer):
        """Blocks of paddle.vision's MobileNetV2 (relu6), ShuffleNetV2 (swish) and MobileNetV3 (hardswish, SE)."""

        def __init__(self):
            super().__init__()
            v3 = importlib.import_module("paddle.vision.models.mobilenetv3")
            shuffle = importlib.import_module("paddle.vision.models.shufflenetv2")
            v2 = importlib.import_module("paddle.vision.models.mobilenetv2")
            self.stem = nn.Conv2D(3, 8, 3, stride=2, padding=1)
            self.v2 = v2.InvertedResidual(8, 8, 1, 2)
            self.shuffle = shuffle.InvertedResidual(8, 8, 1, nn.Swish)
            self.v3 = v3.InvertedResidual(8, 16, 8, 3, 2, True, nn.Hardswish, nn.BatchNorm2D)
            self.fc = nn.Linear(8, 5)

        def forward(self, x):
            h = self.v3(self.shuffle(self.v2(self.stem(x))))
            return self.fc(paddle.flatten(F.adaptive_avg_pool2d(h, 1), 1))

    class Algebra(nn.Layer):
        """Products (bmm, dot, mv, addmm, kron, cross), diagonals, repeats, grids, crops, isclose, fmax, heaviside, logit,
        a 3-D transposed convolution and LP pooling."""

        def __init__(self):
            super().__init__()
            self.up3d = nn.Conv3DTranspose(2, 2, 2, stride=2)

        def forward(self, x):
            m = x[0]
            grid_a, grid_b = paddle.meshgrid(m[0], m[1, :3])
            return (paddle.bmm(x, x.transpose([0, 2, 1])), paddle.dot(m[0], m[1]), paddle.mv(m, m[0]),
                    paddle.addmm(m @ m.T, m, m.T, beta=0.5, alpha=2.0), paddle.kron(m[:2, :2], m[2:, 2:]),
                    paddle.cross(m[:3, :3], m[1:4, :3], axis=1), paddle.diag(m[0], 1), paddle.diag(m, -1),
                    paddle.diagonal(x, 1, 1, 2), paddle.trace(m), paddle.repeat_interleave(x, 2, 1), grid_a + grid_b,
                    paddle.crop(x, [1, 2, 3], [1, 1, 0]), paddle.isclose(x, paddle.maximum(x, x * 0.0)),
                    paddle.fmax(x, x.flip([2])), paddle.heaviside(x, x * 0.5), paddle.logit(F.sigmoid(x), 1e-3),
                    self.up3d(x.reshape([-1, 2, 2, 2, 4])), paddle.dist(x, x * 0.5, 3.0),
                    F.lp_pool2d(x.unsqueeze(1), 2, 2), paddle.linspace(0, 1, 4) + x.mean(), paddle.eye(3, 4) * paddle.sum(x))

    class PirOnly(nn.Layer):
        """APIs paddle 3 traces only to PIR: grid sampling, bilinear, index_put, median, sequence masks, shifts,
        searchsorted, -inf fills, and more."""

        def __init__(self):
            super().__init__()
            self.bilinear = nn.Bilinear(4, 3, 2)

        def forward(self, x, ids):
            theta = x[:, 0, :2, :3] * 0.3 + paddle.to_tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
            grid = F.affine_grid(theta, [2, 4, 3, 6], align_corners=False)
            causal = paddle.triu(paddle.full([5, 5], float("-inf")), 1)
            return (F.grid_sample(x, grid, align_corners=False),
                    F.grid_sample(x, grid * 1.5, mode="nearest", padding_mode="border"),
                    F.grid_sample(x, grid * 1.3, padding_mode="reflection", align_corners=False),
                    self.bilinear(x[:, 0, 0, :4], x[:, 1, 0, :3]), paddle.logcumsumexp(x, 3),
                    paddle.searchsorted(paddle.sort(x[0, 0, 0]), x), F.sequence_mask(ids + 1, maxlen=4) + ids.sum(),
                    F.temporal_shift(x, 2, 0.25), paddle.index_put(x, (ids,), x[0] * 2.0),
                    F.label_smooth(F.one_hot(ids, 3), epsilon=0.1), paddle.renorm(x, 2.0, 1, 1.0),
                    paddle.broadcast_tensors([x, x[:1]])[1], paddle.median(x, 3), paddle.median(x, 2),
                    paddle.tril_indices(3, 4, 0).astype("float32") + x.mean(), paddle.nan_to_num(paddle.log(x)),
                    F.softmax(x[:, 0, :, :] @ x[:, 1, :, :].transpose([0, 2, 1]) + causal[:4, :4], -1),
                    F.adaptive_max_pool3d(x.unsqueeze(1), [1, 2, 1]), F.pixel_unshuffle(x[:, :, :, :4], 2),
                    F.channel_shuffle(x, 2), paddle.atan2(x, x.flip([3])), paddle.diff(x, axis=-1),
                    paddle.rot90(x, 1, [2, 3]), F.glu(x, 1), F.local_response_norm(x, 3))

    class Ernie(nn.Layer):
        """ERNIE-style: word, position and token-type embeddings, a padding mask from the ids, encoder layers,
        pooler and classifier; batch and sequence dynamic."""

        def __init__(self):
            super().__init__()
            self.word, self.pos, self.segment = nn.Embedding(20, 8, padding_idx=0), nn.Embedding(16, 8), nn.Embedding(2, 8)
            self.norm = nn.LayerNorm(8)
            layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.1, activation="gelu")
            self.encoder = nn.TransformerEncoder(layer, 1)
            self.pooler, self.classifier = nn.Linear(8, 8), nn.Linear(8, 3)

        def forward(self, input_ids, token_type_ids):
            ones = paddle.ones_like(input_ids, dtype="int64")
            positions = paddle.cumsum(ones, axis=-1) - ones
            mask = paddle.unsqueeze(paddle.cast(input_ids == 0, "float32") * -1e4, axis=[1, 2])
            h = self.norm(self.word(input_ids) + self.pos(positions) + self.segment(token_type_ids))
            pooled = paddle.tanh(self.pooler(self.encoder(h, mask)[:, 0]))
            return F.softmax(self.classifier(pooled), -1)

    ids = (InputDef("input_ids", (-1, -1), (2, 7), "int64", 20), InputDef("token_type_ids", (-1, -1), (2, 7), "int64", 2))
    return [
        ModelDef("activations", Activations, (InputDef("x", (-1, 4, 3), (2, 4, 3)),)),
        ModelDef("indexing", Indexing, (InputDef("x", (5, 6), (5, 6)), InputDef("ids", (3,), (3,), "int64", 4))),
        ModelDef("reductions", Reductions, (InputDef("x", (-1, 3, 4), (2, 3, 4)),)),
        ModelDef("vision_ops", VisionOps, (InputDef("x", (-1, 4, 5, 5), (1, 4, 5, 5)),)),
        ModelDef("mobile", Mobile, (InputDef("x", (-1, 3, 16, 16), (1, 3, 16, 16)),)),
        ModelDef("ernie", Ernie, ids),
        ModelDef("algebra", Algebra, (InputDef("x", (-1, 4, 4), (2, 4, 4)),)),
        ModelDef("pir_only", PirOnly, (InputDef("x", (-1, 4, 4, 5), (2, 4, 4, 5)), InputDef("ids", (2,), (2,), "int64", 2)),
                 formats=("pir",)),
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
    paddle.seed(sum(map(ord, model.name)))
    layer = model.make()
    if model.committed:
        _initialize(paddle, layer, rng)
    layer.eval()
    feeds, others = _feeds(model, rng), _feeds(model, rng)  # the second set shows the outputs depend on the inputs

    def run(net, arrays):
        return [t.numpy() for t in as_list(net(*[paddle.to_tensor(a) for a in arrays.values()]))]

    eager, eager_others = run(layer, feeds), run(layer, others)
    save_layer(paddle, layer, model.inputs, work / model.name)
    prefix = work / model.name / PREFIX
    if prefix.with_suffix(".pdmodel").exists():
        _drop_callstacks(paddle, prefix.with_suffix(".pdmodel"))
    reloaded = _reload(paddle, prefix, feeds)
    arrays = {f"in_{k}": v for k, v in feeds.items()} | {f"in2_{k}": v for k, v in others.items()}
    arrays |= {f"out_{k}": t for k, t in enumerate(eager)} | {f"out2_{k}": t for k, t in enumerate(eager_others)}
    arrays |= {f"reloaded_{k}": t for k, t in enumerate(reloaded)}
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


def _drop_callstacks(paddle, path: pathlib.Path) -> None:
    """Remove the ops' Python call stacks from a legacy program: most of its bytes, and unused by the importer."""
    desc = importlib.import_module("paddle.base.proto.framework_pb2").ProgramDesc()
    desc.ParseFromString(path.read_bytes())
    for block in desc.blocks:
        for op in block.ops:
            kept = [a for a in op.attrs if a.name != "op_callstack"]
            del op.attrs[:]
            op.attrs.extend(kept)
    path.write_bytes(desc.SerializeToString())


def _feeds(model: ModelDef, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A sample of each input: floats in [-1, 1), integers below their bound."""
    return {i.name: _sample(i, rng) for i in model.inputs}


def _sample(i: InputDef, rng: np.random.Generator) -> np.ndarray:
    if i.values:
        return np.array(i.values, i.dtype).reshape(i.sample)
    if not i.dtype.startswith("int"):
        return rng.uniform(-1, 1, i.sample).astype(i.dtype)
    n = math.prod(i.sample)
    values = rng.permutation(i.high)[:n] if n <= i.high else rng.integers(0, i.high, n)
    return values.reshape(i.sample).astype(i.dtype)


def _child(fmt: PaddleFormat, work: pathlib.Path, names: list[str]) -> None:
    """Save the models (all, or those named) in one format (FLAGS_enable_pir_api is already set by the parent)."""
    import paddle

    paddle.set_device("cpu")
    if fmt is PaddleFormat.LEGACY:
        patch_legacy_apis(paddle)
    models = {m.name: m for m in _models(paddle)}
    for name in names or [n for n, m in models.items() if m.committed]:
        model = models[name] if name in models else _vision_model(paddle, name)
        if fmt in model.formats:
            _save_one(paddle, model, work)
    print(f"saved {fmt} models under {work}")


def _check_and_collect(model: str, works: dict[str, pathlib.Path], out: pathlib.Path) -> None:
    """The formats saved must reproduce the eager outputs; copy the model files and one data.npz."""
    works = {fmt: w for fmt, w in works.items() if (w / model).is_dir()}
    data = {fmt: dict(np.load(w / model / "data.npz")) for fmt, w in works.items()}
    first = data["pir"]
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


def _parent(out: pathlib.Path, names: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        works = {}
        for fmt in PaddleFormat:
            works[fmt] = pathlib.Path(tmp) / fmt
            spawn_in_format(fmt, [sys.executable, __file__, "--format", fmt, "--work", str(works[fmt]),
                                  "--models", ",".join(names)])
        models = sorted(p.name for p in works["pir"].iterdir())
        for model in models:
            _check_and_collect(model, works, out)
    total = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"wrote {len(models)} models to {out} ({total / 1024:.1f} KiB)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT, help="fixture folder")
    p.add_argument("--format", type=PaddleFormat, choices=list(PaddleFormat), help=argparse.SUPPRESS)  # child process
    p.add_argument("--work", type=pathlib.Path, help=argparse.SUPPRESS)
    p.add_argument("--models", default="", help="comma-separated model names (default: all committed ones); "
                   "a paddle.vision.models constructor's name saves that model at full size")
    args = p.parse_args()
    names = [n for n in args.models.split(",") if n]
    if args.format:
        _child(args.format, args.work, names)
    else:
        _parent(args.out, names)


if __name__ == "__main__":
    main()
