"""Turns between pytest-xdist's workers (pytest.ini runs the suite in two): a test marked
`alone` runs, fixtures and all, while no other test does, for what needs a core no other
process wants (tests/accel_target/test_pool.py: workers woken after a pause take their share).

Two lock files per run: every test holds `.lock` shared while it runs, an `alone` test holds
it exclusively; `.gate` is taken to ask for either, and an `alone` test keeps it while it waits,
so the other worker starts nothing until it has run. In one process (-n 0) no lock is taken.
"""

import contextlib
import fcntl
import os
import tempfile

import pytest


def _stem(config) -> str | None:
    """The lock files' path without suffix, the same in every worker of a run; None outside
    xdist's workers."""
    workerinput = getattr(config, "workerinput", None)  # xdist's, in its workers only
    if workerinput is None:
        return None
    return os.path.join(tempfile.gettempdir(), f"accel-tests-{workerinput['testrunuid']}")


@contextlib.contextmanager
def _turn(stem: str, alone: bool):
    with open(stem + ".gate", "a") as gate, open(stem + ".lock", "a") as lock:
        fcntl.flock(gate, fcntl.LOCK_EX)
        fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        fcntl.flock(gate, fcntl.LOCK_UN)
        yield  # closing `lock` releases it


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    stem = _stem(item.config)
    if stem is None:
        yield
        return
    with _turn(stem, item.get_closest_marker("alone") is not None):
        yield


def pytest_sessionfinish(session):
    """A worker that has finished no longer needs turns: the other runs on alone."""
    stem = _stem(session.config)
    if stem is not None:
        for suffix in (".gate", ".lock"):
            with contextlib.suppress(FileNotFoundError):
                os.remove(stem + suffix)
