"""The Paddle importer's rnn op (paddle.nn.SimpleRNN, GRU, LSTM): models saved by real paddlepaddle
(tests/fixtures/paddle/rnn_*, made by tools/make_paddle_fixtures.py) compared with Paddle's outputs, final states
included, in both formats; refusals. paddle itself is not needed."""
from __future__ import annotations

import numpy as np
import pytest

import cinn
from frontend.paddle import PaddleImportError
from frontend.paddle.schema import program_desc
from tests.test_paddle_import import FIXTURES, FORMATS, copy_model, fixture_data, shapes_of

MODELS = {
    "rnn_lstm": "LSTM, one layer, zero initial states",
    "rnn_lstm_bi2_states": "bidirectional 2-layer LSTM from given initial h and c",
    "rnn_lstm_bi2_lengths": "bidirectional 2-layer LSTM over sequences of different lengths",
    "rnn_gru_bi_time_major": "bidirectional GRU, time-major input, given initial h",
    "rnn_gru2_lengths": "2-layer GRU over sequences of different lengths",
    "rnn_simple_tanh2": "2-layer SimpleRNN (tanh)",
    "rnn_simple_relu_bi": "bidirectional SimpleRNN (relu), given initial h",
    "rnn_classifier": "a text classifier's LSTM body: 2 bidirectional layers, lengths, a dynamic batch, a linear head",
}


def _compile(model: str, fmt: str, cache):
    feeds, want = fixture_data(model)
    program = cinn.load_paddle(FIXTURES / model / fmt, input_shapes=shapes_of(feeds))
    return cinn.compile(program, cache_dir=cache), feeds, want


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("model", sorted(MODELS))
def test_matches_paddle(model, fmt, tmp_cache):
    """Outputs and final states equal Paddle's, and change with the input."""
    exe, feeds, want = _compile(model, fmt, tmp_cache)
    got = exe.run(feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.dtype, w.shape)
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
    changed = exe.run(feeds | {"x": feeds["x"] + 0.5})
    assert all(not np.allclose(c, g) for c, g in zip(changed, got, strict=True))


@pytest.mark.parametrize("model", ["rnn_lstm_bi2_lengths", "rnn_gru2_lengths"])
def test_padded_steps_keep_the_state(model, tmp_cache):
    """Past its length a sequence outputs zeros and its final state ignores the padding; its own steps do not depend
    on the padding."""
    exe, feeds, _ = _compile(model, "pir", tmp_cache)
    y, h, *_ = exe.run(feeds)
    lengths = feeds["lengths"]
    short = int(np.argmin(lengths))
    assert lengths[short] < y.shape[1] and not y[short, lengths[short]:].any()
    noisy = feeds["x"].copy()
    noisy[short, lengths[short]:] += 3.0
    y2, h2, *_ = exe.run(feeds | {"x": noisy})
    np.testing.assert_allclose(y2, y, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(h2, h, rtol=1e-5, atol=1e-6)
    y3, *_ = exe.run(feeds | {"lengths": np.full_like(lengths, y.shape[1])})
    assert y3[short, lengths[short]:].any()


def test_dynamic_batch_needs_input_shapes():
    """Paddle's -1 dims of x and lengths are separate symbols, which the probes size apart: input_shapes fixes both
    (as test_matches_paddle does), and without them the error names the lengths."""
    with pytest.raises(ValueError, match=r"SequenceLength has shape \[\d+\], not \[\d+\] \(one per sequence\)"):
        cinn.load_paddle(FIXTURES / "rnn_classifier" / "pir")


def _edit_rnn(path, **attrs) -> None:
    """Rewrite the rnn op's attributes of a legacy model file."""
    desc = program_desc()()
    desc.ParseFromString(path.read_bytes())
    op = next(op for op in desc.blocks[0].ops if op.type == "rnn")
    for a in op.attrs:
        if a.name in attrs:
            field, value = attrs[a.name]
            setattr(a, field, value)
    path.write_bytes(desc.SerializeToString())


@pytest.mark.parametrize(("attrs", "message"), [
    ({"mode": ("s", "LSTMP")}, r"mode 'LSTMP' is not supported \(supported: LSTM, GRU, RNN_TANH, RNN_RELU\)"),
    ({"is_test": ("b", False), "dropout_prob": ("f", 0.5)}, r"training-mode rnn with dropout"),
    ({"num_layers": ("i", 3)}, r"WeightList has 4 tensors, but 3 layers in 1 direction\(s\) need 12"),
    ({"hidden_size": ("i", 6)}, r"PreState must be 2 tensors of shape \[1, 3, 6\] for LSTM"),
])
def test_refusals_name_the_op(attrs, message, tmp_path):
    path = copy_model("rnn_lstm", "legacy", tmp_path)
    _edit_rnn(path, **attrs)
    with pytest.raises(PaddleImportError, match=rf"Paddle op rnn '[^']+': .*{message}"):
        cinn.load_paddle(path)
