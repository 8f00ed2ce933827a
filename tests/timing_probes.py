"""Runners for tests/accel_target/test_timing.py, made in a timing process (no accel_target import)."""

import os
import sys


def environment(threads: str):
    """A no-op runner, made only where nothing imported accel_target and every runtime has `threads`."""
    if "accel_target" in sys.modules:
        raise RuntimeError("accel_target was imported in the timing process")
    unset = {n: os.environ.get(n) for n in ("TVM_NUM_THREADS", "OMP_NUM_THREADS") if os.environ.get(n) != threads}
    if unset:
        raise RuntimeError(f"thread counts {unset}, expected {threads}")
    return lambda: None


def sleeper(ms: float):
    """A runner that takes `ms` milliseconds."""
    import time

    return lambda: time.sleep(ms / 1e3)


def broken():
    raise ValueError("no such model")


def logger(path: str, name: str):
    """A runner that appends `name` to the file at `path` on every call."""

    def run():
        with open(path, "a") as log:
            log.write(name + "\n")

    return run
