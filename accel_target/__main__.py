"""python -m accel_target demo: compile the bundled model for accel and compare with stock TVM."""

import argparse
import sys

from . import demo


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m accel_target", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("demo", help="compile a bundled model for accel, check it, report, time it vs stock TVM")
    args = parser.parse_args(argv)
    if args.command == "demo":
        return demo.run()
    return 2


if __name__ == "__main__":
    sys.exit(main())
