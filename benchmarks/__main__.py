"""python -m cinn.benchmarks: the cinn-bench command."""
import sys

from cinn.benchmarks.cli import main

if __name__ == "__main__":
    sys.exit(main())
