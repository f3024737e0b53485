"""Block classification helpers shared by the schedules."""
from __future__ import annotations

from tvm.s_tir import Schedule, ScheduleError
from tvm.s_tir.schedule.analysis import is_output_block

REDUCE_ITER = 2  # tvm IterVar.CommReduce


def blocks(sch: Schedule) -> list:
    """The child blocks of the root, in program order."""
    return list(sch.get_child_blocks(sch.get_sblock("root")))


def is_reduction(sch: Schedule, block) -> bool:
    """Whether the block has a reduction iterator."""
    return any(iv.iter_type == REDUCE_ITER for iv in sch.get(block).iter_vars)


def is_output(sch: Schedule, block) -> bool:
    """Whether the block writes a function parameter (a kernel output)."""
    return is_output_block(sch, block)


def inline_all(sch: Schedule) -> None:
    """Inline every non-output spatial block into its consumers, where TVM allows."""
    changed = True
    while changed:
        changed = False
        for block in blocks(sch):
            if is_output(sch, block) or is_reduction(sch, block):
                continue
            try:
                sch.compute_inline(block)
                changed = True
            except ScheduleError:  # e.g. a producer of several consumers with different layouts stays
                continue
