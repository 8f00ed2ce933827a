"""Every benchmark in one command: the kernel tables (pytest-benchmark) and the whole models.

    python benchmarks/run.py [bench_models.py options, e.g. --no-stock-tvm]

Writes benchmarks/results/<isa>/{kernels,models}.{md,png} (<isa>: avx512, avx2 or
sse, the host's widest vectors) and the results section of benchmarks/README.md;
ACCEL_BENCH_THREADS sets the thread count for every contender (default: every core).
`python benchmarks/run.py --readme` only regenerates that section from the results
already there.
"""

import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = ("models.md", "kernels.md")
ISAS = {"avx512": "AVX-512", "avx2": "AVX2", "sse": "SSE (no AVX)"}
SECTION = re.compile(r"(<!-- results:[^\n]*-->\n).*?(<!-- /results -->)", re.DOTALL)


def write_readme() -> None:
    """Put benchmarks/results/<isa>/{models,kernels}.md between the README's results markers,
    a section per ISA with results, their headings two levels down."""
    tables = []
    for isa, title in ISAS.items():
        folder = os.path.join(HERE, "results", isa)
        if not os.path.isdir(folder):
            continue
        tables.append(f"### {title} host")
        for name in RESULTS:
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                tables.append(re.sub(r"^# ", "#### ", f.read().strip(), flags=re.MULTILINE))
    readme = os.path.join(HERE, "README.md")
    with open(readme, encoding="utf-8") as f:
        text = f.read()
    if not SECTION.search(text):
        raise SystemExit(f"{readme}: no '<!-- results: ... -->' ... '<!-- /results -->' section to fill")
    body = "\n\n".join(tables)
    with open(readme, "w", encoding="utf-8") as f:
        f.write(SECTION.sub(lambda m: f"{m.group(1)}\n{body}\n\n{m.group(2)}", text))


def main() -> int:
    root = os.path.dirname(HERE)
    if {"-h", "--help"} & set(sys.argv[1:]):
        print(__doc__)
        return subprocess.run([sys.executable, os.path.join(HERE, "bench_models.py"), "--help"], cwd=root).returncode
    if sys.argv[1:] == ["--readme"]:
        write_readme()
        return 0
    kernels = subprocess.run(
        [sys.executable, "-m", "pytest", os.path.join(HERE, "bench_kernels.py"), "-q", "-p", "no:cacheprovider"],
        cwd=root,
    )
    models = subprocess.run([sys.executable, os.path.join(HERE, "bench_models.py"), *sys.argv[1:]], cwd=root)
    write_readme()
    return kernels.returncode or models.returncode


if __name__ == "__main__":
    sys.exit(main())
