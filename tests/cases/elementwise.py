"""Cases for elementwise ops."""
from tests.cases import Case

CASES = [
    Case("relu", (((4, 5), "float32"),)),
    Case("relu", (((3,), "int32"),)),
    Case("add", (((2, 3), "float32"), ((3,), "float32"))),
    Case("add", (((), "float32"), ((2, 1, 3), "float32"))),
]
