"""Reader of `.pdiparams`: persistable tensors concatenated in sorted name order (layout in PADDLE_FORMAT.md)."""
from __future__ import annotations

import os
import struct
from collections.abc import Sequence

import numpy as np
from google.protobuf.message import DecodeError

from frontend.paddle.graph import PaddleImportError, Tensor
from frontend.paddle.registry import dtype_of_code
from frontend.paddle.schema import tensor_desc


class _Reader:
    """Little-endian fields read from a byte buffer; running past its end is a truncated-file error."""

    def __init__(self, data: bytes, path: str):
        self.data, self.pos, self.path = memoryview(data), 0, path

    def take(self, n: int, what: str) -> memoryview:
        if n < 0 or self.pos + n > len(self.data):
            raise PaddleImportError(f"{self.path}: truncated or malformed parameter file (reading {what} at byte {self.pos})")
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def unpack(self, fmt: str, what: str) -> int:
        return struct.unpack("<" + fmt, self.take(struct.calcsize("<" + fmt), what))[0]


def read_params(path: str, params: Sequence[Tensor]) -> dict[str, np.ndarray]:
    """The arrays of `params` (keyed by Tensor.key) from a .pdiparams file; their order there is by sorted name."""
    try:
        with open(path, "rb") as f:
            reader = _Reader(f.read(), path)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such Paddle parameter file (the model has {len(params)} parameters)") from None
    arrays = {p.key: _read_tensor(reader, p) for p in sorted(params, key=lambda p: p.name)}
    if reader.pos != len(reader.data):
        raise PaddleImportError(f"{path}: {len(reader.data) - reader.pos} bytes left after the model's {len(params)} "
                                "parameters (the file does not belong to this model)")
    return arrays


def _read_tensor(reader: _Reader, param: Tensor) -> np.ndarray:
    what = f"parameter {param.name!r}"
    reader.unpack("I", f"{what} version")
    for _ in range(reader.unpack("Q", f"{what} lod level")):
        reader.take(reader.unpack("Q", f"{what} lod size"), f"{what} lod")
    reader.unpack("I", f"{what} tensor version")
    desc = tensor_desc()()
    try:
        desc.ParseFromString(bytes(reader.take(reader.unpack("i", f"{what} header size"), f"{what} header")))
    except DecodeError as e:
        raise PaddleImportError(f"{reader.path}: malformed header of {what} ({e})") from None
    dtype = dtype_of_code(desc.data_type, f"{reader.path}: {what}")
    shape = tuple(desc.dims)
    if dtype != param.dtype or not _shapes_match(shape, param.shape):
        raise PaddleImportError(f"{reader.path}: {what} is {dtype}{list(shape)} in the file but {param.dtype}"
                                f"{list(param.shape)} in the model (the file does not belong to this model)")
    count = int(np.prod(shape, dtype=np.int64))
    data = reader.take(count * np.dtype(dtype).itemsize, f"{what} data")
    return np.frombuffer(data, dtype=np.dtype(dtype).newbyteorder("<")).astype(dtype).reshape(shape)


def _shapes_match(stored: tuple[int, ...], declared: tuple[int, ...]) -> bool:
    return len(stored) == len(declared) and all(d in (s, -1) for s, d in zip(stored, declared, strict=True))


def params_path(model_path: str) -> str:
    """The parameter file beside a model file: the same prefix with `.pdiparams`."""
    return os.path.splitext(model_path)[0] + ".pdiparams"
