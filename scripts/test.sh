#!/usr/bin/env bash
# The tests: install what they need, then run pytest (two workers; GPU tests skip without a GPU).
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$ROOT"
exec "$VENV_PY" -m pytest -n "${CINN_TEST_WORKERS:-2}" -q "$@"
