"""Model files: malformed (the repository's corpus of cut and random files, and new ones: wrong magic, wrong wire
types, huge or negative dims, external data pointing elsewhere), invalid (tests/test_robustness.py's INVALID and more)
and models that would exhaust memory or time."""
from __future__ import annotations

import functools
import os
import pathlib
import shutil
import tempfile
from collections.abc import Callable, Sequence

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from tests.bad_inputs.core import Action, Api, Case, Category, Expect, Want
from tests.test_malformed_inputs import PADDLE, _corpus
from tests.test_onnx_import import make_model
from tests.test_robustness import INVALID

MODEL = "model.onnx"
F32 = T.FLOAT
RNG_BYTES = np.random.default_rng(49).bytes(256)


# -- the repository's malformed-file corpus -------------------------------------------------------------------
@functools.cache
def _corpus_files() -> tuple[str, ...]:
    """The files tests/test_malformed_inputs.py makes, relative to its folder (its invalid models come from INVALID
    below, by name)."""
    with tempfile.TemporaryDirectory() as tmp:
        files = _corpus(pathlib.Path(tmp))
        return tuple(str(f.relative_to(tmp)) for f in files if not f.name.startswith("invalid"))


def _from_corpus(rel: str) -> Callable[[pathlib.Path], None]:
    def make(case_dir: pathlib.Path) -> None:
        shared = case_dir.parent / "_malformed"
        if not shared.exists():  # made once per run, then copied: a cut file needs its siblings
            tmp = pathlib.Path(tempfile.mkdtemp(dir=case_dir.parent))
            _corpus(tmp)
            os.replace(tmp, shared)
        shutil.copytree((shared / rel).parent, case_dir / "in")

    return make


def _corpus_cases() -> list[Case]:
    return [Case(Category.MALFORMED, f"corpus: {rel}", Api(Action.LOAD, str(pathlib.Path("in", pathlib.Path(rel).name))),
                 _from_corpus(rel)) for rel in _corpus_files()]


# -- new malformed files ----------------------------------------------------------------------------------------
def _bytes(content: bytes, name: str = MODEL) -> Callable[[pathlib.Path], None]:
    return lambda d: (d / name).write_bytes(content)


def _saved(build: Callable[[], onnx.ModelProto]) -> Callable[[pathlib.Path], None]:
    return lambda d: onnx.save(build(), d / MODEL)


def _relu(shape: Sequence[object]) -> onnx.ModelProto:
    return make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", F32, list(shape))], [("y", F32, list(shape))])


def _with_tensor(tensor: onnx.TensorProto, shape=(2, 3)) -> onnx.ModelProto:
    """x + tensor."""
    model = make_model([helper.make_node("Add", ["x", tensor.name], ["y"])], [("x", F32, list(shape))],
                       [("y", F32, list(shape))])
    model.graph.initializer.append(tensor)
    return model


def _tensor(dims: Sequence[int], data_type: int = F32, raw: bytes = b"\0" * 24) -> onnx.TensorProto:
    t = onnx.TensorProto(name="w", data_type=data_type, raw_data=raw)
    t.dims.extend(dims)
    return t


def _external(location: str, offset: int = 0) -> Callable[[pathlib.Path], None]:
    """A model whose initializer's data is in `location` (made beside the model when it is w.bin)."""
    def make(d: pathlib.Path) -> None:
        t = onnx.TensorProto(name="w", data_type=F32, dims=[2, 3], data_location=onnx.TensorProto.EXTERNAL)
        for k, v in (("location", location), ("offset", str(offset)), ("length", "24")):
            t.external_data.add(key=k, value=v)
        (d / "m").mkdir()
        onnx.save(_with_tensor(t), d / "m" / MODEL)

    return make


def _symlinked_data(d: pathlib.Path) -> None:
    _external("w.bin")(d)
    (d / "m" / "w.bin").symlink_to("/etc/passwd")


def _sparse() -> onnx.ModelProto:
    model = _relu([2, 3])
    values = numpy_helper.from_array(np.ones(2, np.float32), "s")
    indices = numpy_helper.from_array(np.array([0, 99], np.int64), "s_i")
    model.graph.sparse_initializer.append(helper.make_sparse_tensor(values, indices, [2, 3]))
    return model


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _varint(n: int) -> bytes:
    out = b""
    while n >= 0x80:
        out, n = out + bytes([n & 0x7F | 0x80]), n >> 7
    return out + bytes([n])


def _nested_ifs(depth: int) -> bytes:
    """A model of If inside If `depth` deep, past protobuf's nesting limit (so written field by field: onnx.helper
    cannot build it)."""
    def value_info(name: str) -> bytes:
        return helper.make_tensor_value_info(name, F32, [2, 3]).SerializeToString()

    def if_node(output: str, then: bytes) -> bytes:
        leaf = _field(1, _field(1, b"x") + _field(2, b"e") + _field(4, b"Relu")) + _field(2, b"leaf") + _field(12, value_info("e"))
        branches = [_field(1, name) + _varint(20 << 3) + _varint(5) + _field(6, g) for name, g in ((b"then_branch", then),
                                                                                                     (b"else_branch", leaf))]
        return _field(1, b"c") + _field(2, output.encode()) + _field(4, b"If") + b"".join(_field(5, b) for b in branches)

    graph = _field(1, _field(1, b"x") + _field(2, b"r0") + _field(4, b"Relu")) + _field(2, b"g0") + _field(12, value_info("r0"))
    for i in range(1, depth):
        graph = _field(1, if_node(f"r{i}", graph)) + _field(2, f"g{i}".encode()) + _field(12, value_info(f"r{i}"))
    inputs = [helper.make_tensor_value_info("x", F32, [2, 3]), helper.make_tensor_value_info("c", T.BOOL, [])]
    main = (_field(1, if_node("y", graph)) + _field(2, b"main") + b"".join(_field(11, v.SerializeToString()) for v in inputs)
            + _field(12, value_info("y")))
    opset = _field(1, b"") + _varint(2 << 3) + _varint(17)
    return _varint(1 << 3) + _varint(10) + _field(8, opset) + _field(7, main)


def _paddle_copy(fmt: str, drop: str = "") -> Callable[[pathlib.Path], None]:
    def make(d: pathlib.Path) -> None:
        shutil.copytree(PADDLE / fmt, d / "pd")
        if drop:
            (d / "pd" / drop).unlink()

    return make


def _params_as_folder(d: pathlib.Path) -> None:
    _paddle_copy("pir", "inference.pdiparams")(d)
    (d / "pd" / "inference.pdiparams").mkdir()


def _malformed(name: str, make: Callable[[pathlib.Path], object], path: str = MODEL, want: Want = Want.ERROR) -> Case:
    return Case(Category.MALFORMED, name, Api(Action.LOAD, path), make, Expect(want))


def _new_malformed() -> list[Case]:
    huge = 2**40
    return [
        _malformed("onnx: a zip file", _bytes(b"PK\x03\x04" + RNG_BYTES)),
        _malformed("onnx: an ELF header", _bytes(b"\x7fELF\x02\x01\x01" + RNG_BYTES)),
        _malformed("onnx: the graph field as a varint", _bytes(b"\x08\x0a\x38\x01")),
        _malformed("onnx: ir_version as a string", _bytes(b"\x0a\x03abc")),
        _malformed("onnx: a length past the end", _bytes(b"\x08\x0a\x3a\xff\xff\x03\x0a\x01")),
        _malformed("onnx: a model without a graph", _saved(lambda: helper.make_model(onnx.GraphProto(), ir_version=10))),
        _malformed("onnx: ir_version 999", lambda d: onnx.save(_ir(_relu([2, 3]), 999), d / MODEL)),
        _malformed("onnx: input dims 2**40 x 2**40", _saved(lambda: _relu([huge, huge]))),
        _malformed("onnx: negative input dim", _saved(lambda: _relu([-5, 8]))),
        _malformed("onnx: zero input dim", _saved(lambda: _relu([0, 8])), want=Want.EITHER),
        _malformed("onnx: initializer 2**31 x 2**31 without data", _saved(lambda: _with_tensor(_tensor([2**31, 2**31], raw=b"")))),
        _malformed("onnx: negative initializer dim", _saved(lambda: _with_tensor(_tensor([-2, 3])))),
        _malformed("onnx: initializer data type 999", _saved(lambda: _with_tensor(_tensor([2, 3], 999)))),
        _malformed("onnx: initializer data type UNDEFINED", _saved(lambda: _with_tensor(_tensor([2, 3], 0)))),
        _malformed("onnx: raw data longer than its dims", _saved(lambda: _with_tensor(_tensor([2, 3], raw=b"\0" * 4000)))),
        _malformed("onnx: a string initializer added to floats",
                   _saved(lambda: _with_tensor(helper.make_tensor("w", T.STRING, [2, 3], [b"a"] * 6)))),
        _malformed("onnx: an input without a type", _saved(_untyped_input)),
        _malformed("onnx: two initializers of one name", _saved(_duplicate_initializers)),
        _malformed("onnx: a sparse initializer with an index out of range", _saved(_sparse)),
        _malformed("onnx: a node with an empty op_type", _saved(lambda: make_model(
            [helper.make_node("", ["x"], ["y"])], [("x", F32, [2, 3])], [("y", F32, [2, 3])]))),
        _malformed("onnx: external data outside the model folder", _external("../w.bin"), f"m/{MODEL}"),
        _malformed("onnx: external data at /etc/passwd", _external("/etc/passwd"), f"m/{MODEL}"),
        _malformed("onnx: external data in a missing file", _external("w.bin"), f"m/{MODEL}"),
        _malformed("onnx: external data symlinked to /etc/passwd", _symlinked_data, f"m/{MODEL}"),
        _malformed("onnx: external data past the end of /etc/passwd", _external("/etc/passwd", 2**40), f"m/{MODEL}"),
        _malformed("onnx: If nested 150 deep", _bytes(_nested_ifs(150))),
        _malformed("paddle: an empty model folder", lambda d: (d / "pd").mkdir(), "pd"),
        _malformed("paddle: a .json that is not JSON", _bytes(b'{"program":', "m.json"), "m.json"),
        _malformed("paddle: a .json holding a list", _bytes(b"[]", "m.json"), "m.json"),
        _malformed("paddle: a .json holding 1e999", _bytes(b'{"base_code": 1e999}', "m.json"), "m.json"),
        _malformed("paddle: a .pdmodel without its parameters", _paddle_copy("legacy", "inference.pdiparams"),
                   "pd/inference.pdmodel"),
        _malformed("paddle: a .json without its parameters", _paddle_copy("pir", "inference.pdiparams"), "pd/inference.json"),
        _malformed("paddle: a parameter file that is a folder", _params_as_folder, "pd/inference.json"),
    ]


def _ir(model: onnx.ModelProto, version: int) -> onnx.ModelProto:
    model.ir_version = version
    return model


def _untyped_input() -> onnx.ModelProto:
    model = _relu([2, 3])
    model.graph.input[0].ClearField("type")
    return model


def _duplicate_initializers() -> onnx.ModelProto:
    model = _with_tensor(numpy_helper.from_array(np.ones((2, 3), np.float32), "w"))
    model.graph.initializer.append(numpy_helper.from_array(np.zeros((3, 3), np.float32), "w"))
    return model


# -- invalid models ------------------------------------------------------------------------------------------------
def _graph(nodes, inputs=(("x", F32, [2, 3]),), outputs=(("y", F32, [2, 3]),), inits=(), opset=17) -> onnx.ModelProto:
    return make_model(nodes, list(inputs), list(outputs), list(inits), opset)


def _node(op: str, inputs: Sequence[str], outputs: Sequence[str] = ("y",), **attrs) -> onnx.NodeProto:
    return helper.make_node(op, list(inputs), list(outputs), name=f"bad_{op.lower()}", **attrs)


def _c(name: str, value) -> tuple[str, np.ndarray]:
    return name, np.asarray(value)


def _invalid_models() -> dict[str, Callable[[], onnx.ModelProto]]:
    i64 = np.int64
    return {
        "an input no one produces": lambda: _graph([_node("Relu", ["nope"])]),
        "a cycle": lambda: _graph([_node("Add", ["x", "b"], ["a"]), _node("Relu", ["a"], ["b"]), _node("Neg", ["b"])]),
        "a graph output no node produces": lambda: _graph([_node("Relu", ["x"], ["z"])]),
        "Flatten axis as a float": lambda: _graph([_node("Flatten", ["x"], axis=1.5)], outputs=[("y", F32, None)]),
        "Transpose perm as a string": lambda: _graph([_node("Transpose", ["x"], perm="10")], outputs=[("y", F32, None)]),
        "Gemm alpha as a string": lambda: _graph([_node("Gemm", ["x", "w"], alpha="two")], outputs=[("y", F32, None)],
                                                 inits=[_c("w", np.ones((3, 3), np.float32))]),
        "Conv strides as a tensor": lambda: _graph(
            [_node("Conv", ["x", "w"], strides=numpy_helper.from_array(np.array([1, 1], i64)))],
            inputs=[("x", F32, [1, 1, 4, 4])], outputs=[("y", F32, None)], inits=[_c("w", np.ones((1, 1, 3, 3), np.float32))]),
        "an unsupported op": lambda: _graph([_node("FooBar", ["x"])]),
        "an op of an unknown domain": lambda: _graph([helper.make_node("Relu", ["x"], ["y"], domain="com.evil")]),
        "Add of float32 and int64": lambda: _graph([_node("Add", ["x", "k"])], inits=[_c("k", np.ones((2, 3), i64))]),
        "MatMul of 2x3 and 4x5": lambda: _graph([_node("MatMul", ["x", "w"])], outputs=[("y", F32, None)],
                                                inits=[_c("w", np.ones((4, 5), np.float32))]),
        "opset 1": lambda: _graph([_node("Relu", ["x"])], opset=1),
        "opset 99": lambda: _graph([_node("Relu", ["x"])], opset=99),
        "Reshape 2x3 to 4x5": lambda: _graph([_node("Reshape", ["x", "s"])], outputs=[("y", F32, None)],
                                             inits=[_c("s", np.array([4, 5], i64))]),
        "Slice with step 0": lambda: _graph([_node("Slice", ["x", "s", "e", "a", "st"])], outputs=[("y", F32, None)],
                                            inits=[_c("s", [0]), _c("e", [2]), _c("a", [0]), _c("st", [0])]),
        "Split sizes that do not add up": lambda: _graph([_node("Split", ["x", "s"], ["y", "z"], axis=1)],
                                                         outputs=[("y", F32, None), ("z", F32, None)],
                                                         inits=[_c("s", np.array([1, 5], i64))]),
        "Concat of ranks 2 and 3": lambda: _graph([_node("Concat", ["x", "k"], axis=0)], outputs=[("y", F32, None)],
                                                  inits=[_c("k", np.ones((1, 2, 3), np.float32))]),
        "Conv with a rank-3 weight": lambda: _graph([_node("Conv", ["x", "w"])], inputs=[("x", F32, [1, 1, 4, 4])],
                                                    outputs=[("y", F32, None)], inits=[_c("w", np.ones((1, 1, 3), np.float32))]),
        "Cast to data type 0": lambda: _graph([_node("Cast", ["x"], to=0)], outputs=[("y", F32, None)]),
        "Squeeze of an axis of size 3": lambda: _graph([_node("Squeeze", ["x", "a"])], outputs=[("y", F32, None)],
                                                       inits=[_c("a", np.array([1], i64))]),
        "Transpose perm with a repeated axis": lambda: _graph([_node("Transpose", ["x"], perm=[0, 0])], outputs=[("y", F32, None)]),
        "Softmax axis 5": lambda: _graph([_node("Softmax", ["x"], axis=5)]),
        "Where of unbroadcastable shapes": lambda: _graph([_node("Where", ["c", "x", "k"])],
                                                          inputs=[("x", F32, [2, 3]), ("c", T.BOOL, [4])],
                                                          outputs=[("y", F32, None)], inits=[_c("k", np.ones((5,), np.float32))]),
        "TopK k larger than the axis": lambda: _graph([_node("TopK", ["x", "k"], ["y", "i"])],
                                                      outputs=[("y", F32, None), ("i", T.INT64, None)],
                                                      inits=[_c("k", np.array([9], i64))]),
        "Einsum with a bad equation": lambda: _graph([_node("Einsum", ["x"], equation="ij->k")], outputs=[("y", F32, None)]),
        "Pad removing more than the axis": lambda: _graph([_node("Pad", ["x", "p"])], outputs=[("y", F32, None)],
                                                          inits=[_c("p", np.array([0, -5, 0, 0], i64))]),
    }


def _gather_out_of_range() -> onnx.ModelProto:
    """Refused when compiled (the importer keeps the index as it is)."""
    return _graph([_node("Gather", ["x", "i"], axis=0)], outputs=[("y", F32, None)], inits=[_c("i", np.array([7], np.int64))])


def _invalid_cases() -> list[Case]:
    cases = [Case(Category.INVALID, f"robustness: {name}", Api(Action.LOAD, MODEL), _saved(lambda m=model: m))
             for name, (model, _) in INVALID.items()]
    cases += [Case(Category.INVALID, name, Api(Action.LOAD, MODEL), _saved(build)) for name, build in _invalid_models().items()]
    cases.append(Case(Category.INVALID, "Gather of a constant index out of range", Api(Action.LOAD_COMPILE, MODEL),
                      _saved(_gather_out_of_range)))
    return cases


# -- valid models at the edges -------------------------------------------------------------------------------------
def _batch_norm_after(op: str) -> onnx.ModelProto:
    """A BatchNormalization fed by a one-input op (BatchNorm folding took its producer for a conv or a matmul)."""
    c = 2
    stats = [_c(n, np.full(c, v, np.float32)) for n, v in (("s", 2.0), ("b", 0.5), ("m", 0.1), ("v", 4.0))]
    return _graph([_node(op, ["x"], ["h"]), _node("BatchNormalization", ["h", "s", "b", "m", "v"])],
                  inputs=[("x", F32, [1, c, 4, 4])], outputs=[("y", F32, [1, c, 4, 4])], inits=stats)


def _initializers_not_inputs(ir_version: int) -> onnx.ModelProto:
    """An initializer that is not a graph input, as old exporters wrote at IR version 3 (onnxruntime runs it)."""
    model = _graph([_node("Add", ["x", "w"])], inits=[_c("w", np.ones((2, 3), np.float32))], opset=9)
    model.ir_version = ir_version
    return model


def _conv3d() -> onnx.ModelProto:
    """A video model's first layer in small: a 3-D Conv (run through the 2-D ones) with a stride and pads in space."""
    w = np.random.default_rng(15).standard_normal((4, 3, 3, 3, 3)).astype(np.float32)
    return _graph([_node("Conv", ["x", "w"], strides=[1, 2, 2], pads=[1, 1, 1, 1, 1, 1])], inputs=[("x", F32, [1, 3, 4, 16, 16])],
                  outputs=[("y", F32, None)], inits=[_c("w", w)])


def _valid_cases() -> list[Case]:
    runs, call = Expect(Want.RESULT), Api(Action.LOAD_COMPILE, MODEL)
    return [
        Case(Category.VALID, "BatchNormalization after a Relu", call, _saved(lambda: _batch_norm_after("Relu")), runs),
        Case(Category.VALID, "BatchNormalization after a Sigmoid", call, _saved(lambda: _batch_norm_after("Sigmoid")), runs),
        Case(Category.VALID, "IR version 3, an initializer not among the inputs", call, _saved(lambda: _initializers_not_inputs(3)), runs),
        Case(Category.VALID, "a 3-D Conv, strided and padded", call, _saved(_conv3d), runs),
    ]


# -- resource exhaustion -------------------------------------------------------------------------------------------
def _loop_model(trips: Sequence[int]) -> onnx.ModelProto:
    """Loops nested len(trips) deep, the innermost adding one to the carried value."""
    def body(level: int) -> onnx.GraphProto:
        v_in, v_out = f"v{level}_in", f"v{level}_out"
        nodes = [helper.make_node("Identity", [f"c{level}_in"], [f"c{level}_out"])]
        if level + 1 < len(trips):
            nodes += _loop_nodes(level + 1, v_in, v_out, body(level + 1))
        else:
            nodes.append(helper.make_node("Add", [v_in, "one"], [v_out]))
        vi = helper.make_tensor_value_info
        return helper.make_graph(nodes, f"body{level}", [vi(f"i{level}", T.INT64, []), vi(f"c{level}_in", T.BOOL, []),
                                                         vi(v_in, F32, [2, 3])],
                                 [vi(f"c{level}_out", T.BOOL, []), vi(v_out, F32, [2, 3])])

    def _loop_nodes(level: int, v: str, out: str, graph: onnx.GraphProto) -> list[onnx.NodeProto]:
        return [helper.make_node("Constant", [], [f"trip{level}"], value=numpy_helper.from_array(np.array(trips[level], np.int64))),
                helper.make_node("Constant", [], [f"cond{level}"], value=numpy_helper.from_array(np.array(True))),
                helper.make_node("Loop", [f"trip{level}", f"cond{level}", v], [out], body=graph)]

    return _graph(_loop_nodes(0, "x", "y", body(0)), inits=[("one", np.ones((2, 3), np.float32))])


def _resize(scale: float) -> onnx.ModelProto:
    return _graph([_node("Resize", ["x", "", "s"], mode="nearest")], inputs=[("x", F32, [1, 1, 2, 3])], outputs=[("y", F32, None)],
                  inits=[_c("s", np.array([1, 1, scale, scale], np.float32))])


def _resource_models() -> dict[str, tuple[Callable[[], onnx.ModelProto], Action]]:
    i64, huge = np.int64, 2**20
    load, run = Action.LOAD, Action.LOAD_COMPILE
    out = [("y", F32, None)]
    return {
        "3 nested Loops of 30": (lambda: _loop_model([30, 30, 30]), load),
        "2 nested Loops of 60": (lambda: _loop_model([60, 60]), run),
        "a Loop of 2**40 trips": (lambda: _loop_model([2**40]), load),
        "ConstantOfShape [2**31, 4]": (lambda: _graph([_node("ConstantOfShape", ["s"])], inputs=[], outputs=out,
                                                      inits=[_c("s", np.array([2**31, 4], i64))]), load),
        "ConstantOfShape [-1]": (lambda: _graph([_node("ConstantOfShape", ["s"])], inputs=[], outputs=out,
                                                inits=[_c("s", np.array([-1], i64))]), load),
        "OneHot of depth 2**33": (lambda: _graph([_node("OneHot", ["i", "d", "v"])], inputs=[], outputs=out,
                                                 inits=[_c("i", np.array([1, 2], i64)), _c("d", np.array(2**33, i64)),
                                                        _c("v", np.array([0, 1], np.float32))]), load),
        "Range of 2**40 elements": (lambda: _graph([_node("Range", ["a", "b", "c"])], inputs=[], outputs=[("y", T.INT64, None)],
                                                   inits=[_c("a", np.array(0, i64)), _c("b", np.array(2**40, i64)),
                                                          _c("c", np.array(1, i64))]), load),
        "Tile by [2**20, 2**20]": (lambda: _graph([_node("Tile", ["k", "m"])], inputs=[], outputs=out,
                                                  inits=[_c("k", np.ones((2, 3), np.float32)),
                                                         _c("m", np.array([huge, huge], i64))]), load),
        "Tile of an input by [2**20, 2**20]": (lambda: _graph([_node("Tile", ["x", "m"])], outputs=out,
                                                              inits=[_c("m", np.array([huge, huge], i64))]), load),
        "Expand to [2**20, 2**20, 2**10]": (lambda: _graph([_node("Expand", ["x", "s"])], outputs=out,
                                                           inits=[_c("s", np.array([huge, huge, 2**10], i64))]), load),
        "Expand of a constant to [2**20, 2**20, 3]": (lambda: _graph([_node("Expand", ["k", "s"])], inputs=[], outputs=out,
                                                                     inits=[_c("k", np.ones((1, 3), np.float32)),
                                                                            _c("s", np.array([huge, huge, 3], i64))]), load),
        "Resize by inf": (lambda: _resize(np.inf), load),
        "Resize by nan": (lambda: _resize(np.nan), load),
        "Resize by 1e30": (lambda: _resize(1e30), load),
        "Pad by 2**40": (lambda: _graph([_node("Pad", ["x", "p"])], outputs=out, inits=[_c("p", np.array([0, 2**40, 0, 0], i64))]), load),
        "Pad of a constant by 2**40": (lambda: _graph([_node("Pad", ["k", "p"])], inputs=[], outputs=out,
                                                      inits=[_c("k", np.ones((2, 3), np.float32)),
                                                             _c("p", np.array([0, 2**40, 0, 0], i64))]), load),
    }


def _resource_cases() -> list[Case]:
    # refused, naming the node; a model that compiles (within the timeout) may also run
    return [Case(Category.RESOURCES, name, Api(action, MODEL), _saved(build),
                 Expect(Want.EITHER if action is Action.LOAD_COMPILE else Want.ERROR))
            for name, (build, action) in _resource_models().items()]


def cases() -> list[Case]:
    return _corpus_cases() + _new_malformed() + _invalid_cases() + _resource_cases() + _valid_cases()
