"""Default (hand-written) schedules: rules registered per target kind and picked by priority (schedules.registry)."""
# each rule module registers its rules and post-processors when imported: this imports every one of them, once
from schedules import (  # noqa: F401
    cpu_attention,
    cpu_bf16,
    cpu_common,
    cpu_int8,
    cpu_matmul,
    cpu_reduction,
    cpu_squeeze_excite,
    cpu_winograd,
    cuda_common,
    cuda_matmul,
    cuda_reduction,
    cuda_tensor_core,
)
from schedules.registry import apply_default, postprocess

__all__ = ["apply_default", "postprocess"]
