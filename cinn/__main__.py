"""python -m cinn: the cinn-run command."""
import sys

from cinn.facade.cli import main

if __name__ == "__main__":
    sys.exit(main())
