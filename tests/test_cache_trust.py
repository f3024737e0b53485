"""Nothing cinn reads back from its cache runs code, and disk failures never stop a compile (issue 49, findings 1, 2
and 7): entries hold no pickle, the cache must be the user's alone (as ssh's StrictModes asks), libraries and
compiles carry HMACs under a per-user key, and a cache that cannot be written is built around with one warning."""
from __future__ import annotations

import ast
import contextlib
import errno
import hashlib
import io
import os
import pathlib
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
import warnings
import zipfile

import numpy as np
import pytest

import cinn
from cinn.compiler import build, compiled_cache
from cinn.runtime import disk_cache, trust
from tests.test_compiled_cache import _mlp, lowerings  # noqa: F401  (the fixture)

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAYLOAD = """
#include <stdio.h>
__attribute__((constructor)) static void payload(void) {
    FILE *f = fopen(MARKER, "w");
    if (f) { fputs("code ran", f); fclose(f); }
}
"""


@pytest.fixture
def marker(tmp_path) -> pathlib.Path:
    """Where an attacker's code would leave its mark."""
    return tmp_path / "marker"


def _payload(tmp_path: pathlib.Path, marker: pathlib.Path) -> bytes:
    """A shared library whose constructor writes the marker when it is loaded."""
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    source, lib = tmp_path / "payload.c", tmp_path / "payload.so"
    source.write_text(PAYLOAD)
    subprocess.run(["cc", "-shared", "-fPIC", f'-DMARKER="{marker}"', "-o", str(lib), str(source)], check=True)
    return lib.read_bytes()


class _Evil:
    def __init__(self, marker: pathlib.Path):
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.write_text, (self.marker, "code ran"))


def _compiled(cache: pathlib.Path) -> tuple[cinn.Program, dict, np.ndarray]:
    program, feeds = _mlp(0)
    return program, feeds, cinn.compile(program, cache_dir=cache).run(feeds)[0]


def _messages(caught) -> str:
    return "|".join(str(w.message) for w in caught)


@contextlib.contextmanager
def _recorded():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield caught


# -- finding 1: the whole-compile cache ------------------------------------------------------------------------------

def test_a_pickle_in_place_of_an_entry_never_runs(tmp_path, marker, lowerings):  # noqa: F811
    cache = tmp_path / "cache"
    program, feeds, want = _compiled(cache)
    (entry,) = (cache / compiled_cache.FOLDER).iterdir()
    entry.write_bytes(pickle.dumps(_Evil(marker)))
    with _recorded() as caught:
        got = cinn.compile(program, cache_dir=cache).run(feeds)[0]
    assert not marker.exists()
    assert f"unreadable compile cache entry {entry}" in _messages(caught) and "HMAC" in _messages(caught)
    np.testing.assert_array_equal(got, want)
    assert len(lowerings) == 2


def _rewritten(entry: pathlib.Path, secret: bytes, change) -> None:
    """Rewrite an entry's npz members through change(members), then sign it with `secret` as the cache does."""
    with zipfile.ZipFile(entry) as z:
        members = {name: z.read(name) for name in z.namelist()}
    change(members)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
        z.comment = bytes(trust.MAC_BYTES)
    data = buffer.getvalue()[: -trust.MAC_BYTES]
    entry.write_bytes(data + trust.stream_mac(io.BytesIO(data), entry.name, secret, None).digest())


def test_an_entry_signed_with_another_key_is_refused(tmp_path, marker, lowerings):  # noqa: F811
    """A cache copied in from elsewhere: whole, but its HMAC is another user's."""
    cache = tmp_path / "cache"
    program, feeds, want = _compiled(cache)
    (entry,) = (cache / compiled_cache.FOLDER).iterdir()
    _rewritten(entry, b"another user's key", lambda members: None)
    with _recorded() as caught:
        np.testing.assert_array_equal(cinn.compile(program, cache_dir=cache).run(feeds)[0], want)
    assert f"unreadable compile cache entry {entry}" in _messages(caught) and "HMAC" in _messages(caught)
    assert len(lowerings) == 2


def _object_array(marker: pathlib.Path) -> bytes:
    """An .npy of an object array: np.load(allow_pickle=True) would unpickle it."""
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, np.array([_Evil(marker)], dtype=object), allow_pickle=True)
    return buffer.getvalue()


@pytest.mark.parametrize("change", ["object constant", "unknown op", "library path"])
def test_an_authentic_entry_is_still_parsed_as_data(tmp_path, marker, lowerings, change):  # noqa: F811
    """Even an entry under the user's own key holds no code: an object array, an op that is not in the table or a
    library outside the kernel cache is refused, with one warning, and compiled again."""
    cache = tmp_path / "cache"
    program, feeds, want = _compiled(cache)
    (entry,) = (cache / compiled_cache.FOLDER).iterdir()

    def edit(members: dict[str, bytes]) -> None:
        if change == "object constant":
            members["c0.npy"] = _object_array(marker)
        else:
            meta = np.load(io.BytesIO(members["meta.npy"])).tobytes().decode()
            meta = re.sub('"op":"[a-z_0-9]+"', '"op":"os.system"', meta, count=1) if change == "unknown op" else \
                meta.replace('"library":"', '"library":"../../evil/')
            buffer = io.BytesIO()
            np.save(buffer, np.frombuffer(meta.encode(), np.uint8))
            members["meta.npy"] = buffer.getvalue()

    _rewritten(entry, trust.key(), edit)
    with _recorded() as caught:
        np.testing.assert_array_equal(cinn.compile(program, cache_dir=cache).run(feeds)[0], want)
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1 and f"unreadable compile cache entry {entry}" in messages[0], messages
    assert not marker.exists() and len(lowerings) == 2


def test_no_module_imports_pickle():
    """Nothing of cinn's may read a format that carries code: no pickle (cloudpickle, dill, ...) import, and no
    np.load(allow_pickle=True). (The build workers' transport is TVM's PopenPoolExecutor, outside this tree.)"""
    banned = {"pickle", "_pickle", "cPickle", "cloudpickle", "dill", "shelve", "joblib", "marshal"}
    found = []
    for folder in ("cinn", "frontend", "schedules", "autotune", "benchmarks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module or ""] if isinstance(node, ast.ImportFrom) else []
                found += [f"{path.relative_to(ROOT)}:{node.lineno} imports {n}" for n in names
                          if n.split(".")[0] in banned]
                if isinstance(node, ast.keyword) and node.arg == "allow_pickle" and \
                        not (isinstance(node.value, ast.Constant) and node.value.value is False):
                    found.append(f"{path.relative_to(ROOT)}:{node.value.lineno} allow_pickle")
    assert not found


# -- finding 2: kernel libraries and the thread pool -----------------------------------------------------------------

_CHILD = """
import sys, warnings, numpy as np, cinn
b = cinn.NetBuilder("p")
x = b.create_input("float32", (64, 4096), "x")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    exe = cinn.compile(b.build([b.relu(x)]), cache_dir=sys.argv[1])
    a = np.random.default_rng(0).standard_normal((64, 4096)).astype("float32")
    assert np.array_equal(exe.run({"x": a})[0], np.maximum(a, 0))
print("|".join(str(w.message) for w in caught))
"""


def _child(cache: pathlib.Path) -> str:
    """Compile and run a small program in a fresh process (dlopen hands a process the library it loaded before
    under a path, whatever the file holds now); its warnings."""
    done = subprocess.run([sys.executable, "-c", _CHILD, str(cache)], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "CINN_THREAD_POOL": "cinn"})
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _swap(library: pathlib.Path, evil: bytes) -> None:
    """Put the attacker's library in place, with its plain SHA-256 where the digest is."""
    library.write_bytes(evil)
    pathlib.Path(disk_cache.digest_path(library)).write_text(hashlib.sha256(evil).hexdigest())


def test_a_library_swapped_with_its_digest_is_never_loaded(tmp_path, marker):
    """The keyed digest fails: the entry is rebuilt with a warning naming the library; its constructor never runs."""
    cache = tmp_path / "cache"
    _child(cache)
    evil = _payload(tmp_path, marker)
    (library,) = cache.glob("[0-9a-f]*.so")
    _swap(library, evil)
    warned = _child(cache)
    assert not marker.exists()
    assert f"corrupt cache entry {library}" in warned and "does not match its digest" in warned, warned
    assert library.read_bytes() != evil  # rebuilt


def test_an_entry_others_can_write_is_refused(tmp_path):
    """An entry file that is group-writable (in a trusted root) is refused with a warning and rebuilt."""
    cache = tmp_path / "cache"
    program, feeds, want = _compiled(cache)
    (lib, *_) = sorted(cache.glob("[0-9a-f]*.so"))
    (entry,) = (cache / compiled_cache.FOLDER).iterdir()
    lib.chmod(0o664)
    entry.chmod(0o666)
    with _recorded() as caught:
        np.testing.assert_array_equal(cinn.compile(program, cache_dir=cache).run(feeds)[0], want)
    assert f"unreadable compile cache entry {entry} (it is world-writable" in _messages(caught)
    assert f"corrupt cache entry {lib} (Untrusted: {lib} is group-writable" in _messages(caught)
    with _recorded() as caught:
        np.testing.assert_array_equal(cinn.compile(program, cache_dir=cache).run(feeds)[0], want)
    assert not caught, _messages(caught)  # both written again, the user's alone
    assert not lib.stat().st_mode & 0o022 and not entry.stat().st_mode & 0o022


def test_a_swapped_thread_pool_library_is_never_loaded(tmp_path, marker):
    """The pool is loaded with ctypes on a process's first kernel load: its swapped library is refused with a warning
    naming it, and built again."""
    cache = tmp_path / "cache"
    _child(cache)
    (pool,) = cache.glob("thread-pool-*.so")
    evil = _payload(tmp_path, marker)
    _swap(pool, evil)
    warned = _child(cache)
    assert not marker.exists()
    assert f"refused the thread pool library {pool}" in warned, warned
    assert pool.read_bytes() != evil


# -- trust rules: the cache root and the key ---------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["world-writable", "group-writable", "another owner"])
def test_a_cache_others_can_write_is_not_used(tmp_path, how, lowerings):  # noqa: F811
    cache = tmp_path / "cache"
    program, feeds, want = _compiled(cache)
    if how == "another owner":
        if os.getuid() != 0:
            pytest.skip("changing a folder's owner needs root")
        os.chown(cache, 65534, -1)
    else:
        cache.chmod(0o777 if how == "world-writable" else 0o775)
    before = sorted(p.name for p in cache.iterdir())
    with _recorded() as caught:
        for _ in range(2):
            np.testing.assert_array_equal(cinn.compile(program, cache_dir=cache).run(feeds)[0], want)
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1 and f"not using the cache {cache}: {cache} is {how.replace('another owner', 'owned by')}" \
        in messages[0], messages
    assert len(lowerings) == 3  # its entries were not read
    assert sorted(p.name for p in cache.iterdir()) == before  # nor anything written there


@pytest.fixture
def key_file(tmp_path, monkeypatch) -> pathlib.Path:
    path = tmp_path / "config" / "cinn" / "cache.key"
    monkeypatch.setenv(trust.KEY_VARIABLE, str(path))
    return path


def test_the_key_is_made_private_on_first_use_and_kept(key_file):
    key = trust.key()
    assert len(key) == trust.KEY_BYTES and key_file.read_bytes() == key
    assert key_file.stat().st_mode & 0o777 == 0o600 and key_file.parent.stat().st_mode & 0o777 == 0o700
    trust._make_key(key_file)  # another process that found no key: the first one stays
    assert key_file.read_bytes() == key and not list(key_file.parent.glob(".cache.key-*"))


def test_a_key_file_others_can_read_makes_cinn_compile_without_the_cache(tmp_path, key_file, lowerings):  # noqa: F811
    key_file.parent.mkdir(parents=True)
    key_file.write_bytes(os.urandom(trust.KEY_BYTES))
    key_file.chmod(0o644)
    cache = tmp_path / "cache"
    program, feeds = _mlp(0)
    with _recorded() as caught:
        cinn.compile(program, cache_dir=cache).run(feeds)
    assert f"the cache key {key_file} is open to other users (mode 0644" in _messages(caught)
    assert not list(cache.glob("[0-9a-f]*.so")) and not (cache / compiled_cache.FOLDER).exists()


def test_entries_written_under_another_key_are_rebuilt(tmp_path, key_file, lowerings):  # noqa: F811
    """A new key (another user's cache copied in, or a key file replaced) invalidates every entry, with warnings."""
    cache = tmp_path / "cache"
    program, feeds, want = _compiled(cache)
    key_file.unlink()
    trust._State.keys.clear()
    with _recorded() as caught:
        np.testing.assert_array_equal(cinn.compile(program, cache_dir=cache).run(feeds)[0], want)
    assert "unreadable compile cache entry" in _messages(caught)
    assert len(lowerings) == 2


# -- finding 7: a cache that cannot be written -------------------------------------------------------------------------

def test_a_failed_kernel_write_builds_in_a_temporary_folder(tmp_path, monkeypatch, lowerings):  # noqa: F811
    """In-process (workers=1): every library write into the cache fails with ENOSPC; the compile goes on, with one
    warning, and leaves nothing behind; once the disk has room, the next compile is cached again."""
    cache, scratch = tmp_path / "cache", tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    export = build._export

    def full_disk(ex, path, target):
        if pathlib.Path(path).parent == cache:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        export(ex, path, target)

    monkeypatch.setattr(build, "_export", full_disk)
    program, feeds = _mlp(0)
    with _recorded() as caught:
        got = cinn.compile(program, cache_dir=cache, workers=1).run(feeds)[0]
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1 and f"could not write the kernel cache {cache}" in messages[0], messages
    assert "No space left on device" in messages[0]
    assert not list(cache.glob("[0-9a-f]*.so")) and not (cache / compiled_cache.FOLDER).exists()
    assert not list(cache.glob("tmp*")) and not list(scratch.glob("cinn-uncached-*"))
    monkeypatch.setattr(build, "_export", export)
    np.testing.assert_array_equal(cinn.compile(program, cache_dir=cache, workers=1).run(feeds)[0], got)
    np.testing.assert_array_equal(cinn.compile(program, cache_dir=cache, workers=1).run(feeds)[0], got)
    assert len(lowerings) == 2 and len(list((cache / compiled_cache.FOLDER).iterdir())) == 1


@pytest.fixture
def full_disk(tmp_path):
    """A small tmpfs, private to this user, and a function that fills it; skipped where mounting is not allowed."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.getuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m,mode=0755", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.strip()}")

    def fill() -> None:
        with open(mount / "filler", "ab", buffering=0) as f:
            with contextlib.suppress(OSError):
                while True:
                    f.write(b"\0" * 65536)

    try:
        yield mount, fill
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_never_fails_a_compile(full_disk, lowerings):  # noqa: F811
    """A real full filesystem: kernels built by worker processes (unfused: two) fall back to a temporary folder (one
    warning); with the kernels cached before the disk filled, only the whole compile's entry cannot be written (one
    warning)."""
    mount, fill = full_disk
    cache = mount / "cache"
    cache.mkdir()
    fill()
    program, feeds = _mlp(3)
    with _recorded() as caught:
        got = cinn.compile(program, cache_dir=cache, workers=2, fuse=False).run(feeds)[0]
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1 and f"could not write the kernel cache {cache}" in messages[0], messages
    (mount / "filler").unlink()
    want = cinn.compile(program, cache_dir=cache, workers=2, fuse=False).run(feeds)[0]
    np.testing.assert_array_equal(got, want)
    shutil.rmtree(cache / compiled_cache.FOLDER)
    fill()
    with _recorded() as caught:
        np.testing.assert_array_equal(cinn.compile(program, cache_dir=cache, workers=2, fuse=False).run(feeds)[0], want)
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1 and "could not write the compile cache entry" in messages[0], messages
    assert "No space left on device" in messages[0]
    assert len(lowerings) == 3
