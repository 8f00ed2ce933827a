"""An accel model sharing its process with numpy and PyTorch (issue 19), under thread-pool settings:
TVM's pool (ACCEL_POOL=tvm) with TVM's knobs and with accel's, and accel's pool (accel_target.pool).

    python benchmarks/bench_coexistence.py [--rounds 3] [--reps 2] [--dir DIR]

Builds three models (conv -> conv -> pool -> linear on a 32x32 and on a 128x128 image; a
256x1024x1024 dense) into a temporary directory, or into --dir once (a later run with the same
--dir reuses them), then runs one process per setting, the settings taking turns --reps times.
A process times, median of per-call times in ms: the accel call alone and right after a numpy
512x512 matmul or a PyTorch conv; and a numpy GEMV (1024x1024, float64), the PyTorch conv
and the numpy matmul alone and right after an accel call. Each "after" has two controls that
leave no other library's thread behind: right after a single-threaded copy of 32 MB ("cache
flush"), which evicts the caller's data from the caches, and right after a pause as long as
the call before it ("idle"), in which every library's threads go to sleep (on a VM a pause
alone slows the next call of any library: what the host does with an idle core is its own). What a call loses
after another library beyond its idle control is the thread pools'. Every block of calls
starts after a 0.3 s pause, so that no library's threads are still spinning from the last one,
and its first calls are not timed.
On accel's pool a process also counts the share of the model's tasks that the workers ran
(the caller runs those that no worker has started: a low share after numpy or PyTorch means
their threads held the other cores). Prints one JSON line per process and a table of the
ratios "after / alone", with those shares.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import timeit

SETTINGS = {
    "TVM's pool, TVM's defaults": {
        "ACCEL_POOL": "tvm",
        "TVM_THREAD_POOL_SPIN_COUNT": "300000",
        "TVM_BIND_THREADS": "1",
    },
    "TVM's pool, spin 0, unpinned": {"ACCEL_POOL": "tvm"},
    "accel's defaults (accel's pool)": {},
    # other libraries' threads spin briefly (about as long as accel's workers), or not at all
    "accel's + brief OpenMP/OpenBLAS spin": {"GOMP_SPINCOUNT": "10000", "OPENBLAS_THREAD_TIMEOUT": "10"},
    "accel's + passive OpenMP/OpenBLAS": {"OMP_WAIT_POLICY": "PASSIVE", "OPENBLAS_THREAD_TIMEOUT": "4"},
}
MODELS = ("ccpl", "ccpl128", "dense")
CALLS = 12  # timed calls in a block
SHARE = ": workers' share"  # of the tasks of the model's kernels (accel's pool: the rest, the caller's)
WARMUP = 4  # untimed ones before them: a VM that idled for 0.3 s runs its first calls slower


def build(directory: str) -> None:
    """Save the three models (weights beside the library) and their inputs into `directory`."""
    import numpy as np
    import torch
    from torch import nn

    import accel_target

    torch.manual_seed(0)
    ccpl = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 10),
    ).eval()
    dense = nn.Linear(1024, 1024, bias=False).eval()
    models = {
        "ccpl": (ccpl, torch.randn(1, 3, 32, 32)),
        "ccpl128": (ccpl, torch.randn(1, 3, 128, 128)),  # about as long a call as the model
        "dense": (dense, torch.randn(256, 1024)),
    }
    for name, (model, x) in models.items():
        executable = accel_target.build(accel_target.from_torch(model, (x,)), weights="separate")
        accel_target.save(executable, os.path.join(directory, f"{name}.so"))
        np.save(os.path.join(directory, f"{name}_x.npy"), x.numpy())


@contextlib.contextmanager
def models_in(directory: str | None):
    """The folder of the built models: `directory`, where they are built once and then reused,
    else a temporary one, built afresh and removed on exit."""
    with contextlib.ExitStack() as stack:
        directory = directory or stack.enter_context(tempfile.TemporaryDirectory(prefix="accel_coexistence_"))
        os.makedirs(directory, exist_ok=True)
        if not all(os.path.isfile(os.path.join(directory, f"{n}.so.json")) for n in MODELS):
            build(directory)
        yield directory


def measure(directory: str, rounds: int) -> dict:
    """The medians of one process (see the module's docstring)."""

    import numpy as np
    import torch

    import accel_target
    from accel_target import pool

    rng = np.random.default_rng(0)
    a = rng.standard_normal((512, 512)).astype("float32")
    g, v = rng.standard_normal((1024, 1024)), rng.standard_normal(1024)
    conv, tx = torch.nn.Conv2d(16, 32, 3, padding=1).eval(), torch.randn(1, 16, 56, 56)

    def numpy_mm():
        return a @ a

    def numpy_gemv():
        return g @ v

    def torch_conv():
        with torch.no_grad():
            return conv(tx)

    flush_src, flush_dst = np.ones(1 << 23, "float32"), np.empty(1 << 23, "float32")

    def cache_flush():
        np.copyto(flush_dst, flush_src)

    times: dict[str, list[float]] = {}
    counted = pool.available()  # accel's pool counts the tasks its workers run

    def block(key, before, timed, model=False):
        time.sleep(0.3)
        for i in range(WARMUP + CALLS):
            if i == WARMUP and model and counted:
                first = pool.stats()
            if before is not None:
                before()
            start = time.perf_counter()
            timed()
            if i >= WARMUP:
                times.setdefault(key, []).append((time.perf_counter() - start) * 1e3)
        if model and counted:
            last = pool.stats()
            workers, caller = (last[k] - first[k] for k in ("tasks_by_workers", "tasks_by_caller"))
            times.setdefault(key + SHARE, []).append(workers / max(1, workers + caller))

    models = {}
    for name in MODELS:
        model = accel_target.load(os.path.join(directory, f"{name}.so"))
        x = np.load(os.path.join(directory, f"{name}_x.npy"))
        models[name] = lambda m=model, x=x: m(x)
    for f in [numpy_mm, numpy_gemv, torch_conv, *models.values()]:
        for _ in range(10):
            f()

    def idle_as_long_as(f):
        seconds = float(np.median(timeit.repeat(f, number=1, repeat=10)))
        return lambda: time.sleep(seconds)

    for _ in range(rounds):
        for name, call in models.items():
            block(f"{name} alone", None, call, model=True)
            block(f"{name} after cache flush", cache_flush, call, model=True)
            for other, f in (("numpy mm", numpy_mm), ("torch conv", torch_conv)):
                block(f"{name} after idle as long as {other}", idle_as_long_as(f), call, model=True)
                block(f"{name} after {other}", f, call, model=True)
            idle = idle_as_long_as(call)
            for other, f in (("numpy gemv", numpy_gemv), ("torch conv", torch_conv), ("numpy mm", numpy_mm)):
                block(f"{other} alone", None, f)
                block(f"{other} after cache flush", cache_flush, f)
                block(f"{other} after idle as long as {name}", idle, f)
                block(f"{other} after {name}", call, f)
    return {key: float(np.median(values)) for key, values in times.items()}


def table(results: dict[str, list[dict]]) -> str:
    """Ratios after / alone, median over the processes of each setting; for accel's pool, the
    share of the model's tasks that its workers ran, after and alone (the rest, the caller)."""
    import numpy as np

    def median(runs, key):
        return float(np.median([r[key] for r in runs]))

    pairs = []
    for name in MODELS:
        befores = ("cache flush", "idle as long as numpy mm", "numpy mm", "idle as long as torch conv", "torch conv")
        pairs += [(f"{name} after {before}", f"{name} alone") for before in befores]
        for other in ("numpy gemv", "torch conv", "numpy mm"):
            befores = ("cache flush", f"idle as long as {name}", name)
            pairs += [(f"{other} after {before}", f"{other} alone") for before in befores]
    lines = ["| after / alone | " + " | ".join(results) + " |", "|---|" + "---|" * len(results)]
    for after, alone in dict.fromkeys(pairs):  # (the cache flush rows of the other libraries: once)
        cells = []
        for runs in results.values():
            ratio = float(np.median([r[after] / r[alone] for r in runs]))
            cell = f"{ratio:.2f} ({median(runs, alone):.2f} ms alone)"
            if after + SHARE in runs[0]:
                cell += f", workers {median(runs, after + SHARE):.0%} ({median(runs, alone + SHARE):.0%})"
            cells.append(cell)
        lines.append(f"| {after} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--dir", help="keep the built models here and reuse them (default: build afresh)")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.dir, args.rounds)))
        return
    with models_in(args.dir) as directory:
        results: dict[str, list[dict]] = {name: [] for name in SETTINGS}
        for _ in range(args.reps):
            for name, env in SETTINGS.items():
                cmd = [sys.executable, __file__, "--measure", "--dir", directory, "--rounds", str(args.rounds)]
                out = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True, check=True)
                last = out.stdout.strip().splitlines()[-1]
                results[name].append(json.loads(last))
                print(name, last, flush=True)
    print(table(results))


if __name__ == "__main__":
    main()
