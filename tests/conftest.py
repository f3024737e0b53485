"""Shared fixtures: one kernel cache per test session, so repeated kernels compile once."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tmp_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cinn_cache")


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` run kernels on a CUDA device: skip them cleanly where none is present."""
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    from cinn.cuda_module import device_present

    if not device_present():
        skip = pytest.mark.skip(reason="no CUDA device present")
        for item in gpu_items:
            item.add_marker(skip)
