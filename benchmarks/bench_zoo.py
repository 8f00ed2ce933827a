"""The model zoo of the tests (tests/models/hf_zoo.py), batch 1: accel against PyTorch eager,
ONNX Runtime and stock TVM, each contender in a process of its own, on the same threads.

    python benchmarks/bench_zoo.py [--models vit,bert,...] [--threads 2] [--repeat 20] [--no-stock-tvm]

Writes benchmarks/results/<isa>/zoo.md (machine, threads, versions recorded). Every
contender imports the same random-weight model: accel and stock TVM through
accel_target.from_torch (stock TVM: ``tvm.compile(mod, "llvm")`` of that module), ONNX
Runtime through ``torch.onnx.export`` (where it works). accel's and stock TVM's outputs are
compared with PyTorch's; the script exits with 1 when accel's differs by more than 1e-4
or accel fails where stock TVM builds (it finishes the table first).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # the repository: tests.models.hf_zoo
CONTENDERS = ("accel", "PyTorch", "ONNX Runtime", "stock TVM")
ROUNDS = 5  # a contender's time: median of ROUNDS medians of --repeat runs
TOLERANCE = 1e-4


def _tvm_row(mod, reference, arrays, repeat: int, stock: bool) -> dict:
    """Build with accel (or stock TVM), check against PyTorch, time."""
    import tvm

    import accel_target
    from accel_target.benchmark import max_rel_error, median_ms, median_of_medians, vm_runner

    started = time.perf_counter()
    executable = tvm.compile(mod, target="llvm") if stock else accel_target.build(mod)
    row = {"compile s": time.perf_counter() - started}
    run = vm_runner(executable, arrays)
    row["error"] = max_rel_error(run().numpy(), reference)
    if not stock:
        report = accel_target.report(executable)
        row["transforms"] = report.kernels.activation_transforms
        row["declines"] = len(report.declines)
    # stock TVM takes up to seconds a run: fewer runs, one round
    row["ms"] = median_ms(run, max(2, repeat // 10)) if stock else median_of_medians(run, repeat, ROUNDS)
    return row


def _onnxruntime_row(model, inputs, reference, threads: int, repeat: int) -> dict:
    import torch

    from accel_target.benchmark import max_rel_error, median_of_medians, onnxruntime_runner

    with tempfile.TemporaryDirectory(prefix="accel_zoo_") as tmp:
        path = os.path.join(tmp, "model.onnx")
        try:
            with torch.no_grad():
                torch.onnx.export(model, inputs, path, dynamo=False)
        except Exception as err:  # noqa: BLE001  (the exporter raises many types)
            return {"failed": f"torch.onnx.export: {str(err).strip().splitlines()[0][:120]}"}
        run = onnxruntime_runner(path, [x.numpy() for x in inputs], threads)
        row = {"error": max_rel_error(run()[0], reference)}
        row["ms"] = median_of_medians(run, repeat, ROUNDS)
    return row


def contender_row(name: str, contender: str, threads: int, repeat: int) -> dict:
    """One contender on one zoo model, in this process: {"ms", "error", ...} or {"failed"}."""
    import torch

    import accel_target
    from accel_target.benchmark import median_of_medians
    from tests.models.hf_zoo import ZOO

    torch.set_num_threads(threads)
    model, inputs = ZOO[name].make()
    with torch.inference_mode():
        reference = model(*inputs).numpy()
    if contender == "PyTorch":

        def run():
            with torch.inference_mode():
                model(*inputs)

        return {"ms": median_of_medians(run, repeat, ROUNDS)}
    if contender == "ONNX Runtime":
        return _onnxruntime_row(model, inputs, reference, threads, repeat)
    mod = accel_target.from_torch(model, inputs)
    return _tvm_row(mod, reference, [x.numpy() for x in inputs], repeat, stock=contender == "stock TVM")


def run_contender(name: str, contender: str, threads: int, repeat: int) -> dict:
    """contender_row in a fresh process with `threads` threads for TVM, PyTorch and OpenMP."""
    env = dict(os.environ, TVM_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
    command = [sys.executable, __file__, "--row-of", name, "--contender", contender, "--repeat", str(repeat)]
    command += ["--threads", str(threads)]
    out = subprocess.run(command, env=env, capture_output=True, text=True, cwd=HERE)
    if out.returncode != 0:
        lines = [line for line in out.stderr.strip().splitlines() if line.strip()]
        return {"failed": lines[-1][:160] if lines else f"exit code {out.returncode}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def _cell(row: dict, key: str, fmt: str) -> str:
    return "" if key not in row else format(row[key], fmt)


def markdown(rows: list[dict], header: str) -> str:
    lines = [
        header,
        "",
        "| model | family | accel ms | PyTorch ms | ONNX Runtime ms | stock TVM ms | vs PyTorch | vs ONNX Runtime "
        "| vs stock TVM | accel transforms | max rel error accel / stock TVM / ORT |",
        "|---" * 11 + "|",
    ]
    notes = []
    for r in rows:
        accel = r["accel"].get("ms")
        times = " | ".join(_cell(r[c], "ms", ".2f") or "failed" * ("failed" in r[c]) for c in CONTENDERS)
        ratios = " | ".join(f"{r[c]['ms'] / accel:.2f}x" if accel and "ms" in r[c] else "" for c in CONTENDERS[1:])
        errors = " / ".join(_cell(r[c], "error", ".1e") or "-" for c in ("accel", "stock TVM", "ONNX Runtime"))
        transforms = _cell(r["accel"], "transforms", "d")
        lines.append(f"| {r['model']} | {r['family']} | {times} | {ratios} | {transforms} | {errors} |")
        notes += [f"- {r['model']}, {c}: {r[c]['failed']}" for c in CONTENDERS if "failed" in r[c]]
    lines += [
        "",
        "'vs X' = X's median time / accel's (above 1: accel is faster). accel transforms: runtime layout",
        "transforms of activations (NCHW input). Each contender runs in a process of its own.",
    ]
    if notes:
        lines += ["", "Failures:", "", *notes]
    return "\n".join(lines) + "\n"


def violations(rows: list[dict]) -> list[str]:
    """What breaks the contract: accel failing where stock TVM builds, or off PyTorch."""
    found = []
    for r in rows:
        accel, stock = r["accel"], r["stock TVM"]
        if "failed" in accel and "failed" not in stock:
            found.append(f"{r['model']}: accel failed where stock TVM builds: {accel['failed']}")
        elif accel.get("error", 0.0) > TOLERANCE:
            found.append(f"{r['model']}: accel differs from PyTorch by {accel['error']:.1e}")
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", help="comma-separated zoo names (default: the whole zoo)")
    parser.add_argument("--threads", type=int, default=int(os.environ.get("ACCEL_BENCH_THREADS", 2)))
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--no-stock-tvm", action="store_true", help="skip stock TVM (tens of seconds per build)")
    parser.add_argument("--row-of", metavar="MODEL", help=argparse.SUPPRESS)  # one contender's row (internal)
    parser.add_argument("--contender", choices=CONTENDERS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.row_of:
        try:
            print(json.dumps(contender_row(args.row_of, args.contender, args.threads, args.repeat)))
        except Exception:  # noqa: BLE001  (reported in the table)
            traceback.print_exc()
            return 1
        return 0
    return bench(args)


def write(rows: list[dict], header: str) -> None:
    """benchmarks/results/<isa>/zoo.md (the table) and zoo.json (the rows)."""
    from accel_target.benchmark import isa

    results = os.path.join(HERE, "results", isa())
    os.makedirs(results, exist_ok=True)
    with open(os.path.join(results, "zoo.md"), "w", encoding="utf-8") as f:
        f.write("# Model zoo\n\n" + markdown(rows, header))
    with open(os.path.join(results, "zoo.json"), "w", encoding="utf-8") as f:
        json.dump(rows, f, indent=1)


def bench(args) -> int:
    import onnxruntime
    import torch
    import tvm

    import accel_target
    from tests.models.hf_zoo import ZOO

    names = args.models.split(",") if args.models else list(ZOO)
    unknown = sorted(set(names) - set(ZOO))
    if unknown:
        raise SystemExit(f"unknown zoo models {unknown}; the zoo: {', '.join(ZOO)}")
    contenders = [c for c in CONTENDERS if not (args.no_stock_tvm and c == "stock TVM")]
    header = (
        f"{args.threads} threads for every contender (TVM_NUM_THREADS, torch.set_num_threads, ONNX Runtime "
        f"intra_op_num_threads); CPU {accel_target.machine()}; apache-tvm {tvm.__version__}, torch "
        f"{torch.__version__}, onnxruntime {onnxruntime.__version__}; batch 1; each contender in a process of "
        f"its own: median of {ROUNDS} rounds' medians of {args.repeat} runs (stock TVM: one round of "
        f"{max(2, args.repeat // 10)})"
    )
    rows = []
    for name in names:
        row = {"model": name, "family": ZOO[name].family, "stock TVM": {"failed": "not run (--no-stock-tvm)"}}
        for contender in contenders:
            print(f"[zoo] {name}: {contender}", file=sys.stderr, flush=True)
            row[contender] = run_contender(name, contender, args.threads, args.repeat)
        rows.append(row)
        write(rows, header)  # after every model: a long run leaves what it has measured
    print(markdown(rows, header))
    broken = violations(rows)
    for line in broken:
        print(f"[zoo] {line}", file=sys.stderr)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
