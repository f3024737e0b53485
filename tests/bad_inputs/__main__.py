"""python -m tests.bad_inputs [--category C] [-k TEXT] [--markdown] [--jobs N] [--keep DIR]: run the survey, print
the table of bad inputs per category (tried / failed) and each failure; exit status 1 when a case failed."""
from __future__ import annotations

import argparse
import os
import pathlib
import sys
import tempfile
import time

from tests.bad_inputs.core import Category
from tests.bad_inputs.runner import corpus, run_corpus, table


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.bad_inputs", description=__doc__)
    p.add_argument("--category", action="append", choices=[c.name.lower() for c in Category], help="only these (repeatable)")
    p.add_argument("-k", dest="text", default="", help="only cases whose name contains TEXT")
    p.add_argument("--markdown", action="store_true", help="print the tables as Markdown")
    p.add_argument("--jobs", type=int, default=min(4, max(2, os.cpu_count() or 2)), help="cases run in parallel")
    p.add_argument("--keep", metavar="DIR", help="make the cases' folders here and keep them")
    args = p.parse_args(argv)
    chosen = {Category[c.upper()] for c in args.category} if args.category else set(Category)
    cases = [c for c in corpus() if c.category in chosen and args.text in c.name]
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="cinn-bad-inputs-") as tmp:
        work = pathlib.Path(args.keep) if args.keep else pathlib.Path(tmp)
        results = run_corpus(cases, work, args.jobs)
    print(table(results, args.markdown))
    print(f"\n{len(results)} cases in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    return 1 if any(not r.ok for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
