"""A sweep of transformers architectures beyond the zoo (tests/models/sweep_models.py), through
from_torch and accel_target.build, against PyTorch:

    python -m tests.models.sweep [NAME ...] [--timeout S]

Each architecture runs in a process of its own: PyTorch's output, import, build, a run, and
the largest error relative to the output's largest magnitude. One line each (the step
reached, the error, what a step of ours declined, the ops left to TVM's kernels, seconds),
then a count. Exit status 1 where one fails in a step of ours (build, run, or an error above
1e-4); one that fails at import (an op neither importer has, torch.export's own limits) is
listed but not counted. Not part of the test suite: the 160 take about 40 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import traceback

TOLERANCE = 1e-4
_PREFIX = "SWEEP "


def _one(name: str) -> dict:
    import numpy as np
    import torch

    import accel_target
    from tests.helpers import run_executable
    from tests.models.sweep_models import MODELS

    found: dict = {"name": name, "step": "model"}
    try:
        model, inputs = MODELS[name]()
        with torch.no_grad():
            expected = model(*inputs).detach().numpy()
        found["step"] = "import"
        mod = accel_target.from_torch(model, inputs)
        found["step"] = "build"
        executable = accel_target.build(mod)
        found["step"] = "run"
        out = run_executable(executable, *[x.numpy() for x in inputs])
        scale = max(float(np.max(np.abs(expected))), 1e-30)
        report = accel_target.report(executable)
        found.update(
            step="done",
            error=float(np.max(np.abs(out - expected))) / scale,
            declines=[str(d) for d in report.declines],
            fallbacks=sorted({row.op for row in report.rows if row.kind == "fallback"}),
        )
    except Exception as err:  # reported, the sweep goes on
        found["error"] = f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0][:200]}"
        found["traceback"] = traceback.format_exc()[-2000:]
    return found


def _ours_failed(result: dict) -> bool:
    if result["step"] == "done":
        return result["error"] > TOLERANCE or bool(result["declines"])
    return result["step"] in ("build", "run")


def _line(result: dict, seconds: float) -> str:
    if result["step"] == "done":
        extra = "".join(f"; {key}: {', '.join(result[key])}" for key in ("declines", "fallbacks") if result.get(key))
        return f"{result['name']:34s} match {result['error']:.1e}{extra} ({seconds:.0f} s)"
    return f"{result['name']:34s} FAILS at {result['step']}: {result.get('error', '')} ({seconds:.0f} s)"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.models.sweep", description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="architectures (default: all of tests/models/sweep_models.py)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per architecture (default 600)")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # the child process's mode
    args = parser.parse_args(argv)
    if args.one:
        print(_PREFIX + json.dumps(_one(args.one)), flush=True)
        return 0
    from tests.models.sweep_models import MODELS

    unknown = sorted(set(args.names) - set(MODELS))
    if unknown:
        parser.error(f"unknown architectures {unknown}; known: {', '.join(sorted(MODELS))}")
    failed = imports = 0
    for name in args.names or sorted(MODELS):
        start = time.perf_counter()
        try:
            child = subprocess.run(
                [sys.executable, "-m", "tests.models.sweep", "--one", name],
                capture_output=True,
                text=True,
                timeout=args.timeout,
            )
            lines = [line for line in child.stdout.splitlines() if line.startswith(_PREFIX)]
            result = (
                json.loads(lines[-1][len(_PREFIX) :])
                if lines
                else {"name": name, "step": "run", "error": f"the process died (exit {child.returncode})"}
            )
        except subprocess.TimeoutExpired:
            result = {"name": name, "step": "build", "error": f"timed out after {args.timeout:.0f} s"}
        print(_line(result, time.perf_counter() - start), flush=True)
        failed += _ours_failed(result)
        imports += result["step"] in ("model", "import")
    print(f"{failed} failed in a step of ours; {imports} did not import or export")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
