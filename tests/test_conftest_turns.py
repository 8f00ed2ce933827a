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
addopts = -n 2 --dist loadfile -p no:cacheprovider
markers =
    alone: runs while the other xdist worker waits
"""
RECORD = """import json, os, time
def ran(name, seconds):
    start = time.monotonic()
    time.sleep(seconds)
    with open(os.path.join(os.path.dirname(__file__), name + ".json"), "w") as f:
        json.dump([start, time.monotonic()], f)
"""
ALONE = """import time, pytest
from record import ran
@pytest.mark.alone
def test_alone():
    time.sleep(0.3)  # the other worker is well into its tests
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
    (root / "pytest.ini").write_text(INI)
    (root / "record.py").write_text(RECORD)
    (root / "test_alone.py").write_text(ALONE if alone else ALONE.replace("@pytest.mark.alone\n", ""))
    (root / "test_busy.py").write_text(BUSY)
    subprocess.run([sys.executable, "-m", "pytest", "-q"], cwd=root, check=True, capture_output=True)
    busy = [json.loads((root / f"busy{i}.json").read_text()) for i in range(30)]
    return json.loads((root / "alone.json").read_text()), busy


def _overlapping(interval, others) -> list:
    return [o for o in others if o[0] < interval[1] and interval[0] < o[1]]


def test_an_alone_test_runs_while_the_other_worker_waits(tmp_path):
    alone, busy = _intervals(tmp_path, alone=True)
    assert _overlapping(alone, busy) == []
    control, busy = _intervals(tmp_path, alone=False)
    assert len(_overlapping(control, busy)) >= 5
