"""Payloads whose code, if anything runs it, creates a marker file: a C library constructor, a pickle, LLVM IR."""
from __future__ import annotations

import io
import pathlib
import pickle
import platform
import shutil
import subprocess

import numpy as np

from tests.bad_inputs.core import Unavailable


class Touch:
    """Unpickling it creates the marker file (pickle calls open(marker, "w"))."""

    def __init__(self, marker: pathlib.Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (io.open, (self.marker, "w"))


def pickle_bytes(marker: pathlib.Path) -> bytes:
    return pickle.dumps(Touch(marker))


def object_npz(path: pathlib.Path, marker: pathlib.Path) -> None:
    """An .npz whose 'meta' array is pickled objects, one of them the payload."""
    with open(path, "wb") as f:
        np.savez(f, meta=np.array([Touch(marker)], dtype=object))


def c_constructor(marker: pathlib.Path) -> str:
    """C source whose library constructor creates the marker."""
    return (f'#include <fcntl.h>\n#include <unistd.h>\n__attribute__((constructor)) static void cinn_bad_input(void) '
            f'{{ int fd = creat("{marker}", 0644); if (fd >= 0) close(fd); }}\n')


def constructor_library(path: pathlib.Path, marker: pathlib.Path) -> pathlib.Path:
    """A shared library (built with cc) whose constructor creates the marker."""
    source = path.with_suffix(".c")
    source.write_text(c_constructor(marker))
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise Unavailable("no C compiler for the payload library")
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(path), str(source)], check=True, capture_output=True)
    return path


def llvm_constructor(marker: pathlib.Path) -> str:
    """LLVM IR whose global constructor creates the marker. Its body is module assembly (x86-64 Linux: the creat
    system call), since TVM links only the functions its kernel needs from imported IR, but links module assembly and
    appends llvm.global_ctors."""
    lines = [".text", ".p2align 4", ".globl cinn_bad_input_ctor", ".hidden cinn_bad_input_ctor", "cinn_bad_input_ctor:",
             "lea cinn_bad_input_path(%rip), %rdi", "mov $420, %esi", "mov $85, %eax", "syscall", "ret",
             "cinn_bad_input_path:", f".asciz \\22{marker}\\22"]
    if platform.machine() != "x86_64":
        raise Unavailable(f"the LLVM payload is x86-64 assembly; this machine is {platform.machine()}")
    return ("".join(f'module asm "{line}"\n' for line in lines) + "declare void @cinn_bad_input_ctor()\n"
            "@llvm.global_ctors = appending global [1 x { i32, ptr, ptr }] "
            "[{ i32, ptr, ptr } { i32 65535, ptr @cinn_bad_input_ctor, ptr null }]\n")
