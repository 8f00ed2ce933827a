"""Every benchmark in one command: the kernel tables (pytest-benchmark) and the whole models.

    python benchmarks/run.py [bench_models.py options, e.g. --no-stock-tvm]

Writes benchmarks/results/{kernels,models}.{md,png}; ACCEL_BENCH_THREADS sets the
thread count for every contender (default: every core).
"""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> int:
    root = os.path.dirname(HERE)
    if {"-h", "--help"} & set(sys.argv[1:]):
        print(__doc__)
        return subprocess.run([sys.executable, os.path.join(HERE, "bench_models.py"), "--help"], cwd=root).returncode
    kernels = subprocess.run([sys.executable, "-m", "pytest", os.path.join(HERE, "bench_kernels.py"), "-q", "-p", "no:cacheprovider"], cwd=root)
    models = subprocess.run([sys.executable, os.path.join(HERE, "bench_models.py"), *sys.argv[1:]], cwd=root)
    return kernels.returncode or models.returncode


if __name__ == "__main__":
    sys.exit(main())
