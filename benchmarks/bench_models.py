"""Whole models: accel against stock TVM, PyTorch eager and ONNX Runtime, same threads.

    python benchmarks/bench_models.py [--models resnet50,mobilenet_v2,bert_base_2layers] [--no-stock-tvm]
                                      [--batch 8] [--repeat 5] [--rounds 10] [--mcpu haswell]

Writes benchmarks/results/<isa>/models.md and models.png (models_batch<N>.* for --batch N;
<isa> is the host's widest vectors; machine, threads, versions recorded). For AVX2 figures
on an AVX-512 host, run it as on an AVX2-only host, where every contender picks its AVX2
code (accel's tag resolves to a Haswell, PyTorch and ONNX Runtime read a CPUID without
AVX-512, AVX-VNNI or AMX):

    python benchmarks/cpuid_cap.py python benchmarks/bench_models.py

Where Linux offers no CPUID faulting (AMD hosts), `--mcpu haswell` builds accel and stock TVM
for AVX2, holds PyTorch to AVX2 by its own switches, and runs ONNX Runtime from a copy whose
CPUID and XGETBV instructions ask cpuid_cap.c instead (cpuid_cap.patched_env; objdump finds
them), so that it picks the kernels it would pick on an AVX2-only host.

Each contender runs the same random-weight model
(benchmarks/models.py) on the same input; accel's output is compared with PyTorch's (max
rel error column; the script stops if it exceeds 1e-4). Every model is prepared in a fresh
process, and every contender is timed in a process of its own (accel_target.timing: thread
pools sharing a process steal each other's cores), the contenders taking turns for several
rounds; peak memory is measured in fresh processes of their own.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time

if "ACCEL_BENCH_THREADS" in os.environ:  # same knob as the kernel benchmarks
    os.environ["TVM_NUM_THREADS"] = os.environ["ACCEL_BENCH_THREADS"]
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import cpuid_cap  # noqa: E402
import fma_peak  # noqa: E402
import numpy as np  # noqa: E402
import onnxruntime  # noqa: E402
import torch  # noqa: E402
import tvm  # noqa: E402
from models import MODELS, make  # noqa: E402

import accel_target  # noqa: E402  (sets TVM_NUM_THREADS to every core unless set)
from accel_target.benchmark import isa, max_rel_error, target_for, vm_runner  # noqa: E402
from accel_target.timing import save_inputs, speedup_interval, speedups, take_turns  # noqa: E402

ROUNDS = 10


def _targets(mcpu: str | None) -> tuple:
    """accel's target and stock TVM's: the host's, or built for `mcpu`."""
    return target_for(mcpu), tvm.target.Target({"kind": "llvm", "mcpu": mcpu}) if mcpu else "llvm"


def bench_model(
    name: str, threads: int, repeat: int, stock_tvm: bool, batch: int = 1, mcpu: str | None = None, rounds: int = ROUNDS
) -> dict:
    target, stock_target = _targets(mcpu)
    model, x = make(name, batch=batch)
    with torch.inference_mode():
        reference = model(x).numpy()
    row = {"model": name}

    started = time.perf_counter()
    mod = accel_target.from_torch(model, (x,))
    executable = accel_target.build(mod, target=target)
    row["accel compile s"] = time.perf_counter() - started
    out = vm_runner(executable, [x.numpy()])().numpy()
    row["max rel error"] = max_rel_error(out, reference)
    if row["max rel error"] > 1e-4:
        raise SystemExit(f"{name}: accel's output differs from PyTorch's by {row['max rel error']:.1e}")

    with tempfile.TemporaryDirectory(prefix="accel_bench_") as tmp:
        paths = {k: os.path.join(tmp, f"{name}.{k}") for k in ("onnx", "so", "pt", "npz")}
        torch.onnx.export(model, (x,), paths["onnx"], dynamo=False, input_names=["x"])
        accel_target.save(executable, paths["so"])
        torch.save(model, paths["pt"])  # eager PyTorch, unpickled in its timing process
        data = save_inputs(paths["npz"], [x.numpy()])
        specs = {
            "accel": {"kind": "accel", "path": paths["so"], "inputs": data},
            "PyTorch": {"kind": "torch", "path": paths["pt"], "inputs": data},
            "ONNX Runtime": {"kind": "onnxruntime", "path": paths["onnx"], "inputs": data},
        }
        # each contender in a process of its own, taking turns `rounds` times, so that a noisy
        # spell on this shared machine falls on all of them alike; each gets the median of its
        # rounds' medians, accel's speed-up over it the median of the rounds' speed-ups
        # --mcpu haswell: every contender's process as on an AVX2-only host (ONNX Runtime patched)
        held = cpuid_cap.patched_env("onnxruntime") if mcpu and isa(target) == "avx2" else None
        env = dict.fromkeys(specs, held) if held else None
        turns = take_turns(specs, threads, repeat, rounds, path=[HERE], env=env)
        row.update({contender: float(np.median(times)) for contender, times in turns.items()})
        row["speed-ups"] = speedups(turns)
        row["speed-up intervals"] = {n: speedup_interval(turns, n) for n in turns if n != "accel"} if rounds > 1 else {}
        # memory of both deployments: weights beside the library, and inside it
        paths["separate"] = os.path.join(tmp, f"{name}_separate.so")
        accel_target.save(accel_target.build(mod, target=target, weights="separate"), paths["separate"])
        row["accel peak MB"], row["accel embedded peak MB"], row["ONNX Runtime peak MB"] = peak_memory(
            [paths["separate"], paths["so"]], paths["onnx"], x.numpy(), threads, tmp
        )
        if stock_tvm:
            tvm.compile(mod, target=stock_target).export_library(os.path.join(tmp, "stock.so"))
            spec = {"kind": "tvm", "path": os.path.join(tmp, "stock.so"), "inputs": data}
            row["stock TVM"] = take_turns({"stock TVM": spec}, threads, 2, 1)["stock TVM"][0]
            row["speed-ups"]["stock TVM"] = row["stock TVM"] / row["accel"]  # (not in the rounds)
    return row


# Peak RSS in MB of this process image (VmHWM: ru_maxrss would carry the parent's peak across exec).
# Writing 5 to /proc/self/clear_refs resets VmHWM, so the peak of the runs alone is measured too.
_HWM = (
    "import sys\nsys.modules['torch'] = None  # see _DEPLOYED\n"
    "def _status(key):\n"
    "    return int(next(l for l in open('/proc/self/status') if l.startswith(key)).split()[1]) / 1024\n"
    "def _reset_peak():\n    open('/proc/self/clear_refs', 'w').write('5')\n"
)
# Each runs in a fresh process: load the model, reset the peak, run it 5 times; prints the peak of
# the whole process and the peak while running, in MB. accel loads the weights file beside the
# library when there is one (the recipe of accel_target/deploy.py).
_MEMORY_SCRIPTS = {
    "accel": (
        _HWM + "import os, numpy as np, tvm\nfrom tvm.runtime.vm import VirtualMachine\n"
        "vm = VirtualMachine(tvm.runtime.load_module(sys.argv[1]), tvm.cpu())\n"
        "weights = []\n"
        "if os.path.isfile(sys.argv[1] + '.params'):\n"
        "    params = tvm.runtime.load_param_dict_from_file(sys.argv[1] + '.params')\n"
        "    weights = [params[f'w{i}'] for i in range(len(params))]\n"
        "x = tvm.runtime.tensor(np.load(sys.argv[2]))\n"
        "whole = _status('VmHWM'); _reset_peak()\n"
        "[vm['main'](x, *weights) for _ in range(5)]\n"
        "print(max(whole, _status('VmHWM')), _status('VmHWM'))"
    ),
    "onnxruntime": (
        _HWM + "import numpy as np, onnxruntime as ort\n"
        "o = ort.SessionOptions(); o.intra_op_num_threads = int(sys.argv[3])\n"
        "s = ort.InferenceSession(sys.argv[1], o, providers=['CPUExecutionProvider'])\n"
        "x = np.load(sys.argv[2])\n"
        "whole = _status('VmHWM'); _reset_peak()\n"
        "[s.run(None, {'x': x}) for _ in range(5)]\n"
        "print(max(whole, _status('VmHWM')), _status('VmHWM'))"
    ),
}
# The accel process is a deployment: TVM's runtime library only (no compiler), and no PyTorch
# (tvm_ffi imports torch whenever it is installed; the runtime does not use it).
_DEPLOYED = {"accel": {"TVM_USE_RUNTIME_LIB": "1"}, "onnxruntime": {}}


def peak_memory(libraries: list, path_onnx: str, x: np.ndarray, threads: int, tmp: str) -> list[tuple[float, float]]:
    """(peak RSS of the whole process, peak RSS while running) in MB of a fresh process that
    loads and runs the model: each accel library written by accel_target.save, then ONNX Runtime."""
    data = os.path.join(tmp, "x.npy")
    np.save(data, x)
    peaks = []
    for runtime, model_path in [("accel", path) for path in libraries] + [("onnxruntime", path_onnx)]:
        env = dict(os.environ, TVM_NUM_THREADS=str(threads), **_DEPLOYED[runtime])
        out = subprocess.run(
            [sys.executable, "-c", _MEMORY_SCRIPTS[runtime], model_path, data, str(threads)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        peaks.append(tuple(float(v) for v in out.stdout.split()[-2:]))
    return peaks


def _speedup(row: dict, name: str) -> str:
    """accel's speed-up over `name`, with the range its median could take over resampled
    rounds (`timing.speedup_interval`) where there are rounds."""
    interval = row.get("speed-up intervals", {}).get(name)
    return f"{row['speed-ups'][name]:.2f}x" + (" ({:.2f}-{:.2f})".format(*interval) if interval else "")


def markdown(rows: list[dict], header: str) -> str:
    names = [n for n in ("accel", "PyTorch", "ONNX Runtime", "stock TVM") if any(n in r for r in rows)]
    lines = [
        header,
        "",
        "| model | "
        + " | ".join(f"{n} ms" for n in names)
        + " | "
        + " | ".join(f"vs {n}" for n in names[1:])
        + " | accel compile s | peak MB accel / ORT (while running)"
        + " | peak MB accel, weights in the .so | max rel error |",
        "|---" * (2 * len(names) + 4) + "|",
    ]
    for r in rows:
        times = " | ".join(f"{r[n]:.2f}" if n in r else "" for n in names)
        ratios = " | ".join(_speedup(r, n) if n in r else "" for n in names[1:])
        (accel_peak, accel_run), (ort_peak, ort_run) = r["accel peak MB"], r["ONNX Runtime peak MB"]
        memory = f"{accel_peak:.0f} / {ort_peak:.0f} ({accel_run:.0f} / {ort_run:.0f})"
        embedded = "{:.0f} ({:.0f})".format(*r["accel embedded peak MB"])
        lines.append(
            f"| {r['model']} | {times} | {ratios} | {r['accel compile s']:.1f} | {memory} | {embedded} "
            f"| {r['max rel error']:.1e} |"
        )
    lines += [
        "",
        "'vs X' = X's time / accel's in the same round, median over rounds (above 1: accel is faster; stock TVM:",
        "one turn, its median / accel's); the range after it holds 95% of that median over the rounds drawn",
        "again with replacement (a bootstrap). Peak MB: peak resident memory of a",
        "fresh process that loads the model and runs it 5 times (accel: TVM's runtime library only, the library",
        'and its weights file from build(weights="separate"); last column: the library with the weights inside);',
        "in brackets, the peak while running (after loading).",
    ]
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in ("accel", "PyTorch", "ONNX Runtime", "stock TVM") if any(n in r for r in rows)]
    fig, ax = plt.subplots(figsize=(8, 3.5))
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        values = [r.get(name, np.nan) for r in rows]
        ax.bar(np.arange(len(rows)) + i * width, values, width, label=name)
    ax.set_xticks(np.arange(len(rows)) + width * (len(names) - 1) / 2, [r["model"] for r in rows])
    ax.set_yscale("log")
    ax.set_ylabel("ms per inference (median, log)")
    ax.set_title("\n".join(textwrap.wrap(title, 110)), fontsize=8)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--repeat", type=int, default=20, help="timed runs a turn (default 20)")
    parser.add_argument(
        "--rounds",
        type=int,
        default=ROUNDS,
        help=f"turns of every contender (default {ROUNDS}); more where the host's speed drifts",
    )
    parser.add_argument("--no-stock-tvm", action="store_true", help="skip stock TVM (seconds per ResNet-50 run)")
    parser.add_argument("--batch", type=int, default=1, help="samples per inference (default 1)")
    parser.add_argument(
        "--mcpu",
        help="build accel and stock TVM for this LLVM CPU on a host without CPUID faulting, where cpuid_cap.py "
        "cannot run (haswell: AVX2, with PyTorch held to AVX2 by its switches and ONNX Runtime by a patched copy)",
    )
    parser.add_argument("--row-of", metavar="MODEL", help=argparse.SUPPRESS)  # one model's row as JSON (internal)
    args = parser.parse_args()
    if args.rounds < 1 or args.repeat < 1:
        parser.error(f"--rounds {args.rounds} and --repeat {args.repeat} must be at least 1")
    threads = accel_target.num_threads()
    torch.set_num_threads(threads)
    if args.row_of:
        row = bench_model(args.row_of, threads, args.repeat, not args.no_stock_tvm, args.batch, args.mcpu, args.rounds)
        print(json.dumps(row))
        return
    rows = []
    host_before = fma_peak.tile_shares(threads)
    for name in args.models.split(","):
        # every model in a fresh process: the one before leaves the heap and the thread pools
        # in a state that slowed the next model's accel runs by up to 1.3x
        print(f"[bench] {name}", file=sys.stderr, flush=True)
        command = [sys.executable, __file__, "--row-of", name, "--repeat", str(args.repeat), "--batch", str(args.batch)]
        command += ["--rounds", str(args.rounds)]
        command += ["--mcpu", args.mcpu] if args.mcpu else []
        out = subprocess.run(
            command + ["--no-stock-tvm"] * args.no_stock_tvm, stdout=subprocess.PIPE, text=True, check=True
        )
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    header = (
        f"{threads} threads for every contender; CPU {accel_target.machine()}; "
        f"apache-tvm {tvm.__version__}, torch {torch.__version__}, "
        f"onnxruntime {onnxruntime.__version__}; batch {args.batch}, each contender in a process of its "
        f"own, taking turns: median of {args.rounds} rounds' medians of {args.repeat} runs, speed-ups the "
        f"median of the rounds' speed-ups"
    )
    header += cpuid_cap.note() + fma_peak.host_note(host_before, fma_peak.tile_shares(threads))
    if args.mcpu:
        held = ", ".join(f"{k}={v}" for k, v in cpuid_cap.AVX2_ENV.items())
        header += f"; accel and stock TVM built for mcpu={args.mcpu}"
        if isa(_targets(args.mcpu)[0]) == "avx2":
            header += f", PyTorch held to AVX2 ({held}), ONNX Runtime by a copy whose CPUID and XGETBV report an "
            header += "AVX2-only CPU (benchmarks/cpuid_cap.py patched_env)"
    text = markdown(rows, header)
    print(text)
    results = os.path.join(os.path.dirname(__file__), "results", isa(_targets(args.mcpu)[0]))
    os.makedirs(results, exist_ok=True)
    name = "models" if args.batch == 1 else f"models_batch{args.batch}"
    with open(os.path.join(results, f"{name}.md"), "w") as f:
        f.write(("# Whole models" if args.batch == 1 else f"# Whole models, batch {args.batch}") + "\n\n" + text)
    plot(rows, os.path.join(results, f"{name}.png"), header)


if __name__ == "__main__":
    main()
