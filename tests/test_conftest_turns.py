"""tests/conftest.py's turns: under pytest-xdist, a test marked `alone` runs while the other
worker runs nothing. Run on a throwaway suite of sleeping tests that write when they ran; the
same suite without the mark is the control, whose tests do overlap."""

import json
import os
import shutil
import subprocess
import sys

CONFTEST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "conftest.py")
INI = """[pytest]
addopts = -n 2 --dist loadfile -p no:cacheprovider -p wait_for_busy
markers =
    alone: runs while no other test does
"""
# a plugin whose hook runs before the conftest's: the alone test asks for its turn only once
# the other worker is into its tests
WAIT = """import glob, os, time, pytest
@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    deadline = time.monotonic() + 60
    while item.name == "test_alone" and not glob.glob(os.path.join(os.path.dirname(__file__), "busy*.json")):
        assert time.monotonic() < deadline, "the busy tests never started"
        time.sleep(0.01)
    yield
"""
RECORD = """import json, os, time
def ran(name, seconds):
    start = time.monotonic()
    time.sleep(seconds)
    with open(os.path.join(os.path.dirname(__file__), name + ".json"), "w") as f:
        json.dump([start, time.monotonic()], f)
"""
ALONE = """import pytest
from record import ran
@pytest.mark.alone
def test_alone():
    ran("alone", 0.5)
"""
BUSY = """import pytest
from record import ran
@pytest.mark.parametrize("i", range(30))
def test_busy(i):
    ran(f"busy{i}", 0.05)
"""


def _intervals(tmp_path, alone: bool) -> tuple[list[float], list[list[float]]]:
    root = tmp_path / ("marked" if alone else "control")
    root.mkdir()
    shutil.copy(CONFTEST, root / "conftest.py")
    for name, text in (("pytest.ini", INI), ("wait_for_busy.py", WAIT), ("record.py", RECORD), ("test_busy.py", BUSY)):
        (root / name).write_text(text)
    (root / "test_alone.py").write_text(ALONE if alone else ALONE.replace("@pytest.mark.alone\n", ""))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}  # not this run's options
    result = subprocess.run([sys.executable, "-m", "pytest", "-q"], cwd=root, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    busy = [json.loads((root / f"busy{i}.json").read_text()) for i in range(30)]
    return json.loads((root / "alone.json").read_text()), busy


def _overlapping(interval, others) -> list:
    return [o for o in others if o[0] < interval[1] and interval[0] < o[1]]


def test_an_alone_test_runs_while_the_other_worker_waits(tmp_path):
    alone, busy = _intervals(tmp_path, alone=True)
    assert _overlapping(alone, busy) == []
    control, busy = _intervals(tmp_path, alone=False)
    assert _overlapping(control, busy) != []
