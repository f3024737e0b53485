"""ONNX's node conformance cases through load_onnx and cinn.compile: every supported case must pass."""
from __future__ import annotations

import json
import pathlib
import warnings
from collections import Counter
from dataclasses import dataclass

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

import cinn  # noqa: E402
from frontend.onnx import CONVERTERS, OnnxImportError  # noqa: E402

# Cases whose ops are all supported but that are expected to fail, each with its reason.
_ARGMAX_POOL = "MaxPool's Indices output: no argmax-pooling op"
EXCLUDED: dict[str, str] = {
    "test_mvn": "onnx's strict shape inference fails inside MeanVarianceNormalization's function body (opset 13), so "
                "the model is refused as invalid; test_mvn_expanded and the opset 18 form pass",
    "test_maxpool_with_argmax_2d_precomputed_pads": _ARGMAX_POOL,
    "test_maxpool_with_argmax_2d_precomputed_strides": _ARGMAX_POOL,
}
# Import errors that mean "not supported by design" (the case is skipped with the message as its reason).
SKIP_REASONS = (
    "element type",  # bfloat16, float8, float4, int4/uint4, int2/uint2, strings, sequences: not cinn dtypes
    "opset 1 is not supported",
    "training_mode",  # inference only
    "must be a constant",  # a shape argument computed at run time (a dynamic shape)
    "zero-size tensors",  # a Loop or Scan of no iteration: its scan outputs' shapes are unknown
)
# Every case declined by design, with its SKIP_REASONS entry (onnx 1.23; regenerate when onnx or the importer
# changes): a case declined for any other reason, or no longer declined, fails, so a regression cannot hide as a skip.
DECLINED: dict[str, str] = json.loads(
    (pathlib.Path(__file__).parent / "fixtures" / "onnx_conformance_declined.json").read_text())
PASSING = 1493  # the cases of supported ops that must pass (onnx 1.23)
# float16 kernels compute in float16; the references were computed in float32 and rounded (a few ulp apart)
_TOLERANCE = {"float16": (4e-3, 2e-3)}


@dataclass(frozen=True)
class Outcome:
    """What happened to one case: passed, skipped (with the reason) or failed (with the error)."""

    name: str
    status: str
    detail: str = ""


def _supported(case) -> bool:
    return _ops_supported(case.model.graph)


def _ops_supported(graph) -> bool:
    """Whether every node of a graph and of its subgraphs (If's branches) has a converter."""
    subgraphs = [a.g for n in graph.node for a in n.attribute if a.type == onnx.AttributeProto.GRAPH]
    return all(n.domain in ("", "ai.onnx") and n.op_type in CONVERTERS for n in graph.node) and \
        all(_ops_supported(g) for g in subgraphs)


def _cases():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from onnx.backend.test.case.node import collect_testcases

        return [c for c in collect_testcases() if _supported(c)]


def _feeds(case, program, inputs) -> dict[str, np.ndarray]:
    names = [i.name for i in case.model.graph.input if i.name not in {t.name for t in case.model.graph.initializer}]
    return {n: a for n, a in zip(names, inputs, strict=False) if n in {v.name for v in program.inputs}}


def _arrays(values) -> list:
    """Data-set entries as numpy arrays (some cases store TensorProtos or numpy scalars)."""
    return [onnx.numpy_helper.to_array(v) if isinstance(v, onnx.TensorProto) else
            np.asarray(v) if isinstance(v, np.generic) else v for v in values]


def _import(case, inputs):
    """The case's Program; inputs a shape, axes or pads argument reads are read by value (see load_onnx)."""
    shapes = {i.name: a.shape for i, a in zip(case.model.graph.input, inputs, strict=False) if isinstance(a, np.ndarray)}
    return cinn.load_onnx(case.model, input_shapes=shapes)


def run_case(case, cache_dir) -> Outcome:
    """Import, compile once and run every data set of one case."""
    try:
        program = _import(case, _arrays(case.data_sets[0][0]))
        exe = cinn.compile(program, cache_dir=cache_dir, workers=1)
        # a program that reads inputs by value is converted at its first run, for the values fed
        first = exe.run(_feeds(case, program, _arrays(case.data_sets[0][0])))
    except (OnnxImportError, NotImplementedError, TypeError, ValueError) as e:
        # what the importer declines by design is skipped with its reason; any other import error fails
        status = "skipped" if any(p in str(e) for p in SKIP_REASONS) else "failed"
        return Outcome(case.name, status, f"import: {e}")
    for k, (inputs, expected) in enumerate(case.data_sets):
        outs = first if k == 0 else exe.run(_feeds(case, program, _arrays(inputs)))
        for got, expected_out in zip(outs, _arrays(expected), strict=True):
            want = np.asarray(expected_out)
            if got.shape != want.shape or got.dtype != want.dtype:
                return Outcome(case.name, "failed", f"got {got.dtype}{got.shape}, expected {want.dtype}{want.shape}")
            try:
                rtol, atol = _TOLERANCE.get(str(want.dtype), (max(case.rtol, 1e-4), max(case.atol, 1e-5)))
                np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
            except AssertionError as e:
                return Outcome(case.name, "failed", str(e).strip().splitlines()[2] if str(e).count("\n") > 2 else str(e))
    return Outcome(case.name, "passed")


_CASES = _cases()


def _param(case):
    # the expanded Attention functions are large graphs (about 40 s together): run with the slow tests
    marks = [pytest.mark.slow] if case.name.startswith("test_attention") and case.name.endswith("_expanded") else []
    return pytest.param(case, id=case.name, marks=marks)


@pytest.mark.parametrize("case", [_param(c) for c in _CASES])
def test_node_conformance(case, tmp_cache):
    outcome = run_case(case, tmp_cache)
    if case.name in EXCLUDED:
        assert outcome.status != "passed", f"{case.name} passes now: remove it from EXCLUDED"
        pytest.xfail(EXCLUDED[case.name])
    declined = DECLINED.get(case.name)
    if outcome.status == "skipped":
        assert declined is not None and declined in outcome.detail, f"{case.name} is newly declined: {outcome.detail}"
        pytest.skip(outcome.detail)
    assert declined is None, f"{case.name} {outcome.status} now, but is listed as declined ({declined!r}): update DECLINED"
    assert outcome.status == "passed", outcome.detail


def test_declined_cases_are_pinned():
    """How many cases are declined, per reason; and of all the supported-op cases, how many must pass."""
    assert Counter(DECLINED.values()) == {"element type": 194, "training_mode": 8, "opset 1 is not supported": 3}
    assert set(DECLINED) <= {c.name for c in _CASES} and not set(DECLINED) & set(EXCLUDED)
    assert len(_CASES) - len(DECLINED) - len(EXCLUDED) == PASSING

