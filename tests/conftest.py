"""Shared fixtures: one kernel cache per test session, so repeated kernels compile once."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tmp_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cinn_cache")
