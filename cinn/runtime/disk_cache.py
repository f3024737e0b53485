"""The on-disk cache's lock and size bound: once the cache passes its limit, the least recently used entries go.

An entry is a kernel (its library, source and keyed digest, one stem) or a whole compile (compiled/NAME.npz); loading one
touches it, so its modification time says when it was last used. Readers hold the directory's lock (shared) while
they check and load a kernel, and pruning holds it exclusively, so no reader loads a library half deleted; a whole
compile whose kernels were pruned is compiled again, and a kernel pruned is built again.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import pathlib
import re
import tempfile
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from cinn.runtime import trust

LIMIT_VARIABLE = "CINN_CACHE_LIMIT"
DEFAULT_LIMIT = 8 << 30
# pruning goes below the limit, so that the stores after it do not each scan and prune again
LOW_WATER = 0.8
# .sha256 and .pkl: what older versions wrote (plain digests, pickled compiles), never read, pruned as entries
KERNEL_SUFFIXES = (".so", ".src", ".mac", ".sha256")
COMPILED_FOLDER, COMPILED_SUFFIX, COMPILED_SUFFIXES = "compiled", ".npz", (".npz", ".pkl")
LOCK = ".lock"
KERNEL_STEM = re.compile(r"[0-9a-f]{32}")  # cinn.compiler.build.cache_key's; a kernel being written has a temporary name
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


@dataclass(frozen=True)
class Entry:
    """One cache entry: its files, when it was last used and its size in bytes."""

    files: tuple[pathlib.Path, ...]
    used: float
    size: int


@contextlib.contextmanager
def lock(cache_dir: pathlib.Path, exclusive: bool, name: str = LOCK) -> Iterator[None]:
    """The cache directory's advisory lock (the entries', else the one named): writers and pruning hold it
    exclusively, readers shared."""
    with open(cache_dir / name, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def digest_path(lib_path: str | os.PathLike) -> str:
    """Where the keyed digest (cinn.runtime.trust.file_mac) of a cached library is written beside it: a library is loaded
    only when its bytes match, as loading a truncated one can kill the process (SIGBUS in dlopen) and loading one
    that this user's cinn did not build runs its code."""
    return os.fspath(lib_path)[: -len(".so")] + ".mac"


def check_entry(files: Sequence[str], secret: bytes) -> None:
    """Raise trust.Untrusted unless an entry's files (its library first) and its digest are this user's alone and the
    library's bytes match the digest keyed by `secret`."""
    library, digest = files[0], digest_path(files[0])
    for f in (*files, digest):
        trust.check(f)
    if not trust.same_mac(pathlib.Path(digest).read_bytes().strip(), trust.file_mac(library, secret).encode()):
        raise trust.Untrusted("the library does not match its digest (truncated, overwritten, or not built by this "
                              "user's cinn)")


def write_entry(finals: Sequence[str], write: Callable[[list[str]], object], secret: bytes | None,
                lock_name: str = LOCK) -> None:
    """Write the files of an entry, a library first: temporary files made beside them are filled by write(), the
    library's digest keyed by `secret` is added (none without one), and all are renamed into place together under
    the cache's lock (or the one named), so that a reader holding it shared meets them all old or all new (two
    processes building one kernel write different bytes: one library with the other's digest would be refused). On
    failure none is left."""
    library = finals[0]
    finals = [*finals, digest_path(library)] if secret is not None else list(finals)
    made: list[str] = []
    try:
        for final in finals:
            fd, tmp = tempfile.mkstemp(suffix=os.path.splitext(final)[1], dir=os.path.dirname(final))
            os.close(fd)
            made.append(tmp)
        write(made)
        if secret is not None:
            pathlib.Path(made[-1]).write_text(trust.file_mac(made[0], secret, os.path.basename(library)))
        for tmp in made:
            trust.private(tmp)
        with lock(pathlib.Path(library).parent, exclusive=True, name=lock_name):
            for tmp, final in zip(made, finals, strict=True):
                os.replace(tmp, final)
    finally:
        for tmp in made:
            pathlib.Path(tmp).unlink(missing_ok=True)


def parse_size(text: str) -> int | None:
    """Bytes from '8G', '500M', '1048576' (binary units; 'none' for no limit); ValueError on anything else."""
    if text.strip().lower() in ("none", "unlimited"):
        return None
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*", text.lower())
    if match is None:
        raise ValueError(f"not a size: {text!r} (e.g. 8G, 500M, 1048576 or none)")
    return int(float(match[1]) * _UNITS[match[2]])


def limit() -> int | None:
    """The cache's size limit: $CINN_CACHE_LIMIT, else 8 GiB (a value that cannot be read warns and keeps that)."""
    text = os.environ.get(LIMIT_VARIABLE)
    if not text:
        return DEFAULT_LIMIT
    try:
        return parse_size(text)
    except ValueError as err:
        warnings.warn(f"cinn: ${LIMIT_VARIABLE}: {err}; the cache keeps its default limit", stacklevel=2)
        return DEFAULT_LIMIT


def touch(path: str | os.PathLike) -> None:
    """Mark an entry's file used now (a read-only cache is passed by)."""
    with contextlib.suppress(OSError):
        os.utime(path)


def entries(cache_dir: pathlib.Path) -> list[Entry]:
    """The cache's complete entries: kernels by stem (used when their library was) and whole compiles; files being
    written (temporary names), the lock and the measured peaks are not entries."""
    stems: dict[str, list[os.DirEntry]] = {}
    for f in _files(cache_dir):
        stem, suffix = os.path.splitext(f.name)
        if suffix in KERNEL_SUFFIXES and KERNEL_STEM.fullmatch(stem):
            stems.setdefault(stem, []).append(f)
    found = [_entry(files, next((f for f in files if f.name.endswith(".so")), files[0])) for files in stems.values()]
    found += [_entry([f], f) for f in _files(cache_dir / COMPILED_FOLDER) if f.name.endswith(COMPILED_SUFFIXES)]
    return [e for e in found if e is not None]


def _files(folder: pathlib.Path) -> list[os.DirEntry]:
    with contextlib.suppress(OSError), os.scandir(folder) as it:
        return [f for f in it if f.is_file()]
    return []


def _entry(files: list[os.DirEntry], used: os.DirEntry) -> Entry | None:
    """The entry of these files; None when one has gone since the folder was read (another process pruned it)."""
    try:
        return Entry(tuple(pathlib.Path(f.path) for f in files), used.stat().st_mtime,
                     sum(f.stat().st_size for f in files))
    except FileNotFoundError:
        return None


def prune(cache_dir: pathlib.Path, bound: int | None = None) -> int:
    """Delete the least recently used entries once the cache is over its limit (`bound`, else limit()), down to
    LOW_WATER of it; the bytes freed."""
    bound = limit() if bound is None else bound
    if bound is None or sum(e.size for e in entries(cache_dir)) <= bound:
        return 0
    freed = 0
    with contextlib.suppress(OSError), lock(cache_dir, exclusive=True):
        found = sorted(entries(cache_dir), key=lambda e: e.used)  # again: another process may have pruned
        excess = sum(e.size for e in found) - int(bound * LOW_WATER)
        for e in found:
            if freed >= excess:
                break
            for f in e.files:
                f.unlink(missing_ok=True)
            freed += e.size
    return freed
