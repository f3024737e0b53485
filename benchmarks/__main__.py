"""python -m benchmarks: the cinn-bench command."""
import sys

from benchmarks.cli import main

if __name__ == "__main__":
    sys.exit(main())
