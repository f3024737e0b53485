"""The survey of bad inputs (tests/bad_inputs, issue 49): every case gets a clear error or the right result, with no
crash, hang, traceback or code execution. `python -m tests.bad_inputs --markdown` prints the table per category."""
from __future__ import annotations

import os

import pytest

from tests.bad_inputs.core import Category
from tests.bad_inputs.runner import Setup, corpus, run_corpus, set_up, table

# a test per category, so that xdist's workers share them out; inside one, cases run side by side unless xdist's
# workers do already
JOBS = 1 if os.environ.get("PYTEST_XDIST_WORKER") else 2


@pytest.fixture(scope="session")
def setup(tmp_path_factory) -> Setup:
    return set_up(tmp_path_factory.mktemp("bad_inputs"))


def test_the_corpus_covers_every_category():
    cases = corpus()
    assert len(cases) >= 150
    assert {c.category for c in cases} == set(Category)


@pytest.mark.parametrize("category", Category, ids=lambda c: c.name.lower())
def test_every_bad_input_is_handled(category, setup, tmp_path):
    results = run_corpus([c for c in corpus() if c.category is category], tmp_path, JOBS, setup)
    failed = [r for r in results if not r.ok]
    assert not failed, "\n" + table(failed)
