"""The benchmark driver: every contender in a process of its own, round after round, the results
merged into benchmarks/results/<isa>/<suite>.json.

    python benchmarks/run.py models --contenders accel,torch,inductor,onnxruntime --rounds 10 --threads 2
    python benchmarks/run.py kernels | int8 | coexistence | zoo [options]
    python benchmarks/run.py ab --base REV [--suite models] [--models resnet50,mobilenet_v2] --rounds 20

A suite is a pytest module (benchmarks/test_<suite>.py) whose cases every contender runs. First
a build pass: one pytest process per contender builds every case into the cache
(contenders.py), checks its output against PyTorch's and records what it could not run. Then
`--rounds` rounds: in each, for each case (the kernels: all cases at once), one pytest process
per contender, in an order that rotates from round to round (`turn_order`), each timing
`--calls` calls (pytest-benchmark's ``pedantic``) into a JSON file of its own. A contender's
time in a round is the median of its calls; report.py takes the median of those, and a ratio
as the median of the per-round ratios.

``ab`` times the "accel" contender of a git worktree of REV ("accel@REV") against this
checkout's ("accel"), each in a process of its own every round, and prints the new/old time
ratios; results/<isa>/ab.json.

<isa> (avx512, avx2, sse) is the widest vectors of accel's target: the host's, or with
``--mcpu haswell`` AVX2 code, with PyTorch and numpy held to AVX2 by their own switches (ONNX
Runtime picks its kernels by CPUID and has no switch: the JSON says so).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile

import contenders  # benchmarks/, beside this script

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results")
INI = os.path.join(HERE, "pytest.ini")
ALL = contenders.CONTENDERS


@dataclasses.dataclass(frozen=True)
class Suite:
    module: str
    contenders: tuple[str, ...]  # the default ones
    per_case: bool = True  # a process per case; else all cases in one process a round
    calls: int = 20

    def group(self, case: str) -> str:
        """The cases timed in one process: one case (coexistence: a model, alone and after)."""
        if not self.per_case:
            return "all"
        return case.rsplit("-", 1)[0] if self.module == "test_coexistence.py" else case


SUITES = {
    "models": Suite("test_models.py", ("accel", "torch", "inductor", "onnxruntime")),
    "kernels": Suite("test_kernels.py", ("accel", "torch", "onnxruntime"), per_case=False),
    "int8": Suite("test_int8.py", ("accel", "onnxruntime")),
    "coexistence": Suite("test_coexistence.py", ("accel", "onnxruntime", "torch"), calls=21),
    "zoo": Suite("test_zoo.py", ("accel", "torch", "onnxruntime")),
}
# --mcpu haswell on a wider host: PyTorch (oneDNN, ATen, MKL) and numpy (OpenBLAS) held to AVX2
AVX2_ENV = {
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    "OPENBLAS_CORETYPE": "Haswell",
}
# flags of /proc/cpuinfo worth recording: what the contenders' kernels choose from
FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx_vnni")
FLAGS += ("avx512_bf16", "avx512_fp16", "amx_tile", "amx_int8", "amx_bf16")
PACKAGES = ("apache-tvm", "torch", "onnxruntime", "onnx", "numpy", "pytest-benchmark")


def log(message: str) -> None:
    print(f"[run] {message}", file=sys.stderr, flush=True)


def turn_order(names: list[str], number: int) -> list[str]:
    """The contenders' turns in round `number` (from 0): `names` rotated left by `number`, and
    reversed in every other block of ``len(names)`` rounds, so that each contender goes first
    once a block and follows each other one in both orders."""
    start = number % len(names)
    order = names[start:] + names[:start]
    return order[::-1] if number // len(names) % 2 else order


# --- facts -----------------------------------------------------------------------------


def machine() -> dict:
    """The CPU's model name, the flags of FLAGS it has, and its CPUs (from /proc/cpuinfo)."""
    name, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and name in ("", platform.processor(), platform.machine()):
                    name = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    return {"cpu": name, "flags": [f for f in FLAGS if f in flags], "cpus": os.cpu_count()}


def versions() -> dict:
    found = {"python": platform.python_version()}
    for package in PACKAGES:
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pass
    return found


def revision(root: str) -> dict:
    """The commit of `root` and whether its tree differs from it."""
    git = ["git", "-C", root]
    commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    status = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
    return {"commit": commit, "dirty": bool(status.stdout.strip())}


_TARGET_FACTS = """
import json, sys
import tvm
import accel_target
from topi_accel.knobs import vector_bits
target = tvm.target.Target({"tag": "accel", "mcpu": sys.argv[1]} if sys.argv[1] else "accel")
print(json.dumps({"bits": vector_bits(target), "mcpu": str(target.attrs.get("mcpu", ""))}))
"""


def target_facts(mcpu: str | None) -> dict:
    """{"isa": avx512 / avx2 / sse, "mcpu": LLVM CPU} of accel's target (this checkout's), read
    in a process of its own."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", _TARGET_FACTS, mcpu or ""], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"reading accel's target failed (import accel_target from {ROOT}):\n{done.stderr[-3000:]}")
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    return {"isa": {512: "avx512", 256: "avx2"}.get(facts["bits"], "sse"), "mcpu": facts["mcpu"]}


def host_isa(flags: list[str]) -> str:
    return "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else "sse"


# --- pytest processes ------------------------------------------------------------------


def collect(suite: Suite) -> list[tuple[str, str]]:
    """(node id, case) of every test of `suite`."""
    command = [sys.executable, "-m", "pytest", "-c", INI, "--rootdir", HERE, "--collect-only", "-q", suite.module]
    done = subprocess.run(command, cwd=HERE, capture_output=True, text=True)
    nodes = [line.strip() for line in done.stdout.splitlines() if line.startswith(suite.module + "::")]
    if done.returncode not in (0, 5):  # 5: nothing collected
        raise SystemExit(f"collecting {suite.module} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return [(n, n[n.index("[") + 1 : -1]) for n in nodes if n.endswith("]") and not n.endswith("[NOTSET]")]


def pytest_run(nodes, contender, root, args, env, log_path, extra=()) -> int:
    """One pytest process: `contender` (accel from the checkout `root`) on `nodes`."""
    command = [sys.executable, "-m", "pytest", "-c", INI, "--rootdir", HERE, "-q", *nodes]
    command += ["--contender", contender, "--threads", str(args.threads), "--calls", str(args.calls)]
    command += ["--warmup", str(args.warmup), "--bench-cache", args.cache, *extra]
    command += ["--mcpu", args.mcpu] if args.mcpu else []
    process_env = dict(env)
    if root:
        command += ["--accel-root", root]
        process_env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    with open(log_path, "a", encoding="utf-8") as out:
        out.write(f"$ {shlex.join(command)}\n")
        out.flush()
        return subprocess.run(command, cwd=HERE, env=process_env, stdout=out, stderr=subprocess.STDOUT).returncode


def _read_json(path: str) -> dict:
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def measure(suite: Suite, labels: dict[str, tuple[str, str | None]], args, env, raw: str) -> dict:
    """Build pass, then `args.rounds` rounds; the merged results of every (case, label)."""
    wanted = set(args.models or [])
    nodes = [(n, case) for n, case in collect(suite) if not wanted or {case, suite.group(case)} & wanted]
    if not nodes:
        raise SystemExit(f"{suite.module}: no cases to run (--models {','.join(args.models or [])})")
    results = {case: {} for _, case in nodes}
    for label, (contender, root) in labels.items():
        log(f"build pass: {label} on {len(nodes)} case(s)")
        outcomes_path = os.path.join(raw, f"build-{label}.json")
        extra = ["--build-only", "--benchmark-disable", "--outcomes", outcomes_path]
        pytest_run([n for n, _ in nodes], contender, root, args, env, os.path.join(raw, "build.log"), extra)
        outcomes = _read_json(outcomes_path)
        for _, case in nodes:
            entry = outcomes.get(case, {"outcome": "failed", "message": f"no outcome: see {raw}/build.log"})
            if entry["outcome"] == "passed":
                results[case][label] = {"ms": [None] * args.rounds, "info": entry.get("info", {})}
            else:
                results[case][label] = {entry["outcome"]: entry.get("message", "")}
                log(f"  {label} {entry['outcome']} on {case}: {entry.get('message', '')}")
    groups: dict[str, list[tuple[str, str]]] = {}
    for node, case in nodes:
        groups.setdefault(suite.group(case), []).append((node, case))
    orders = []
    for number in range(args.rounds):
        order = turn_order(list(labels), number)
        orders.append(order)
        for group, members in groups.items():
            for label in order:
                mine = [(n, c) for n, c in members if "ms" in results[c][label]]
                if not mine:
                    continue
                path = os.path.join(raw, f"r{number:03d}-{label}-{group}.json".replace("/", "_"))
                code = pytest_run(
                    [n for n, _ in mine], labels[label][0], labels[label][1], args, env,
                    os.path.join(raw, "rounds.log"), ["--benchmark-json", path],
                )  # fmt: skip
                for bench in _read_json(path).get("benchmarks", []):
                    results[bench["param"]][label]["ms"][number] = float(f"{bench['stats']['median'] * 1e3:.6g}")
                times = ", ".join(f"{c} {results[c][label]['ms'][number]}" for _, c in mine)
                log(f"round {number + 1}/{args.rounds} {label}: {times} ms" + (f" (exit code {code})" if code else ""))
    return {"results": results, "orders": orders}


# options that say where files go, not what is measured: left out of the recorded command
LOCAL_OPTIONS = ("--out", "--keep-raw", "--cache")


def command_line(argv: list[str]) -> str:
    """The run.py command that measured, without LOCAL_OPTIONS."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in LOCAL_OPTIONS:
            skip = True
        elif not arg.startswith(tuple(f"{option}=" for option in LOCAL_OPTIONS)):
            kept.append(arg)
    return shlex.join(["python", "benchmarks/run.py", *kept])


def environment(args, facts: dict, host: dict) -> tuple[dict, dict | None]:
    """The contenders' environment (threads; AVX2 switches where accel is built for AVX2 on a
    wider host) and what was held (None: nothing)."""
    env = {**os.environ, **contenders.threads_env(args.threads)}
    held = None
    if args.mcpu and facts["isa"] != host_isa(host["flags"]):
        env.update(AVX2_ENV if facts["isa"] == "avx2" else {})
        held = {"env": AVX2_ENV if facts["isa"] == "avx2" else {}, "not held": "onnxruntime (CPUID)"}
    return env, held


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("suite", choices=[*SUITES, "ab"])
    parser.add_argument("--contenders", help=f"comma-separated, of {', '.join(ALL)} (default: the suite's)")
    parser.add_argument("--models", help="comma-separated cases to run (default: all of the suite's)")
    parser.add_argument("--rounds", type=int, help="rounds of every contender (default 10; ab 20)")
    parser.add_argument("--threads", type=int, default=2, help="threads of every runtime (default 2)")
    parser.add_argument("--calls", type=int, help="timed calls a process (default 20; coexistence 21)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed calls before them, at least (default 5)")
    parser.add_argument("--mcpu", help="build accel (and stock TVM) for this LLVM CPU: haswell gives AVX2 results")
    parser.add_argument("--base", help="ab: the git revision to compare this checkout with")
    parser.add_argument("--suite", dest="ab_suite", default="models", choices=SUITES, help="ab: the suite (models)")
    parser.add_argument("--cache", default=None, help="the build cache (default ~/.cache/accel_bench)")
    parser.add_argument("--out", help="the results file (default results/<isa>/<suite>.json)")
    parser.add_argument("--keep-raw", metavar="DIR", help="keep each process's JSON and the logs in DIR")
    args = parser.parse_args(argv)
    suite = SUITES[args.ab_suite if args.suite == "ab" else args.suite]
    args.rounds = args.rounds or (20 if args.suite == "ab" else 10)
    args.calls = args.calls or suite.calls
    args.cache = args.cache or contenders.CACHE
    args.models = args.models.split(",") if args.models else None
    if args.rounds < 1 or args.calls < 1:
        parser.error("--rounds and --calls must be at least 1")
    worktree = None
    if args.suite == "ab":
        if not args.base:
            parser.error("ab needs --base REV")
        worktree = tempfile.mkdtemp(prefix="accel_ab_")
        subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", worktree, args.base], check=True)
        labels = {f"accel@{args.base}": ("accel", worktree), "accel": ("accel", ROOT)}
    else:
        names = args.contenders.split(",") if args.contenders else list(suite.contenders)
        unknown = sorted(set(names) - set(ALL))
        if unknown:
            parser.error(f"unknown contenders {unknown}; the contenders: {', '.join(ALL)}")
        labels = {name: (name, ROOT if name in ("accel", "accel-dynamo") else None) for name in names}
    raw = args.keep_raw or tempfile.mkdtemp(prefix="accel_bench_raw_")
    os.makedirs(raw, exist_ok=True)
    try:
        host, facts = machine(), target_facts(args.mcpu)
        env, held = environment(args, facts, host)
        log(f"{suite.module}: {', '.join(labels)}; {args.rounds} rounds, {args.threads} threads; isa {facts['isa']}")
        merged = measure(suite, labels, args, env, raw)
        data = {
            "suite": args.suite,
            "isa": facts["isa"],
            "command": command_line(sys.argv[1:] if argv is None else argv),
            "threads": args.threads,
            "rounds": args.rounds,
            "calls": args.calls,
            "mcpu": args.mcpu,
            "machine": {**host, "accel_mcpu": facts["mcpu"]},
            "held_to_isa": held,
            "versions": versions(),
            "revision": revision(ROOT),
            "contenders": list(labels),
            **({"base": {"rev": args.base, **revision(worktree)}, "ab_suite": args.ab_suite} if worktree else {}),
            **merged,
        }
    finally:
        if worktree:
            subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", worktree], check=False)
            shutil.rmtree(worktree, ignore_errors=True)
        if not args.keep_raw:
            shutil.rmtree(raw, ignore_errors=True)
    out = args.out or os.path.join(RESULTS, facts["isa"], f"{args.suite}.json")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    log(f"wrote {out}")
    import report

    print(report.table(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
