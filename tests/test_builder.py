"""NetBuilder: the one emitter of the builder, the passes and the importers; its errors; the shared folding policy."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import cinn
from cinn.compiler.passes.fold_constants import fold_constants
from cinn.compiler.passes.rewrite import rewrite
from cinn.core.builder import Names, new_node
from frontend.folding import FoldingBuilder
from tests.timeouts import scaled


def _relu_program(name: str):
    b = cinn.NetBuilder(name)
    x = b.create_input("float32", (2, 3), "x")
    return b, x, b.relu(x)


def test_build_needs_an_output():
    b, _, _ = _relu_program("p")
    with pytest.raises(ValueError, match="program 'p' needs at least one output"):
        b.build(outputs=[])


def test_a_value_of_another_builder_is_refused_even_with_a_matching_name():
    a, _, ya = _relu_program("a")
    b, xb, yb = _relu_program("b")
    assert ya == yb and ya.name == "relu_0"  # same name and type: only identity tells them apart
    with pytest.raises(ValueError, match=r"build: output %relu_0 was made by another builder, not by NetBuilder 'b'"):
        b.build([ya])
    with pytest.raises(ValueError, match=r"exp: input %relu_0 was made by another builder"):
        b.exp(ya)
    with pytest.raises(ValueError, match=r"add: input %x was made by another builder"):
        b.add(xb, a._inputs[0])
    assert b.build([yb]).outputs == (yb,)


def test_build_refuses_a_single_value_and_non_values():
    b, _, y = _relu_program("p")
    with pytest.raises(TypeError, match="outputs must be a list of values"):
        b.build(y)
    with pytest.raises(TypeError, match="is not a Value"):
        b.build([np.zeros(3)])


@pytest.mark.parametrize("shape", [(2.5, 3), "34", 3, (2, "3")])
def test_input_shapes_must_be_integers(shape):
    b = cinn.NetBuilder("p")
    with pytest.raises(TypeError, match="input 'x'"):
        b.create_input("float32", shape, "x")


def test_multi_output_values_are_named_alike_by_builder_and_passes():
    """NetBuilder and the rewriter name a multi-output op's values by one rule: node_i."""
    b = cinn.NetBuilder("split")
    x = b.create_input("float32", (4, 6), "x")
    parts = b.split(x, num_or_sections=[3, 3], axis=1)
    assert [v.name for v in parts] == ["split_0_0", "split_0_1"]
    program = b.build(list(parts))

    def resplit(rw, node):
        outs = rw.emit("split", rw.inputs(node), node.attrs)
        for old, new in zip(node.outputs, outs, strict=True):
            rw.substitute(old, new)
        return True

    emitted = rewrite(program, resplit)
    assert [v.name for v in emitted.outputs] == ["split_1_0", "split_1_1"]


def test_names_refuse_repeats_and_skip_taken_ones():
    names = Names({"relu_0"})
    assert names.fresh("relu") == "relu_1"
    with pytest.raises(ValueError, match="duplicate value name 'relu_1'"):
        names.claim("relu_1")
    node = new_node("relu", [cinn.Value("x", cinn.TensorType((2,), "float32"))], None, names)
    assert node.name == node.outputs[0].name == "relu_2"


def test_importers_fold_what_the_graph_pass_leaves_to_kernels():
    """One folding policy: an importer folds a broadcast of constants (its converters need the values); the pass
    keeps it for the kernel, where it costs nothing."""
    fb = FoldingBuilder("f")
    c = fb.create_constant(np.arange(3, dtype="float32"), "c")
    wide = fb.broadcast_to(c, out_shape=[4, 3])
    assert fb.constant_of(wide) is not None and fb.constant_of(wide).shape == (4, 3)

    b = cinn.NetBuilder("g")
    c = b.create_constant(np.arange(3, dtype="float32"), "c")
    program = b.build([b.broadcast_to(c, out_shape=[4, 3])])
    assert [n.op for n in fold_constants(program).nodes] == ["broadcast_to"]


def test_version_is_exported():
    assert cinn.__version__ and cinn.__version__ != "0+unknown"


@pytest.mark.parametrize("module", ["cinn.facade.cli", "cinn.facade.tune_cli", "benchmarks.cli"])
def test_clis_answer_version(module):
    code = f"import sys; from {module} import main; sys.exit(main(['--version']))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=scaled(120))
    assert proc.returncode == 0, proc.stderr
    assert cinn.__version__ in proc.stdout


def test_importing_cinn_is_cheap():
    """`import cinn` loads neither TVM nor the importers: the public names are resolved on first use."""
    code = ("import sys, cinn; assert 'tvm' not in sys.modules and 'onnx' not in sys.modules; cinn.NetBuilder; "
            "assert 'cinn.facade.api' not in sys.modules")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=scaled(120))
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("layout, shape, message", [
    (None, (1, 3, 3, 3, 32), r"w of shape \(1, 3, 3, 3, 32\) is not 4-D OIHW"),  # conv2d: OIHW only
    ("IHWO32", (3, 3, 3, 32), r"w of shape \(3, 3, 3, 32\) is not 5-D IHWO32"),
    ("IHWO", (1, 3, 3, 3, 32), r"w of shape \(1, 3, 3, 3, 32\) is not 4-D IHWO"),
])
def test_conv_weights_of_the_wrong_layout_are_named(layout, shape, message):
    b = cinn.NetBuilder("layouts")
    x = b.create_input("float32", (1, 3, 8, 8), "x")
    w = b.create_input("float32", shape, "w")
    with pytest.raises(ValueError, match=message):
        b.conv2d(x, w) if layout is None else b.conv2d_packed(x, w, weight_layout=layout)
