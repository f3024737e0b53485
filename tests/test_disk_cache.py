"""The cache's size bound: least recently used entries go once the cache passes its limit, and what was pruned is
compiled again."""
from __future__ import annotations

import os

import numpy as np
import pytest

import cinn
from cinn.compiler import compiled_cache
from cinn.runtime import disk_cache
from tests.test_compiled_cache import _mlp, lowerings  # noqa: F401  (the fixture)

KERNEL = "0123456789abcdef0123456789abcdef"


def _kernel(folder, stem: str, size: int, used: float) -> None:
    for suffix in disk_cache.KERNEL_SUFFIXES:
        path = folder / f"{stem}{suffix}"
        path.write_bytes(b"x" * (size if suffix == ".so" else 1))
        os.utime(path, (used, used))


@pytest.mark.parametrize(("text", "size"), [("1048576", 1 << 20), ("8G", 8 << 30), ("500M", 500 << 20),
                                            ("1.5k", 1536), ("2 GiB", 2 << 30), ("none", None)])
def test_sizes_read_in_binary_units(text, size):
    assert disk_cache.parse_size(text) == size


def test_a_limit_that_cannot_be_read_warns_and_keeps_the_default(monkeypatch):
    monkeypatch.setenv(disk_cache.LIMIT_VARIABLE, "lots")
    with pytest.warns(UserWarning, match="CINN_CACHE_LIMIT.*not a size"):
        assert disk_cache.limit() == disk_cache.DEFAULT_LIMIT


def test_the_least_recently_used_entries_go_down_to_the_low_water_mark(tmp_path):
    for i in range(10):  # entry i used at time 1000 + i
        _kernel(tmp_path, f"{i:032x}", 100, 1000.0 + i)
    (tmp_path / "compiled").mkdir()
    whole = tmp_path / "compiled" / f"{KERNEL}{disk_cache.COMPILED_SUFFIX}"
    whole.write_bytes(b"y" * 300)
    os.utime(whole, (1004.5, 1004.5))
    keep = [tmp_path / ".lock", tmp_path / "peaks-znver3-2.json", tmp_path / "tmpab12cd.so"]  # not entries
    for path in keep:
        path.write_bytes(b"z" * 1000)
    kernel = 100 + len(disk_cache.KERNEL_SUFFIXES) - 1
    assert disk_cache.prune(tmp_path, bound=2000) == 0  # 10 kernels of 103 bytes and the compile: within the bound
    freed = disk_cache.prune(tmp_path, bound=1000)  # down to 800: the five oldest kernels and the compile go
    assert freed == 5 * kernel + 300
    left = {p.name[:32] for p in tmp_path.glob("*.so") if p.name[0] != "t"}
    assert left == {f"{i:032x}" for i in range(5, 10)} and not whole.exists()
    assert all(p.exists() for p in keep) and len(list(tmp_path.glob("*.src"))) == 5


def test_a_load_marks_the_entry_used(tmp_path):
    program, _ = _mlp(0)
    cinn.compile(program, cache_dir=tmp_path)
    # the kernel's library and the whole compile (the thread pool's library beside them is no entry)
    files = [f for entry in disk_cache.entries(tmp_path) for f in entry.files if f.suffix in (".so", disk_cache.COMPILED_SUFFIX)]
    assert len(files) == 2
    for path in files:
        os.utime(path, (1000.0, 1000.0))
    cinn.compile(program, cache_dir=tmp_path)
    assert all(path.stat().st_mtime > 1000.0 for path in files)


def test_a_compile_pruned_from_the_cache_compiles_again(tmp_path, monkeypatch, lowerings):  # noqa: F811
    program, feeds = _mlp(0)
    want = cinn.compile(program, cache_dir=tmp_path).run(feeds)[0]
    for entry in disk_cache.entries(tmp_path):
        for path in entry.files:
            os.utime(path, (1000.0, 1000.0))
    monkeypatch.setenv(disk_cache.LIMIT_VARIABLE, "1")  # every store prunes the whole cache, the newest entry too
    other, _ = _mlp(1)
    cinn.compile(other, cache_dir=tmp_path)
    assert not disk_cache.entries(tmp_path)
    monkeypatch.delenv(disk_cache.LIMIT_VARIABLE)
    np.testing.assert_array_equal(cinn.compile(program, cache_dir=tmp_path).run(feeds)[0], want)
    assert len(lowerings) == 3 and len(list((tmp_path / compiled_cache.FOLDER).iterdir())) == 1
