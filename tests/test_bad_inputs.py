"""The survey of bad inputs (tests/bad_inputs, issue 49): every case gets a clear error or the right result, with no
crash, hang, traceback or code execution. `python -m tests.bad_inputs --markdown` prints the table per category."""
from __future__ import annotations

import pytest

from tests.bad_inputs.core import Category
from tests.bad_inputs.runner import Result, corpus, run_corpus, table

@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, Result]:
    return {r.case.name: r for r in run_corpus(corpus(), tmp_path_factory.mktemp("bad_inputs"), jobs=2)}


def test_the_corpus_covers_every_category(results):
    assert len(results) >= 170
    assert {r.case.category for r in results.values()} == set(Category)


def test_every_bad_input_is_handled(results):
    failed = [r for r in results.values() if not r.ok]
    assert not failed, "\n" + table(failed)
