"""The survey of bad inputs (tests/bad_inputs, issue 49): every case gets a clear error or the right result, with no
crash, hang, traceback or code execution. `python -m tests.bad_inputs --markdown` prints the table per category."""
from __future__ import annotations

import pytest

from tests.bad_inputs.core import Category
from tests.bad_inputs.runner import Result, corpus, run_corpus, table

# Cases that fail until the fixes of issue 49 made on other branches are merged: case name -> finding. The merge
# removes these lines; the cases then count in test_every_bad_input_is_handled. (new): found by this survey, not in
# the list; the finding named is the nearest.
KNOWN_FAILURES: dict[str, int] = {
    "a whole-compile entry replaced by a pickle payload": 1,
    "a whole-compile entry of garbage bytes": 1,
    "the cache folder of mode 0777": 1,
    "the cache folder of mode 0775": 1,
    "the cache owned by another user": 1,
    "a whole-compile entry of mode 0666": 1,
    "a kernel library swapped with its digest": 2,
    "a kernel library symlinked to a payload with its digest": 2,
    "the thread-pool library swapped with its digest": 2,
    "a kernel library truncated with a matching digest": 2,
    "a kernel library that is a folder": 2,  # (new)
    "pragma_import_llvm with a constructor payload": 3,
    "pragma_import_llvm of a payload .ll file": 3,
    "cinn-run --log with a pragma_import_llvm payload": 3,
    "pragma_import_c with a constructor payload": 3,
    "an annotation key outside cinn's space": 3,
    "an unknown instruction kind": 3,
    "a tile decision of [0, 0]": 3,  # (new) SIGFPE
    "3 nested Loops of 30": 4,
    "2 nested Loops of 60": 4,
    "ConstantOfShape [2**31, 4]": 5,
    "OneHot of depth 2**33": 5,
    "Range of 2**40 elements": 5,
    "Resize by inf": 6,
    "Resize by 1e30": 6,
    "an empty file": 8,
    "a negative warmup_samples": 8,
    "eta of NaN": 8,
    "max_depth of 10**9": 8,
    "rows declared (1, 2**40)": 8,
    "a booster declared 2**50 bytes": 8,
    "rows of strings": 8,
    "cinn-tune --cost-model: an empty file": 8,
    "cinn-tune --cost-model: rows declared (1, 2**40)": 8,
    "cinn-run: --target nonsense": 9,
    "cinn-run: --target cuda (no GPU: an error; a GPU: it runs)": 9,
    "cinn-run: --input-shape x=8,,16": 9,
    "cinn-run: --input-shape x=-1": 9,
    "cinn-run: --input-shape x=abc": 9,
    "cinn-run: --input-shape =8": 9,
    "cinn-bench: a text file named .onnx": 9,
    "cinn-tune: --timeout nan": 9,  # (new) nan passes the "positive" check
    "a ragged list": 10,
    "None": 10,
    "2**70": 10,
    "IR version 3, an initializer not among the inputs": 11,
    "BatchNormalization after a Relu": 14,
    "BatchNormalization after a Sigmoid": 14,
}


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
