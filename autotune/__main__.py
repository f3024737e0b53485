"""python -m cinn.autotune: the cinn-tune command."""
import sys

from cinn.tune_cli import main

if __name__ == "__main__":
    sys.exit(main())
