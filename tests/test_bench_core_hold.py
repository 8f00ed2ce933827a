"""benchmarks/bench_core_hold.py: schedstat readings of this process's threads, and their
sums by the library that started each thread."""

import importlib.util
import pathlib
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("bench_core_hold", ROOT / "benchmarks" / "bench_core_hold.py")
bench_core_hold = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_core_hold)


def test_threads_reads_every_thread_and_its_run_time():
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            pass

    worker = threading.Thread(target=spin)
    worker.start()
    try:
        time.sleep(0.05)
        started = time.perf_counter()
        first = bench_core_hold._threads()
        time.sleep(0.2)
        last = bench_core_hold._threads()
        wall_ms = (time.perf_counter() - started) * 1e3
    finally:
        stop.set()
        worker.join()
    assert worker.native_id in first and threading.get_native_id() in first
    ran_ms = (last[worker.native_id][0] - first[worker.native_id][0]) / 1e6
    # it spun, holding the GIL while this thread slept, and no longer than the readings took
    assert 0.1 * wall_ms < ran_ms <= wall_ms + 1, (ran_ms, wall_ms)


def test_by_library_sums_each_librarys_threads():
    first = {1: (0, 0), 2: (1_000_000, 0), 3: (0, 5_000_000)}
    last = {1: (2_000_000, 0), 2: (4_000_000, 1_000_000), 3: (500_000, 7_000_000), 4: (3_000_000, 0)}
    owner = {1: "caller", 2: "numpy's", 3: "numpy's"}
    assert bench_core_hold._by_library(first, last, owner) == {
        "caller": {"run": 2.0, "wait": 0.0},
        "numpy's": {"run": 3.5, "wait": 3.0},
        "other": {"run": 3.0, "wait": 0.0},  # a thread that started after the last claim
    }
