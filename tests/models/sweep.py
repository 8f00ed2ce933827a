"""A sweep of transformers architectures (tests/models/sweep_models.py) and timm families
(tests/models/sweep_timm.py, ``timm-NAME``, built fed NHWC) beyond the zoo, through from_torch and
accel_target.build, against PyTorch:

    python -m tests.models.sweep [NAME ...] [--timeout S]

Each architecture runs in a process of its own: PyTorch's output, import, build, a run, and
the largest error relative to the output's largest magnitude, against the model run in float64
by PyTorch where it runs so (PyTorch's own float32 error beside it). One line each (the step
reached, the error, what a step of ours declined, the ops left to TVM's kernels, for an image
model fed NHWC its runtime transposes against the model's own permutes, seconds), then a
count. Exit status 1 where one fails in a step of ours (build, run, an error above 1e-4 or
twice PyTorch's own, more transposes than the model's own); one that fails at import (an op
neither importer has, torch.export's own limits) is listed but not counted. Not part of the test suite: the 165
transformers architectures take about 40 minutes on 2 cores, the 117 timm ones about 40.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import traceback

from tests.models import sweep_timm

TOLERANCE = 1e-4
_PREFIX = "SWEEP "


def _one(name: str) -> dict:
    import numpy as np
    import torch

    import accel_target
    from tests.helpers import run_executable
    from tests.models.test_hf_zoo import own_transposes

    found: dict = {"name": name, "step": "model"}
    nhwc = name in sweep_timm.MODELS
    try:
        model, inputs = _models()[name]()
        with torch.no_grad():
            expected = model(*inputs).detach().numpy()
        exact = _in_float64(model, inputs, expected)
        found["step"] = "import"
        mod = accel_target.from_torch(model, inputs)
        found["step"] = "build"
        executable = accel_target.build(mod, input_layout="NHWC" if nhwc else None)
        found["step"] = "run"
        fed = [x.permute(0, 2, 3, 1).contiguous() if nhwc else x for x in inputs]
        out = run_executable(executable, *[x.numpy() for x in fed])
        reference = expected if exact is None else exact
        scale = max(float(np.max(np.abs(reference))), 1e-30)
        report = accel_target.report(executable)
        found.update(
            step="done",
            error=float(np.max(np.abs(out - reference))) / scale,
            torch_error=None if exact is None else float(np.max(np.abs(expected - exact))) / scale,
            declines=[str(d) for d in report.declines],
            fallbacks=sorted({row.op for row in report.rows if row.kind == "fallback"}),
        )
        if nhwc:
            found.update(transposes=report.kernels.activation_transforms, own=own_transposes(mod))
    except Exception as err:  # reported, the sweep goes on
        found["error"] = f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0][:200]}"
        found["traceback"] = traceback.format_exc()[-2000:]
    return found


def _in_float64(model, inputs, expected):
    """The model's output computed in float64 by PyTorch (a copy of it), the reference the sweep
    measures errors against; None where the model does not run in float64, or where that output
    is not finite where the float32 one (`expected`) is (canine scales its float32 attention mask
    by float64's lowest value: -inf in float32, and 0 * -inf is NaN)."""
    import copy

    import numpy as np
    import torch

    try:
        with torch.no_grad():
            wide = copy.deepcopy(model).double()
            exact = wide(*[x.double() if x.is_floating_point() else x for x in inputs]).detach().float().numpy()
    except Exception:  # a model that casts to float32 itself, or a dtype-specific kernel
        return None
    return exact if np.array_equal(np.isfinite(exact), np.isfinite(expected)) else None


def _models() -> dict:
    from tests.models import sweep_models

    return {**sweep_models.MODELS, **sweep_timm.MODELS}


def _ours_failed(result: dict) -> bool:
    if result["step"] == "done":
        extra = result.get("transposes", 0) > result.get("own", 0)
        return result["error"] > _tolerance(result) or bool(result["declines"]) or extra
    return result["step"] in ("build", "run")


def _tolerance(result: dict) -> float:
    """TOLERANCE, or twice PyTorch's own float32 error where that is larger (a deep network of
    random weights can amplify rounding: PyTorch itself then differs from float64 by more)."""
    return max(TOLERANCE, 2 * (result.get("torch_error") or 0.0))


def _line(result: dict, seconds: float) -> str:
    if result["step"] == "done":
        extra = "".join(f"; {key}: {', '.join(result[key])}" for key in ("declines", "fallbacks") if result.get(key))
        if "transposes" in result:
            extra += f"; transposes {result['transposes']} (the model's own {result['own']})"
        if result.get("torch_error") is not None:
            extra = f" (PyTorch float32 {result['torch_error']:.1e})" + extra
        verdict = "match" if result["error"] <= _tolerance(result) else "DIFFERS"
        return f"{result['name']:34s} {verdict} {result['error']:.1e}{extra} ({seconds:.0f} s)"
    return f"{result['name']:34s} FAILS at {result['step']}: {result.get('error', '')} ({seconds:.0f} s)"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.models.sweep", description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="architectures (default: all, transformers' then timm's)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per architecture (default 600)")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # the child process's mode
    args = parser.parse_args(argv)
    if args.one:
        print(_PREFIX + json.dumps(_one(args.one)), flush=True)
        return 0
    models = _models()
    unknown = sorted(set(args.names) - set(models))
    if unknown:
        parser.error(f"unknown architectures {unknown}; known: {', '.join(models)}")
    failed = imports = 0
    for name in args.names or models:
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
