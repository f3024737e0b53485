"""Arrays placed against inaccessible memory, so that a kernel reading out of their bounds faults at once."""
from __future__ import annotations

import ctypes
import mmap

import numpy as np

PROT_NONE = 0  # mprotect's "no access" (the mmap module exports PROT_READ and PROT_WRITE only)


def guarded(data: np.ndarray, at_end: bool = False) -> np.ndarray:
    """A copy of `data` between two inaccessible regions as large as itself, against the first or the last: a kernel
    that reads before or past the array (up to its size) dies at once, where a read out of bounds elsewhere may go
    unseen or crash only sometimes."""
    page, nbytes = mmap.PAGESIZE, data.nbytes
    span = -(-nbytes // page) * page
    buf = mmap.mmap(-1, 3 * span)
    start = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    for guard in (start, start + 2 * span):
        assert libc.mprotect(guard, span, PROT_NONE) == 0, ctypes.get_errno()
    x = np.frombuffer(buf, data.dtype, data.size, span + (span - nbytes if at_end else 0)).reshape(data.shape)
    x[...] = data
    return x
