"""pytest options and the `measure` fixture of the benchmarks: one contender per pytest process.

    pytest -c benchmarks/pytest.ini benchmarks/test_models.py --contender torch --threads 2 \\
        --benchmark-json out.json

benchmarks/run.py starts these processes, one per contender and case, round after round, and
merges their JSON files; run by hand, a process times one contender (no ratios).
"""

from __future__ import annotations

import atexit
import json
import math
import os
import shutil
import sys
import tempfile
import time

import contenders
import pytest

# seconds of untimed calls before the timed ones, at least: the first calls of a fresh runtime
# fault in its memory and wake its threads
WARMUP_S = 0.2
# stock TVM runs seconds a call on the whole models (no fusion, no schedules): fewer calls
CALL_SHARE = {"tvm": 0.1}
_OUTCOMES: dict[str, dict] = {}


def pytest_addoption(parser):
    group = parser.getgroup("accel benchmarks")
    group.addoption("--contender", default="accel", choices=contenders.CONTENDERS, help="what this process times")
    group.addoption("--accel-root", help="import accel_target (and topi_accel, strategy) from this checkout")
    group.addoption("--threads", type=int, default=2, help="threads of every runtime (default 2)")
    group.addoption("--mcpu", help="build accel and stock TVM for this LLVM CPU (haswell: AVX2 code)")
    group.addoption("--calls", type=int, default=20, help="timed calls: pytest-benchmark's rounds (default 20)")
    group.addoption("--warmup", type=int, default=5, help="untimed calls before them, at least (default 5)")
    group.addoption("--build-only", action="store_true", help="build, load and check every case; time none")
    group.addoption("--bench-cache", default=contenders.CACHE, help="the build cache (default %(default)s)")
    group.addoption("--outcomes", help="write each test's outcome, skip reason or error and info to this JSON file")


def _packages_of(root: str) -> str:
    """A folder holding links to `root`'s accel_target, topi_accel and strategy only, for
    sys.path: the rest (tests/, benchmarks/) stays this checkout's."""
    folder = tempfile.mkdtemp(prefix="accel_root_")
    atexit.register(shutil.rmtree, folder, True)  # the links only, not what they point at
    for package in ("accel_target", "topi_accel", "strategy"):
        os.symlink(os.path.join(root, package), os.path.join(folder, package))
    return folder


def pytest_configure(config):
    root = config.getoption("--accel-root")
    if root:
        sys.path.insert(0, _packages_of(os.path.abspath(root)))
        if "accel_target" in sys.modules:
            raise pytest.UsageError("--accel-root: accel_target was imported before the benchmarks' conftest")
    os.environ.update(contenders.threads_env(config.getoption("--threads")))


@pytest.fixture(scope="session")
def settings(request) -> contenders.Settings:
    option = request.config.getoption
    return contenders.Settings(threads=option("--threads"), mcpu=option("--mcpu"), cache=option("--bench-cache"))


@pytest.fixture
def measure(request, benchmark, settings):
    """measure(case, before=None, calls=None): build or load `case` for this process's contender,
    check its output against PyTorch's, and time it with benchmark.pedantic (`before`, if given,
    runs untimed before every call)."""
    option = request.config.getoption
    contender = option("--contender")

    def run(case: contenders.Case, before=None, calls: int | None = None):
        try:
            runner = contenders.runner(contender, case, settings)
        except contenders.NotApplicable as why:
            pytest.skip(str(why))
        error = contenders.check(runner, case, settings)  # (the first call: torch.compile compiles in it)
        started = time.perf_counter()
        runner.fn()
        call_s = time.perf_counter() - started
        info = {"contender": contender, "case": case.name, "max_rel_error": float(f"{error:.3g}"), **runner.info}
        benchmark.extra_info.update(info)
        request.node.user_properties.append(("info", info))
        if option("--build-only"):  # (run.py adds --benchmark-disable: one untimed call)
            benchmark.pedantic(runner.fn, rounds=1, iterations=1)
            return
        calls = calls or max(2, math.ceil(option("--calls") * CALL_SHARE.get(contender, 1)))
        warmup = max(option("--warmup") if contender not in CALL_SHARE else 1, math.ceil(WARMUP_S / call_s))
        benchmark.pedantic(runner.fn, setup=before, rounds=calls, warmup_rounds=min(warmup, 5000), iterations=1)

    return run


def _case_of(nodeid: str) -> str:
    return nodeid[nodeid.index("[") + 1 : -1] if nodeid.endswith("]") else nodeid


def pytest_runtest_logreport(report):
    if report.when == "call" or report.outcome != "passed":
        entry = {"outcome": report.outcome}
        if report.skipped and isinstance(report.longrepr, tuple):
            entry["message"] = report.longrepr[2].removeprefix("Skipped: ")
        elif report.failed:
            lines = [line for line in str(report.longrepr).splitlines() if line.startswith("E ")]
            entry["message"] = lines[-1][1:].strip() if lines else str(report.longrepr).splitlines()[-1]
        entry.update(dict(report.user_properties))
        _OUTCOMES.setdefault(_case_of(report.nodeid), entry)


def pytest_sessionfinish(session):
    path = session.config.getoption("--outcomes")
    if path:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(_OUTCOMES, f, indent=1)
