"""cinn's facade layer (see docs/architecture.md)."""
