"""The on-disk cache's lock and size bound: once the cache passes its limit, the least recently used entries go.

An entry is a kernel (its library, source and digest, one stem) or a whole compile (compiled/NAME.pkl); loading one
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
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

LIMIT_VARIABLE = "CINN_CACHE_LIMIT"
DEFAULT_LIMIT = 8 << 30
# pruning goes below the limit, so that the stores after it do not each scan and prune again
LOW_WATER = 0.8
KERNEL_SUFFIXES = (".so", ".src", ".sha256")
COMPILED_FOLDER, COMPILED_SUFFIX = "compiled", ".pkl"
KERNEL_STEM = re.compile(r"[0-9a-f]{32}")  # cinn.build.cache_key's; a kernel being written has a temporary name
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


@dataclass(frozen=True)
class Entry:
    """One cache entry: its files, when it was last used and its size in bytes."""

    files: tuple[pathlib.Path, ...]
    used: float
    size: int


@contextlib.contextmanager
def lock(cache_dir: pathlib.Path, exclusive: bool) -> Iterator[None]:
    """The cache directory's advisory lock: writers and pruning hold it exclusively, readers shared."""
    with open(cache_dir / ".lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


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
    found += [_entry([f], f) for f in _files(cache_dir / COMPILED_FOLDER) if f.name.endswith(COMPILED_SUFFIX)]
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
