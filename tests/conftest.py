"""Turns between pytest-xdist's workers (pytest.ini runs the suite in two): a test marked
`alone` runs, fixtures and all, while no other test does, for what needs a core that no
other test wants (tests/accel_target/test_pool.py: the pool's workers, woken after a pause,
take their share of a call).

Two lock files per run, in a directory the controller makes and removes: every test holds
`lock` shared while it runs, an `alone` test holds it exclusively; `gate` is taken to ask for
either, and an `alone` test keeps it while it waits, so no other test starts before it (flock
alone would let shared holders come and go ahead of it). Without workers (-n 0) no lock is
taken.
"""

import contextlib
import fcntl
import os
import shutil
import tempfile

import pytest

_TURNS = pytest.StashKey[str]()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """(xdist's controller, for each worker it starts) the run's directory of lock files."""
    if _TURNS not in node.config.stash:
        node.config.stash[_TURNS] = tempfile.mkdtemp(prefix="accel-tests-")
    node.workerinput["accel_turns"] = node.config.stash[_TURNS]


def pytest_unconfigure(config):
    if _TURNS in config.stash:
        shutil.rmtree(config.stash[_TURNS], ignore_errors=True)


@contextlib.contextmanager
def _turn(directory: str, alone: bool):
    with open(os.path.join(directory, "gate"), "a") as gate, open(os.path.join(directory, "lock"), "a") as lock:
        fcntl.flock(gate, fcntl.LOCK_EX)
        fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        fcntl.flock(gate, fcntl.LOCK_UN)
        yield  # closing `lock` releases it


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    directory = getattr(item.config, "workerinput", {}).get("accel_turns")  # in xdist's workers only
    if directory is None:
        yield
        return
    with _turn(directory, item.get_closest_marker("alone") is not None):
        yield
