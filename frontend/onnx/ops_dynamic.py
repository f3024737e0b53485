"""ONNX ops whose output size is known only at run time: NonZero and NonMaxSuppression run as host ops
(cinn.core.host_ops) between the stages of a StagedProgram, which the loader cuts after them; Compress is NonZero
and a Gather.

Their converters fold them where their inputs are known (constants, or an empty NonZero input): anywhere else the
loader cuts the graph before converting them, which it can in the main graph and in the If branches it inlines, not
in a Loop or Scan body (converted once per iteration, inside one stage).
"""
from __future__ import annotations

import onnx

from cinn.core.host_ops import HostOp, HostOpKind, NmsAttrs
from cinn.core.ir import Attrs, NoAttrs
from frontend.onnx.registry import NodeContext, OnnxImportError, converter

# ONNX op type -> its host op
RUN_TIME_SIZED: dict[str, HostOpKind] = {
    "NonZero": HostOpKind.NONZERO,
    "NonMaxSuppression": HostOpKind.NON_MAX_SUPPRESSION,
}


def host_attrs(node: onnx.NodeProto) -> Attrs:
    """A run-time sized node's host op attributes."""
    if node.op_type == "NonMaxSuppression":
        box = next((a.i for a in node.attribute if a.name == "center_point_box"), 0)
        if box not in (0, 1):
            raise OnnxImportError(f"NonMaxSuppression's center_point_box is {box}, not 0 or 1")
        return NmsAttrs(center_point_box=bool(box))
    return NoAttrs()


@converter(*RUN_TIME_SIZED)
def run_time_sized(ctx: NodeContext):
    """Folded when its inputs are known when converting."""
    arrays = [None if v is None else ctx.b.constant_of(v) for v in ctx.inputs]
    if any(a is None and v is not None for a, v in zip(arrays, ctx.inputs, strict=True)):
        raise NotImplementedError(f"{ctx.node.op_type}'s output size is known only at run time: supported in the main "
                                  "graph and in If branches, not inside a Loop or Scan body")
    op = HostOp(RUN_TIME_SIZED[ctx.node.op_type], (), (), host_attrs(ctx.node), ctx.node.name)
    return [ctx.b.create_constant(r, dtype="int64") for r in op.run(arrays)]


@converter("Compress")
def compress(ctx: NodeContext):
    """Reached only inside a Loop or Scan body: the loader expands Compress into NonZero and Gather elsewhere."""
    raise NotImplementedError("Compress's output size is known only at run time: supported in the main graph and in "
                              "If branches, not inside a Loop or Scan body")


def expand_compress(node: onnx.NodeProto) -> list[onnx.NodeProto]:
    """Compress(x, condition, axis) as NonZero(condition) -> indices and Gather(x, indices, axis) (x flattened
    without an axis): the count of true conditions is the output's size along the axis."""
    axis = next((a.i for a in node.attribute if a.name == "axis"), None)
    x, condition = node.input[0], node.input[1]
    out = node.output[0]
    at = f"{out}/cinn_compress"  # names no model node makes (the checker keeps each name to one producer)
    flat_shape = onnx.helper.make_node("Constant", [], [f"{at}_flat_shape"],
                                       value=onnx.helper.make_tensor("shape", onnx.TensorProto.INT64, [1], [-1]))
    nodes = [onnx.helper.make_node("NonZero", [condition], [f"{at}_nonzero"], name=f"{node.name}/nonzero"), flat_shape,
             onnx.helper.make_node("Reshape", [f"{at}_nonzero", flat_shape.output[0]], [f"{at}_indices"])]
    if axis is None:
        nodes.append(onnx.helper.make_node("Reshape", [x, flat_shape.output[0]], [f"{at}_flat"]))
        x, axis = f"{at}_flat", 0
    return [*nodes, onnx.helper.make_node("Gather", [x, f"{at}_indices"], [out], name=node.name, axis=axis)]
