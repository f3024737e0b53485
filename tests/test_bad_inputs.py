"""The survey of bad inputs (tests/bad_inputs, issue 49): every case gets a clear error or the right result, with no
crash, hang, traceback or code execution. `python -m tests.bad_inputs --markdown` prints the table per category."""
from __future__ import annotations

import pytest

from tests.bad_inputs.core import Category
from tests.bad_inputs.runner import Result, corpus, run_corpus, table

# Cases that fail until the fixes of issue 49 made on other branches are merged: case name -> finding. The merge
# removes these lines; the cases then count in test_every_bad_input_is_handled.
KNOWN_FAILURES: dict[str, int] = {}


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, Result]:
    return {r.case.name: r for r in run_corpus(corpus(), tmp_path_factory.mktemp("bad_inputs"), jobs=2)}


def test_the_corpus_covers_every_category(results):
    assert len(results) >= 170
    assert {r.case.category for r in results.values()} == set(Category)
    assert set(KNOWN_FAILURES) <= set(results), set(KNOWN_FAILURES) - set(results)


def test_every_bad_input_is_handled(results):
    failed = [r for name, r in results.items() if not r.ok and name not in KNOWN_FAILURES]
    assert not failed, "\n" + table(failed)


@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.xfail(
    strict=False, reason=f"issue 49 finding {finding}: fixed on another branch")) for name, finding in KNOWN_FAILURES.items()])
def test_known_failure(results, name):
    r = results[name]
    assert r.ok, f"{r.outcome.value}: {r.detail}"
