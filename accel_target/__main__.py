"""python -m accel_target: the accel-tvm command line (see accel_target.tools.cli)."""

import sys

from .tools.cli import main

if __name__ == "__main__":
    sys.exit(main())
