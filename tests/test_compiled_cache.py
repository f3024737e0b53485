"""The compile cache: a program compiled before skips the passes and the lowering, and any change compiles again."""
from __future__ import annotations

import pickle

import numpy as np
import pytest

import cinn
from cinn.compiler import compiled_cache
from cinn.facade import api


def _mlp(seed: int) -> tuple[cinn.Program, dict]:
    rng = np.random.default_rng(seed)
    b = cinn.NetBuilder("mlp")
    x = b.create_input("float32", (4, 16), "x")
    w = b.create_constant(rng.standard_normal((16, 32)).astype("float32"), "w")
    y = b.relu(b.matmul(x, w))
    return b.build([y]), {"x": rng.standard_normal((4, 16)).astype("float32")}


@pytest.fixture
def lowerings(monkeypatch):
    """Counts compile's lowerings of a program."""
    calls = []
    lower = api.lower_program
    monkeypatch.setattr(api, "lower_program", lambda *a, **k: calls.append(1) or lower(*a, **k))
    return calls


def test_a_second_compile_takes_the_cached_one(tmp_path, lowerings):
    program, feeds = _mlp(0)
    first = cinn.compile(program, cache_dir=tmp_path)
    second = cinn.compile(program, cache_dir=tmp_path)
    assert len(lowerings) == 1 and len(list((tmp_path / compiled_cache.FOLDER).iterdir())) == 1
    np.testing.assert_array_equal(second.run(feeds)[0], first.run(feeds)[0])
    assert second.kernel_sources() == first.kernel_sources()


def test_an_int8_compile_comes_back_from_the_cache(tmp_path, lowerings):
    """A quantized matmul (on a VNNI host: an integer kernel over int8 constants) is kept and read back whole."""
    from cinn.core.target import parse_target
    from tests.test_integer_kernels import _quantized_matmul, _weights

    if not parse_target("llvm").has_vnni:
        pytest.skip("the integer kernels need a VNNI host")
    program = _quantized_matmul(_weights(32, 48, True), 7)
    x = np.random.default_rng(2).uniform(-6, 6, (6, 32)).astype(np.float32)
    first = cinn.compile(program, cache_dir=tmp_path)
    second = cinn.compile(program, cache_dir=tmp_path)
    assert len(lowerings) == 1 and "matmul_u8i8" in [n.op for n in second.program.nodes]
    (entry,) = (tmp_path / compiled_cache.FOLDER).iterdir()
    cached = compiled_cache.load(entry)
    assert cached is not None and any(a.dtype == np.int8 for a in cached.program.constants.values())
    np.testing.assert_array_equal(second.run({"x": x})[0], first.run({"x": x})[0])


def test_other_constants_or_options_compile_again(tmp_path, lowerings):
    program, feeds = _mlp(0)
    other, _ = _mlp(1)  # the same graph with other weights
    want = cinn.compile(other, cache_dir=tmp_path).run(feeds)[0]
    cinn.compile(program, cache_dir=tmp_path)
    cinn.compile(program, cache_dir=tmp_path, fuse=False)
    assert len(lowerings) == 3
    np.testing.assert_array_equal(cinn.compile(other, cache_dir=tmp_path).run(feeds)[0], want)
    assert len(lowerings) == 3


def test_an_unreadable_entry_or_a_lost_kernel_compiles_again(tmp_path, lowerings):
    program, feeds = _mlp(0)
    want = cinn.compile(program, cache_dir=tmp_path).run(feeds)[0]
    (entry,) = (tmp_path / compiled_cache.FOLDER).iterdir()
    entry.write_bytes(b"not a pickle")
    with pytest.warns(UserWarning, match="unreadable compile cache entry"):
        np.testing.assert_array_equal(cinn.compile(program, cache_dir=tmp_path).run(feeds)[0], want)
    for library in tmp_path.glob("*.so"):
        library.unlink()
    np.testing.assert_array_equal(cinn.compile(program, cache_dir=tmp_path).run(feeds)[0], want)
    assert len(lowerings) == 3


def test_programs_pickle_with_their_constants():
    program, _ = _mlp(0)
    back = pickle.loads(pickle.dumps(program))
    assert back.nodes == program.nodes and back.constants.keys() == program.constants.keys()
    np.testing.assert_array_equal(back.constants["w"], program.constants["w"])
