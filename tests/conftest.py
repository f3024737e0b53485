"""Shared fixtures: one kernel cache per test session, so repeated kernels compile once; the timeout scale."""
from __future__ import annotations

import os

import pytest

from tests.timeouts import SCALE_ENV, timeout_scale


def pytest_configure(config):
    """Measure the timeout scale once, before xdist's workers start: they and the tests' subprocesses inherit it."""
    try:
        os.environ[SCALE_ENV] = f"{timeout_scale():.2f}"
    except ValueError as err:
        raise pytest.UsageError(str(err)) from None


def pytest_report_header(config):
    return f"timeouts scaled by {os.environ[SCALE_ENV]} (${SCALE_ENV})"


@pytest.fixture(scope="session")
def tmp_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cinn_cache")


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` run kernels on a CUDA device: skip them cleanly where none is present."""
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    from cinn.runtime.cuda_module import device_present

    if not device_present():
        skip = pytest.mark.skip(reason="no CUDA device present")
        for item in gpu_items:
            item.add_marker(skip)
