"""Whole compiles cached on disk: a static program compiled before skips the passes and the lowering.

The kernel cache (cinn.compiler.build) keys each library by its PrimFunc, so even a compile whose kernels are all cached
optimized the program and lowered every group to find their keys: most of its time (see docs/notes/compile-time.md).
This cache keys the whole compile by the input program (its nodes and the bytes of its constants),
the target, compile's options, the schedule log's records and the compiler's code, and keeps the optimized program
(its constants in the layouts the kernels read: about the model's size per entry) with its kernels' libraries.
An entry whose libraries have left the kernel cache, or that cannot be read, is compiled again. Only a compile of
its own is cached: the per-binding compiles of a symbolic program share one constant pool, and an entry per binding
would hash and store every weight again.

An entry is an .npz holding no code (read with allow_pickle=False): the array `meta` is a JSON document (the format
and cinn's code version, the optimized program in cinn.core.ir_json's form, its kernels with their libraries' names in
the kernel cache), the arrays c0, c1, ... are the program's constants in the order the document names them. The
zip's comment, its last bytes, is an HMAC of all before it under the user's key (cinn.runtime.trust): an entry is
authenticated before anything in it is parsed.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import tempfile
import warnings
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np

from cinn.compiler.build import code_version
from cinn.core import ir_json
from cinn.core.ir import DTYPES, Program, Value
from cinn.runtime import disk_cache, trust

FOLDER = disk_cache.COMPILED_FOLDER
FORMAT, VERSION = "cinn-compiled", 1
META = "meta"


@dataclass(frozen=True)
class CachedKernel:
    """What compile keeps of one kernel: its group's name, its library in the kernel cache, its parameters, its
    arithmetic, its PrimFunc's structural hash and the bytes it moves."""

    name: str
    library: str
    params: tuple[Value, ...]
    flops: int
    workload: str
    nbytes: int


@dataclass(frozen=True)
class CachedCompile:
    """The optimized program and its kernels, in order."""

    program: Program
    kernels: tuple[CachedKernel, ...]


def entry_path(cache_dir: pathlib.Path, program: Program, options: Sequence[object]) -> pathlib.Path:
    """Where the compile of `program` with `options` (target, flags, schedule records) is kept."""
    h = hashlib.sha256()  # CPUs' SHA extensions make it the fastest (see docs/notes/compile-time.md)
    h.update(f"{code_version()}|{options!r}|{program.name}|{program.inputs!r}|{program.nodes!r}|{program.outputs!r}".encode())
    for name in sorted(program.constants):
        array = np.ascontiguousarray(program.constants[name])
        h.update(f"|{name}|{array.dtype.str}|{array.shape}|".encode())
        h.update(array.data)
    return cache_dir / FOLDER / f"{h.hexdigest()[:32]}{disk_cache.COMPILED_SUFFIX}"


def load(path: pathlib.Path) -> CachedCompile | None:
    """The cached compile at `path`, or None when there is none, the cache may not be trusted, or the entry is not
    one this user's cinn wrote whole (with a warning naming it)."""
    cache_dir = path.parent.parent
    if not cache_dir.is_dir() or not os.path.lexists(path):  # (a cache_dir that is a file: the kernel cache refuses it)
        return None
    secret = trust.usable(cache_dir, stacklevel=3)
    if secret is None:
        return None
    try:
        trust.check(path.parent, directory=True)
        with open(path, "rb", opener=_no_follow) as f:
            entry = read(f, path.name, secret, cache_dir)
    except FileNotFoundError:  # pruned since
        return None
    except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile, RecursionError) as err:
        warnings.warn(f"cinn: unreadable compile cache entry {path} ({err}); compiling again", stacklevel=3)
        return None
    disk_cache.touch(path)
    return entry


def store(path: pathlib.Path, entry: CachedCompile) -> None:
    """Write an entry atomically (a reader sees the whole file or none), then keep the cache within its limit. A
    compile built without the cache (its libraries elsewhere: the kernel cache warned of it) is not kept; a write
    that fails (a full disk) warns, and the compile goes on uncached."""
    cache_dir = path.parent.parent
    if any(pathlib.Path(k.library).parent != cache_dir for k in entry.kernels):
        return
    secret = trust.usable(cache_dir, stacklevel=3)
    if secret is None:
        return
    tmp = None
    try:
        path.parent.mkdir(exist_ok=True, mode=0o755)
        trust.check(path.parent, directory=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "w+b") as f:
            write(f, path.name, secret, entry)
        os.replace(tmp, path)
    except (OSError, TypeError, ValueError) as err:
        warnings.warn(f"cinn: could not write the compile cache entry {path} ({err}); this compile is not cached",
                      stacklevel=3)
    finally:
        if tmp is not None:
            pathlib.Path(tmp).unlink(missing_ok=True)
    disk_cache.prune(cache_dir)


def write(f: BinaryIO, name: str, secret: bytes, entry: CachedCompile) -> None:
    """Write an entry to f (open for reading and writing): the .npz, then its HMAC as the zip's comment."""
    program = entry.program
    meta = {"format": FORMAT, "version": VERSION, "cinn": code_version(), "program": ir_json.program_to_json(program),
            "kernels": [{**ir_json.encode(k, CachedKernel), "library": pathlib.Path(k.library).name}
                        for k in entry.kernels]}
    text = json.dumps(meta, allow_nan=False, separators=(",", ":")).encode()
    arrays = {META: np.frombuffer(text, np.uint8), **{f"c{i}": program.constants[k] for i, k in enumerate(program.constants)}}
    with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED, allowZip64=True) as z:
        for member, array in arrays.items():
            with z.open(f"{member}.npy", "w", force_zip64=True) as m:
                np.lib.format.write_array(m, np.asanyarray(array), allow_pickle=False)
        z.comment = bytes(trust.MAC_BYTES)  # its place: the zip's last bytes
    size = f.tell()
    f.seek(0)
    mac = trust.stream_mac(f, name, secret, size - trust.MAC_BYTES).digest()
    f.seek(size - trust.MAC_BYTES)
    f.write(mac)


def read(f: BinaryIO, name: str, secret: bytes, cache_dir: pathlib.Path) -> CachedCompile:
    """Read an entry from f, authenticated before it is parsed; ValueError (trust.Untrusted, ir_json.DecodeError)
    for one that is not this user's or not whole, OSError and zipfile.BadZipFile for one that cannot be read."""
    size = trust.check_open(f).st_size
    if size < trust.MAC_BYTES or not trust.same_mac(trust.stream_mac(f, name, secret, size - trust.MAC_BYTES).digest(),
                                                    f.read(trust.MAC_BYTES)):
        raise trust.Untrusted("it does not match its HMAC: not written whole by this user's cinn")
    f.seek(0)
    with np.load(f, allow_pickle=False) as z:
        members = sorted(z.files)
        meta = _meta(bytes(z[META]))
        kernels = meta.get("kernels")
        constants = ir_json.decode(meta.get("program", {}).get("constants"), tuple[str, ...], "program.constants")
        if members != sorted([META, *(f"c{i}" for i in range(len(constants)))]):
            raise ir_json.DecodeError(f"the arrays {members[:5]} are not the {len(constants)} constants named")
        arrays = {k: _constant(z[f"c{i}"], k) for i, k in enumerate(constants)}
    if not isinstance(kernels, list):
        raise ir_json.DecodeError("kernels: not a list")
    return CachedCompile(ir_json.program_from_json(meta["program"], arrays),
                         tuple(_kernel(k, cache_dir, f"kernels[{i}]") for i, k in enumerate(kernels)))


def _meta(text: bytes) -> dict[str, Any]:
    """The entry's JSON document, of this format and this cinn's code."""
    meta = json.loads(text)
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise ir_json.DecodeError(f"not a {FORMAT} document of version {VERSION}")
    if meta.get("cinn") != code_version():
        raise ir_json.DecodeError(f"written by another cinn ({meta.get('cinn')!r}, this is {code_version()})")
    if not isinstance(meta.get("program"), dict):
        raise ir_json.DecodeError("program: not an object")
    return meta


def _constant(array: np.ndarray, name: str) -> np.ndarray:
    if str(array.dtype) not in DTYPES:
        raise ir_json.DecodeError(f"constant {name!r} has dtype {array.dtype}")
    return array


def _kernel(data: Any, cache_dir: pathlib.Path, where: str) -> CachedKernel:
    """A kernel of the entry, its library a file of the kernel cache (a name, never a path)."""
    kernel = ir_json.decode(data, CachedKernel, where)
    stem, suffix = os.path.splitext(kernel.library)
    if suffix != ".so" or not disk_cache.KERNEL_STEM.fullmatch(stem):
        raise ir_json.DecodeError(f"{where}.library: {kernel.library!r} is not a library of the kernel cache")
    return dataclasses.replace(kernel, library=str(cache_dir / kernel.library))


def _no_follow(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NOFOLLOW)
