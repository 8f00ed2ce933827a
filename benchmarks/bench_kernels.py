"""conv2d_nhwc_ohwi and dense_kn against stock TVM, PyTorch channels-last conv and numpy matmul.

    python benchmarks/bench_kernels.py [--rounds 3] [--repeat 20] [--only TEXT] [--no-stock-tvm]
                                       [--mcpu haswell]

prints (and writes to benchmarks/results/<isa>/kernels.md and .png) the median time of each
contender per shape, accel's speed-up over each, and the geometric mean of the speed-ups per family.
Every contender runs in a process of its own (accel_target.timing) with the same threads
(ACCEL_BENCH_THREADS, default every core); the contenders take turns shape by shape, every shape in
each of `--rounds` rounds, in an order that changes from round to round (`timing.turn_order`). A
time is the median of a contender's rounds' medians; a speed-up is the median of the rounds'
speed-ups (each from two turns back to back, so a slow spell of this shared machine that spoils one
contender's turn spoils one round's ratio). accel's kernels run as `accel_target.build` gives them
(accel's thread pool), stock TVM's as `tvm.compile(mod, "llvm")` does, in a process that never
imports accel_target (TVM's pool as TVM sets it up). `--mcpu haswell` gives AVX2 figures on an
AVX-512 host: accel and stock TVM built for it, PyTorch and numpy held to AVX2 by their own switches
(results/avx2/kernels.md).
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))

# every distinct ResNet-50 convolution (v1.5: stride on the 3x3): (H=W, C, O, kernel, stride)
RESNET50_CONVS = [
    (224, 3, 64, 7, 2),
    (56, 64, 64, 1, 1),
    (56, 64, 64, 3, 1),
    (56, 64, 256, 1, 1),
    (56, 256, 64, 1, 1),
    (56, 256, 128, 1, 1),
    (56, 128, 128, 3, 2),
    (28, 128, 512, 1, 1),
    (56, 256, 512, 1, 2),
    (28, 512, 128, 1, 1),
    (28, 128, 128, 3, 1),
    (28, 512, 256, 1, 1),
    (28, 256, 256, 3, 2),
    (14, 256, 1024, 1, 1),
    (28, 512, 1024, 1, 2),
    (14, 1024, 256, 1, 1),
    (14, 256, 256, 3, 1),
    (14, 1024, 512, 1, 1),
    (14, 512, 512, 3, 2),
    (7, 512, 2048, 1, 1),
    (14, 1024, 2048, 1, 2),
    (7, 2048, 512, 1, 1),
    (7, 512, 512, 3, 1),
]
# every distinct MobileNetV2 depthwise convolution: (H=W, C, stride)
MOBILENET_DEPTHWISE = [
    (112, 32, 1),
    (112, 96, 2),
    (56, 144, 1),
    (56, 144, 2),
    (28, 192, 1),
    (28, 192, 2),
    (14, 384, 1),
    (14, 576, 1),
    (14, 576, 2),
    (7, 960, 1),
]
# FC layers from batch 1 (GEMV) to 256 rows: BERT-base (seq 128), classifier heads: (M, K, N)
DENSE_SHAPES = [
    (1, 2048, 1000),
    (1, 768, 3072),
    (16, 768, 768),
    (128, 768, 768),
    (128, 768, 3072),
    (128, 3072, 768),
    (256, 1024, 1000),
    (256, 768, 3072),
]

# (name, kind, args): conv args are (H, C, O, kernel, stride, groups), dense args (M, K, N)
CASES = (
    [(f"conv{k}x{k}/{s} {h}x{h}x{c}->{o}", "conv", (h, c, o, k, s, 1)) for h, c, o, k, s in RESNET50_CONVS]
    + [(f"depthwise3x3/{s} {h}x{h}x{c}", "conv", (h, c, c, 3, s, c)) for h, c, s in MOBILENET_DEPTHWISE]
    + [("dense {}x{}x{}".format(*shape), "dense", shape) for shape in DENSE_SHAPES]
)
# contender -> the kinds of case it runs; stock TVM takes a few runs per turn (tens of ms each)
CONTENDERS = {"accel": ("conv", "dense"), "stock_tvm": ("conv", "dense"), "torch": ("conv",), "numpy": ("dense",)}
STOCK_REPEAT = 2
# numpy's OpenBLAS on its AVX2 kernels (what it picks on a Haswell)
NUMPY_AVX2_ENV = {"OPENBLAS_CORETYPE": "Haswell"}


def _arrays(kind: str, args) -> tuple[np.ndarray, np.ndarray]:
    """(data, weight): NHWC / OHWI for a conv, [M, K] / [K, N] for a dense; random, seeded."""
    rng = np.random.default_rng(0)
    if kind == "conv":
        h, c, o, k, _, groups = args
        return rng.standard_normal((1, h, h, c), "float32"), rng.standard_normal((o, k, k, c // groups), "float32")
    m, k, n = args
    return rng.standard_normal((m, k), "float32"), rng.standard_normal((k, n), "float32")


def _module(kind: str, args):
    """The case as a Relax module with constant weights (NHWC / OHWI conv2d, or matmul)."""
    from tvm import relax

    x, w = _arrays(kind, args)
    bb = relax.BlockBuilder()
    data = relax.Var("data", relax.TensorType(x.shape, "float32"))
    with bb.function("main", [data]):
        with bb.dataflow():
            if kind == "conv":
                _, _, _, k, stride, groups = args
                call = relax.op.nn.conv2d(
                    data, relax.const(w), stride, k // 2, 1, groups, data_layout="NHWC", kernel_layout="OHWI"
                )
            else:
                call = relax.op.matmul(data, relax.const(w))
            out = bb.emit_output(call)
        bb.emit_func_output(out)
    return bb.get(), x


# --- runners, made in each contender's timing process ---------------------------------


def accel_runner(kind: str, args, mcpu: str | None = None):
    import accel_target
    from accel_target.benchmark import target_for
    from accel_target.timing import vm_runner

    mod, x = _module(kind, args)
    return vm_runner(accel_target.build(mod, target=target_for(mcpu)), [x])


def stock_tvm_runner(kind: str, args, mcpu: str | None = None):
    import tvm
    from tvm import relax

    mod, x = _module(kind, args)  # (TVM alone: importing accel_target would set TVM's pool knobs)
    target = tvm.target.Target({"kind": "llvm", "mcpu": mcpu} if mcpu else "llvm")
    main = relax.VirtualMachine(tvm.compile(mod, target=target), tvm.cpu())["main"]
    data = tvm.runtime.tensor(x)
    return lambda: main(data)


def torch_runner(kind: str, args, mcpu: str | None = None):  # (held to AVX2 by its process's environment)
    import torch

    x, w = _arrays(kind, args)
    _, _, _, k, stride, groups = args
    xt, wt = torch.from_numpy(x).permute(0, 3, 1, 2), torch.from_numpy(w).permute(0, 3, 1, 2)
    assert xt.is_contiguous(memory_format=torch.channels_last)

    def run():
        with torch.inference_mode():
            torch.nn.functional.conv2d(xt, wt, stride=stride, padding=k // 2, groups=groups)

    return run


def numpy_runner(kind: str, args, mcpu: str | None = None):  # (likewise)
    x, w = _arrays(kind, args)
    return lambda: x @ w


# --- the table -------------------------------------------------------------------------


def ratio_table(times: dict[str, dict[str, list[float]]], ups: dict[str, dict[str, float]]) -> str:
    """Markdown: one row per shape, median ms of each contender (`times`: each round's), accel's
    speed-up over each (`ups`); then the geometric mean of the speed-ups per family."""
    names = [n for n in CONTENDERS if n != "accel" and any(n in g for g in times.values())]
    lines = [
        "| shape | accel ms | "
        + " | ".join(f"{n} ms" for n in names)
        + " | "
        + " | ".join(f"vs {n}" for n in names)
        + " |",
        "|---" * (2 + 2 * len(names)) + "|",
    ]
    for group, rounds in times.items():
        cells = [f"{np.median(rounds[n]):.3f}" if n in rounds else "" for n in names]
        ratios = [f"{ups[group][n]:.2f}x" if n in rounds else "" for n in names]
        lines.append(f"| {group} | {np.median(rounds['accel']):.3f} | " + " | ".join(cells + ratios) + " |")
    lines += [
        "",
        "| family | shapes | " + " | ".join(f"geomean vs {n}" for n in names) + " |",
        "|---" * (2 + len(names)) + "|",
    ]
    for family, members in families(ups).items():
        means = []
        for n in names:
            ratios = [member[n] for member in members if n in member]
            means.append(f"{math.exp(sum(map(math.log, ratios)) / len(ratios)):.2f}x" if ratios else "")
        lines.append(f"| {family} | {len(members)} | " + " | ".join(means) + " |")
    return "\n".join(lines)


def families(groups: dict) -> dict:
    """Shape groups by family: the group name's first word without its kernel size (conv, depthwise, dense)."""
    out: dict[str, list] = {}
    for group, times in groups.items():
        word = group.split()[0].split("/")[0].rstrip("0123456789x")
        out.setdefault(word, []).append(times)
    return out


def plot_speedups(groups: dict[str, dict[str, float]], path: str, title: str) -> None:
    """Bar chart of accel's speed-up over each contender, per shape (log scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    others = [n for n in CONTENDERS if n != "accel" and any(n in g for g in groups.values())]
    fig, ax = plt.subplots(figsize=(max(9, 0.3 * len(groups)), 4.5))
    width = 0.8 / len(others)
    for i, other in enumerate(others):
        ratios = [g.get(other, float("nan")) for g in groups.values()]
        ax.bar([x + i * width for x in range(len(groups))], ratios, width, label=f"vs {other}")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_yscale("log")
    ax.set_ylabel("accel speed-up (log)")
    ticks = [x + width * (len(others) - 1) / 2 for x in range(len(groups))]
    ax.set_xticks(ticks, list(groups), rotation=70, ha="right", fontsize=6)
    ax.set_title(title, fontsize=7)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="turns per contender and shape (default 3)")
    parser.add_argument("--repeat", type=int, default=20, help="timed runs per turn (default 20)")
    parser.add_argument("--only", default="", help="shapes whose name contains this text (default: all)")
    parser.add_argument("--no-stock-tvm", action="store_true", help="skip stock TVM (the slowest contender)")
    parser.add_argument(
        "--mcpu",
        help="build accel and stock TVM for this LLVM CPU; haswell holds PyTorch (oneDNN, ATen, MKL) and numpy "
        "(OpenBLAS) to AVX2 too: AVX2 figures on an AVX-512 host",
    )
    args = parser.parse_args()

    sys.path.insert(0, HERE)
    import cpuid_cap
    import fma_peak
    import torch
    import tvm

    import accel_target
    from accel_target.benchmark import isa, target_for
    from accel_target.timing import TimingProcess, speedups, turn_order

    threads = int(os.environ.get("ACCEL_BENCH_THREADS", accel_target.host_cores()))
    contenders = {n: kinds for n, kinds in CONTENDERS.items() if not (args.no_stock_tvm and n == "stock_tvm")}
    avx2 = args.mcpu is not None and isa(target_for(args.mcpu)) == "avx2"
    env = {"torch": cpuid_cap.AVX2_ENV, "numpy": NUMPY_AVX2_ENV} if avx2 else {}
    host_before = fma_peak.tile_shares(threads)
    processes = {name: TimingProcess(name, threads, [HERE], env.get(name)) for name in contenders}
    cases = [(group, kind, case) for group, kind, case in CASES if args.only in group]
    times: dict[str, dict[str, list[float]]] = {group: {} for group, _, _ in cases}
    try:
        # every shape in every round: a slow spell of the machine spoils one round of a few
        # shapes, which their medians drop, rather than every round of one shape
        for turn in range(args.rounds):
            for group, kind, case in cases:
                for name in turn_order([n for n, kinds in contenders.items() if kind in kinds], turn):
                    runner = f"bench_kernels:{name}_runner"
                    spec = {"kind": "call", "function": runner, "args": [kind, list(case), args.mcpu]}
                    repeat = STOCK_REPEAT if name == "stock_tvm" else args.repeat
                    times[group].setdefault(name, []).append(processes[name].median_ms(spec, repeat))
                cells = ", ".join(f"{n} {t[-1]:.3f}" for n, t in times[group].items())
                print(f"[bench] round {turn + 1}, {group}: {cells} ms", file=sys.stderr, flush=True)
    finally:
        for process in processes.values():
            process.close()
    ups = {group: speedups(rounds) for group, rounds in times.items()}
    host = fma_peak.host_note(host_before, fma_peak.tile_shares(threads))
    header = (
        f"{threads} threads for every contender, each in a process of its own, taking turns shape by shape, "
        f"every shape in every round: median of {args.rounds} rounds' medians of {args.repeat} runs "
        f"({STOCK_REPEAT} for stock TVM), speed-ups the median of the rounds' speed-ups; "
        f"CPU {accel_target.machine()}; apache-tvm {tvm.__version__}, torch {torch.__version__}, "
        f"numpy {np.__version__}{cpuid_cap.note()}{host}"
    )
    if args.mcpu:
        header += f"; accel and stock TVM built for mcpu={args.mcpu}"
        header += "; PyTorch and numpy held to AVX2 by their own switches" if avx2 else ""
    legend = "'vs X' = X's time / accel's in the same round, median over rounds (above 1: accel is faster)"
    text = f"{header}\n\n{ratio_table(times, ups)}\n\n{legend}\n"
    print(text)
    if args.only:  # a subset does not replace the tables
        return 0
    results = os.path.join(HERE, "results", isa(target_for(args.mcpu)))
    os.makedirs(results, exist_ok=True)
    with open(os.path.join(results, "kernels.md"), "w", encoding="utf-8") as f:
        f.write(f"# kernels\n\n{text}")
    plot_speedups(ups, os.path.join(results, "kernels.png"), header)
    return 0


if __name__ == "__main__":
    sys.exit(main())
