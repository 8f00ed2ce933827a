"""A/B of a heuristic or a code change: a model built as it is (A) and with module constants set
otherwise (B), or by an earlier revision's code (A) and as it is (B), the two executables timed
in turns in one process.

    python benchmarks/bench_ab.py --set topi_accel.conv2d.ROW_CHUNKS_MAX_KERNEL_BYTES=-1
                                  [--models mobilenet_v2,resnet50] [--mcpu haswell] [--rounds 25] [--int8]
    python benchmarks/bench_ab.py --base HEAD~1 [--models ...]
    python benchmarks/bench_ab.py --tuning-db tuning.json [--models ...]

With --base REV, A is the model built by the code of git revision REV instead (its tree
extracted by `git archive`, the build in a process of its own that imports accel_target,
topi_accel and strategy from there, the library exported and loaded here, on this checkout's
runtime) and B the code as it is (with any --set): a change to the code, not a constant.
With --tuning-db FILE, B takes the configs of that database (`accel-tvm tune`): what tuning
gains over the heuristic in the model, where the tuner timed each conv alone.

Both builds are accel's kernels on accel's thread pool, so sharing a process costs neither
(unlike two runtimes' pools: bench_models.py gives those a process each), and turns back to
back see the same state of a shared host (A first in even rounds, B in odd ones). Prints
each build's median time and the median over rounds of B's time / A's (above 1: A is
faster); both builds are checked against PyTorch first (`--int8`: the models quantized by
ONNX Runtime's `quantize_static`, as bench_int8.py does). Threads: TVM_NUM_THREADS
(ACCEL_BENCH_THREADS), else every core.
"""

from __future__ import annotations

import argparse
import ast
import functools
import importlib
import os
import shutil
import subprocess
import sys
import tempfile

if "ACCEL_BENCH_THREADS" in os.environ:  # same knob as the other benchmarks
    os.environ["TVM_NUM_THREADS"] = os.environ["ACCEL_BENCH_THREADS"]
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import numpy as np  # noqa: E402
import torch  # noqa: E402
import tvm  # noqa: E402
from models import MODELS, make  # noqa: E402

import accel_target  # noqa: E402
from accel_target.benchmark import max_rel_error, median_ms, target_for, vm_runner  # noqa: E402


def _setting(text: str) -> tuple[object, str, object]:
    """(module, name, value) of ``package.module.NAME=literal``."""
    path, sep, literal = text.partition("=")
    module, _, name = path.rpartition(".")
    if not sep or not module:
        raise SystemExit(f"--set {text!r}: expected MODULE.NAME=VALUE (topi_accel.conv2d.MIN_FMA_CHAINS=8)")
    mod = importlib.import_module(module)
    if not hasattr(mod, name):
        raise SystemExit(f"--set {text!r}: {module} has no {name}")
    return mod, name, ast.literal_eval(literal)


def _build(make_module, target, settings, layout, tuning_db=None):
    """The module built with `settings` in force (restored after), and `tuning_db`'s configs."""
    saved = [(mod, name, getattr(mod, name)) for mod, name, _ in settings]
    try:
        for mod, name, value in settings:
            setattr(mod, name, value)
        return accel_target.build(make_module(), input_layout=layout, target=target, tuning_db=tuning_db)
    finally:
        for mod, name, value in saved:
            setattr(mod, name, value)


# the build of A for --base: argv [tree, model, mcpu, layout, ONNX file, library] ("": none)
BUILD_AT_BASE = """
import os, sys
tree, name, mcpu, layout, onnx, library = sys.argv[1:7]
sys.path[:0] = [tree, {here!r}]  # the revision's packages, this checkout's models
import tvm, accel_target
if not os.path.abspath(accel_target.__file__).startswith(tree + os.sep):
    raise SystemExit(f"bench_ab --base: accel_target came from {{accel_target.__file__}}, not {{tree}}")
if onnx:
    mod = accel_target.from_onnx(onnx)
else:
    from models import make
    mod = accel_target.from_torch(*make(name))
target = tvm.target.Target({{"tag": "accel", "mcpu": mcpu}}) if mcpu else "accel"
accel_target.build(mod, input_layout=layout or None, target=target).export_library(library)
"""


def _build_at(rev: str, name: str, mcpu: str | None, layout, onnx: str | None, folder: str):
    """The model `name` built by the code of git revision `rev` (BUILD_AT_BASE), loaded."""
    tree = os.path.join(folder, "tree")
    if not os.path.isdir(tree):
        os.makedirs(tree)
        # from the repository's root: `git archive` run in a subfolder packs only that folder
        command = ["git", "-C", os.path.dirname(HERE), "archive", rev]
        archive = subprocess.run(command, stdout=subprocess.PIPE, check=True).stdout
        subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
    library = os.path.join(folder, f"{name}.so")
    script = BUILD_AT_BASE.format(here=HERE)
    argv = [tree, name, mcpu or "", layout or "", onnx or "", library]
    subprocess.run([sys.executable, "-c", script, *argv], check=True, cwd=folder)
    module = tvm.runtime.load_module(library)
    accel_target.pool.install(library)  # on accel's pool, as B's build is (AccelExecutable.jit)
    return module


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", action="append", default=[], help="MODULE.NAME=VALUE for build B (repeatable)")
    ap.add_argument("--base", metavar="REV", help="build A with the code of this git revision (default: as it is)")
    ap.add_argument("--models", default="mobilenet_v2", help=f"comma-separated, of {', '.join(MODELS)}")
    ap.add_argument("--mcpu", help="build for this CPU (haswell: AVX2) instead of the host's")
    ap.add_argument("--tuning-db", metavar="FILE", help="build B with this tuning database (accel-tvm tune)")
    ap.add_argument("--rounds", type=int, default=25)
    ap.add_argument("--repeat", type=int, default=20, help="calls timed per turn")
    ap.add_argument("--int8", action="store_true", help="the models quantized (bench_int8.py's QDQ files)")
    args = ap.parse_args(argv)
    if not args.set and not args.base and not args.tuning_db:
        ap.error("give --set MODULE.NAME=VALUE, --base REV or --tuning-db FILE (or several)")
    if args.tuning_db and not os.path.isfile(args.tuning_db):
        ap.error(f"--tuning-db {args.tuning_db}: no such file")
    settings = [_setting(s) for s in args.set]
    target = target_for(args.mcpu)
    a_is = f"the code at {args.base}" if args.base else "the code as it is"
    b_is = ", ".join(["the code as it is", *args.set, *([f"tuned by {args.tuning_db}"] if args.tuning_db else [])])
    print(f"{accel_target.num_threads()} threads; A: {a_is}; B: {b_is}; target {target}")
    base_folder = tempfile.mkdtemp(prefix="accel-ab-") if args.base else None
    for name in args.models.split(","):
        model, x = make(name)
        with torch.no_grad():
            ref = model(x).numpy()
        layout = "NHWC" if x.dim() == 4 else None
        inputs = [(x.permute(0, 2, 3, 1) if layout else x).contiguous().numpy()]
        path = None
        if args.int8:  # ONNX Runtime's QDQ file, as bench_int8.py makes it; int8 results are off by more
            from bench_int8 import _quantize

            path, bound = _quantize(name, tempfile.mkdtemp()), 0.2
            make_module = functools.partial(accel_target.from_onnx, path)
        else:
            bound, make_module = 1e-4, functools.partial(accel_target.from_torch, model, x)
        runs = {}
        for label, changes in (("A", []), ("B", settings)):
            if label == "A" and args.base:
                executable = _build_at(args.base, name, args.mcpu, layout, path, base_folder)
            else:
                executable = _build(make_module, target, changes, layout, args.tuning_db if label == "B" else None)
            run = vm_runner(executable, inputs)
            error = max_rel_error(run().numpy(), ref)
            if error > bound:
                raise SystemExit(f"{name}: build {label} is {error:.1e} off PyTorch")
            runs[label] = run
        times = {"A": [], "B": []}
        for round_ in range(args.rounds):
            for label in "AB" if round_ % 2 == 0 else "BA":  # either goes first in half the rounds
                times[label].append(median_ms(runs[label], args.repeat))
        ratio = np.median(np.array(times["B"]) / np.array(times["A"]))
        a, b = (float(np.median(times[k])) for k in "AB")
        print(f"{name}: A {a:.3f} ms, B {b:.3f} ms, B / A {ratio:.3f} (median of {args.rounds} rounds)")
    if base_folder:  # the loaded libraries stay mapped
        shutil.rmtree(base_folder)


if __name__ == "__main__":
    main()
