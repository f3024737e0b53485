"""python -m autotune: the cinn-tune command."""
import sys

from cinn.facade.tune_cli import main

if __name__ == "__main__":
    sys.exit(main())
