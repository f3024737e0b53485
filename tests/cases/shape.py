"""Cases for shape (injective) ops."""
from tests.cases import Case, random_array


def _gather(x_shape, index_shape, axis, dtype="float32", index_dtype="int64"):
    """Inputs for gather: x and in-range indices along axis (negative ones included)."""
    n = x_shape[axis]
    return lambda rng: [random_array(rng, x_shape, dtype), rng.integers(-n, n, size=index_shape).astype(index_dtype)]


F, I, B = "float32", "int32", "bool"

CASES = [
    Case("reshape", (((2, 3, 4), F),), {"shape": [4, -1]}),
    Case("reshape", (((6,), I),), {"shape": [1, 2, 3, 1]}),
    Case("reshape", (((), F),), {"shape": [1, 1]}),
    Case("reshape", (((1, 1), B),), {"shape": []}, id="reshape-to-scalar:bool"),
    Case("transpose", (((2, 3, 4), F),), {"axis": [2, 0, 1]}),
    Case("transpose", (((3, 1), B),), {"axis": [-1, 0]}),
    Case("transpose", (((), I),), {"axis": []}),
    Case("slice", (((5, 6), F),), {"axes": [0, 1], "starts": [1, -4], "ends": [4, 100]}),
    Case("slice", (((4, 7), I),), {"axes": [1], "starts": [-1], "ends": [-100], "strides": [-2]},
         id="slice-negstride:int32"),
    Case("slice", (((2, 3, 4), B),), {"axes": [-1, 0], "starts": [0, 1], "ends": [4, 2], "strides": [3, 1]}),
    Case("concat", (((2, 3), F), ((2, 1), F), ((2, 2), F)), {"axis": 1}),
    Case("concat", (((1,), I), ((3,), I)), {"axis": -1}),
    Case("concat", (((2, 2), B),)),
    Case("split", (((4, 6), F),), {"num_or_sections": 3, "axis": 1}),
    Case("split", (((5, 2), I),), {"num_or_sections": [1, -1, 2]}),
    Case("split", (((3, 1), B),), {"num_or_sections": [3]}),
    Case("squeeze", (((1, 3, 1, 2), F),), {"axes": [0, -2]}),
    Case("squeeze", (((1, 3, 1), I),)),
    Case("squeeze", (((1, 1), B),), id="squeeze-to-scalar:bool"),
    Case("squeeze", (((2, 3), F),), {"axes": [1]}, id="squeeze-keeps-non-unit:float32"),
    Case("expand_dims", (((2, 3), F),), {"axes": [0, -1]}),
    Case("expand_dims", (((), I),), {"axes": [0]}),
    Case("expand_dims", (((3,), B),), {"axes": [1, 2]}),
    Case("broadcast_to", (((3, 1), F),), {"out_shape": [2, 3, 4]}),
    Case("broadcast_to", (((3,), I),), {"out_shape": [3, 4], "broadcast_axes": [0]}),
    Case("broadcast_to", (((), B),), {"out_shape": [2, 2]}),
    Case("broadcast_to", (((1, 4), F),), {"out_shape": [1, 2, 4], "broadcast_axes": [0, 2]},
         id="broadcast_to-axes-size1:float32"),
    Case("flatten", (((2, 3, 4), F),)),
    Case("flatten", (((2, 3, 4, 1), I),), {"start_axis": 0, "stop_axis": 2}),
    Case("flatten", (((), B),), {"start_axis": 0, "stop_axis": 0}),
    Case("gather", (((4, 3), F), ((5,), "int64")), {"axis": 0}, make=_gather((4, 3), (5,), 0)),
    Case("gather", (((2, 5, 3), I), ((2, 2), "int32")), {"axis": 1}, make=_gather((2, 5, 3), (2, 2), 1, I, "int32")),
    Case("gather", (((3, 4), B), ((), "int32")), {"axis": -1}, make=_gather((3, 4), (), 1, B, "int32")),
    Case("gather_elements", attrs={"axis": 1}, make=_gather((3, 4), (3, 6), 1), id="gather_elements-axis1:float32"),
    Case("gather_elements", attrs={"axis": 0}, make=_gather((5, 2, 3), (2, 2, 3), 0, I, "int32"),
         id="gather_elements-axis0:int32"),
    Case("gather_elements", attrs={"axis": -1}, make=_gather((2, 5), (1, 3), 1, B), id="gather_elements-smaller:bool"),
    Case("pad", (((2, 3), F),), {"paddings": [[1, 0], [2, 1]], "pad_value": 1.5}),
    Case("pad", (((3, 4), I),), {"paddings": [[2, 1], [0, 3]], "mode": "reflect"}),
    Case("pad", (((1, 3), F),), {"paddings": [[2, 1], [1, 0]], "mode": "edge"}),
    Case("pad", (((2, 2), B),), {"paddings": [[0, 1], [1, 0]], "pad_value": 1}),
    Case("pad", (((2, 3), I),), {"paddings": [[3, 1], [1, 4]], "mode": "wrap"}, id="pad-wrap-wider-than-dims:int32"),
    Case("tile", (((2, 3), F),), {"repeat_times": [2, 1, 2]}),
    Case("tile", (((2, 1, 3), I),), {"repeat_times": [3]}),
    Case("tile", (((), B),), {"repeat_times": [2, 2]}),
    Case("reverse", (((3, 4), F),), {"axis": [0, -1]}),
    Case("reverse", (((2, 1, 3), I),), {"axis": [1, 2]}),
    Case("reverse", (((4,), B),), {"axis": [0]}),
    Case("arange", (), {"start": 1, "end": 5, "step": 0.5}, id="arange-float32"),
    Case("arange", (), {"start": 10, "end": -3, "step": -3, "dtype": "int32"}, id="arange-int32"),
    Case("arange", (), {"start": 0, "end": 1, "step": 1, "dtype": "int64"}, id="arange-single:int64"),
]
