"""Same-thread-count timing of a model on accel and other runtimes (used by `accel-tvm bench`)."""

from __future__ import annotations

import os
import time

import numpy as np
import tvm
from tvm import relax

from topi_accel.knobs import vector_bits

from .pipeline import build
from .target import machine, num_threads

WARMUP_S = 0.2
# the widest vectors of a target, by the name its benchmark results are kept under
ISA_BY_VECTOR_BITS = {512: "avx512", 256: "avx2", 128: "sse"}


def isa(target="accel") -> str:
    """ "avx512", "avx2" or "sse": the vector ISA the kernels of `target` use (the host's for
    the plain "accel" tag); benchmark results are kept per ISA."""
    return ISA_BY_VECTOR_BITS[vector_bits(tvm.target.Target(target))]


def median_ms(fn, repeat: int) -> float:
    """Median wall time of `repeat` calls of `fn`, in ms, after warming up (at least three
    calls and WARMUP_S seconds: the first calls of a fresh runtime fault in its memory and
    wake its threads)."""
    started, calls = time.perf_counter(), 0
    while calls < 3 or time.perf_counter() - started < WARMUP_S:
        fn()
        calls += 1
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times) * 1e3)


def median_of_medians(fn, repeat: int, rounds: int) -> float:
    """Median of `rounds` `median_ms(fn, repeat)`, in ms: a noisy spell spoils a round, not the time."""
    return float(np.median([median_ms(fn, repeat) for _ in range(rounds)]))


def max_rel_error(out, reference) -> float:
    """Largest absolute difference of `out` from `reference`, relative to `reference`'s largest
    magnitude (arrays of the same shape)."""
    return float(np.abs(out - reference).max() / max(np.abs(reference).max(), 1e-30))


def vm_runner(executable, arrays):
    vm = relax.VirtualMachine(executable, tvm.cpu())
    args = [tvm.runtime.tensor(a) for a in arrays]
    return lambda: vm["main"](*args)


def _torch_runner(path: str, arrays, threads: int):
    import torch

    torch.set_num_threads(threads)
    module = torch.export.load(path).module()
    tensors = [torch.from_numpy(a) for a in arrays]

    def run():
        with torch.inference_mode():
            module(*tensors)

    return run


def onnxruntime_runner(path: str, arrays, threads: int):
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    feed = {i.name: a for i, a in zip(session.get_inputs(), arrays)}
    return lambda: session.run(None, feed)


CONTENDERS = ("tvm", "torch", "onnxruntime")


def compare(path: str, mod: tvm.IRModule, inputs: list[dict], contenders, repeat: int, progress=lambda m: None) -> dict:
    """Median ms of accel and each contender on random inputs of the model's signature."""
    unknown = sorted(set(contenders) - set(CONTENDERS))
    if unknown:
        raise ValueError(f"unknown contender(s) {unknown}; supported: {', '.join(CONTENDERS)}")
    symbolic = [i["name"] for i in inputs if i["shape"] is None]
    if symbolic:
        raise ValueError(f"inputs {symbolic} have symbolic shapes; bench needs a model with static input shapes")
    threads = num_threads()
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(i["shape"]).astype(i["dtype"]) for i in inputs]
    progress("building for accel")
    rows = [("accel", vm_runner(build(mod), arrays), repeat)]
    for name in contenders:
        if name == "tvm":
            progress("building with stock TVM (target llvm)")
            rows.append(("stock TVM", vm_runner(tvm.compile(mod, target="llvm"), arrays), max(2, repeat // 10)))
        elif name == "torch" and path.endswith(".pt2"):
            rows.append(("PyTorch", _torch_runner(path, arrays, threads), repeat))
        elif name == "onnxruntime" and path.endswith(".onnx"):
            rows.append(("ONNX Runtime", onnxruntime_runner(path, arrays, threads), repeat))
        else:
            progress(f"skipping {name}: it cannot run {os.path.basename(path)}")
    results = []
    for name, run, rounds in rows:
        progress(f"timing {name} ({rounds} rounds)")
        results.append({"runtime": name, "ms": median_ms(run, rounds)})
    accel_ms = results[0]["ms"]
    for r in results:
        r["accel_speedup"] = r["ms"] / accel_ms
    return {
        "model": os.path.basename(path),
        "threads": threads,
        "machine": machine(),
        "results": results,
    }


def table(results: dict) -> str:
    lines = [
        f"{results['model']}: median of timed runs, {results['threads']} threads each, {results['machine']}",
        f"{'runtime':<14} {'ms':>10} {'accel speed-up':>15}",
    ]
    for r in results["results"]:
        speed = "" if r["runtime"] == "accel" else f"{r['accel_speedup']:.2f}x"
        lines.append(f"{r['runtime']:<14} {r['ms']:>10.3f} {speed:>15}")
    return "\n".join(lines)


def plot(results: dict, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["runtime"] for r in results["results"]]
    values = [r["ms"] for r in results["results"]]
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.barh(names, values, color=["#2a7" if n == "accel" else "#889" for n in names])
    ax.set_xscale("log")
    ax.set_xlabel(f"ms per run (median, {results['threads']} threads, log scale)")
    ax.set_title(title)
    for y, v in enumerate(values):
        ax.text(v, y, f" {v:.2f}", va="center")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
