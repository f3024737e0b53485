"""Every op of the table against its numpy reference, compiled through the whole pipeline."""
from __future__ import annotations

import importlib
import pkgutil

import numpy as np
import pytest

import cinn
import tests.cases as cases_pkg
from cinn.core.ops import OPS
from cinn.core.ops.registry import infer
from tests.cases import Case
from tests.cases.spatial import max_pooled
from tests.guarded import guarded


def _all_cases() -> list[Case]:
    out = []
    for mod in pkgutil.iter_modules(cases_pkg.__path__):
        out += importlib.import_module(f"tests.cases.{mod.name}").CASES
    return out


CASES = _all_cases()


def _case_id(c: Case) -> str:
    return c.id or f"{c.op}-" + "-".join(f"{'x'.join(map(str, s)) or 'scalar'}:{d}" for s, d in c.inputs)


def test_every_op_has_cases():
    covered = {c.op for c in CASES}
    assert sorted(set(OPS) - covered) == []


def emit(case: Case, arrays: list[np.ndarray], dims=lambda a: a.shape):
    """A builder holding the case's op over its arrays (inputs of `dims(array)`, or constants), its outputs and
    feeds."""
    b = cinn.NetBuilder(case.op)
    values, feeds = [], {}
    for i, a in enumerate(arrays):
        if i in case.constant_inputs:
            values.append(b.create_constant(a, f"c{i}"))
        else:
            values.append(b.create_input(str(a.dtype), dims(a), f"in{i}"))
            feeds[f"in{i}"] = a
    args = [values] if OPS[case.op].num_inputs is None else values
    outs = getattr(b, case.op)(*args, **case.attrs)
    return b, list(outs) if isinstance(outs, tuple) else [outs], feeds


def _build(case: Case, arrays: list[np.ndarray]):
    b, outs, feeds = emit(case, arrays)
    return b.build(outs), feeds


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_op_matches_numpy(case: Case, tmp_cache):
    rng = np.random.default_rng(0)
    arrays = case.arrays(rng)
    program, feeds = _build(case, arrays)
    # passes off: identity-like ops and constant inputs must reach their kernels
    _assert_matches_reference(case, program, arrays, cinn.compile(program, cache_dir=tmp_cache, passes=False).run(feeds))


def _assert_matches_reference(case: Case, program, arrays: list[np.ndarray], got: list[np.ndarray]) -> None:
    expected = OPS[case.op].reference(arrays, program.nodes[0].attrs)
    assert len(got) == len(expected)
    for g, e, v in zip(got, expected, program.outputs, strict=True):
        assert g.shape == tuple(e.shape) == v.shape, f"{case.op}: shape {g.shape} vs reference {e.shape}"
        assert str(g.dtype) == v.dtype
        rtol, atol = case.tolerance(v.dtype)
        np.testing.assert_allclose(g, e, rtol=rtol, atol=atol)


WINDOW_GATHERS = [  # large enough to be vectorized, where each crashed at either end of its input
    Case("col2im", (((1, 8, 352), "float32"),), {"image_shape": [32, 64], "block_shape": [2, 2], "strides": [2, 3],
                                                 "pads": [0, 1, 1, 1]}, id="col2im-strides-pads"),
    Case("col2im", (((1, 24, 186), "float32"),), {"image_shape": [4, 5, 64], "block_shape": [2, 2, 3],
                                                  "strides": [1, 2, 2]}, id="col2im-3d"),
    Case("max_unpool", make=max_pooled((1, 4, 32, 64), (3, 3), (2, 2), (1, 1, 1, 1)),
         attrs={"kernel_size": [3, 3], "strides": [2, 2], "paddings": [1, 1, 1, 1], "out_shape": [32, 64]},
         id="max_unpool-overlapping-pads"),
]


@pytest.mark.parametrize("at_end", [False, True])
@pytest.mark.parametrize("case", WINDOW_GATHERS, ids=_case_id)
def test_window_gathers_read_inside_their_inputs(case: Case, at_end: bool, tmp_cache):
    """col2im and max_unpool load their inputs only inside them (each input against an inaccessible region): they
    loaded at each covering window's clamped position under a Select, whose value TVM evaluates either way, and TVM
    had simplified the clamps away under its condition (as in the pad of finding 15)."""
    arrays = case.arrays(np.random.default_rng(0))
    program, feeds = _build(case, arrays)
    exe = cinn.compile(program, cache_dir=tmp_cache, passes=False)
    _assert_matches_reference(case, program, arrays, exe.run({k: guarded(a, at_end) for k, a in feeds.items()}))


@pytest.mark.parametrize("case", CASES[:: max(1, len(CASES) // 40)], ids=_case_id)
def test_inference_matches_reference(case: Case):
    arrays = case.arrays(np.random.default_rng(1))
    program, _ = _build(case, arrays)
    node = program.nodes[0]
    types = infer(OPS[case.op], [v.type for v in node.inputs], node.attrs)
    expected = OPS[case.op].reference(arrays, node.attrs)
    assert [t.shape for t in types] == [tuple(e.shape) for e in expected]
