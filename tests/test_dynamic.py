"""Symbolic input dims: NetBuilder, ONNX and Paddle programs over named sizes, compiled once for many shapes."""
from __future__ import annotations

import threading
import warnings

import numpy as np
import pytest

import cinn
from cinn.core.symbolic import ShapeBindingError, SymbolicProgram
from frontend.zoo import symbolic_encoder
from tests.test_passes import evaluate
from tests.timeouts import scaled

RNG = np.random.default_rng(7)


def rand(*shape):
    return RNG.uniform(-1, 1, shape).astype(np.float32)


def _mlp() -> SymbolicProgram:
    b = cinn.NetBuilder("mlp")
    x = b.create_input("float32", ("batch", 24), "x")
    h = b.relu(b.add(b.matmul(x, b.create_constant(rand(24, 40), "w1")), b.create_constant(rand(40), "b1")))
    return b.build_symbolic([b.matmul(h, b.create_constant(rand(40, 10), "w2"))])


def _reference(program: SymbolicProgram, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The outputs in numpy (the op table's references) of the static program the feeds' shapes give."""
    return evaluate(program.specialize(program.bind({k: a.shape for k, a in feeds.items()})), feeds)


def test_symbolic_mlp_at_many_batches(tmp_cache):
    program = _mlp()
    assert program.symbols == ("batch",) and str(program) == "symbolic program mlp(%x:float32[batch, 24])"
    exe = cinn.compile(program, cache_dir=tmp_cache, shape_hints={"batch": [1, 16]}, symbolic_kernels=False)
    assert [str(b) for b in exe.bindings] == ["batch=1", "batch=16"]
    for n in (1, 16, 3, 17, 33):  # 17 is the probe size the builder showed
        x = rand(n, 24)
        (got,) = exe.run({"x": x})
        assert got.shape == (n, 10)
        np.testing.assert_allclose(got, _reference(program, {"x": x})[0], rtol=1e-4, atol=1e-4)
    assert exe.built_on_demand == 3 and len(exe.bindings) == 5
    one, three = (exe.executable(program.binding({"batch": n})) for n in (1, 3))
    assert one.program.constants == {}  # uploaded: the executable keeps no host copy
    shared = {id(t) for t in one._constants.values()} & {id(t) for t in three._constants.values()}
    assert shared  # one copy of a weight both bindings hold alike (packed panels may differ: GEMV at batch 1)
    static = cinn.compile(program.specialize(program.binding({"batch": 3})), cache_dir=tmp_cache)
    assert exe.executable(program.binding({"batch": 3})).num_kernels == static.num_kernels


def test_symbolic_cnn_batch(tmp_cache):
    b = cinn.NetBuilder("cnn")
    x = b.create_input("float32", ("n", 3, 12, 12), "x")
    y = b.conv2d(x, b.create_constant(rand(8, 3, 3, 3), "w"), paddings=[1, 1])
    y = b.batchnorm(y, *(b.create_constant(RNG.uniform(0.5, 1.5, 8).astype(np.float32), k) for k in "sbmv"))
    y = b.pool2d(b.relu(y), "max", [2, 2], strides=[2, 2])
    program = b.build_symbolic([b.reshape(y, [0, -1])])
    exe = cinn.compile(program, cache_dir=tmp_cache)
    for n in (1, 2, 5):
        x_ = rand(n, 3, 12, 12)
        (got,) = exe.run({"x": x_})
        assert got.shape == (n, 8 * 6 * 6)
        np.testing.assert_allclose(got, _reference(program, {"x": x_})[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("batch", "seq"), [(1, 1), (2, 7), (1, 13), (3, 20)])
def test_symbolic_encoder_fused_equals_unfused_and_numpy(batch, seq, tmp_cache):
    program = symbolic_encoder(small=True)
    assert program.symbols == ("batch", "seq")
    x = rand(batch, seq, 16)
    (fused,) = cinn.compile(program, cache_dir=tmp_cache).run({"x": x})
    (unfused,) = cinn.compile(program, fuse=False, cache_dir=tmp_cache).run({"x": x})
    np.testing.assert_allclose(fused, unfused, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(fused, _reference(program, {"x": x})[0], rtol=1e-4, atol=1e-4)


def test_relation_errors_name_the_input_symbol_and_both_values():
    b = cinn.NetBuilder("pair")
    x = b.create_input("float32", ("batch", "seq"), "x")
    m = b.create_input("float32", ("batch", "seq"), "mask")
    program = b.build_symbolic([b.multiply(x, m)])
    with pytest.raises(ShapeBindingError, match=r"input 'mask' dim 1 is seq = 9, but input 'x' dim 1 gave seq = 8"):
        program.bind({"x": (2, 8), "mask": (2, 9)})
    with pytest.raises(ShapeBindingError, match=r"input 'x': shape \(2,\) has rank 1.*rank 2"):
        program.bind({"x": (2,), "mask": (2, 9)})
    with pytest.raises(ShapeBindingError, match="missing input 'mask'"):
        program.bind({"x": (2, 8)})
    with pytest.raises(ShapeBindingError, match="symbol seq = -1 must be a non-negative int"):
        program.binding({"batch": 1, "seq": -1})
    with pytest.raises(ShapeBindingError, match=r"input 'x' dim 1 is 23, the program's input .*fixes it to 24"):
        _mlp().bind({"x": (2, 23)})


def test_run_errors_and_on_demand_off(tmp_cache):
    exe = cinn.compile(_mlp(), cache_dir=tmp_cache, shape_hints={"batch": [2]}, on_demand=False,
                       symbolic_kernels=False)
    assert exe.run({"x": np.zeros((2, 24), np.float32)})[0].shape == (2, 10)
    with pytest.raises(ShapeBindingError, match=r"no executable for batch=3 \(built: batch=2\)"):
        exe.run({"x": np.zeros((3, 24), np.float32)})
    with pytest.raises(ShapeBindingError, match=r"shape hints name no sizes for symbols \['batch'\]"):
        cinn.compile(_mlp(), cache_dir=tmp_cache, shape_hints={})
    with pytest.raises(TypeError, match="shape_hints are for symbolic programs"):
        cinn.compile(_mlp().specialize(_mlp().binding({"batch": 1})), shape_hints={"batch": [1]})


@pytest.mark.parametrize("symbolic", [False, True])
def test_concurrent_runs_build_each_binding_once(symbolic, tmp_cache):
    exe = cinn.compile(_mlp(), cache_dir=tmp_cache, symbolic_kernels=symbolic)
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            x = np.ones((n, 24), np.float32)
            assert exe.run({"x": x})[0].shape == (n, 10)
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(n,)) for n in (4, 5, 4, 5, 4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and (exe.built_on_demand, exe.served_symbolic) == ((0, 2) if symbolic else (2, 0))


def test_builder_symbolic_rules():
    b = cinn.NetBuilder("s")
    x = b.create_input("float32", ("batch", 4), "x")
    assert x.shape == (17, 4)  # the probe size while the program is written
    y = b.relu(x)
    with pytest.raises(TypeError, match=r"inputs \['x'\] of 's' have symbolic dims; build_symbolic"):
        b.build([y])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        program = b.build_symbolic([y])
    with pytest.warns(UserWarning, match=r"attribute ends holds 17, the probe size of symbol batch"):
        b.build_symbolic([b.slice(y, axes=[0], starts=[0], ends=[x.shape[0]])])
    with pytest.raises(TypeError, match="neither a size nor a symbol name"):
        b.create_input("float32", ("2b", 4), "z")
    b2 = cinn.NetBuilder("t")
    z = b2.create_input("float32", ("batch", 17), "z")
    square = b2.build_symbolic([b2.matmul(z, z)])  # [batch, 17] @ [batch, 17] fits at the probe size only
    with pytest.raises(ValueError, match=r"t at batch=2: node matmul_0 \(matmul\)"):
        square.specialize(square.binding({"batch": 2}))
    assert program.specialize(program.binding({"batch": 2})).outputs[0].shape == (2, 4)


# -- importers --------------------------------------------------------------------------------------
onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402

from tests.test_onnx_import import assert_matches_ort, make_model  # noqa: E402


def _reshape_by_shape_model() -> onnx.ModelProto:
    """y = Reshape(x, Concat(Shape(x)[0], [-1])) @ w: a shape computed from the input at run time."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "zero_axis"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus_one"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["flat"]),
        helper.make_node("MatMul", ["flat", "w"], ["y"]),
    ]
    inits = [("zero", np.array(0, np.int64)), ("zero_axis", np.array([0], np.int64)),
             ("minus_one", np.array([-1], np.int64)), ("w", rand(12, 5))]
    return make_model(nodes, [("x", TensorProto.FLOAT, ("batch", 3, 4))], [("y", TensorProto.FLOAT, None)], inits)


def test_onnx_dim_params_import_symbolic(tmp_cache):
    model = _reshape_by_shape_model()
    program = cinn.load_onnx(model)
    assert isinstance(program, SymbolicProgram) and program.symbols == ("batch",)
    for n in (1, 2, 9):
        assert_matches_ort(model, {"x": rand(n, 3, 4)}, tmp_cache)
    fixed = cinn.load_onnx(model, input_shapes={"x": (2, 3, 4)})
    assert isinstance(fixed, cinn.Program) and fixed.inputs[0].shape == (2, 3, 4)


def test_onnx_unnamed_dims_get_symbols():
    model = make_model([helper.make_node("Relu", ["input.1"], ["y"])], [("input.1", TensorProto.FLOAT, (None, 3))],
                       [("y", TensorProto.FLOAT, None)])
    assert cinn.load_onnx(model).symbols == ("input_1_0",)


def test_paddle_dynamic_dims_are_symbols(tmp_cache):
    from tests.test_paddle_import import FIXTURES

    program = cinn.load_paddle(FIXTURES / "encoder" / "pir")
    assert isinstance(program, SymbolicProgram) and str(program.inputs[0]) == "%x:float32[x_0, 8, 16]"
    exe = cinn.compile(program, cache_dir=tmp_cache)
    for n in (1, 3):
        x = rand(n, 8, 16)
        static = cinn.load_paddle(FIXTURES / "encoder" / "pir", input_shapes={"x": (n, 8, 16)})
        np.testing.assert_allclose(exe.run({"x": x})[0], evaluate(static, {"x": x})[0], rtol=1e-4, atol=1e-4)


def test_symbolic_bert_exports_with_dim_params_and_matches_onnxruntime(tmp_cache):
    from benchmarks.onnx_export import to_onnx
    from frontend.zoo import bert_feeds, symbolic_bert_base

    model = to_onnx(symbolic_bert_base(small=True))
    assert [[d.dim_param for d in i.type.tensor_type.shape.dim] for i in model.graph.input] == [["batch", "seq"]] * 3
    imported = cinn.load_onnx(model)
    assert isinstance(imported, SymbolicProgram) and imported.symbols == ("batch", "seq")
    for batch, seq in ((1, 1), (2, 9), (3, 33)):
        assert_matches_ort(model, bert_feeds(batch, seq, small=True), tmp_cache, rtol=1e-3, atol=1e-4)


def test_dynamic_benchmark_smoke(tmp_path):
    import subprocess
    import sys

    csv = tmp_path / "dyn.csv"
    args = ["--small", "--size", "batch=1,2", "--size", "seq=3", "--repeat", "1", "--csv", str(csv)]
    result = subprocess.run([sys.executable, "-m", "benchmarks.dynamic", *args], capture_output=True, text=True,
                            timeout=scaled(600))
    assert result.returncode == 0, result.stderr
    assert "0 built after it, 0 sizes on its symbolic kernels" in result.stdout  # cinn-dynamic: every size hinted
    assert "0 built after it, 2 sizes on its symbolic kernels" in result.stdout  # cinn-symbolic: none
    assert "max abs difference from onnxruntime" in result.stdout
    assert csv.read_text().splitlines()[0].startswith(
        "batch,seq,cinn-dynamic ms,cinn-symbolic ms,cinn-static ms,onnxruntime ms")
    bad = subprocess.run([sys.executable, "-m", "benchmarks.dynamic", "--small", "--size", "nope=1"],
                         capture_output=True, text=True, timeout=scaled(600))
    assert bad.returncode == 2 and "unknown ['nope']" in bad.stderr and "Traceback" not in bad.stderr


def test_cinn_tune_shape_hints_tune_every_binding(tmp_path, tmp_cache, capsys):
    from autotune.database import read_records
    from autotune.task import extract_tasks
    from cinn.facade import tune_cli

    path = tmp_path / "m.onnx"
    onnx.save(_reshape_by_shape_model(), path)
    symbolic = cinn.load_onnx(path)
    programs = [symbolic.specialize(symbolic.binding({"batch": n})) for n in (1, 3)]
    tasks = extract_tasks(programs)
    assert len(tasks) == len(extract_tasks(programs[0])) + len(extract_tasks(programs[1]))  # no kernel in common
    log = tmp_path / "log.jsonl"
    args = [str(path), "--shape-hint", "batch=1,3", "--trials", str(len(tasks)), "--repeat", "1", "--verify", "0"]
    assert tune_cli.main([*args, "--log", str(log)]) == 0
    assert {r.workload for r in read_records(log)} == {t.workload for t in tasks}
    exe = cinn.compile(symbolic, tuning_log=log, cache_dir=tmp_cache, shape_hints={"batch": [1, 3]})
    x = rand(3, 3, 4)
    np.testing.assert_allclose(exe.run({"x": x})[0], _reference(symbolic, {"x": x})[0], rtol=1e-4, atol=1e-5)
    assert tune_cli.main([str(path), "--shape-hint", "nope=2", "--log", str(log)]) == 2
    assert "symbols are ['batch']; unknown ['nope']" in capsys.readouterr().err


def test_shape_read_from_an_input_is_specialized_by_value(tmp_cache):
    """Reshape(x, shape) and Expand(y, dims) with `shape` and `dims` graph inputs: each value fed builds once."""
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"]), helper.make_node("Expand", ["r", "dims"], ["y"])]
    model = make_model(nodes, [("x", TensorProto.FLOAT, ("n", 6)), ("shape", TensorProto.INT64, (2,)),
                               ("dims", TensorProto.INT64, (3,))], [("y", TensorProto.FLOAT, None)])
    program = cinn.load_onnx(model)
    assert [i.by_value for i in program.inputs] == [False, True, True]
    assert str(program.inputs[1]) == "%shape:int64[2] (by value)"
    exe = cinn.compile(program, cache_dir=tmp_cache)
    cases = [(2, [3, 4], [2, 3, 4]), (2, [4, 3], [1, 4, 3]), (3, [-1, 2], [2, 9, 2]), (2, [3, 4], [2, 3, 4])]
    for n, shape, dims in cases:
        feeds = {"x": rand(n, 6), "shape": np.array(shape, np.int64), "dims": np.array(dims, np.int64)}
        assert_matches_ort(model, feeds, tmp_cache)
        (got,) = exe.run(feeds)
        np.testing.assert_array_equal(got, np.broadcast_to(feeds["x"].reshape(shape), dims))
    assert exe.built_on_demand == 3 and "shape=[3, 4], dims=[2, 3, 4]" in str(exe.bindings[0])
    with pytest.raises(ShapeBindingError, match=r"inputs \['shape', 'dims'\] are read by value"):
        cinn.compile(program, shape_hints={"n": [2]})
    with pytest.raises(ValueError, match="cannot reshape"):
        exe.run({"x": rand(2, 6), "shape": np.array([5, 5], np.int64), "dims": np.array([1, 5, 5], np.int64)})


def test_many_bindings_built_at_run_time_are_warned_of(tmp_cache, monkeypatch):
    from cinn.runtime import dynamic

    monkeypatch.setattr(dynamic, "MANY_ON_DEMAND", 3)
    exe = cinn.compile(_mlp(), cache_dir=tmp_cache, symbolic_kernels=False)
    for n in (1, 2):
        exe.run({"x": rand(n, 24)})
    with pytest.warns(UserWarning, match=r"mlp has built 3 executables at run time, each kept for good; hint"):
        exe.run({"x": rand(3, 24)})
