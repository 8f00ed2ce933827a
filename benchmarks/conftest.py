"""Benchmark setup: every contender on the same thread count, shape by shape; a ratio table at the end.

The thread count is ACCEL_BENCH_THREADS (default: every core); it is applied
before anything starts a thread pool: TVM (TVM_NUM_THREADS), PyTorch
(set_num_threads) and numpy's OpenBLAS (threadpoolctl).
"""

import math
import os

import cpuid_cap

import accel_target
from accel_target.benchmark import isa

THREADS = int(os.environ.get("ACCEL_BENCH_THREADS", accel_target.host_cores()))
os.environ["TVM_NUM_THREADS"] = str(THREADS)


import pytest  # noqa: E402
import threadpoolctl  # noqa: E402
import torch  # noqa: E402
import tvm  # noqa: E402

torch.set_num_threads(THREADS)
threadpoolctl.threadpool_limits(THREADS)

RESULTS = os.path.join(os.path.dirname(__file__), "results", isa())  # one folder per vector ISA


def pytest_collection_modifyitems(items):
    """Run the contenders of one shape one after the other (accel, stock TVM, PyTorch or
    numpy), shape by shape: a noisy spell on this shared machine then falls on one shape's
    contenders alike, not on one contender's every shape."""

    def shape(item) -> str:
        return getattr(getattr(item, "callspec", None), "id", item.nodeid)

    first_seen: dict[str, int] = {}
    for item in items:
        first_seen.setdefault(shape(item), len(first_seen))
    items.sort(key=lambda item: first_seen[shape(item)])


def machine_line() -> str:
    return (
        f"{THREADS} threads for every contender; CPU {accel_target.machine()}; apache-tvm {tvm.__version__}, "
        f"torch {torch.__version__}, numpy {__import__('numpy').__version__}{cpuid_cap.note()}"
    )


def _median_ms(benchmarks) -> dict[str, dict[str, float]]:
    """{shape group: {contender: median ms}}; tests are test_<contender>[...] or test_<contender>_dense[...]."""
    groups: dict[str, dict[str, float]] = {}
    for bench in benchmarks:
        contender = bench.name.split("[")[0].removeprefix("test_").removesuffix("_dense")
        groups.setdefault(bench.group, {})[contender] = bench.stats.median * 1e3
    return groups


def ratio_table(benchmarks) -> str:
    """Markdown: one row per group, median ms of each contender, accel's speed-up over each."""
    groups = _median_ms(benchmarks)
    names = sorted({c for g in groups.values() for c in g} - {"accel"})
    lines = [
        "| shape | accel ms | "
        + " | ".join(f"{n} ms" for n in names)
        + " | "
        + " | ".join(f"vs {n}" for n in names)
        + " |",
        "|---" * (2 + 2 * len(names)) + "|",
    ]
    for group, times in groups.items():
        accel = times.get("accel")
        cells = [f"{times[n]:.3f}" if n in times else "" for n in names]
        ratios = [f"{times[n] / accel:.2f}x" if n in times and accel else "" for n in names]
        lines.append(
            f"| {group} | {'' if accel is None else f'{accel:.3f}'} | "
            + " | ".join(cells)
            + " | "
            + " | ".join(ratios)
            + " |"
        )
    lines += [
        "",
        "| family | shapes | " + " | ".join(f"geomean vs {n}" for n in names) + " |",
        "|---" * (2 + len(names)) + "|",
    ]
    for family, members in families(groups).items():
        means = []
        for n in names:
            ratios = [t[n] / t["accel"] for t in members if n in t and "accel" in t]
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


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter, config):
    session = getattr(config, "_benchmarksession", None)
    if session is None or not session.benchmarks:
        return
    table = ratio_table(session.benchmarks)
    text = f"{machine_line()}\n\n{table}\n\n'vs X' = X's median time / accel's (above 1: accel is faster)\n"
    terminalreporter.write_line("")
    terminalreporter.write_line(text)
    os.makedirs(RESULTS, exist_ok=True)
    name = os.environ.get("ACCEL_BENCH_RESULT", "kernels")
    with open(os.path.join(RESULTS, f"{name}.md"), "w") as f:
        f.write(f"# {name}\n\n{text}")
    plot_speedups(session.benchmarks, os.path.join(RESULTS, f"{name}.png"))


def plot_speedups(benchmarks, path: str) -> None:
    """Bar chart of accel's speed-up over each contender, per shape (log scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = _median_ms(benchmarks)
    others = sorted({c for g in groups.values() for c in g} - {"accel"})
    fig, ax = plt.subplots(figsize=(max(9, 0.3 * len(groups)), 4.5))
    width = 0.8 / len(others)
    for i, other in enumerate(others):
        ratios = [g[other] / g["accel"] if other in g and "accel" in g else float("nan") for g in groups.values()]
        ax.bar([x + i * width for x in range(len(groups))], ratios, width, label=f"vs {other}")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_yscale("log")
    ax.set_ylabel("accel speed-up (log)")
    ax.set_xticks(
        [x + width * (len(others) - 1) / 2 for x in range(len(groups))],
        list(groups),
        rotation=70,
        ha="right",
        fontsize=6,
    )
    ax.set_title(machine_line(), fontsize=7)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
