"""Coexistence: a runtime's model calls when other libraries work between them.

Each runtime (accel at its defaults: ``accel_target.build``, ``load``, accel's thread pool; ONNX
Runtime and PyTorch, eager, at theirs) runs in a process of its own with 2 threads everywhere
(its own pool, numpy's OpenBLAS, PyTorch's OpenMP) and times 21 calls of a model twice: alone,
back to back, and right after the same work before each call, a 512x512 float32 numpy product
and a PyTorch conv (16->32, 3x3, on 1x16x56x56). slowdown = median after / median alone. The
models: a 2-conv model (conv 32->64 3x3, ReLU, conv 64->64 3x3, ReLU on 1x32x56x56) and
MobileNetV2.

    python benchmarks/coexistence.py                      # every runtime and model, a table
    python benchmarks/coexistence.py accel two_conv       # one, as JSON

From Python (importable without pytest; each call starts fresh processes)::

    from benchmarks.coexistence import slowdowns
    slowdowns("accel", "two_conv")  # {"alone_ms": ..., "after_ms": ..., "slowdown": ..., ...}

benchmarks/test_coexistence.py times the same with pytest-benchmark, for run.py's "coexistence"
suite (rounds alternating the runtimes).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

try:
    from . import contenders  # imported as benchmarks.coexistence
except ImportError:
    import contenders  # run as a script, or by pytest with benchmarks/ on sys.path
from tests.runtime.coexistence import Work, median_ms, two_conv  # noqa: E402  (the CI test's model and work)

MODELS = ("two_conv", "mobilenet_v2")
RUNTIMES = ("accel", "onnxruntime", "torch")
THREADS = 2
CALLS = 21


def _two_conv():
    model, x = two_conv()
    return model, (x,)


def _mobilenet_v2():
    from tests.models.classic import make

    model, x = make("mobilenet_v2")
    return model, (x,)


def case(model: str) -> contenders.Case:
    """The benchmark case of `model` (one of MODELS), fed NCHW as the runtimes' defaults take it."""
    makers = {"two_conv": _two_conv, "mobilenet_v2": _mobilenet_v2}
    if model not in makers:
        raise ValueError(f"coexistence: unknown model {model!r}; the models: {', '.join(MODELS)}")
    return contenders.Case(model, makers[model], source=__file__)


def measure(runtime: str, model: str, threads: int = THREADS, calls: int = CALLS, build_only: bool = False) -> dict:
    """Alone and after medians of `runtime` on `model`, in this process (see the module's docstring)."""
    settings = contenders.Settings(threads=threads)
    the_case = case(model)
    runner = contenders.runner(runtime, the_case, settings)
    contenders.check(runner, the_case, settings)
    if build_only:
        return {"runtime": runtime, "model": model, "built": True}
    import torch

    torch.set_num_threads(threads)
    alone = median_ms(runner.fn, None, calls)
    after = median_ms(runner.fn, Work(), calls)
    result = {"runtime": runtime, "model": model, "threads": threads, "calls": calls}
    return {**result, "alone_ms": alone, "after_ms": after, "slowdown": after / alone}


def process_env(threads: int) -> dict[str, str]:
    """The environment of a measuring process: `threads` threads for every pool, and this
    checkout's accel_target first on the path."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, **contenders.threads_env(threads)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    return env


def _child(args: list[str], threads: int) -> dict:
    command = [sys.executable, os.path.abspath(__file__), *args, "--threads", str(threads), "--json"]
    done = subprocess.run(command, env=process_env(threads), capture_output=True, text=True)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = "\n".join(done.stderr.strip().splitlines()[-15:])
        raise RuntimeError(f"coexistence {' '.join(args)}: exit code {done.returncode}\n{tail}")
    return json.loads(lines[-1])


def slowdowns(runtime: str, model: str, threads: int = THREADS, calls: int = CALLS) -> dict:
    """`measure` in a fresh process of its own (after another that builds the model, if it is
    not in the cache yet): {"runtime", "model", "threads", "calls", "alone_ms", "after_ms",
    "slowdown"}."""
    if runtime not in RUNTIMES:
        raise ValueError(f"coexistence: unknown runtime {runtime!r}; the runtimes: {', '.join(RUNTIMES)}")
    _child([runtime, model, "--build-only"], threads)
    return _child([runtime, model, "--calls", str(calls)], threads)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runtime", nargs="?", choices=RUNTIMES)
    parser.add_argument("model", nargs="?", choices=MODELS)
    parser.add_argument("--threads", type=int, default=THREADS)
    parser.add_argument("--calls", type=int, default=CALLS)
    parser.add_argument("--build-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true", help="measure in this process, print one JSON line")
    args = parser.parse_args(argv)
    if args.runtime and args.model:
        if args.json:
            print(json.dumps(measure(args.runtime, args.model, args.threads, args.calls, args.build_only)))
        else:
            print(json.dumps(slowdowns(args.runtime, args.model, args.threads, args.calls)))
        return 0
    print("| model | runtime | alone ms | after ms | slowdown |\n|---|---|---|---|---|")
    for model in MODELS:
        for runtime in RUNTIMES:
            r = slowdowns(runtime, model, args.threads, args.calls)
            print(f"| {model} | {runtime} | {r['alone_ms']:.3f} | {r['after_ms']:.3f} | {r['slowdown']:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
