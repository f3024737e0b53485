"""cinn's compiler layer (see docs/architecture.md)."""
