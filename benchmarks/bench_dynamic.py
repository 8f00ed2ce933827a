"""Dynamic against static builds at the static build's size: one build that serves every
batch / sequence length, timed where a static build was made for.

    python benchmarks/bench_dynamic.py [--cases bert_seq128,resnet50_batch1,resnet50_batch8] [--repeat 30]

Each (case, build) runs in a fresh process with 2 threads (TVM_NUM_THREADS=2): the dynamic
build is exported with torch.export Dims (BERT: batch and sequence; ResNet-50: batch), the
static one with the example's shape. Both outputs are checked against PyTorch (1e-4). Prints
one line per case: static ms, dynamic ms, their ratio (goal: at most 1.1).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

# the repository this script is in: its accel_target, not an installed one (the script's own
# directory, not the working directory, is first on sys.path)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

THREADS = "2"
# case -> (model in benchmarks/models.py, input shape at which both builds are timed, dynamic axes)
CASES = {
    "bert_seq128": ("bert_base_2layers", (1, 128, 768), {0: "batch", 1: "seq"}),
    "resnet50_batch1": ("resnet50", (1, 3, 224, 224), {0: "batch"}),
    "resnet50_batch8": ("resnet50", (8, 3, 224, 224), {0: "batch"}),
}


def _dims(axes: dict[int, str]):
    import torch

    limits = {"batch": (1, 64), "seq": (2, 512)}
    return {axis: torch.export.Dim(name, min=limits[name][0], max=limits[name][1]) for axis, name in axes.items()}


def child(case: str, mode: str, repeat: int) -> dict:
    """Build `case` static or dynamic, check it against PyTorch, time it (this process)."""
    import time

    import torch

    import accel_target
    from accel_target.benchmark import max_rel_error, median_of_medians, vm_runner
    from accel_target.torch_ops import import_program

    sys.path.insert(0, os.path.dirname(__file__))
    from models import make

    name, shape, axes = CASES[case]
    model, _ = make(name)
    x = torch.randn(*shape)
    example = x
    if mode == "dynamic":  # an example of size 2 on every dynamic axis: size 1 would be specialized
        example = torch.randn(*[2 if a in axes else d for a, d in enumerate(shape)])
    started = time.perf_counter()
    with torch.no_grad():
        dynamic_shapes = (_dims(axes),) if mode == "dynamic" else None
        program = torch.export.export(model.eval(), (example,), dynamic_shapes=dynamic_shapes)
    executable = accel_target.build(import_program(program))
    compile_s = time.perf_counter() - started
    run = vm_runner(executable, [x.numpy()])
    with torch.no_grad():
        reference = model(x).numpy()
    error = max_rel_error(run().numpy(), reference)
    if error > 1e-4:
        raise SystemExit(f"{case} {mode}: output differs from PyTorch's by {error:.1e}")
    ms = median_of_medians(run, repeat, 3)
    return {"case": case, "mode": mode, "ms": ms, "compile s": compile_s, "max rel error": error}


def measure(case: str, mode: str, repeat: int) -> dict:
    """`child` in a fresh process with THREADS threads."""
    env = {**os.environ, "TVM_NUM_THREADS": THREADS, "OMP_NUM_THREADS": THREADS}
    args = [sys.executable, __file__, "--child", case, mode, "--repeat", str(repeat)]
    done = subprocess.run(args, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{case} {mode} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--child", nargs=2, metavar=("CASE", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(*args.child, args.repeat)))
        return 0
    for case in args.cases.split(","):
        static, dynamic = (measure(case, mode, args.repeat) for mode in ("static", "dynamic"))
        print(
            f"{case}: static {static['ms']:.2f} ms (built in {static['compile s']:.0f} s) | "
            f"dynamic {dynamic['ms']:.2f} ms (built in {dynamic['compile s']:.0f} s) | "
            f"dynamic / static {dynamic['ms'] / static['ms']:.2f}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
