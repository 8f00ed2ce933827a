"""Where a model's time goes: each kernel of an accel build timed in the model, as it runs.

    python benchmarks/profile_model.py resnet50 [--mcpu haswell] [--batch 8] [--top 20] [--again] [--onnxruntime]

Builds one of benchmarks/models.py's models in this process, with every kernel launching the
thread pool itself (`launches.disabled()`: a shared launch would time its members as one),
and times every VM call of `--calls` runs of `main` with a VM instrument. Prints the time
of a run without the instrument, then each kernel's time per run (the median of its calls,
times its calls per run), slowest first, and its share of their sum. The kernels see the
caches they see in the model (a weight read from memory each run shows as such), which
timing a kernel alone in a loop hides. The instrument adds a little to every call.

`--again` calls every kernel a second time right after the model's call, with the same
arguments, and sets that time beside it: the kernel in the caches it just left (its weights
and input read a moment before), so the ratio is what the model's state of the caches costs
it in this build. A build whose kernels share launches, the one `accel_target.build` makes, may
pay less: MobileNetV2's 7x7x960 depthwise conv reads 7x here (4x with TVM's spinning workers),
2x with its channel blocks outermost (reading what its own core's 1x1 conv wrote), a change that
left the shipped model's time as it was (benchmarks/README.md). The model's outputs in those
runs are not its results (a kernel that writes over its input reads its own output the second
time); only the times are kept.

`--onnxruntime` sets ONNX Runtime's node profile beside it: the model exported to ONNX, run as
many times in a process of its own (same threads) with ONNX Runtime's profiler on, each node's
median time. Kernels and nodes are matched by their first input's and first output's shapes
(NCHW read as NHWC), summed per pair of shapes: layers of one geometry sum together, and a
kernel that fuses what ONNX Runtime runs as two nodes (or the other way round) shows as one side
without the other. ORT/ours above 1: accel's kernels are faster. The two profiles run one after
the other, not in turns, so a host whose speed drifts moves every ratio of a run alike.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import NamedTuple

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpuid_cap  # noqa: E402
import tvm  # noqa: E402
from models import MODELS, make  # noqa: E402
from tvm import relax  # noqa: E402

import accel_target  # noqa: E402  (sets TVM_NUM_THREADS to every core unless set)
from accel_target import launches  # noqa: E402
from accel_target.benchmark import isa, target_for  # noqa: E402
from accel_target.timing import threads_env  # noqa: E402

# Run in a process of its own: argv = ONNX file, input .npy, runs, profile prefix, threads. Prints
# [[node name, input shapes, output shapes, median us of its last `runs` calls], ...].
_ONNXRUNTIME_PROFILE = """
import json, sys, numpy as np, onnxruntime as ort
path, x, runs, prefix = sys.argv[1], np.load(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
options = ort.SessionOptions()
options.intra_op_num_threads = int(sys.argv[5])
options.inter_op_num_threads = 1
options.enable_profiling = True
options.profile_file_prefix = prefix
session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
feed = {session.get_inputs()[0].name: x}
for _ in range(10 + runs):
    session.run(None, feed)
nodes = {}
for event in json.load(open(session.end_profiling())):
    if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
        args = event["args"]
        shapes = [[next(iter(t.values())) for t in args[k]] for k in ("input_type_shape", "output_type_shape")]
        nodes.setdefault(event["name"], (args["op_name"], shapes, []))[2].append(event["dur"])
print(json.dumps([[op, *shapes, float(np.median(d[-runs:]))] for op, shapes, d in nodes.values()]))
"""


class KernelTime(NamedTuple):
    """One VM call's times in a model: us per run of main (the median of its calls, times its
    calls per run), its calls per run, its first call's argument shapes, and with ``again`` the
    same for the second call of each (None without)."""

    us: float
    calls: int
    shapes: list
    again: float | None = None


def kernel_times(vm: relax.VirtualMachine, args: list, calls: int, again: bool = False) -> dict[str, KernelTime]:
    """{VM call name: KernelTime} over `calls` runs of main; `again`: every call made twice
    in a row, the second timed too (see the module's docstring)."""
    times: dict[str, list[float]] = {}
    repeated: dict[str, list[float]] = {}
    shapes: dict[str, list] = {}
    started = []

    def instrument(func, name, before, ret, *call_args):
        if before:
            started.append(time.perf_counter())
            return
        times.setdefault(name, []).append((time.perf_counter() - started.pop()) * 1e6)
        shapes.setdefault(name, [tuple(a.shape) for a in call_args if hasattr(a, "shape")])
        if again:
            start = time.perf_counter()
            func(*call_args)
            repeated.setdefault(name, []).append((time.perf_counter() - start) * 1e6)

    vm.set_instrument(instrument)
    try:
        for _ in range(calls):
            vm["main"](*args)
    finally:
        vm.set_instrument(lambda *a: None)

    def per_run(t):
        return float(np.median(t)) * (len(t) // calls)

    return {
        name: KernelTime(per_run(t), len(t) // calls, shapes[name], per_run(repeated[name]) if again else None)
        for name, t in times.items()
    }


def onnxruntime_node_times(model, x, threads: int, runs: int, env=None) -> list[tuple[str, list, list, float]]:
    """[(op, input shapes, output shapes, median us a run)] of every node ONNX Runtime runs for
    `model` (exported to ONNX here) on `x`, profiled over `runs` runs in a process of its own
    (`env` over this one's environment)."""
    import torch

    with tempfile.TemporaryDirectory(prefix="accel_profile_") as tmp:
        onnx_path, x_path = os.path.join(tmp, "model.onnx"), os.path.join(tmp, "x.npy")
        torch.onnx.export(model, (x,), onnx_path, dynamo=False, input_names=["x"])
        np.save(x_path, x.numpy())
        argv = [onnx_path, x_path, str(runs), os.path.join(tmp, "p"), str(threads)]
        environment = {**os.environ, **threads_env(threads), **(env or {})}
        done = subprocess.run(
            [sys.executable, "-c", _ONNXRUNTIME_PROFILE, *argv], env=environment, capture_output=True, text=True
        )
        if done.returncode:
            raise SystemExit(f"ONNX Runtime's profile failed:\n{done.stderr}")
        return [tuple(node) for node in json.loads(done.stdout.splitlines()[-1])]


def _nhwc(shape) -> tuple:
    """A 4-D NCHW shape as NHWC; any other shape as it is."""
    shape = tuple(shape)
    return (shape[0], *shape[2:], shape[1]) if len(shape) == 4 else shape


def beside_onnxruntime(kernels: dict, nodes: list) -> list[tuple]:
    """[(first input shape, first output shape, accel us, accel kernels, ONNX Runtime us,
    ONNX Runtime ops)] summed per pair of shapes, slowest accel first: `kernels` as
    `kernel_times` gives them (a kernel's first argument its input, its last its output),
    `nodes` as `onnxruntime_node_times` (NCHW read as NHWC, but where a kernel reads it as it is)."""
    rows: dict[tuple, list] = {}
    for name, kernel in kernels.items():
        if len(kernel.shapes) >= 2:
            row = rows.setdefault((kernel.shapes[0], kernel.shapes[-1]), [0.0, [], 0.0, []])
            row[0] += kernel.us
            row[1].append(f"{name} x{kernel.calls}")
    for op, inputs, outputs, us in nodes:
        if inputs and outputs:
            key = (_nhwc(inputs[0]), _nhwc(outputs[0]))
            if key not in rows and (tuple(inputs[0]), key[1]) in rows:  # a first conv reading the NCHW image
                key = (tuple(inputs[0]), key[1])
            row = rows.setdefault(key, [0.0, [], 0.0, []])
            row[2] += us
            row[3].append(op)
    return sorted(((*key, *row) for key, row in rows.items()), key=lambda r: (-r[2], -r[4]))


def _print_beside(rows: list, ours_total: float, theirs_total: float) -> None:
    print(f"\nbeside ONNX Runtime's nodes (their sum {theirs_total / 1e3:.3f} ms, ours {ours_total / 1e3:.3f}):")
    print(f"{'accel us':>9} {'ORT us':>9} {'ORT/ours':>8}  input -> output  accel kernels | ONNX Runtime nodes")
    for inp, out, ours, names, theirs, ops in rows:
        ratio = f"{theirs / ours:8.2f}" if ours and theirs else f"{'-':>8}"
        counts = ", ".join(f"{op} x{ops.count(op)}" for op in sorted(set(ops)))
        print(f"{ours:9.1f} {theirs:9.1f} {ratio}  {inp} -> {out}  {', '.join(names) or '-'} | {counts or '-'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", choices=sorted(MODELS))
    parser.add_argument("--mcpu", help="build for this LLVM CPU (haswell: AVX2 code) instead of the host's")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--calls", type=int, default=50, help="runs of main timed (default 50)")
    parser.add_argument("--top", type=int, default=25, help="kernels printed (default 25)")
    parser.add_argument(
        "--again", action="store_true", help="each kernel also called again at once: its time in the caches it left"
    )
    parser.add_argument(
        "--onnxruntime", action="store_true", help="then ONNX Runtime's node profile beside the kernels, by shapes"
    )
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

    kernels = kernel_times(vm, inputs, args.calls, again=args.again)
    total = sum(k.us for k in kernels.values())
    print(
        f"{args.model}, batch {args.batch}, {accel_target.num_threads()} threads, {isa(target)} code: "
        f"{run_ms:.3f} ms a run; its VM calls sum to {total / 1e3:.3f} ms with the instrument"
    )
    if args.again:
        repeated = sum(k.again for k in kernels.values())
        print(f"called again at once they sum to {repeated / 1e3:.3f} ms (in the model / again {total / repeated:.3f})")
    heading = f" {'again':>9} {'ratio':>6}" if args.again else ""
    print(f"{'us/run':>9} {'share':>6}{heading} {'calls':>5}  kernel  argument shapes")
    for name, k in sorted(kernels.items(), key=lambda kv: -kv[1].us)[: args.top]:
        beside = f" {k.again:9.1f} {k.us / k.again:6.3f}" if args.again else ""
        print(f"{k.us:9.1f} {k.us / total:6.1%}{beside} {k.calls:5d}  {name}  {k.shapes}")
    if args.onnxruntime:
        # --mcpu haswell: ONNX Runtime as on an AVX2-only host, as bench_models runs it
        held = cpuid_cap.patched_env("onnxruntime") if args.mcpu and isa(target) == "avx2" else None
        nodes = onnxruntime_node_times(model, x, accel_target.num_threads(), args.calls, held)
        _print_beside(beside_onnxruntime(kernels, nodes), total, sum(node[3] for node in nodes))


if __name__ == "__main__":
    main()
