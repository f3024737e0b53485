"""cinn's runtime layer (see docs/architecture.md)."""
