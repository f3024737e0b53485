"""Symbolic kernels: a symbolic program's kernels built once for every size, checked against numpy at sizes that are
not multiples of any tile or vector width, with nothing built at run time."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from onnx import TensorProto, helper
from tvm import tirx

import cinn
from cinn.compiler import build as build_module
from cinn.compiler import symbolic_kernels
from cinn.core.ops import OPS
from cinn.core.ops.te_util import dim_at
from cinn.core.symbolic import SymbolicProgram
from cinn.core.target import parse_target
from cinn.runtime import dynamic
from frontend.zoo import bert_feeds, symbolic_bert_base, symbolic_encoder
from tests.test_dynamic import _mlp, _reference, _reshape_by_shape_model, rand
from tests.test_onnx_import import make_model, ort_run
from tests.test_ops import CASES, emit


def _cnn() -> SymbolicProgram:
    b = cinn.NetBuilder("cnn")
    x = b.create_input("float32", ("n", 3, 12, 12), "x")
    y = b.conv2d(x, b.create_constant(rand(8, 3, 3, 3), "w"), paddings=[1, 1])
    y = b.batchnorm(y, *(b.create_constant(np.random.default_rng(3).uniform(0.5, 1.5, 8).astype(np.float32), k)
                         for k in "sbmv"))
    y = b.pool2d(b.relu(y), "max", [2, 2], strides=[2, 2])
    return b.build_symbolic([b.reshape(y, [0, -1])])


def _check(exe, program: SymbolicProgram, feeds: dict[str, np.ndarray], tol: float = 1e-4) -> None:
    (got,) = exe.run(feeds)
    np.testing.assert_allclose(got, _reference(program, feeds)[0], rtol=tol, atol=tol)


def test_mlp_runs_every_batch_on_kernels_built_once(tmp_cache):
    program = _mlp()
    exe = cinn.compile(program, cache_dir=tmp_cache)
    assert exe.symbolic_kernels and exe.symbolic_reason == "" and exe.bindings == ()
    for n in (1, 3, 16, 17, 33, 100):  # 1, primes, a vector width, more than the nominal size
        _check(exe, program, {"x": rand(n, 24)})
    assert (exe.built_on_demand, exe.served_symbolic) == (0, 6)
    one, eight, many = (exe.executable(program.binding({"batch": n})) for n in (1, 8, 100))
    assert eight.kernel_sources() == many.kernel_sources()  # the same kernels, other buffers
    assert all("batch: T.int32" in s for s in one.kernel_sources())
    # rows in whole tiles of 8 (the last one padded) from 8 rows on; fewer take the matmuls' unpadded variants
    assert all("// 8 * 8" in s for s in many.kernel_sources())
    assert not any("// 8 * 8" in s for s in one.kernel_sources())
    assert {id(t) for t in one._constants.values()} == {id(t) for t in many._constants.values()}


def test_hinted_sizes_keep_their_own_kernels(tmp_cache):
    program = _mlp()
    exe = cinn.compile(program, cache_dir=tmp_cache, shape_hints={"batch": [1, 8]})
    assert [str(b) for b in exe.bindings] == ["batch=1", "batch=8"]
    for n in (1, 8, 5):
        _check(exe, program, {"x": rand(n, 24)})
    assert (exe.built_on_demand, exe.served_symbolic) == (0, 1)
    assert "batch: T.int32" not in exe.executable(program.binding({"batch": 8})).kernel_sources()[0]


def test_cnn_with_a_symbolic_batch(tmp_cache):
    program = _cnn()
    exe = cinn.compile(program, cache_dir=tmp_cache)
    assert exe.symbolic_kernels, exe.symbolic_reason
    for n in (1, 2, 5):
        _check(exe, program, {"x": rand(n, 3, 12, 12)})
    assert (exe.built_on_demand, exe.served_symbolic) == (0, 3)


def test_a_batch_of_3x3_convs_computes_them_directly(tmp_cache):
    """The static compile takes Winograd where it gains; the symbolic kernels compute the convs directly (a Winograd
    conv's matmul vectorizes over every image's tiles, a symbolic count)."""
    b = cinn.NetBuilder("convs")
    x = b.create_input("float32", ("n", 64, 14, 14), "x")
    for k in range(2):
        x = b.relu(b.conv2d(x, b.create_constant(rand(64, 64, 3, 3) * 0.1, f"w{k}"), paddings=[1, 1]))
    program = b.build_symbolic([x])
    exe = cinn.compile(program, cache_dir=tmp_cache)
    assert exe.symbolic_kernels, exe.symbolic_reason
    for n in (1, 3):
        _check(exe, program, {"x": rand(n, 64, 14, 14)}, tol=1e-3)
    sources = exe.executable(program.binding({"n": 2})).kernel_sources()
    assert all("n: T.int32" in s and "winograd" not in s for s in sources)


@pytest.mark.parametrize("fuse", [True, False])
def test_encoder_at_odd_sizes_equals_numpy(fuse, tmp_cache):
    program = symbolic_encoder(small=True)
    exe = cinn.compile(program, fuse=fuse, cache_dir=tmp_cache)
    assert exe.symbolic_kernels, exe.symbolic_reason
    for batch, seq in ((1, 1), (2, 7), (1, 13), (3, 20), (1, 77)):
        _check(exe, program, {"x": rand(batch, seq, 16)})
    assert exe.built_on_demand == 0 and exe.served_symbolic == 5


def test_bert_equals_its_static_builds(tmp_cache):
    program = symbolic_bert_base(small=True)
    exe = cinn.compile(program, cache_dir=tmp_cache)
    assert exe.symbolic_kernels, exe.symbolic_reason
    for batch, seq in ((1, 5), (2, 16), (3, 9)):
        feeds = bert_feeds(batch, seq, small=True)
        static = cinn.compile(program.specialize(program.bind({k: a.shape for k, a in feeds.items()})),
                              cache_dir=tmp_cache)
        np.testing.assert_allclose(exe.run(feeds)[0], static.run(feeds)[0], rtol=1e-4, atol=1e-5)
        assert exe.executable(exe.bind(feeds)).num_kernels == static.num_kernels
    assert exe.built_on_demand == 0


def test_dims_are_fitted_as_products_of_symbols(tmp_cache):
    b = cinn.NetBuilder("rows")
    x = b.create_input("float32", ("batch", "seq", 4), "x")
    rows = b.matmul(b.reshape(x, [-1, 4]), b.create_constant(rand(4, 3), "w"))
    program = b.build_symbolic([b.reshape(b.relu(rows), [-1])])
    plan = symbolic_kernels.plan(program, parse_target("llvm"))
    texts = {str(d) for dims in plan.dims.values() for d in dims if not isinstance(d, int)}
    assert {"batch", "seq", "batch * seq"} < texts and len(texts) == 4  # and 3 * batch * seq, however TVM prints it
    assert all(isinstance(lg.func.params[-1], tirx.Var) for lg in plan.lowered)
    assert plan.program_at(program.binding({"batch": 2, "seq": 5})).outputs[0].shape == (30,)
    exe = cinn.compile(program, cache_dir=tmp_cache)
    _check(exe, program, {"x": rand(3, 7, 4)})


def test_bindings_served_are_bounded(tmp_cache, monkeypatch):
    monkeypatch.setattr(dynamic, "MAX_SERVED", 2)
    program = _mlp()
    exe = cinn.compile(program, cache_dir=tmp_cache)
    for n in (2, 3, 4, 2):
        _check(exe, program, {"x": rand(n, 24)})
    assert (exe.built_on_demand, exe.served_symbolic, len(exe._served)) == (0, 4, 2)  # 2 was dropped, planned again


def test_a_kernel_whose_schedule_fails_gets_the_plain_one(tmp_path, monkeypatch):
    def failing(sch, kind, target, knobs=None):
        raise RuntimeError("no schedule at symbolic sizes")

    b = cinn.NetBuilder("act")
    x = b.create_input("float32", ("batch", 5), "x")
    program = b.build_symbolic([b.relu(b.scale(x, scale=2.0))])
    target = parse_target("llvm")
    (lg,) = symbolic_kernels.plan(program, target).lowered
    monkeypatch.setattr(build_module, "apply_default", failing)
    path = build_module.build_kernel(build_module.KernelSpec("w", lg.func, lg.group.kind), target,
                                     str(tmp_path / "k.so"))
    assert "cinn.plain_schedule" in (tmp_path / "k.src").read_text()
    func = build_module.load_library(path, target)["main"]
    for n in (1, 7):
        a = rand(n, 5)
        out = tvm.runtime.tensor(np.zeros((n, 5), np.float32))
        func(tvm.runtime.tensor(a), out, n)
        np.testing.assert_allclose(out.numpy(), np.maximum(2 * a, 0), rtol=1e-6)


def test_plain_kernels_are_not_served(tmp_path, monkeypatch):
    """A symbolic kernel on the plain schedule (a conv's: 30x slower) makes sizes build on demand instead."""
    def failing(sch, kind, target, knobs=None):
        if symbolic_kernels.NOMINAL_SIZES in sch.mod["main"].attrs:
            raise RuntimeError("no schedule at symbolic sizes")
        return default(sch, kind, target)

    default = build_module.apply_default
    monkeypatch.setattr(build_module, "apply_default", failing)
    program = _mlp()
    # built in this process, with the patch, in a cache of its own (the kernel cache is keyed by the source)
    exe = cinn.compile(program, cache_dir=tmp_path, workers=1)
    assert not exe.symbolic_kernels and "have no fast schedule at symbolic sizes" in exe.symbolic_reason
    _check(exe, program, {"x": rand(3, 24)})
    assert (exe.built_on_demand, exe.served_symbolic) == (1, 0)


def test_a_shape_computed_reshape_takes_symbolic_kernels(tmp_cache):
    model = _reshape_by_shape_model()  # Reshape(x, Concat(Shape(x)[0], [-1])): its target differs at every size
    exe = cinn.compile(cinn.load_onnx(model), cache_dir=tmp_cache)
    assert exe.symbolic_kernels, exe.symbolic_reason
    for n in (1, 2, 9):
        feeds = {"x": rand(n, 3, 4)}
        np.testing.assert_allclose(exe.run(feeds)[0], ort_run(model, feeds)[0], rtol=1e-4, atol=1e-5)
    assert (exe.built_on_demand, exe.served_symbolic) == (0, 3)


def test_programs_without_symbolic_kernels_say_why(tmp_cache):
    model = make_model([helper.make_node("Reshape", ["x", "shape"], ["y"])],
                       [("x", TensorProto.FLOAT, ("n", 6)), ("shape", TensorProto.INT64, (2,))],
                       [("y", TensorProto.FLOAT, None)])
    exe = cinn.compile(cinn.load_onnx(model), cache_dir=tmp_cache)
    assert not exe.symbolic_kernels and "read by value" in exe.symbolic_reason
    assert cinn.compile(_mlp(), cache_dir=tmp_cache, symbolic_kernels=False).symbolic_reason == ""
    b = cinn.NetBuilder("halves")  # a 2x2 pool of a symbolic height: ceil(h / 2) rows, no product of symbols
    x = b.create_input("float32", (1, 4, "h", 8), "x")
    program = b.build_symbolic([b.pool2d(x, "max", [2, 2], strides=[2, 2], ceil_mode=True)])
    exe = cinn.compile(program, cache_dir=tmp_cache)
    assert not exe.symbolic_kernels and "at the probes are no product of symbols" in exe.symbolic_reason
    _check(exe, program, {"x": rand(1, 4, 5, 8)})


def _symbolic_case(case):
    """The op of a test row over a symbolic leading dim `n` (every fed input whose first dim is the first fed input's),
    and that dim's size in the row; None where the op takes no symbolic leading dim (its attrs fix it)."""
    arrays = case.arrays(np.random.default_rng(0))
    fed = [a for i, a in enumerate(arrays) if i not in case.constant_inputs and a.ndim]
    if not fed or fed[0].shape[0] < 2:
        return None
    size = fed[0].shape[0]
    try:
        b, outs, _ = emit(case, arrays, lambda a: ("n", *a.shape[1:]) if a.ndim and a.shape[0] == size else a.shape)
        return b.build_symbolic(outs), size
    except (ValueError, TypeError):  # e.g. a reshape to a fixed shape, a slice of the leading dim
        return None


def test_every_op_infers_shapes_with_a_symbolic_dim():
    """Each op's output dims, fitted as expressions of `n` from three probe sizes, equal its static inference at
    sizes that are no probe (the test row's, 1 and 5). An op's first test row that takes a symbolic leading dim is
    used; ops none of whose rows take one (their attrs fix it, or every row has a leading dim of 1) are counted."""
    checked, fixed, refused = [], [], []
    for op in sorted(OPS):
        made = next((m for m in map(_symbolic_case, (c for c in CASES if c.op == op)) if m is not None), None)
        if made is None:
            fixed.append(op)
            continue
        program, size = made
        try:
            dims = symbolic_kernels.symbolic_shapes(program)
        except symbolic_kernels.NotSymbolic:
            refused.append(op)
            continue
        for k in {size, 1, 5}:
            try:
                static = program.specialize(program.binding({"n": k}))
            except ValueError:  # the op refuses this size (a window larger than the input)
                continue
            for v in static.outputs:
                if 0 in v.shape:  # an empty result is compiled on its own, never served by symbolic kernels
                    continue
                got = tuple(dim_at(d, {"n": k}) for d in dims[v.name])
                assert got == v.shape, f"{op} at n={k}: fitted {dims[v.name]} -> {got}, inferred {v.shape}"
        checked.append(op)
    # 104 of 109 today; the others: arange (no input), broadcast_to and winograd_output (attrs fix the shape), ceil
    # and sqrt (rows of a leading dim of 1)
    assert not refused and len(checked) >= len(OPS) - 5, (fixed, refused)
