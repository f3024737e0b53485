"""Cases for the fused attention op (more in tests/test_attention.py)."""
from tests.cases import Case

F32 = "float32"
ACC = {"rtol": 1e-4, "atol": 1e-5}

CASES = [
    Case("attention", (((2, 5, 8), F32), ((2, 7, 8), F32), ((2, 7, 12), F32), ((2, 1, 1, 7), F32)),
         {"heads": 2, "scale": 0.5}, **ACC),
    Case("attention", (((1, 3, 4, 6), F32), ((1, 3, 9, 6), F32), ((1, 3, 9, 6), F32), ((4, 9), F32)),
         {"heads": 3}, **ACC, id="attention-two-batch-dims"),
    Case("attention", (((16, 32), "float64"), ((16, 32), "float64"), ((16, 16), "float64"), ((), "float64")),
         {"heads": 4, "scale": 0.25}, rtol=1e-10, atol=1e-10, id="attention-float64"),
    # queries no whole vectors and keys with no fitting tile height: both computed in whole tiles
    Case("attention", (((1, 37, 16), F32), ((1, 41, 16), F32), ((1, 41, 16), F32), ((1, 37, 41), F32)),
         {"heads": 2, "scale": 0.25}, **ACC, id="attention-odd-sizes"),
]
