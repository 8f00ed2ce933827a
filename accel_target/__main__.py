"""python -m accel_target: the accel-tvm command line (see accel_target.cli)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
