"""Property-based fuzzing (hypothesis) of NetBuilder programs against the op table's numpy references.

Random small graphs of the table's elementwise and broadcast ops, over float32 and integer data (int8, int16, int32,
uint8, uint16, uint32) holding special values (NaN, +-inf, -0.0, the integer type's extremes, zeros), are compiled
fused and unfused; both must match the program
evaluated node by node with each op's `reference`. CI runs a fixed, derandomized set of examples; a longer run is an
environment variable away: `CINN_FUZZ_EXAMPLES=500 pytest tests/test_fuzz.py`.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cinn
from cinn.core.ir import Program
from cinn.core.ops import OPS, PatternKind
from cinn.core.ops.registry import dtype_class

EXAMPLES = int(os.environ.get("CINN_FUZZ_EXAMPLES", "30"))
# libm-grade functions whose float32 kernels use vectorized polynomial forms: compared with a looser tolerance
APPROXIMATE = {"exp", "erf", "tanh", "sigmoid", "silu", "gelu", "softplus", "elu", "pow", "log", "sin", "cos"}
# ops outside the fuzz: dropout's reference is training-mode randomness-free only by attribute
EXCLUDED = {"dropout"}
FLOAT_SPECIALS = [np.nan, np.inf, -np.inf, -0.0, 0.0, 1.0, -1.0, 3.5, -2.25, 1e30, -1e-30]
INT_SPECIALS = [0, 1, -1, 2, -3, 7]  # with the dtype's extremes; -1 and -3 wrap in the unsigned types
# int64 and uint64 are left out: their overflowing arithmetic is not defined to wrap (no wider type to compute in)
DTYPES = ["float32", "int32", "int8", "int16", "uint8", "uint16", "uint32"]


def _fuzzable() -> list[str]:
    """Ops of one or two inputs, elementwise or broadcasting, whose attributes all have defaults."""
    names = []
    for name, op in sorted(OPS.items()):
        if name in EXCLUDED or op.num_inputs not in (1, 2) or op.is_composite:
            continue
        if op.kind not in (PatternKind.ELEMENTWISE, PatternKind.BROADCAST):
            continue
        try:
            op.attrs()
        except TypeError:
            continue
        names.append(name)
    return names


OPS_FUZZED = _fuzzable()
SHAPES = [(), (1,), (5,), (2, 3), (3, 1, 4)]


@st.composite
def programs(draw):
    """A program spec: input dtype and shape, then ops applied to earlier values of an accepted dtype."""
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(st.sampled_from(SHAPES))
    steps = []
    for k in range(draw(st.integers(1, 5))):
        op = draw(st.sampled_from(OPS_FUZZED))
        steps.append((op, [draw(st.integers(0, k + 1)) for _ in range(OPS[op].num_inputs or 1)]))  # 2 inputs + k values
    data_seed = draw(st.integers(0, 2**31 - 1))
    return dtype, shape, steps, data_seed


def _build(dtype: str, shape, steps) -> Program | None:
    """The program of a spec; ops whose operands have dtypes they refuse are skipped (None: nothing applied)."""
    b = cinn.NetBuilder("fuzz")
    values = [b.create_input(dtype, shape, "in0"), b.create_input(dtype, shape, "in1")]
    applied = []
    for op, args in steps:
        operands = [values[a % len(values)] for a in args]
        if len({v.dtype for v in operands}) > 1 or not dtype_class(operands[0].dtype) & OPS[op].dtypes:
            continue
        out = getattr(b, op)(*operands)
        values.append(out)
        applied.append(out)
    return b.build(applied[-2:]) if applied else None


def _data(dtype: str, shape, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype == "float32":
        pool, regular = np.array(FLOAT_SPECIALS, dtype), rng.uniform(-4, 4, shape)
    else:
        info = np.iinfo(dtype)
        pool, regular = np.array(INT_SPECIALS + [info.max, info.min]), rng.integers(-9, 10, shape)
    mixed = np.where(rng.random(shape) < 0.4, rng.choice(pool, shape), regular)
    return mixed.astype(dtype)  # negatives wrap in the unsigned types


def _evaluate(program: Program, feeds: dict) -> list[np.ndarray]:
    env = dict(feeds)
    with np.errstate(all="ignore"):
        for node in program.nodes:
            outs = OPS[node.op].reference([env[v.name] for v in node.inputs], node.attrs)
            env.update((v.name, np.asarray(o, dtype=v.dtype)) for v, o in zip(node.outputs, outs, strict=True))
    return [env[v.name] for v in program.outputs]


def _tolerance(program: Program) -> tuple[float, float]:
    loose = any(n.op in APPROXIMATE for n in program.nodes)
    return (2e-3, 1e-4) if loose else (1e-5, 1e-6)


@pytest.mark.skipif(not OPS_FUZZED, reason="no fuzzable ops")
@settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(programs())
def test_random_programs_match_the_numpy_references(tmp_path_factory, spec):
    dtype, shape, steps, seed = spec
    program = _build(dtype, shape, steps)
    if program is None:
        return
    feeds = {v.name: _data(dtype, shape, seed + i) for i, v in enumerate(program.inputs)}
    want = _evaluate(program, feeds)
    rtol, atol = _tolerance(program)
    cache = tmp_path_factory.mktemp("fuzz")
    for fuse in (True, False):
        got = cinn.compile(program, fuse=fuse, cache_dir=cache, workers=1).run(feeds)
        for g, w in zip(got, want, strict=True):
            assert g.dtype == w.dtype and g.shape == w.shape
            if g.dtype.kind == "f":
                np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, equal_nan=True,
                                           err_msg=f"fuse={fuse}\n{program}\nfeeds={feeds}")
            else:
                np.testing.assert_array_equal(g, w, err_msg=f"fuse={fuse}\n{program}\nfeeds={feeds}")


def test_the_fuzz_covers_the_elementwise_table():
    assert len(OPS_FUZZED) >= 40 and {"max", "min", "relu", "floor_divide", "mod", "abs", "pow"} <= set(OPS_FUZZED)
