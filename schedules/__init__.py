"""Default (hand-written) schedules by group kind and target."""
from schedules.dispatch import apply_default

__all__ = ["apply_default"]
