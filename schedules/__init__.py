"""Default (hand-written) schedules by group kind and target."""
from cinn.schedules.dispatch import apply_default

__all__ = ["apply_default"]
