"""What cinn reads back from its on-disk cache, it trusts only as ssh's StrictModes trusts a key file.

The cache root (and its compiled/ folder) and each entry must belong to the user and must not be group- or
world-writable: anyone else who could write there could make the next compile load their code. And every kernel
library (the thread pool's too) and whole-compile entry carries an HMAC-SHA256 under a per-user key kept outside the
cache ($CINN_CACHE_KEY, else $XDG_CONFIG_HOME/cinn/cache.key, else ~/.config/cinn/cache.key; made on first use, mode
0600), so a library swapped together with its digest, or a cache copied in from elsewhere, is refused, never loaded.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import pathlib
import secrets
import stat
import tempfile
import threading
import typing
import warnings

KEY_VARIABLE = "CINN_CACHE_KEY"
KEY_BYTES = 32
MAC_BYTES = hashlib.sha256().digest_size
_CHUNK = 1 << 20


class Untrusted(ValueError):
    """A cache path or key file that breaks the trust rules (the message names it and why)."""


class _State:
    """The keys read in this process (by path) and the warnings already given."""

    lock = threading.Lock()
    keys: typing.ClassVar[dict[pathlib.Path, bytes]] = {}
    warned: typing.ClassVar[set[str]] = set()


def key_path() -> pathlib.Path:
    """Where the user's cache key is: $CINN_CACHE_KEY, else $XDG_CONFIG_HOME/cinn/cache.key, else ~/.config/cinn/."""
    explicit = os.environ.get(KEY_VARIABLE)
    if explicit:
        return pathlib.Path(explicit)
    config = os.environ.get("XDG_CONFIG_HOME") or pathlib.Path.home() / ".config"
    return pathlib.Path(config) / "cinn" / "cache.key"


def key() -> bytes:
    """The user's cache key, made on first use; Untrusted (or OSError) when it cannot be made or is not private."""
    path = key_path()
    with _State.lock:
        if path not in _State.keys:
            try:
                _State.keys[path] = _read_key(path)
            except FileNotFoundError:
                _make_key(path)
                _State.keys[path] = _read_key(path)
        return _State.keys[path]


def key_or_none() -> bytes | None:
    """The user's cache key, or None where it cannot be made or is not private (the cache's users warn of that)."""
    try:
        return key()
    except (Untrusted, OSError):
        return None


def _read_key(path: pathlib.Path) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        why = _problem(st, directory=False, private=True)
        if why:
            raise Untrusted(f"the cache key {path} is {why}")
        data = f.read(KEY_BYTES + 1)
    if len(data) != KEY_BYTES:
        raise Untrusted(f"the cache key {path} is not {KEY_BYTES} bytes long")
    return data


def _make_key(path: pathlib.Path) -> None:
    """Write a new random key where none is; a key another process made first is kept (link never replaces)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".cache.key-")  # mode 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(KEY_BYTES))
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
    finally:
        os.unlink(tmp)


def file_mac(path: str | os.PathLike, secret: bytes, name: str | None = None) -> str:
    """The HMAC-SHA256 (hex) of a file's bytes and its name (`name`, else its own): a valid entry moved to another
    entry's name is refused."""
    with open(path, "rb") as f:
        return stream_mac(f, name or os.path.basename(path), secret, None).hexdigest()


def stream_mac(f, name: str, secret: bytes, size: int | None) -> hmac.HMAC:
    """The HMAC of `name` and the next `size` bytes of the file object f (all of them for None)."""
    mac = hmac.new(secret, name.encode() + b"\0", hashlib.sha256)
    left = size
    while left is None or left > 0:
        chunk = f.read(_CHUNK if left is None else min(_CHUNK, left))
        if not chunk:
            break
        mac.update(chunk)
        if left is not None:
            left -= len(chunk)
    return mac


def same_mac(a: bytes, b: bytes) -> bool:
    """Compare two MACs in constant time."""
    return hmac.compare_digest(a, b)


def problem(path: str | os.PathLike, directory: bool = False) -> str | None:
    """Why a cache path may not be trusted (another owner, group- or world-writable, not a regular file or directory),
    or None. Entries are never links (a cache root may be: it is followed)."""
    st = os.stat(path) if directory else os.lstat(path)
    return _problem(st, directory, private=False)


def check(path: str | os.PathLike, directory: bool = False) -> None:
    """Raise Untrusted naming the path and why it may not be trusted."""
    why = problem(path, directory)
    if why:
        raise Untrusted(f"{path} is {why}")


def check_open(f) -> os.stat_result:
    """The status of an open file (f, an entry being read), after checking it as `check` checks a path."""
    st = os.fstat(f.fileno())
    why = _problem(st, directory=False, private=False)
    if why:
        raise Untrusted(f"it is {why}")
    return st


def _problem(st: os.stat_result, directory: bool, private: bool) -> str | None:
    if not (stat.S_ISDIR(st.st_mode) if directory else stat.S_ISREG(st.st_mode)):
        return "not a directory" if directory else "not a regular file"
    if st.st_uid != os.getuid():
        return f"owned by uid {st.st_uid}, not by this user (uid {os.getuid()})"
    mode = stat.S_IMODE(st.st_mode)
    if private and mode & 0o077:
        return f"open to other users (mode {mode:04o}; it must be 0600)"
    if mode & 0o002:
        return f"world-writable (mode {mode:04o})"
    if mode & 0o020:
        return f"group-writable (mode {mode:04o})"
    return None


def usable(cache_dir: pathlib.Path, stacklevel: int = 2) -> bytes | None:
    """The key to read and write the cache at cache_dir with, or None when it may not be used: a root that another
    user owns or others can write, or no private key (warned once per process, naming the path and why)."""
    try:
        check(cache_dir, directory=True)
        return key()
    except (Untrusted, OSError) as err:
        warn_once(f"cinn: not using the cache {cache_dir}: {err}; compiling without it (a cache must belong to you "
                  "and be writable by you alone, as ssh's StrictModes asks of ~/.ssh)", stacklevel + 1)
        return None


def warn_once(message: str, stacklevel: int) -> None:
    """Warn with `message` the first time this process meets it."""
    with _State.lock:
        if message in _State.warned:
            return
        _State.warned.add(message)
    warnings.warn(message, stacklevel=stacklevel + 1)


def private(path: str | os.PathLike) -> None:
    """Take group and world write permission off a file cinn wrote (a umask of 002 leaves them on a linker's
    output), so that the cache never refuses its own entries."""
    mode = stat.S_IMODE(os.stat(path).st_mode)
    if mode & 0o022:
        os.chmod(path, mode & ~0o022)
