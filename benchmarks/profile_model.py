"""Where a model's time goes: each kernel of an accel build timed in the model, as it runs.

    python benchmarks/profile_model.py resnet50 [--mcpu haswell] [--batch 8] [--top 20]

Builds one of benchmarks/models.py's models in this process, with every kernel launching the
thread pool itself (`launches.disabled()`: a shared launch would time its members as one),
and times every VM call of `--calls` runs of `main` with a VM instrument. Prints the time
of a run without the instrument, then each kernel's time per run (the median of its calls,
times its calls per run), slowest first, and its share of their sum. The kernels see the
caches they see in the model (a weight read from memory each run shows as such), which
timing a kernel alone in a loop hides. The instrument adds a little to every call.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tvm  # noqa: E402
from models import MODELS, make  # noqa: E402
from tvm import relax  # noqa: E402

import accel_target  # noqa: E402  (sets TVM_NUM_THREADS to every core unless set)
from accel_target import launches  # noqa: E402
from accel_target.benchmark import isa, target_for  # noqa: E402


def kernel_times(vm: relax.VirtualMachine, args: list, calls: int) -> dict[str, tuple[float, int, list]]:
    """{VM call name: (us per run of main, calls per run, its first call's argument shapes)}
    over `calls` runs of main."""
    times: dict[str, list[float]] = {}
    shapes: dict[str, list] = {}
    started = []

    def instrument(func, name, before, ret, *call_args):
        if before:
            started.append(time.perf_counter())
        else:
            times.setdefault(name, []).append((time.perf_counter() - started.pop()) * 1e6)
            shapes.setdefault(name, [tuple(a.shape) for a in call_args if hasattr(a, "shape")])

    vm.set_instrument(instrument)
    try:
        for _ in range(calls):
            vm["main"](*args)
    finally:
        vm.set_instrument(lambda *a: None)
    return {name: (float(np.median(t)) * (len(t) // calls), len(t) // calls, shapes[name]) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", choices=sorted(MODELS))
    parser.add_argument("--mcpu", help="build for this LLVM CPU (haswell: AVX2 code) instead of the host's")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--calls", type=int, default=50, help="runs of main timed (default 50)")
    parser.add_argument("--top", type=int, default=25, help="kernels printed (default 25)")
    args = parser.parse_args()

    target = target_for(args.mcpu)
    model, x = make(args.model, batch=args.batch)
    with launches.disabled():
        executable = accel_target.build(accel_target.from_torch(model, (x,)), target=target)
    vm = relax.VirtualMachine(executable, tvm.cpu())
    inputs = [tvm.runtime.tensor(x.numpy())]
    for _ in range(10):
        vm["main"](*inputs)
    started = time.perf_counter()
    for _ in range(args.calls):
        vm["main"](*inputs)
    run_ms = (time.perf_counter() - started) / args.calls * 1e3

    kernels = kernel_times(vm, inputs, args.calls)
    total = sum(us for us, _, _ in kernels.values())
    print(
        f"{args.model}, batch {args.batch}, {accel_target.num_threads()} threads, {isa(target)} code: "
        f"{run_ms:.3f} ms a run; its VM calls sum to {total / 1e3:.3f} ms with the instrument"
    )
    print(f"{'us/run':>9} {'share':>6} {'calls':>5}  kernel  argument shapes")
    for name, (us, count, shapes) in sorted(kernels.items(), key=lambda kv: -kv[1][0])[: args.top]:
        print(f"{us:9.1f} {us / total:6.1%} {count:5d}  {name}  {shapes}")


if __name__ == "__main__":
    main()
