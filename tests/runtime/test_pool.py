"""accel's thread pool (runtime/pool.c): the libraries accel builds and loads run their
parallel loops on it, a kernel finishes without workers that never get a core, and the
results are the bits of TVM's pool.

References: PyTorch's outputs (to tolerance); TVM's own pool (``ACCEL_POOL=tvm``) and the
model's first output (to the bit).
"""

import multiprocessing
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
import tvm
from torch import nn
from tvm import relax

import accel_target
from accel_target.runtime import pool
from tests.helpers import assert_close
from tests.runtime.test_reliability import ConvConvPoolLinear


def _convs():
    torch.manual_seed(0)
    return ConvConvPoolLinear().eval(), torch.randn(1, 3, 32, 32)


def _dense():
    torch.manual_seed(1)
    return nn.Linear(512, 512).eval(), torch.randn(64, 512)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """name -> (library path, input, PyTorch's output)."""
    root = tmp_path_factory.mktemp("pool")
    out = {}
    for name, make in (("convs", _convs), ("dense", _dense)):
        model, x = make()
        with torch.no_grad():
            ref = model(x).numpy()
        library = str(root / f"{name}.so")
        accel_target.save(accel_target.build(accel_target.from_torch(model, (x,))), library)
        out[name] = (library, x.numpy(), ref)
    return out


def _run_elsewhere(code: str, *args: str, **env: str) -> None:
    subprocess.run([sys.executable, "-c", code, *args], check=True, env={**os.environ, **env}, cwd=os.getcwd())


def test_built_model_runs_on_accel_pool():
    """relax.VirtualMachine over what `build` returns launches accel's pool, not TVM's."""
    model, x = _convs()
    executable = accel_target.build(accel_target.from_torch(model, (x,)))
    before = pool.stats()["launches"]
    vm = relax.VirtualMachine(executable, tvm.cpu())
    out = vm["main"](tvm.runtime.tensor(x.numpy())).numpy()
    with torch.no_grad():
        assert_close(out, model(x).numpy())
    assert pool.stats()["launches"] > before


def test_loaded_model_runs_on_accel_pool(saved):
    library, x, ref = saved["dense"]
    model = accel_target.load(library)
    assert model.pool == "accel"
    before = pool.stats()["launches"]
    assert_close(model(x).numpy(), ref)
    assert pool.stats()["launches"] > before


@pytest.mark.parametrize("name", ["convs", "dense"])
def test_kernels_finish_without_their_workers(saved, name):
    """With every worker kept off its core (`pool.workers_held`), the calling thread runs
    every task: the call ends, with the bits of a call the workers helped with."""
    library, x, _ = saved[name]
    model = accel_target.load(library)
    first = model(x).numpy()
    before = pool.stats()
    with pool.workers_held():
        held = model(x).numpy()
    after = pool.stats()
    assert np.array_equal(held, first)
    assert after["launches"] > before["launches"]
    assert after["tasks_by_workers"] == before["tasks_by_workers"]


def _until_a_worker_runs_a_task(saved, tmp_path, setup: str, then: str = "") -> None:
    """In a process of its own with two threads: `setup` (which loads the "dense" model as
    `model` and its input as `x`), then calls of `model(x)` until a worker has run a task,
    which must happen within 20 s, then `then`."""
    code = (
        f"{setup}"
        "before, end = pool.stats(), time.monotonic() + 20\n"
        "while pool.stats()['tasks_by_workers'] == before['tasks_by_workers'] and time.monotonic() < end:\n"
        "    model(x)\n"
        "after = pool.stats()\n"
        "assert after['tasks_by_workers'] > before['tasks_by_workers'], (before, after)\n"
        f"{then}"
    )
    library, x, _ = saved["dense"]
    np.save(tmp_path / "x.npy", x)
    _run_elsewhere(code, library, str(tmp_path / "x.npy"), TVM_NUM_THREADS="2")


def test_workers_take_tasks_of_a_model_called_in_a_loop(saved, tmp_path):
    """In a process of its own, a model called again and again: its worker runs part of the
    tasks (it spins between the calls' launches). The caller and the threads the first call
    starts (the worker) are pinned to two CPUs, where the process has two. The calls go on
    until the worker has taken a task or 20 s have passed: with the test suite's other process
    on the second core, the worker may get its core only after many calls, each short enough
    for the caller alone."""
    code = (
        "import os, sys, time, numpy as np, accel_target\n"
        "from accel_target.runtime import pool\n"
        "model, x = accel_target.load(sys.argv[1]), np.load(sys.argv[2])\n"
        "threads = set(os.listdir('/proc/self/task'))\n"
        "model(x)\n"
        "cpus = sorted(os.sched_getaffinity(0))\n"
        "if len(cpus) > 1:\n"
        "    os.sched_setaffinity(0, {cpus[0]})\n"
        "    for tid in set(os.listdir('/proc/self/task')) - threads:\n"
        "        os.sched_setaffinity(int(tid), {cpus[1]})\n"
        "for _ in range(20): model(x)\n"
    )
    _until_a_worker_runs_a_task(saved, tmp_path, code)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs a process with two CPUs")
def test_workers_keep_off_the_callers_cpu(saved, tmp_path):
    """The worker's CPUs ("accel-pool") leave out the caller's: after a call from either of two
    CPUs, and after the worker was put on the caller's CPU (it moves and runs tasks on the
    other; a worker that napped on the caller's CPU would never run one)."""
    code = (
        "import os, sys, time, numpy as np, accel_target\n"
        "from accel_target.runtime import pool\n"
        "model, x = accel_target.load(sys.argv[1]), np.load(sys.argv[2])\n"
        "model(x)\n"
        "tasks = os.listdir('/proc/self/task')\n"
        "workers = [int(t) for t in tasks if open(f'/proc/self/task/{t}/comm').read().strip() == 'accel-pool']\n"
        "assert len(workers) == 1, workers\n"
        "allowed = os.sched_getaffinity(0)\n"
        "cpus = sorted(allowed)[:2]\n"
        "for cpu in reversed(cpus):\n"
        "    os.sched_setaffinity(0, {cpu})\n"
        "    model(x)\n"
        "    assert os.sched_getaffinity(workers[0]) == allowed - {cpu}, (cpu, os.sched_getaffinity(workers[0]))\n"
        "os.sched_setaffinity(workers[0], {cpus[0]})\n"
    )
    after = "assert os.sched_getaffinity(workers[0]) == allowed - {cpus[0]}, os.sched_getaffinity(workers[0])\n"
    _until_a_worker_runs_a_task(saved, tmp_path, code, after)


def test_tvm_pool_on_request_gives_the_same_bits(saved, tmp_path):
    """``ACCEL_POOL=tvm`` leaves a loaded library on TVM's pool, with the same results."""
    code = (
        "import sys, numpy as np, accel_target\n"
        "from accel_target.runtime import pool\n"
        "model = accel_target.load(sys.argv[1])\n"
        "assert model.pool == 'tvm', model.pool\n"
        "np.save(sys.argv[3], model(np.load(sys.argv[2])).numpy())\n"
        "assert pool.stats()['launches'] == 0\n"
    )
    for name, (library, x, _) in saved.items():
        np.save(tmp_path / "x.npy", x)
        _run_elsewhere(code, library, str(tmp_path / "x.npy"), str(tmp_path / "out.npy"), ACCEL_POOL="tvm")
        assert np.array_equal(np.load(tmp_path / "out.npy"), accel_target.load(library)(x).numpy()), name


def _call_in_child(library, x, queue):
    queue.put(accel_target.load(library)(x).numpy())


def test_forked_child_runs_models_after_its_parent(saved):
    """A child forked after its parent used the pool (whose workers it does not inherit)
    starts workers of its own."""
    library, x, _ = saved["convs"]
    first = accel_target.load(library)(x).numpy()
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_call_in_child, args=(library, x, queue))
    child.start()
    out = queue.get(timeout=120)
    child.join(timeout=60)
    assert child.exitcode == 0
    assert np.array_equal(out, first)


@pytest.fixture(scope="module")
def pool_stress(tmp_path_factory):
    """``pool_stress.c`` (which says what it does), compiled once: a function of its arguments
    returning (launches, launches that both threads took part in)."""
    binary = tmp_path_factory.mktemp("pool_stress") / "pool_stress"
    source = os.path.join(os.path.dirname(__file__), "pool_stress.c")
    flags = [*pool.compile_flags(), "-DTIMEOUT_S=30", f"-I{os.path.dirname(pool.SOURCE)}"]
    subprocess.run([os.environ.get("CC", "gcc"), *flags, source, "-o", binary], check=True)

    def run(*args: str) -> tuple[int, int]:
        done = subprocess.run([binary, *args], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        launches, by_both = re.fullmatch(r"launches (\d+), by both threads (\d+)\n", done.stdout).groups()
        return int(launches), int(by_both)

    return run


def test_launches_interleaved_with_a_worker_reading_the_last_job_run_each_task_once(pool_stress):
    """20000 launches of one task, each followed by one of eight tasks, with
    pauses where a worker reading the last job and the caller publishing the next interleave:
    every task runs once, with its launch's data, and every launch ends; run again (up to five
    times) until the worker has taken part in 100 launches."""
    by_both = 0
    for _ in range(5):  # more runs where the worker got its core seldom (another process on it)
        launches, by_both_now = pool_stress("20000")
        assert launches == 40000
        by_both += by_both_now
        if by_both >= 100:
            break
    assert by_both >= 100  # the worker took part: the interleavings were met


def test_a_pool_whose_worker_did_not_start_runs_every_task_on_the_caller(pool_stress):
    """pthread_create fails (a process that may start no more threads): every launch ends,
    its tasks run by the caller."""
    assert pool_stress("200", "no-workers") == (400, 0)


def test_a_worker_woken_late_runs_no_task_of_a_launch_made_while_held(pool_stress):
    """2000 launches made while the workers are held (`pool.workers_held`), each after one
    that woke the worker and with its first task taking 100 us: the worker, reaching the
    held launch late, leaves its tasks to the caller."""
    assert pool_stress("2000", "held") == (4000, 0)


def test_a_caller_waiting_for_a_slow_worker_task_is_woken(pool_stress):
    """500 launches of eight tasks, each taking 20 us on the caller and 300 us on the worker:
    the caller, done with the others, outwaits its spin and sleeps until the worker wakes it. Every launch
    ends (a lost wake-up would hang it until the harness's timeout), each task run once; run
    again (up to five times) until the worker has taken part in 50 launches."""
    by_both = 0
    for _ in range(5):
        launches, by_both_now = pool_stress("500", "slow-worker")
        assert launches == 1000
        by_both += by_both_now
        if by_both >= 50:
            break
    assert by_both >= 50


def test_a_worker_on_the_callers_cpu_runs_no_task(pool_stress):
    """A process confined to one CPU: its worker could only take time from the launching
    thread, so it naps and every task runs on the caller."""
    assert pool_stress("2000", "one-cpu") == (4000, 0)


def test_without_a_c_compiler_models_run_on_tvm_pool_with_a_warning(saved, tmp_path):
    """No compiler for pool.c (``CC`` names none, nothing cached): the model loads and runs
    on TVM's pool, and a warning names the file."""
    code = (
        "import sys, warnings, numpy as np, accel_target\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    model = accel_target.load(sys.argv[1])\n"
        "assert model.pool == 'tvm', model.pool\n"
        "assert any('pool.c did not compile' in str(w.message) for w in caught), [str(w.message) for w in caught]\n"
        "np.save(sys.argv[3], model(np.load(sys.argv[2])).numpy())\n"
    )
    library, x, ref = saved["dense"]
    np.save(tmp_path / "x.npy", x)
    env = {"CC": str(tmp_path / "no-such-compiler"), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    _run_elsewhere(code, library, str(tmp_path / "x.npy"), str(tmp_path / "out.npy"), **env)
    assert_close(np.load(tmp_path / "out.npy"), ref)
