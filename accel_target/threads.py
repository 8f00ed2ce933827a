"""TVM's thread pool in a process it shares with other libraries and threads.

The libraries `accel_target.build` returns and `accel_target.load` loads do not use TVM's
pool: they run on accel's (`accel_target.pool`), in which the calling thread runs the tasks
that no worker has started, so that a worker kept off its core by another library's
spinning thread delays no kernel. What follows is about TVM's pool, which runs everything
else: ``tvm.compile``'s executables, libraries loaded with ``tvm.runtime.load_module``,
and accel's with ``ACCEL_POOL=tvm``.

TVM's CPU thread pool (``src/runtime/thread_pool.cc`` in TVM's sources, not installed)
reads three environment variables once, when the first kernel runs; ``import
accel_target`` sets each one the user has not set (`configure_pool`):

``TVM_NUM_THREADS``
    threads per pool; TVM's default is half the hardware threads; accel: every core
    this process may run on (`target.host_cores`).
``TVM_THREAD_POOL_SPIN_COUNT``
    how many times a worker that finds no work calls ``sched_yield`` before it
    sleeps. TVM's 300000 keeps every worker busy for a fraction of a second after each
    call, on the cores that numpy's or PyTorch's threads want next. accel: 0, the
    worker sleeps at once and each kernel wakes it.
``TVM_BIND_THREADS``
    TVM pins each worker to one core (1, its default). A kernel ends when every
    worker has run its share (accel's kernels let the calling thread take over the
    share of a worker that has not started, `topi_accel.workshare`, but still wait for
    it to start), so a worker pinned to a core that another library's spinning thread
    holds makes every kernel wait for a scheduler quantum. accel: 0, the OS places it.

Measured on a quiet 2-core Emerald Rapids, each setting in processes of its own
(`benchmarks/bench_coexistence.py`; the table is in `benchmarks/README.md`). What the
defaults buy: a 10-kernel model right after a numpy matmul or a PyTorch conv took 1.1
to 1.6 times its time alone, where TVM's defaults gave 8 to 40 times, spin 1000 with
pinned workers up to 167 times and spin 1000 unpinned up to 19 times (in some
processes: whether another library's spinning thread sits on the worker's core is
luck). What they cost, in a process that runs nothing else: waking the worker for
every launch of the pool (spin 1000 unpinned: ResNet-50 23.1 instead of 25.9 ms, MobileNetV2
3.1 instead of 3.8 ms, measured before SerialSmallKernels, which runs small kernels without
waking it, `topi_accel.workshare`, and SharedLaunches, which runs up to 8 consecutive
kernels in one launch, `accel_target.launches`: MobileNetV2 4.23 -> 3.54 ms, ResNet-50 28.3
-> 26.2 in one A/B run), and a worker woken on the caller's core now and then (a
single-kernel model called in a loop from a process that had used PyTorch: a
256x1024x1024 dense in 3.6 ms instead of 2.0). A process that runs accel alone may
set ``TVM_THREAD_POOL_SPIN_COUNT=1000`` before importing accel_target.

Each Python thread that runs kernels gets a pool of its own (TVM keeps it thread-local),
so K threads calling models at once run K pools of TVM_NUM_THREADS threads: when a
server calls from many threads, TVM_NUM_THREADS=1 gives one thread per call.

The other libraries have knobs of their own, read when they load (before ``import
torch`` / ``import numpy``), which accel leaves alone: ``OMP_WAIT_POLICY=PASSIVE``
(PyTorch's OpenMP threads sleep when idle instead of spinning) and
``OPENBLAS_THREAD_TIMEOUT=4`` (numpy's OpenBLAS threads, likewise). accel leaves them alone
because they cost those libraries' own calls (a 0.07 ms numpy GEMV took 0.13 ms with them, a
0.32 ms PyTorch conv 0.50, `benchmarks/README.md`); what they buy is an accel call right after
numpy or PyTorch that gets its workers' cores.
"""

from __future__ import annotations

import os

# yields of an idle worker before it sleeps (TVM's default: 300000)
SPIN_COUNT = 0
POOL_DEFAULTS = {"TVM_THREAD_POOL_SPIN_COUNT": str(SPIN_COUNT), "TVM_BIND_THREADS": "0"}
KNOBS = ("TVM_NUM_THREADS", "TVM_THREAD_POOL_SPIN_COUNT", "TVM_BIND_THREADS")


def configure_pool(num_threads: int) -> None:
    """Set TVM's pool knobs the user has not set: `num_threads` threads, `POOL_DEFAULTS`.
    Effective only before the process runs its first parallel kernel."""
    os.environ.setdefault("TVM_NUM_THREADS", str(num_threads))
    for name, value in POOL_DEFAULTS.items():
        os.environ.setdefault(name, value)


def pool_settings() -> dict[str, str | None]:
    """The pool knobs as this process's environment has them."""
    return {name: os.environ.get(name) for name in KNOBS}
