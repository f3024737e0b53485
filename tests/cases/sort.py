"""Cases for topk: largest and smallest, inner and outer axes, ties (int inputs in [-5, 5] repeat)."""
from tests.cases import Case

F, I = "float32", "int32"

CASES = [
    Case("topk", (((3, 7), F),), {"k": 3}),
    Case("topk", (((3, 8), I),), {"k": 4, "axis": 1, "largest": False}, id="topk-smallest-ties:int32"),
    Case("topk", (((6, 2, 3), I),), {"k": 6, "axis": 0}, id="topk-outer-axis-all-ties:int32"),
    Case("topk", (((5,), F),), {"k": 1, "axis": 0}, id="topk-k1:float32"),
]
