#!/usr/bin/env bash
# The tests: install what they need, lint (ruff), type-check (mypy), then run pytest (two workers; GPU tests skip
# without a GPU). The import layers are checked by tests/test_layers.py.
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$ROOT"
"$VENV_PY" -m ruff check .
"$VENV_PY" -m mypy
exec "$VENV_PY" -m pytest -n "${CINN_TEST_WORKERS:-2}" -q "$@"
