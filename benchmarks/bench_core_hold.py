"""Who holds the cores when an accel call follows numpy or PyTorch (issue 19): each thread's
time on a core, and runnable off one, read from Linux's /proc/self/task/*/schedstat.

    python benchmarks/bench_core_hold.py [--calls 20] [--dir DIR]

Builds bench_coexistence.py's models (or reuses them from --dir), then runs one process per
setting of bench_coexistence.SETTINGS on accel's pool (its defaults, a brief and a passive
OpenMP/OpenBLAS spin). A process labels every thread by the library whose first call started
it (numpy's: OpenBLAS's; PyTorch's: its OpenMP pool's and any other; accel's: its pool's and any
other of TVM's runtime; the caller: the main thread) and prints:

- after one call of numpy's 512x512 product and of the PyTorch conv, how long each library's
  threads ran in the next second (what a library's threads do once its call has returned);
- `--calls` calls of ccpl128, alone and each right after the product or the conv: the accel
  calls' time in all, each library's threads' run time and runnable wait from the first call
  before to the last (summed over its threads; the caller's includes the product's or the
  conv's own work), and the share of the model's tasks that accel's workers ran (the caller
  ran the rest: those no worker had started).

A thread's wait is time it was runnable but off a core (the sums do not say which thread had
which core meanwhile). One reading per setting, so the times carry the host's drift. Linux
only (schedstat); times in ms.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_coexistence import SETTINGS, models_in  # noqa: E402

POOL_SETTINGS = [name for name, env in SETTINGS.items() if env.get("ACCEL_POOL") != "tvm"]
LINGER_S = 1.0  # how long after one call the other threads' run time is counted
MODEL = "ccpl128"


def _threads() -> dict[int, tuple[int, int]]:
    """{thread id: (ns on a core, ns runnable waiting for one)} of this process's threads."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                run, wait, _ = (int(v) for v in f.read().split())
            out[int(tid)] = (run, wait)
    return out


def _by_library(before: dict, after: dict, owner: dict[int, str]) -> dict[str, dict[str, float]]:
    """{library: {"run": ms, "wait": ms}} between two `_threads` readings."""
    out: dict[str, dict[str, float]] = {}
    for tid, (run, wait) in after.items():
        run0, wait0 = before.get(tid, (0, 0))
        entry = out.setdefault(owner.get(tid, "other"), {"run": 0.0, "wait": 0.0})
        entry["run"] += (run - run0) / 1e6
        entry["wait"] += (wait - wait0) / 1e6
    return {k: {m: round(v, 2) for m, v in entry.items()} for k, entry in out.items()}


def measure(directory: str, calls: int) -> dict:
    """One process's readings (see the module's docstring)."""
    import numpy as np

    owner = {os.getpid(): "caller"}

    def claim(library):  # the threads that appeared since the last claim are `library`'s
        for tid in _threads():
            owner.setdefault(tid, library)

    rng = np.random.default_rng(0)
    a = rng.standard_normal((512, 512)).astype("float32")
    a @ a
    claim("numpy's")
    import torch

    conv, tx = torch.nn.Conv2d(16, 32, 3, padding=1).eval(), torch.randn(1, 16, 56, 56)

    def torch_conv():
        with torch.no_grad():
            return conv(tx)

    torch_conv()
    claim("PyTorch's")
    import accel_target
    from accel_target import pool

    model = accel_target.load(os.path.join(directory, f"{MODEL}.so"))
    x = np.load(os.path.join(directory, f"{MODEL}_x.npy"))
    model(x)
    claim("accel's")
    others = {"numpy mm": lambda: a @ a, "torch conv": torch_conv}
    for f in [*others.values(), lambda: model(x)]:
        for _ in range(10):
            f()

    result: dict = {"linger": {}, "calls": {}}
    for name, f in others.items():
        time.sleep(LINGER_S)
        f()
        first = _threads()
        time.sleep(LINGER_S)
        result["linger"][name] = _by_library(first, _threads(), owner)
    for name, before in {"alone": None, **others}.items():
        time.sleep(0.3)
        first, tasks, elapsed = _threads(), pool.stats(), 0.0
        for _ in range(calls):
            if before is not None:
                before()
            started = time.perf_counter()
            model(x)
            elapsed += time.perf_counter() - started
        last, done = _threads(), pool.stats()
        workers, caller = (done[k] - tasks[k] for k in ("tasks_by_workers", "tasks_by_caller"))
        result["calls"][name] = {
            "ms": round(elapsed * 1e3, 2),
            "threads": _by_library(first, last, owner),
            "workers' share": round(workers / max(1, workers + caller), 3),
        }
    return result


def report(setting: str, result: dict, calls: int) -> str:
    """One setting's readings (`measure`'s result) as a list and a markdown table."""
    lines = [f"## {setting}", ""]
    for name, libraries in result["linger"].items():
        ran = ", ".join(f"{lib} {v['run']:.1f}" for lib, v in libraries.items() if lib != "caller")
        lines.append(f"- after one {name}, the next {LINGER_S:g} s: ran {ran}")
    lines += ["", f"| {calls} x {MODEL} | ms (its calls) | caller run / wait | thread run / wait | workers' share |"]
    lines.append("|---|---|---|---|---|")
    for name, row in result["calls"].items():
        threads = row["threads"]
        caller = threads.get("caller", {"run": 0, "wait": 0})
        share = row["workers' share"]
        rest = "; ".join(f"{lib} {v['run']:.1f} / {v['wait']:.1f}" for lib, v in threads.items() if lib != "caller")
        lines.append(
            f"| {'alone' if name == 'alone' else 'after ' + name} | {row['ms']:.1f} | "
            f"{caller['run']:.1f} / {caller['wait']:.1f} | {rest} | {share:.0%} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=20, help=f"{MODEL} calls per reading (default 20)")
    parser.add_argument("--dir", help="keep the built models here and reuse them (default: build afresh)")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not os.path.isdir("/proc/self/task"):
        raise SystemExit("bench_core_hold: needs Linux's /proc/self/task/*/schedstat")
    if args.measure:
        print(json.dumps(measure(args.dir, args.calls)))
        return
    with models_in(args.dir) as directory:
        for setting in POOL_SETTINGS:
            cmd = [sys.executable, __file__, "--measure", "--dir", directory, "--calls", str(args.calls)]
            env = {**os.environ, **SETTINGS[setting]}
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
            print(report(setting, json.loads(out.stdout.strip().splitlines()[-1]), args.calls), "\n", flush=True)


if __name__ == "__main__":
    main()
