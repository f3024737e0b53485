"""A corpus of malformed model files: every one is refused with a clear error, none crashes the process.

The corpus is made from the repository's own valid models: each ONNX and Paddle file empty, as random bytes, and cut
at several points (model and parameter files alike), plus the invalid-model cases of tests/test_robustness.py (huge
or non-finite constants and attributes among them), nested loops past the import limit and causal attention over
60000 positions. All files load in one subprocess, which prints each file's name before loading it: a crash fails
the test and names the file that caused it.
"""
from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper

from tests.test_onnx_import import _nested_loops, make_model
from tests.test_paddle_import import legacy_program
from tests.test_robustness import HUGE_CONSTANTS, INVALID, NON_FINITE, _long_attention
from tests.timeouts import scaled

PADDLE = pathlib.Path(__file__).parent / "fixtures" / "paddle" / "mlp"
CUTS = (0.0, 0.1, 0.37, 0.5, 0.83, 0.99)
# what a refusal may raise: the importers' errors (ValueErrors), missing files, unsupported features
EXPECTED = ("OnnxImportError", "PaddleImportError", "ValueError", "FileNotFoundError", "NotImplementedError",
            "TypeError", "ShapeTooLarge")

_LOADER = """
import json, sys, cinn
for path in sys.argv[1:]:
    print("loading", path, flush=True)
    try:
        cinn.load_model(path)
        outcome = "accepted"
    except Exception as e:
        outcome = type(e).__name__ + ": " + str(e)[:300]
    print("RESULT " + json.dumps([path, outcome]), flush=True)
"""


def _valid_onnx(path: pathlib.Path) -> pathlib.Path:
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
                       [("x", T.FLOAT, [2, 8])], [("y", T.FLOAT, [2, 4])],
                       [("w", np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32))])
    onnx.save(model, path)
    return path


def _variants(src: pathlib.Path, dest: pathlib.Path, rng: np.random.Generator) -> list[pathlib.Path]:
    """The file empty, random, and cut at CUTS, each in its own directory (with the source's siblings intact)."""
    data = src.read_bytes()
    out = []
    contents = {"empty": b"", "random": rng.bytes(max(64, len(data)))}
    contents |= {f"cut{int(c * 100)}": data[: int(len(data) * c)] for c in CUTS if c}
    for label, content in contents.items():
        d = dest / f"{src.parent.name}-{src.name}-{label}"
        shutil.copytree(src.parent, d)
        (d / src.name).write_bytes(content)
        out.append(d / src.name)
    return out


def _corpus(tmp_path: pathlib.Path) -> list[pathlib.Path]:
    rng = np.random.default_rng(0)
    onnx_dir = tmp_path / "onnx"
    onnx_dir.mkdir(parents=True)
    files = _variants(_valid_onnx(onnx_dir / "model.onnx"), tmp_path, rng)
    for fmt, model in (("legacy", "inference.pdmodel"), ("pir", "inference.json")):
        for name in (model, "inference.pdiparams"):
            variants = _variants(PADDLE / fmt / name, tmp_path / fmt, rng)
            files += [v.parent / model for v in variants]  # a cut parameter file is read through its model
    models = [m for m, _ in INVALID.values()] + list(HUGE_CONSTANTS.values()) + [m for m, _ in NON_FINITE.values()]
    models += [_nested_loops(3, 30), _long_attention(causal=1), _long_attention(causal=1, op="com.microsoft")]
    for i, model in enumerate(models):
        onnx.save(model, tmp_path / f"invalid{i}.onnx")
        files.append(tmp_path / f"invalid{i}.onnx")
    fills = {"huge": {"shape": [2**16, 2**16], "dtype": 5, "value": 1.0}, "inf": {"shape": [2], "dtype": 3, "str_value": "inf"}}
    for name, attrs in fills.items():
        legacy_program(tmp_path / f"fill-{name}.pdmodel", {"x": (2,)}, [("fill_constant", {}, {"Out": ["y"]}, attrs)], ["y"])
        files.append(tmp_path / f"fill-{name}.pdmodel")
    (tmp_path / "deep.json").write_text("[" * 200_000 + "]" * 200_000)
    files.append(tmp_path / "deep.json")
    return files


def test_malformed_files_are_refused_without_a_crash(tmp_path):
    files = _corpus(tmp_path / "corpus")
    proc = subprocess.run([sys.executable, "-c", _LOADER, *map(str, files)], capture_output=True, text=True, timeout=scaled(600))
    results = dict(json.loads(line[len("RESULT "):]) for line in proc.stdout.splitlines() if line.startswith("RESULT "))
    crashed_on = proc.stdout.strip().splitlines()[-1] if proc.returncode else ""
    assert proc.returncode == 0, f"status {proc.returncode} {crashed_on}: {proc.stderr[-2000:]}"
    assert len(results) == len(files) == 61
    accepted = [p for p, outcome in results.items() if outcome == "accepted"]
    assert not accepted, f"malformed files accepted: {accepted}"
    unclear = {p: o for p, o in results.items() if not o.startswith(EXPECTED) or len(o.split(": ", 1)[-1]) < 10}
    assert not unclear, f"refused without a clear error: {unclear}"
