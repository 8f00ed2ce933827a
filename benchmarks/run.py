"""Every benchmark in one command: the kernel tables, the whole models and the model zoo of
the tests.

    python benchmarks/run.py [bench_models.py options, e.g. --no-stock-tvm]

Writes benchmarks/results/<isa>/{kernels,models}.{md,png} and zoo.md (<isa>: avx512, avx2
or sse, the host's widest vectors) and the results and zoo sections of
benchmarks/README.md; ACCEL_BENCH_THREADS sets the thread count for every contender
(default: every core for the kernels and models, 2 for the zoo). `--no-stock-tvm` applies
to the kernels and the zoo too. `python benchmarks/run.py --readme` only regenerates those sections from
the results already there.
"""

import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = ("models.md", "models_batch8.md", "kernels.md")
ISAS = {"avx512": "AVX-512", "avx2": "AVX2", "sse": "SSE (no AVX)"}
# README sections that this script fills: marker -> the files of benchmarks/results/<isa> they show
SECTIONS = {"results": RESULTS, "zoo": ("zoo.md",)}


def _section(marker: str) -> re.Pattern:
    """The README section between '<!-- marker: ... -->' and '<!-- /marker -->' (both kept as groups)."""
    return re.compile(rf"(<!-- {marker}:[^\n]*-->\n).*?(<!-- /{marker} -->)", re.DOTALL)


def _tables(names: tuple[str, ...]) -> str:
    """benchmarks/results/<isa>/<name> for every ISA with results, a heading per ISA, their
    own headings two levels down."""
    tables = []
    for isa, title in ISAS.items():
        paths = [os.path.join(HERE, "results", isa, name) for name in names]
        paths = [p for p in paths if os.path.isfile(p)]
        if not paths:
            continue
        tables.append(f"### {title}")  # (AVX2 figures may come from an AVX-512 host: --mcpu haswell)
        for path in paths:
            with open(path, encoding="utf-8") as f:
                tables.append(re.sub(r"^# ", "#### ", f.read().strip(), flags=re.MULTILINE))
    return "\n\n".join(tables)


def write_readme() -> None:
    """Put benchmarks/results/<isa>/{models,kernels}.md between the README's results markers
    and <isa>/zoo.md between its zoo markers."""
    readme = os.path.join(HERE, "README.md")
    with open(readme, encoding="utf-8") as f:
        text = f.read()
    for marker, names in SECTIONS.items():
        section = _section(marker)
        if not section.search(text):
            raise SystemExit(f"{readme}: no '<!-- {marker}: ... -->' ... '<!-- /{marker} -->' section to fill")
        body = _tables(names)
        text = section.sub(lambda m, body=body: f"{m.group(1)}\n{body}\n\n{m.group(2)}", text)
    with open(readme, "w", encoding="utf-8") as f:
        f.write(text)


def main() -> int:
    root = os.path.dirname(HERE)
    if {"-h", "--help"} & set(sys.argv[1:]):
        print(__doc__)
        return subprocess.run([sys.executable, os.path.join(HERE, "bench_models.py"), "--help"], cwd=root).returncode
    if sys.argv[1:] == ["--readme"]:
        write_readme()
        return 0
    no_stock = ["--no-stock-tvm"] if "--no-stock-tvm" in sys.argv[1:] else []
    kernels = subprocess.run([sys.executable, os.path.join(HERE, "bench_kernels.py"), *no_stock], cwd=root)
    models = subprocess.run([sys.executable, os.path.join(HERE, "bench_models.py"), *sys.argv[1:]], cwd=root)
    zoo = subprocess.run([sys.executable, os.path.join(HERE, "bench_zoo.py"), *no_stock], cwd=root)
    write_readme()
    return kernels.returncode or models.returncode or zoo.returncode


if __name__ == "__main__":
    sys.exit(main())
