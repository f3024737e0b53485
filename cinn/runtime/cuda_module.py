"""CUDA kernel libraries built without a GPU: nvcc compiles TVM's CUDA C to PTX, which the exported library embeds.

The TVM wheel's codegen leaves CUDA modules as source when no CUDA runtime is loaded (no libcuda), and such a
library would need a compiler again wherever it is loaded. So the build compiles the source with nvcc for the
target's architecture and packs the PTX into the library in place of the source: a GPU machine loads it with
the driver alone.
"""
from __future__ import annotations

import os
import re
import struct

import tvm
import tvm_ffi
from tvm.support import nvcc

from cinn.core.target import Target

NO_DEVICE = "no CUDA device present: CUDA kernels were built (see kernel_sources()) but cannot run on this machine"


def device_present() -> bool:
    """Whether a CUDA device can run kernels here (needs the driver and a GPU)."""
    return bool(tvm.cuda(0).exist)


def require_device() -> None:
    """Raise the clear no-GPU error."""
    if not device_present():
        raise RuntimeError(NO_DEVICE)


def cuda_source(ex) -> str:
    """The CUDA C of a compiled module (its imported cuda module), or '' when it has none."""
    cuda = [m for m in ex.mod.imports if m.kind == "cuda"]
    return cuda[0].inspect_source("cuda") if cuda else ""


# TVM 0.27's CUDA codegen names a vector select's condition with the select's value type: a lane-invariant
# condition (a broadcast bool, printed make_ushortN) becomes `floatN v = make_ushortN(...)`, which nvcc rejects
_BOOL_VECTOR_DECL = re.compile(r"\b\w+?(\d+) (\w+) = make_ushort\1\(")


# TVM's CUDA codegen declares no TF32 input fragments: cinn's TF32 kernels (schedules.cuda_tensor_core) give them
# fp16 in TIR, and WMMA's m16n16k8 shape exists for TF32 alone, so such a half fragment is a TF32 one
_TF32_FRAGMENT = re.compile(r"(fragment<nvcuda::wmma::matrix_[ab], 16, 16, 8, )half,")


def fixed_source(source: str) -> str:
    """TVM's CUDA C with its known codegen slips corrected (bool vectors declared as what they are, TF32
    fragments as TF32)."""
    source = _BOOL_VECTOR_DECL.sub(r"ushort\1 \2 = make_ushort\1(", source)
    return _TF32_FRAGMENT.sub(r"\1nvcuda::wmma::precision::tf32,", source)


def compile_ptx(source: str, target: Target) -> bytes:
    """Compile CUDA C to PTX with nvcc for the target's architecture."""
    with target.tvm():  # nvcc.compile_cuda reads the compute version of the current target
        return bytes(nvcc.compile_cuda(fixed_source(source), target_format="ptx", arch=target.arch, compiler="nvcc"))


def runtime_loaded() -> bool:
    """Whether TVM's CUDA runtime is loaded (libcuda found): then codegen JIT-compiles kernels itself."""
    return tvm.get_global_func("ffi.Module.create.cuda", allow_missing=True) is not None


def use_nvcc(target: Target) -> None:
    """Make TVM's JIT compile (used when the CUDA runtime is loaded) call nvcc for PTX instead of NVRTC, which
    needs the cuda-python package."""
    def compile_cuda(code: str) -> bytes:
        return compile_ptx(code, target)

    tvm_ffi.register_global_func("tvm_callback_cuda_compile", compile_cuda, override=True)


def export(ex, path: str, source: str, ptx: bytes) -> None:
    """Export the host module and its CUDA module (holding `source`) as one shared library whose CUDA module
    holds `ptx` instead."""

    def pack(mod, is_system_lib: bool, prefix: str, workspace_dir: str) -> str:
        blob = tvm.get_global_func("runtime.ModulePackImportsToTensor")(mod).numpy().tobytes()
        llvm_target = mod.get_function("_get_target_string")()
        new_blob = _with_ptx(blob, source.encode(), ptx)
        packed = tvm.get_global_func("codegen.codegen_blob")(new_blob, is_system_lib, llvm_target, prefix)
        out = os.path.join(workspace_dir, f"{prefix}devc.o")
        packed.write_to_file(out)
        return out

    ex.export_library(path, fpack_imports=pack)


def _with_ptx(blob: bytes, source: bytes, ptx: bytes) -> bytes:
    """Rewrite a serialized import tree so its cuda module holds PTX instead of `source`.

    Layout (tvm_ffi): u64 nbytes, indptr: vec<u64>, child_indices: vec<u64>, then per module its kind (str) and,
    unless it is the host library ('_lib'), its bytes; a cuda module's bytes are fmt (str), fmap, code (str)."""
    pos = 8
    for _ in range(2):  # the import tree's CSR vectors
        (count,) = struct.unpack_from("<Q", blob, pos)
        pos += 8 + 8 * count
    head, out = blob[8:pos], []
    while pos < len(blob):
        kind, pos = _read_str(blob, pos)
        out.append(_str(kind))
        if kind != b"_lib":
            payload, pos = _read_str(blob, pos)
            out.append(_str(_cuda_ptx(payload, source, ptx) if kind == b"cuda" else payload))
    body = head + b"".join(out)
    return struct.pack("<Q", len(body)) + body


def _cuda_ptx(payload: bytes, source: bytes, ptx: bytes) -> bytes:
    """A source cuda module's bytes with format 'ptx' and the PTX as code (the function table is kept)."""
    fmt, pos = _read_str(payload, 0)
    code = _str(source)
    if fmt != b"cuda" or not payload.endswith(code):
        raise ValueError(f"cinn: unexpected CUDA module layout (format {fmt!r}); cannot embed PTX")
    return _str(b"ptx") + payload[pos : len(payload) - len(code)] + _str(ptx)


def _read_str(buf: bytes, pos: int) -> tuple[bytes, int]:
    """A length-prefixed byte string at `pos`, and the position after it."""
    (n,) = struct.unpack_from("<Q", buf, pos)
    return buf[pos + 8 : pos + 8 + n], pos + 8 + n


def _str(data: bytes) -> bytes:
    """`data` with its u64 length prefix."""
    return struct.pack("<Q", len(data)) + data
