"""Real CNN model files for the benchmarks: the CNNs shipped with the onnx package (``light_*``: their weights are
constant fills, here replaced by seeded random ones) and a MobileNetV2 written with onnx.helper as exporters write it
(BatchNorm folded into the convolutions, ReLU6 as Clip). ``python -m benchmarks.real_models DIR`` writes them."""
from __future__ import annotations

import argparse
import functools
import pathlib
import sys
from collections.abc import Callable, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SEED = 0
LIGHT = ("resnet50", "vgg19", "densenet121", "squeezenet", "zfnet512", "shufflenet", "inception_v1", "inception_v2",
         "bvlc_alexnet")
# MobileNetV2 1.0: (expansion, channels, repeats, first stride) per stage
MOBILENET_V2_STAGES = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                       (6, 320, 1, 1))


def light_path(name: str) -> pathlib.Path:
    """Where the onnx package keeps its light_NAME.onnx (weights stored as constant fills)."""
    return pathlib.Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / f"light_{name}.onnx"


def _random_weight(shape: Sequence[int], rng: np.random.Generator) -> np.ndarray:
    """He-scaled weights for matrices and kernels; 1-D tensors (BatchNorm scale, bias, mean, variance) in [0.5, 1.5),
    positive so that variances stay valid and activations stay in range through deep nets."""
    if len(shape) <= 1:
        return rng.uniform(0.5, 1.5, shape).astype(np.float32)
    fan_in = int(np.prod(shape[1:]))
    return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)


def light_model(name: str) -> onnx.ModelProto:
    """An onnx-shipped CNN with its ConstantOfShape weight fills replaced by seeded random initializers."""
    model = onnx.load(light_path(name))
    graph = model.graph
    shapes = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    rng = np.random.default_rng(SEED)
    fills = [n for n in graph.node if n.op_type == "ConstantOfShape" and n.input[0] in shapes]
    for node in fills:
        graph.initializer.append(numpy_helper.from_array(_random_weight(tuple(shapes[node.input[0]]), rng), node.output[0]))
        graph.node.remove(node)
    used = {i for n in graph.node for i in n.input}
    kept = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    initialized = {t.name for t in kept}
    kept_inputs = [i for i in graph.input if i.name in used and i.name not in initialized]
    del graph.input[:]
    graph.input.extend(kept_inputs)
    model.ir_version = 8  # initializers need not be graph inputs (IR >= 4); onnxruntime reads IR <= 10
    return model


class _Graph:
    """Nodes and random initializers of a hand-written model."""

    def __init__(self):
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.rng = np.random.default_rng(SEED)
        self._n = 0
        self.relu6_bounds = (self._initializer(np.float32(0.0)), self._initializer(np.float32(6.0)))

    def _name(self, prefix: str) -> str:
        self._n += 1
        return f"{prefix}{self._n}"

    def _initializer(self, array: np.ndarray) -> str:
        name = self._name("w")
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def weight(self, shape: Sequence[int]) -> str:
        """A random weight (He-scaled) or, 1-D, a bias in [-0.1, 0.1)."""
        bias = len(shape) <= 1
        return self._initializer(self.rng.uniform(-0.1, 0.1, shape).astype(np.float32) if bias
                                 else _random_weight(shape, self.rng))

    def node(self, op: str, inputs: Sequence[str], **attrs) -> str:
        out = self._name(op.lower())
        self.nodes.append(helper.make_node(op, list(inputs), [out], **attrs))
        return out

    def conv(self, x: str, cin: int, cout: int, k: int, stride: int = 1, groups: int = 1, relu6: bool = True) -> str:
        w = self.weight((cout, cin // groups, k, k))
        y = self.node("Conv", [x, w, self.weight((cout,))], kernel_shape=[k, k], strides=[stride, stride],
                      pads=[k // 2] * 4, group=groups)
        return self.node("Clip", [y, *self.relu6_bounds]) if relu6 else y


def mobilenet_v2(resolution: int = 224, classes: int = 1000) -> onnx.ModelProto:
    """MobileNetV2 1.0 at batch 1, as torch.onnx exports it in eval mode."""
    g = _Graph()
    x = g.conv("input", 3, 32, 3, 2)
    cin = 32
    for t, c, n, s in MOBILENET_V2_STAGES:
        for i in range(n):
            stride = s if i == 0 else 1
            h = g.conv(x, cin, cin * t, 1) if t != 1 else x
            h = g.conv(h, cin * t, cin * t, 3, stride, groups=cin * t)
            h = g.conv(h, cin * t, c, 1, relu6=False)
            x = g.node("Add", [x, h]) if stride == 1 and cin == c else h
            cin = c
    x = g.conv(x, cin, 1280, 1)
    x = g.node("GlobalAveragePool", [x])
    x = g.node("Flatten", [x], axis=1)
    logits = g.node("Gemm", [x, g.weight((classes, 1280)), g.weight((classes,))], transB=1)
    graph = helper.make_graph(
        g.nodes, "mobilenet_v2", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, resolution, resolution])],
        [helper.make_tensor_value_info(logits, TensorProto.FLOAT, [1, classes])], g.inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


MODELS: dict[str, Callable[[], onnx.ModelProto]] = {name: functools.partial(light_model, name) for name in LIGHT}
MODELS["mobilenet_v2"] = mobilenet_v2


def write_models(directory: pathlib.Path, names: Sequence[str]) -> list[pathlib.Path]:
    """Write the named models as DIR/NAME.onnx (checked by onnx.checker); returns the paths."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in names:
        model = MODELS[name]()
        onnx.checker.check_model(model, full_check=True)
        path = directory / f"{name}.onnx"
        onnx.save(model, path)
        paths.append(path)
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.real_models", description=__doc__.splitlines()[0])
    p.add_argument("directory", type=pathlib.Path, help="where to write NAME.onnx")
    p.add_argument("models", nargs="*", metavar="MODEL", help=f"which models (default: all): {', '.join(MODELS)}")
    a = p.parse_args(argv)
    unknown = [m for m in a.models if m not in MODELS]
    if unknown:
        p.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS)}")
    for path in write_models(a.directory, a.models or list(MODELS)):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
