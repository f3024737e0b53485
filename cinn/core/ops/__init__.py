"""The op table; importing this package registers every op."""
from cinn.core.ops import attention as _attention  # noqa: F401  (registers)
from cinn.core.ops import bf16 as _bf16  # noqa: F401  (registers)
from cinn.core.ops import elementwise as _elementwise  # noqa: F401  (registers)
from cinn.core.ops import nn as _nn  # noqa: F401  (registers)
from cinn.core.ops import quant as _quant  # noqa: F401  (registers)
from cinn.core.ops import reduction as _reduction  # noqa: F401  (registers)
from cinn.core.ops import resize as _resize  # noqa: F401  (registers)
from cinn.core.ops import shape as _shape  # noqa: F401  (registers)
from cinn.core.ops import sort as _sort  # noqa: F401  (registers)
from cinn.core.ops import spatial as _spatial  # noqa: F401  (registers)
from cinn.core.ops import winograd as _winograd  # noqa: F401  (registers)
from cinn.core.ops.registry import (
    OPS,
    DtypeClass,
    OpDef,
    PatternKind,
    RuleName,
    TargetKind,
    get_op,
    infer,
    layout_variant,
    op_flops,
)

__all__ = ["OPS", "DtypeClass", "OpDef", "PatternKind", "RuleName", "TargetKind", "get_op", "infer", "layout_variant", "op_flops"]
