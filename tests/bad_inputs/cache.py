"""Cache tampering: the tiny model compiled again over a copy of the warm cache that someone else wrote to.

Every case's folder holds cache/ (the warm cache, copied: its whole-compile entries name the warm cache's libraries,
so cases that swap a library drop those entries and the kernel is loaded from the copy), and cinn runs with
CINN_CACHE_DIR pointing at it. What passes: the model runs with the right result, no payload runs; a cache that
others can write, or that is on a full disk, is named in a warning.
"""
from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import subprocess
from collections.abc import Callable, Iterator

from cinn.runtime import disk_cache, trust
from tests.bad_inputs import payloads
from tests.bad_inputs.core import MARKER, Action, Api, Case, Category, Expect, Unavailable, Want

OTHER_UID = 65534  # nobody


def _cache(d: pathlib.Path) -> pathlib.Path:
    return d / "cache"


def _kernels(cache: pathlib.Path) -> list[pathlib.Path]:
    return [p for p in cache.glob("*.so") if not p.name.startswith("thread-pool")]


def _compiled(cache: pathlib.Path) -> Iterator[pathlib.Path]:
    return (p for p in (cache / "compiled").rglob("*") if p.is_file())


# The key "a matching digest" is made with: an attacker's own, as who can write the cache cannot read the user's key
# (tests.bad_inputs.runner.Setup's). An entry signed with the user's key is cinn's own writing, trusted as ssh trusts
# the user's files: a library cut short and signed so is no case (dlopen of it dies of SIGBUS).
ATTACKER_KEY = b"attacker" * 4


def _sign(lib: pathlib.Path, secret: bytes = ATTACKER_KEY) -> None:
    """Rewrite the keyed digest stored beside a library to match its bytes under `secret`."""
    pathlib.Path(disk_cache.digest_path(lib)).write_text(trust.file_mac(lib, secret))


def _drop_compiled(cache: pathlib.Path) -> None:
    shutil.rmtree(cache / "compiled", ignore_errors=True)


def _swap(select: Callable[[pathlib.Path], list[pathlib.Path]], digest: bool) -> Callable[[pathlib.Path], None]:
    """Replace the selected libraries by one whose constructor creates the marker (with a matching digest)."""
    def make(d: pathlib.Path) -> None:
        cache = _cache(d)
        _drop_compiled(cache)
        evil = payloads.constructor_library(d / "evil.so", d / MARKER)
        for lib in select(cache):
            shutil.copyfile(evil, lib)
            if digest:
                _sign(lib)

    return make


def _symlink_kernel(d: pathlib.Path) -> None:
    cache = _cache(d)
    _drop_compiled(cache)
    evil = payloads.constructor_library(d / "evil.so", d / MARKER)
    for lib in _kernels(cache):
        lib.unlink()
        lib.symlink_to(evil)
        _sign(lib)


def _pool(cache: pathlib.Path) -> list[pathlib.Path]:
    return list(cache.glob("thread-pool-*.so"))


def _entries(content: Callable[[pathlib.Path, pathlib.Path], bytes]) -> Callable[[pathlib.Path], None]:
    """Overwrite every whole-compile entry with content(case folder, entry)."""
    def make(d: pathlib.Path) -> None:
        for entry in _compiled(_cache(d)):
            entry.write_bytes(content(d, entry))

    return make


def _truncate_kernel(digest: bool) -> Callable[[pathlib.Path], None]:
    def make(d: pathlib.Path) -> None:
        cache = _cache(d)
        _drop_compiled(cache)
        for lib in _kernels(cache):
            lib.write_bytes(lib.read_bytes()[:4096])
            if digest:
                _sign(lib)

    return make


def _each(select: Callable[[pathlib.Path], list[pathlib.Path]], change: Callable[[pathlib.Path], None],
          drop_compiled: bool = True) -> Callable[[pathlib.Path], None]:
    def make(d: pathlib.Path) -> None:
        cache = _cache(d)
        if drop_compiled:
            _drop_compiled(cache)
        for p in select(cache):
            change(p)

    return make


def _folder(p: pathlib.Path) -> None:
    """A folder (holding a file) in the file's place."""
    p.unlink()
    p.mkdir()
    (p / "file").write_text("not a library")


def _compiled_entries(cache: pathlib.Path) -> list[pathlib.Path]:
    return list(_compiled(cache))


def _chmod_tree(mode: int) -> Callable[[pathlib.Path], None]:
    return lambda d: os.chmod(_cache(d), mode)


def _chown_tree(d: pathlib.Path) -> None:
    if os.geteuid() != 0:
        raise Unavailable("giving the cache to another user needs root")
    for root, dirs, files in os.walk(_cache(d)):
        for name in [*dirs, *files]:
            os.lchown(os.path.join(root, name), OTHER_UID, OTHER_UID)
    os.chown(_cache(d), OTHER_UID, OTHER_UID)


def _entry_writable(d: pathlib.Path) -> None:
    for entry in _compiled(_cache(d)):
        entry.chmod(0o666)


def _lock_folder(d: pathlib.Path) -> None:
    lock = _cache(d) / ".lock"
    lock.unlink(missing_ok=True)
    lock.mkdir()


def _cache_is_file(d: pathlib.Path) -> None:
    shutil.rmtree(_cache(d))
    _cache(d).write_text("not a folder")


def _on_a_full_disk(kernels: bool) -> Callable[[pathlib.Path], None]:
    """The cache on a small tmpfs (tests.bad_inputs.runner unmounts it), empty or holding the warm cache's kernels,
    then filled to the last byte: an empty file can still be made there, as cinn's write probe makes."""
    def make(d: pathlib.Path) -> None:
        cache, warm = _cache(d), d / "warm-cache"
        if os.geteuid() != 0 or shutil.which("mount") is None:
            raise Unavailable("mounting a tmpfs needs root")
        cache.rename(warm)
        cache.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0755", "tmpfs", str(cache)], capture_output=True,
                              text=True)
        if done.returncode != 0:
            raise Unavailable(f"cannot mount a tmpfs: {done.stderr.strip()}")
        if kernels:
            shutil.copytree(warm, cache, symlinks=True, dirs_exist_ok=True)
            _drop_compiled(cache)
        with open(cache / "filler", "ab", buffering=0) as f, contextlib.suppress(OSError):
            while True:
                f.write(bytes(1 << 16))

    return make


def _garbage(_: pathlib.Path, __: pathlib.Path) -> bytes:
    return b"\x80\x04\x95garbage" * 10


RUNS = Expect(Want.RESULT)
NAMED = Expect(Want.RESULT, warns="{dir}/cache")


def cases() -> list[Case]:
    specs: list[tuple[str, Callable[[pathlib.Path], object], Expect]] = [
        ("a whole-compile entry replaced by a pickle payload", _entries(lambda d, _: payloads.pickle_bytes(d / MARKER)), RUNS),
        ("a whole-compile entry of garbage bytes", _entries(_garbage), RUNS),
        ("a whole-compile entry of garbage JSON", _entries(lambda *_: b'{"program": [1, 2,'), RUNS),
        ("an empty whole-compile entry", _entries(lambda *_: b""), RUNS),
        ("a whole-compile entry cut in half", _entries(lambda _, p: p.read_bytes()[: p.stat().st_size // 2]), RUNS),
        ("a kernel library swapped with its digest", _swap(_kernels, digest=True), RUNS),
        ("a kernel library swapped without its digest", _swap(_kernels, digest=False), RUNS),
        ("a kernel library symlinked to a payload with its digest", _symlink_kernel, RUNS),
        ("a kernel library truncated", _truncate_kernel(digest=False), RUNS),
        ("a kernel library truncated with a matching digest", _truncate_kernel(digest=True), RUNS),
        ("a kernel digest of garbage", _each(_kernels, lambda p: pathlib.Path(disk_cache.digest_path(p)).write_text("zz\0")), RUNS),
        ("a kernel without its source", _each(_kernels, lambda p: p.with_suffix(".src").unlink()), RUNS),
        ("a kernel library that is a folder", _each(_kernels, _folder), RUNS),
        ("a whole-compile entry that is a folder", _each(_compiled_entries, _folder, drop_compiled=False), RUNS),
        ("the cache folder of mode 0777", _chmod_tree(0o777), NAMED),
        ("the cache folder of mode 0775", _chmod_tree(0o775), NAMED),
        ("the cache owned by another user", _chown_tree, NAMED),
        ("a whole-compile entry of mode 0666", _entry_writable, NAMED),
        ("the cache lock is a folder", _lock_folder, Expect(Want.EITHER)),
        ("the cache folder is a file", _cache_is_file, Expect(Want.EITHER, names="{dir}/cache")),
        ("the cache on a full disk", _on_a_full_disk(kernels=False),
         Expect(Want.RESULT, warns="could not write the kernel cache {dir}/cache")),
        ("the cache on a full disk, the kernels cached", _on_a_full_disk(kernels=True),
         Expect(Want.RESULT, warns="could not write the compile cache entry {dir}/cache")),
    ]
    # alone: a process loads the thread pool once, from the first cache it compiles with
    pool: list[tuple[str, Callable[[pathlib.Path], object], Expect]] = [
        ("the thread-pool library swapped with its digest", _swap(_pool, digest=True), RUNS),
        ("the thread-pool library swapped without its digest", _swap(_pool, digest=False), RUNS),
        ("the thread-pool library that is a folder", _each(_pool, _folder), RUNS),
    ]
    return [Case(Category.CACHE, name, Api(Action.COMPILE_TINY), make, expect, alone)
            for alone, chosen in ((False, specs), (True, pool)) for name, make, expect in chosen]
