"""cinn's core layer (see docs/architecture.md)."""
