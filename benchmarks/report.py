"""Markdown tables from benchmarks/results/<isa>/<suite>.json, written into the marked sections of
benchmarks/README.md and README.md, so that a table never drifts from its data.

    python benchmarks/report.py                  # rewrite every marked section of both files
    python benchmarks/report.py --check          # exit 1 where a section is not what its data gives
    python benchmarks/report.py --print models   # one section's markdown, to stdout (ab: the A/B)

A section runs from ``<!-- results:NAME -->`` to ``<!-- /results:NAME -->``; NAME is a suite
(every ISA with results, a table each) or ``SUITE/ISA`` (one table), e.g. ``models/avx512``.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import re
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
FILES = (os.path.join(HERE, "README.md"), os.path.join(os.path.dirname(HERE), "README.md"))
ISAS = {"avx512": "AVX-512", "avx2": "AVX2", "sse": "SSE"}
NAMES = {
    "tvm": "stock TVM",
    "torch": "PyTorch",
    "inductor": "torch.compile",
    "accel-dynamo": "torch.compile(accel)",
    "onnxruntime": "ONNX Runtime",
}
SECTION = re.compile(r"(<!-- results:([\w/.-]+) -->\n).*?(<!-- /results:\2 -->)", re.DOTALL)


def _name(label: str) -> str:
    return NAMES.get(label, label)


def _ms(value: float | None) -> str:
    if value is None:
        return ""
    decimals = 0 if value >= 100 else 1 if value >= 10 else 2 if value >= 1 else 3  # three digits or more
    return f"{value:.{decimals}f}"


def _median(values) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def per_round(num: list, den: list) -> list[float]:
    """num[r] / den[r] for every round where both were timed."""
    return [a / b for a, b in zip(num, den) if a is not None and b]


def _ratio(values: list[float]) -> str:
    """The median of per-round ratios, with the lowest and highest round's in brackets."""
    if not values:
        return ""
    middle = f"{statistics.median(values):.2f}x"
    return middle if len(values) == 1 else f"{middle} ({min(values):.2f}-{max(values):.2f})"


def _first_column(data: dict) -> str:
    return "layer" if data.get("ab_suite", data["suite"]) == "kernels" else "model"


def _cell(entry: dict) -> str:
    if "ms" in entry:
        return _ms(_median(entry["ms"]))
    return "failed" if "failed" in entry else "n/a"


def _notes(data: dict) -> list[str]:
    """A line for each contender that failed on or could not run a case."""
    lines = []
    for case, entries in data["results"].items():
        for label, entry in entries.items():
            for what in ("failed", "skipped"):
                if what in entry:
                    lines.append(f"- {_name(label)}, {case}: {what}: {entry[what]}")
    return lines


def heading(data: dict) -> str:
    """What produced the table: the ISA, the CPU, threads, rounds and the command."""
    held = ""
    if data.get("held_to_isa"):
        switches = " ".join(f"{k}={v}" for k, v in data["held_to_isa"]["env"].items())
        held = f"; PyTorch and numpy held to {ISAS[data['isa']]} ({switches}), ONNX Runtime not (it reads CPUID)"
    return (
        f"**{ISAS.get(data['isa'], data['isa'])}** ({data['machine']['cpu']}, accel built for "
        f"{data['machine'].get('accel_mcpu') or 'the host'}), {data['threads']} threads, {data['rounds']} "
        f"round{'s' * (data['rounds'] != 1)} of {data['calls']} calls{held}:\n`{data['command']}`"
    )


def speedup_table(data: dict) -> str:
    """One row per case: each contender's ms, accel's speed-up over each of the others."""
    labels = data["contenders"]
    base = "accel" if "accel" in labels else labels[0]
    others = [label for label in labels if label != base]
    builds = {case: e.get(base, {}).get("info", {}).get("build_s") for case, e in data["results"].items()}
    timed_builds = any(b is not None for b in builds.values())
    rows = [
        f"| {_first_column(data)} | " + " | ".join(f"{_name(c)} ms" for c in labels) + " | "
        + " | ".join(f"vs {_name(c)}" for c in others) + " |" + f" {_name(base)} build s |" * timed_builds,
        "|---" + "|---:" * (len(labels) + len(others) + timed_builds) + "|",
    ]  # fmt: skip
    speedups: dict[str, list[float]] = {c: [] for c in others}
    for case, entries in data["results"].items():
        ours = entries.get(base, {}).get("ms")
        cells = []
        for other in others:
            theirs = entries.get(other, {}).get("ms")
            ratios = per_round(theirs, ours) if ours and theirs else []
            if ratios:
                speedups[other].append(statistics.median(ratios))
            cells.append(_ratio(ratios))
        if timed_builds:
            cells.append("" if builds[case] is None else f"{builds[case]:.1f}")
        rows.append(f"| {case} | " + " | ".join([_cell(entries.get(c, {})) for c in labels] + cells) + " |")
    if len(data["results"]) > 2 and any(speedups.values()):
        means = [f"{math.exp(statistics.fmean(map(math.log, s))):.2f}x" if s else "" for s in speedups.values()]
        rows.append("| " + " | ".join(["geometric mean", *[""] * len(labels), *means, *[""] * timed_builds]) + " |")
    legend = (
        f"ms: the median over rounds of each round's median. vs X: X's time / {_name(base)}'s in the same "
        "round, the median over rounds (lowest-highest round in brackets); above 1: "
        f"{_name(base)} is faster."
    )
    if timed_builds:
        legend += f" build s: {_name(base)}'s import and build, in seconds (blank: loaded from the run's cache)."
    return "\n".join(rows) + "\n\n" + legend


def coexistence_table(data: dict) -> str:
    """One row per model: each runtime's ms alone and after the other libraries' work, its
    slowdown (after / alone, per round), and accel's slowdown over the others'."""
    labels = data["contenders"]
    models = list(dict.fromkeys(case.rsplit("-", 1)[0] for case in data["results"]))
    others = [label for label in labels if label != "accel"] if "accel" in labels else []
    head = " | ".join(f"{_name(c)} alone ms | after ms | slowdown" for c in labels)
    rows = ["| model | " + head + "".join(f" | accel's slowdown / {_name(c)}'s" for c in others) + " |"]
    rows.append("|---" + "|---:" * (3 * len(labels) + len(others)) + "|")
    for model in models:
        alone, after = data["results"].get(f"{model}-alone", {}), data["results"].get(f"{model}-after", {})
        slow, cells = {}, []
        for label in labels:
            a, b = alone.get(label, {}).get("ms"), after.get(label, {}).get("ms")
            slow[label] = [x / y if x is not None and y else None for x, y in zip(b, a)] if a and b else []
            ratios = [v for v in slow[label] if v is not None]
            cells += [_cell(alone.get(label, {})), _cell(after.get(label, {})), _ratio(ratios)]
        cells += [_ratio(per_round(slow["accel"], slow[c])) for c in others]
        rows.append(f"| {model} | " + " | ".join(cells) + " |")
    legend = (
        "alone: calls back to back; after: each call right after a 512x512 numpy product and a PyTorch conv "
        "(benchmarks/coexistence.py). slowdown: after / alone in the same process, the median over rounds "
        "(lowest-highest round in brackets)."
    )
    return "\n".join(rows) + "\n\n" + legend


def ab_table(data: dict) -> str:
    """One row per case: the base revision's ms, this checkout's, and new / old per round."""
    old, new = data["contenders"]
    rows = [f"| {_first_column(data)} | {old} ms | {new} ms | new / old |", "|---|---:|---:|---:|"]
    for case, entries in data["results"].items():
        a, b = entries.get(old, {}), entries.get(new, {})
        ratio = _ratio(per_round(b["ms"], a["ms"])) if "ms" in a and "ms" in b else ""
        rows.append(f"| {case} | {_cell(a)} | {_cell(b)} | {ratio} |")
    legend = "new / old: this checkout's time / the base's in the same round, median over rounds; below 1: faster."
    return "\n".join(rows) + "\n\n" + legend


def table(data: dict) -> str:
    """The markdown of one results file: heading, table, legend, failures."""
    make = {"coexistence": coexistence_table, "ab": ab_table}.get(data["suite"], speedup_table)
    notes = _notes(data)
    return heading(data) + "\n\n" + make(data) + ("\n\n" + "\n".join(notes) if notes else "")


def load(name: str) -> list[dict]:
    """The results of section NAME (a suite, or SUITE/ISA), widest ISA first."""
    suite, _, isa = name.partition("/")
    found = []
    for key in ISAS if not isa else [isa]:
        path = os.path.join(RESULTS, key, f"{suite}.json")
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
            if not isinstance(data, dict) or "results" not in data:
                raise SystemExit(f"report: {os.path.relpath(path)} is not a results file of benchmarks/run.py")
            found.append(data)
    return found


def section(name: str) -> str:
    tables = [table(data) for data in load(name)]
    suite = name.partition("/")[0]
    return "\n\n".join(tables) if tables else f"No results yet: `python benchmarks/run.py {suite}`."


def rewrite(text: str) -> str:
    return SECTION.sub(lambda m: f"{m.group(1)}\n{section(m.group(2))}\n\n{m.group(3)}", text)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 where a section is stale")
    parser.add_argument("--print", metavar="NAME", help="print section NAME (a suite, or SUITE/ISA) and stop")
    args = parser.parse_args(argv)
    if args.print:
        print(section(args.print))
        return 0
    known = {os.path.basename(os.path.dirname(p)) for p in glob.glob(os.path.join(RESULTS, "*", "*.json"))}
    unknown = sorted(known - set(ISAS))
    if unknown:
        print(f"report: results of unknown ISAs {unknown} are not shown", file=sys.stderr)
    stale = []
    for path in FILES:
        if not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8") as f:
            text = f.read()
        new = rewrite(text)
        if new != text:
            stale.append(os.path.relpath(path))
            if not args.check:
                with open(path, "w", encoding="utf-8") as f:
                    f.write(new)
    if stale:
        print(("stale: " if args.check else "rewrote: ") + ", ".join(stale), file=sys.stderr)
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
