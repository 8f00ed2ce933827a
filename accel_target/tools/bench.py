"""Same-thread-count timing of a model on accel and other runtimes (used by `accel-tvm bench`).

`compare` times every runtime in a process of its own, the runtimes taking turns
(`accel_target.tools.timing`); `compare_remote` times accel and stock TVM on a remote device
through TVM's RPC tracker, built here for the device's CPU; `vm_runner`, `onnxruntime_runner`
and `median_ms` time one runtime in the calling process, for scripts that already give each
contender a process.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np
import tvm

from topi_accel.knobs import vector_bits

from ..compiler import build
from ..runtime import remote as remotes
from ..runtime.deploy import save
from ..target import machine, num_threads
from .timing import median_ms, onnxruntime_runner, save_inputs, speedups, take_turns, time_libraries, vm_runner

__all__ = [
    "compare",
    "compare_remote",
    "isa",
    "max_rel_error",
    "median_ms",
    "median_of_medians",
    "onnxruntime_runner",
    "target_for",
    "vm_runner",
]
# the widest vectors of a target, by the name its benchmark results are kept under
ISA_BY_VECTOR_BITS = {512: "avx512", 256: "avx2", 128: "sse"}


def target_for(mcpu: str | None = None):
    """accel's target for the LLVM CPU `mcpu` (the benchmarks' --mcpu: haswell gives AVX2 code,
    which any AVX2 or AVX-512 host runs), or the host's tag without one."""
    return tvm.target.Target({"tag": "accel", "mcpu": mcpu}) if mcpu else "accel"


def isa(target="accel") -> str:
    """ "avx512", "avx2" or "sse": the vector ISA the kernels of `target` use (the host's for
    the plain "accel" tag); benchmark results are kept per ISA."""
    return ISA_BY_VECTOR_BITS[vector_bits(tvm.target.Target(target))]


def median_of_medians(fn, repeat: int, rounds: int) -> float:
    """Median of `rounds` `median_ms(fn, repeat)`, in ms: a noisy spell spoils a round, not the time."""
    return float(np.median([median_ms(fn, repeat) for _ in range(rounds)]))


def max_rel_error(out, reference) -> float:
    """Largest absolute difference of `out` from `reference`, relative to `reference`'s largest
    magnitude (arrays of the same shape)."""
    return float(np.abs(out - reference).max() / max(np.abs(reference).max(), 1e-30))


CONTENDERS = ("tvm", "torch", "onnxruntime")
# rounds of turns in `compare`; stock TVM takes one run in ten of the others (seconds a run)
ROUNDS = 3


def compare(
    path: str,
    mod: tvm.IRModule,
    inputs: list[dict],
    contenders,
    repeat: int,
    progress=lambda m: None,
    tuning_db: str | None = None,
) -> dict:
    """Median ms of accel and each contender on random inputs of the model's signature, and
    accel's speed-up over each: each runtime in a process of its own, taking turns ROUNDS times
    (median of the rounds' medians; speed-up: median of the rounds' ratios, `timing.speedups`).
    With `tuning_db`, "accel, tuned" (accel built with that database's configs) is one more
    contender: accel's speed-up over it above 1 means the tuned configs made the model slower."""
    unknown = sorted(set(contenders) - set(CONTENDERS))
    if unknown:
        raise ValueError(f"unknown contender(s) {unknown}; supported: {', '.join(CONTENDERS)}")
    symbolic = [i["name"] for i in inputs if i["shape"] is None]
    if symbolic:
        raise ValueError(f"inputs {symbolic} have symbolic shapes; bench needs a model with static input shapes")
    threads = num_threads()
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(i["shape"]).astype(i["dtype"]) for i in inputs]
    with tempfile.TemporaryDirectory(prefix="accel_bench_") as tmp:
        data = save_inputs(os.path.join(tmp, "inputs.npz"), arrays)
        specs, repeats = {}, {}
        for name, db in [("accel", None)] + ([("accel, tuned", tuning_db)] if tuning_db is not None else []):
            progress(f"building for accel{f' with the configs of {db}' if db else ''}")
            library = os.path.join(tmp, f"{name.replace(', ', '_')}.so")
            save(build(mod, tuning_db=db), library)
            specs[name] = {"kind": "accel", "path": library, "inputs": data}
            repeats[name] = repeat
        for name in contenders:
            if name == "tvm":
                progress("building with stock TVM (target llvm)")
                tvm.compile(mod, target="llvm").export_library(os.path.join(tmp, "stock.so"))
                specs["stock TVM"] = {"kind": "tvm", "path": os.path.join(tmp, "stock.so"), "inputs": data}
                repeats["stock TVM"] = max(2, repeat // 10)
            elif name == "torch" and path.endswith(".pt2"):
                specs["PyTorch"] = {"kind": "torch", "path": os.path.abspath(path), "inputs": data}
                repeats["PyTorch"] = repeat
            elif name == "onnxruntime" and path.endswith(".onnx"):
                specs["ONNX Runtime"] = {"kind": "onnxruntime", "path": os.path.abspath(path), "inputs": data}
                repeats["ONNX Runtime"] = repeat
            else:
                progress(f"skipping {name}: it cannot run {os.path.basename(path)}")
        progress(f"timing {', '.join(specs)}: each in a process of its own, {ROUNDS} rounds of turns")
        rounds = take_turns(specs, threads, repeats, ROUNDS)
    return _results(path, threads, machine(), rounds)


def _results(path: str, threads: int, where: str, rounds: dict[str, list[float]]) -> dict:
    ups = speedups(rounds)
    results = [
        {"runtime": name, "ms": float(np.median(times)), "accel_speedup": ups[name]} for name, times in rounds.items()
    ]
    return {"model": os.path.basename(path), "threads": threads, "machine": where, "results": results}


def _stock_target(target):
    """Stock TVM's target for the CPU `target` (accel's) names: LLVM with the same CPU options."""
    if not isinstance(target, dict):
        return "llvm"
    return {"kind": "llvm", **{k: v for k, v in target.items() if k != "tag"}}


def compare_remote(
    path: str,
    mod: tvm.IRModule,
    inputs: list[dict],
    contenders,
    repeat: int,
    remote,
    *,
    target="accel",
    cc: str | None = None,
    progress=lambda m: None,
    tuning_db: str | None = None,
) -> dict:
    """`compare` on a remote device (an accel_target.runtime.remote.Device): accel ("accel,
    tuned" too, with `tuning_db`) and stock TVM built here for `target` (the device's CPU;
    linked with `cc`), uploaded to one server of the device's key and timed there, taking
    turns ROUNDS times, a turn the mean of `repeat` runs on the device's clock (TVM's
    time_evaluator: no input or output crosses the network while it times). PyTorch and ONNX
    Runtime do not run on a TVM RPC server: they are skipped."""
    if any(i["shape"] is None for i in inputs):
        raise ValueError("bench needs a model with static input shapes")
    repeats = {}
    with tempfile.TemporaryDirectory(prefix="accel_bench_") as tmp:
        libraries = {}
        for name, db in [("accel", None)] + ([("accel, tuned", tuning_db)] if tuning_db is not None else []):
            progress(f"building for accel{f' with the configs of {db}' if db else ''}")
            libraries[name] = save(
                build(mod, target=target, tuning_db=db), os.path.join(tmp, f"{len(libraries)}.so"), cc=cc
            )[0]
            repeats[name] = repeat
        if "tvm" in contenders:
            progress("building with stock TVM (target llvm)")
            libraries["stock TVM"] = save(
                tvm.compile(mod, target=_stock_target(target)), os.path.join(tmp, "stock.so"), cc=cc
            )[0]
            repeats["stock TVM"] = max(2, repeat // 10)
        for name in sorted(set(contenders) - {"tvm"}):
            progress(f"skipping {name}: it does not run on a TVM RPC server")
        session = remotes.session_of(remote)
        progress(f"timing {', '.join(libraries)} on {remote}, {ROUNDS} rounds of turns")
        rounds = time_libraries(libraries, session, number=repeats, rounds=ROUNDS)
        return _results(path, remotes.threads(session), f"{remote}", rounds)


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
