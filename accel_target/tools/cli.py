"""accel-tvm: compile, run, report, benchmark and tune models for the accel target.

    accel-tvm compile MODEL -o OUT.so [--input-layout NHWC] [--output-layout NHWC] [--strict] [--report]
                      [--weights separate] [--tuning-db tuning.json] [TARGET OPTIONS]
    accel-tvm run OUT.so --input x.npy [...] [--output y.npy] [--rpc HOST:PORT --key KEY]
    accel-tvm report MODEL
    accel-tvm bench MODEL [--vs tvm,torch,onnxruntime] [--tuning-db tuning.json] [--plot out.png]
                    [--rpc HOST:PORT --key KEY [TARGET OPTIONS]]
    accel-tvm tune MODEL --db tuning.json [--limit N] [--parallel N]
                   [--rpc HOST:PORT --key KEY [--timeout S] [TARGET OPTIONS]]
    accel-tvm demo

MODEL is an ONNX file (.onnx) or a program saved with torch.export.save (.pt2).
A symbolic input dimension (an ONNX dim_param such as "batch", a torch.export Dim) stays
symbolic: compile writes one library for every size, its signature (OUT.so.json) names the
dimension, and run takes any size from 1 for it, the same in every input that names it;
a wrong rank, fixed size, dtype or a disagreeing shared dimension is an error naming the
input and the dimension.

Remote devices: --rpc HOST:PORT --key KEY runs, benchmarks or tunes on the servers that
registered under KEY at TVM's RPC tracker HOST:PORT (`pip install accel-tvm[rpc]`):
    python -m tvm.exec.rpc_tracker --host 127.0.0.1 --port 9190
    python -m tvm.exec.rpc_server --tracker 127.0.0.1:9190 --key mybox --host 127.0.0.1
The library and its weights are uploaded and loaded there, and timed on the device's
clock. A server runs whatever library it is sent: keep tracker and servers on 127.0.0.1,
or on a network only you can reach.
Cross-compiling for a device of another CPU: the TARGET OPTIONS --mtriple, --mcpu,
--mattr and --num-cores name it (as LLVM does), --cc the compiler that links for it:
    accel-tvm compile m.onnx -o m.so --mtriple aarch64-linux-gnu --mcpu cortex-a72
                      --mattr +neon --num-cores 4 --cc aarch64-linux-gnu-gcc
Errors are one line on stderr and a non-zero exit code; --debug shows the traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np


class CLIError(Exception):
    """A user-facing error: printed as one line, exit code 1."""


def _progress(message: str) -> None:
    print(f"[accel-tvm] {message}", file=sys.stderr, flush=True)


def _one_line(err: BaseException) -> str:
    """The message of an error on one line (TVM's errors end with it, after their context)."""
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
    return lines[-1].removeprefix("accel: ") if lines else type(err).__name__


def _inputs_of(mod) -> list[dict]:
    from strategy.layout import static_shape

    return [{"name": p.name, "shape": static_shape(p), "dtype": str(p.ty.dtype)} for p in mod["main"].params]


def _load(path: str):
    from .. import frontends

    _progress(f"importing {path}")
    return frontends.load_model(path)


def _target(args):
    """The accel target the options name: the host's, or a device's (cross-compilation)."""
    named = {
        "mtriple": args.mtriple,
        "mcpu": args.mcpu,
        "mattr": [a.strip() for a in args.mattr.split(",") if a.strip()] if args.mattr else None,
        "num-cores": args.num_cores,
    }
    named = {k: v for k, v in named.items() if v}
    return {"tag": "accel", **named} if named else "accel"


def _remote(args):
    """The remote device of --rpc and --key, its tracker checked (None without --rpc)."""
    from ..runtime.remote import Device, check_tracker

    if args.rpc is None:
        if args.key is not None:
            raise CLIError("--key names the servers of a tracker: give its address with --rpc HOST:PORT")
        return None
    device = Device.parse(args.rpc, args.key)
    check_tracker(device.host, device.port)
    return device


def _build(mod, args, tuning_db=None, target="accel"):
    from ..compiler import build

    _progress("building for accel (layout conversion, weight folding, kernels, LLVM)")
    started = time.perf_counter()
    executable = build(
        mod,
        target=target,
        input_layout=args.input_layout,
        output_layout=getattr(args, "output_layout", None),
        strict=getattr(args, "strict", False),
        tuning_db=tuning_db,
        weights=getattr(args, "weights", "embedded"),
    )
    _progress(f"built in {time.perf_counter() - started:.1f} s")
    return executable


def cmd_compile(args) -> int:
    from ..compiler import report
    from ..runtime.deploy import save
    from ..runtime.signature import executable_inputs, symbolic_dims

    mod = _load(args.model)
    executable = _build(mod, args, args.tuning_db, _target(args))
    meta = {
        "model": os.path.abspath(args.model),
        "input_layout": args.input_layout,
        "output_layout": args.output_layout,
    }
    written = save(executable, args.output, meta=meta, cc=args.cc)
    inputs = executable_inputs(executable)  # as the signature records them: symbolic dims by name
    rep = report(executable)
    if args.json:
        data = {"output": args.output, "files": written, "inputs": [i.to_dict() for i in inputs]}
        print(json.dumps({**data, "report": rep.to_dict()}, indent=2))
        return 0
    if args.report:
        print(rep)
    symbolic = symbolic_dims(inputs)
    sizes = f" ({', '.join(symbolic)}: any size from 1)" if symbolic else ""
    print(f"inputs: {'; '.join(i.describe() for i in inputs)}{sizes}")
    k = rep.kernels
    print(
        f"wrote {' and '.join(written)}: {len(k.calls)} kernels, {k.accel} on accel, runtime layout transforms: "
        f"{k.activation_transforms} of activations, {k.weight_transforms} of weights"
    )
    return 0


def cmd_run(args) -> int:
    import tvm

    from ..runtime import remote
    from ..runtime.deploy import load
    from ..target import num_threads

    if not os.path.isfile(args.library):
        raise CLIError(f"library {args.library!r} does not exist")
    arrays = []
    for path in args.input:
        if not os.path.isfile(path):
            raise CLIError(f"input file {path!r} does not exist")
        arrays.append(np.load(path))
    device = _remote(args)
    if device is not None:
        _progress(f"uploading {args.library} to a server of {device}")
    model = load(args.library, remote=device)  # with its signature (LIBRARY.json): a missing or stale one is an error
    tensors = model.check_inputs(arrays)  # count, dtype, shape, NaN/Inf: errors name the input
    result = model(*tensors)
    outputs = [result] if isinstance(result, tvm.runtime.Tensor) else list(result)
    ms = model.time_ms(*tensors, number=args.repeat)  # on the device's clock
    shapes = [list(o.shape) for o in outputs]
    if args.output:
        for i, out in enumerate(outputs):
            np.save(args.output if len(outputs) == 1 else f"{os.path.splitext(args.output)[0]}_{i}.npy", out.numpy())
    threads = num_threads() if model.session is None else remote.threads(model.session)
    where = "" if device is None else f" on {device}"
    if args.json:
        print(json.dumps({"outputs": shapes, "ms": ms, "threads": threads, "device": str(device or "host")}))
    else:
        print(f"outputs: {', '.join(str(s) for s in shapes)}; {ms:.3f} ms per run ({threads} threads{where})")
    return 0


def cmd_report(args) -> int:
    from ..compiler import report

    mod = _load(args.model)
    rep = report(_build(mod, args))
    print(rep.to_json() if args.json else rep)
    return 0


def cmd_tune(args) -> int:
    from .tuner import tune

    device = _remote(args)
    mod = _load(args.model)
    _progress(f"tuning every accel conv2d (up to {args.limit or 'all'} candidates each) into {args.db}")
    db = tune(
        mod,
        args.db,
        target=_target(args),
        input_layout=args.input_layout,
        limit=args.limit,
        progress=_progress,
        remote=device,
        parallel=args.parallel,
        timeout=args.timeout,
        cc=args.cc,
    )
    _progress(
        f"accel with and without them, each in a process of its own: accel-tvm bench {args.model} --vs ''"
        f" --tuning-db {args.db}"
    )
    print(
        json.dumps({"db": args.db, "entries": len(db.entries)})
        if args.json
        else f"{args.db}: {len(db.entries)} tuned kernels"
    )
    return 0


def cmd_bench(args) -> int:
    from . import bench

    device = _remote(args)
    mod = _load(args.model)
    inputs = _inputs_of(mod)
    contenders = [c.strip() for c in args.vs.split(",") if c.strip()]
    options = {"progress": _progress, "tuning_db": args.tuning_db}
    if device is None:
        results = bench.compare(args.model, mod, inputs, contenders, args.repeat, **options)
    else:
        options.update(target=_target(args), cc=args.cc)
        results = bench.compare_remote(args.model, mod, inputs, contenders, args.repeat, device, **options)
    if args.plot:
        bench.plot(results, args.plot, title=os.path.basename(args.model))
        _progress(f"wrote {args.plot}")
    print(json.dumps(results, indent=2) if args.json else bench.table(results))
    return 0


def cmd_demo(args) -> int:
    from . import demo

    return demo.run()


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive number")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number of seconds")
    return value


def _arg(*flags, **options) -> tuple:
    return flags, options


_MODEL = "an .onnx file or a torch.export .pt2 file"
_IN_LAYOUT = "make main take channels-last (NHWC) image inputs instead of the model's NCHW"
_OUT_LAYOUT = "make main return channels-last (NHWC) image outputs instead of the model's NCHW"
_WEIGHTS = (
    "keep the weights in the library (default) or write them beside it to OUT.so.params "
    "(a code-only library; loading holds one copy of the weights, not several)"
)
_INPUT = (
    ".npy file, once per model input, in order; a symbolic dimension takes any size from 1, "
    "the same in every input that names it"
)
_VS = (
    "comma-separated: tvm (stock TVM), torch (.pt2 only), onnxruntime (.onnx only); '' for none "
    "(with --rpc: tvm only, the others do not run on a TVM RPC server)"
)

# every argument of a command, by name: (flags, argparse keywords); the names that share a
# flag (--output, --repeat, --tuning-db) differ in what the command does with it
ARGUMENTS = {
    "model": _arg("model", help=_MODEL),
    "output": _arg("-o", "--output", required=True, help="library to write (.so); its signature goes to OUT.so.json"),
    "input_layout": _arg("--input-layout", choices=["NCHW", "NHWC"], help=_IN_LAYOUT),
    "output_layout": _arg("--output-layout", choices=["NCHW", "NHWC"], help=_OUT_LAYOUT),
    "strict": _arg("--strict", action="store_true", help="fail instead of falling back to TVM's kernel"),
    "report": _arg("--report", action="store_true", help="print which kernel every op got"),
    "tuning_db": _arg("--tuning-db", help="JSON file written by 'accel-tvm tune': its schedules replace the defaults"),
    "weights": _arg("--weights", choices=["embedded", "separate"], default="embedded", help=_WEIGHTS),
    "library": _arg("library", help="a library written by 'accel-tvm compile' (its LIBRARY.params are loaded too)"),
    "input": _arg("--input", action="append", default=[], required=True, help=_INPUT),
    "output_npy": _arg("--output", help="write the output to this .npy file"),
    "repeat_run": _arg("--repeat", type=_positive, default=10, help="runs to average the time over (default 10)"),
    "vs": _arg("--vs", default="tvm,torch,onnxruntime", help=_VS),
    "repeat_bench": _arg("--repeat", type=_positive, default=20, help="timed runs per contender (default 20)"),
    "tuning_db_bench": _arg(
        "--tuning-db", help="also time accel built with this tuning database ('accel-tvm tune'): 'accel, tuned'"
    ),
    "plot": _arg("--plot", help="also write a bar chart to this PNG file"),
    "db": _arg("--db", required=True, help="JSON tuning database to create or extend (a tune resumes from it)"),
    "limit": _arg("--limit", type=_positive, help="at most this many candidates per shape (default: all)"),
    "parallel": _arg("--parallel", type=_positive, default=1, help="candidates built at once, a process each"),
    "timeout": _arg(
        "--timeout",
        type=_seconds,
        default=300.0,
        help="seconds a measurement on a server may take before it is tried on another (default 300)",
    ),
    "rpc": _arg("--rpc", metavar="HOST:PORT", help="run on a remote device: the address of TVM's RPC tracker"),
    "key": _arg("--key", help="with --rpc: the key the device's RPC servers registered under"),
    "mtriple": _arg("--mtriple", help="cross-compile for a device: its LLVM target triple (aarch64-linux-gnu)"),
    "mcpu": _arg("--mcpu", help="the device's LLVM CPU name (default: this host's)"),
    "mattr": _arg("--mattr", help="the device's CPU features, comma-separated (+neon,+fp-armv8)"),
    "num_cores": _arg("--num-cores", type=_positive, help="the device's cores, which the kernels split work for"),
    "cc": _arg("--cc", help="the compiler that links the library for the device (aarch64-linux-gnu-gcc)"),
}
_TARGET = ["mtriple", "mcpu", "mattr", "num_cores", "cc"]
_REMOTE = ["rpc", "key"]

# (name, handler, help, arguments, --json)
COMMANDS = [
    (
        "compile",
        cmd_compile,
        "compile MODEL for accel into a deployable library; symbolic input dimensions stay symbolic",
        ["model", "output", "input_layout", "output_layout", "strict", "report", "tuning_db", "weights", *_TARGET],
        True,
    ),
    (
        "run",
        cmd_run,
        "run a compiled library on .npy inputs, checked against its signature (LIBRARY.json), here or remotely",
        ["library", "input", "output_npy", "repeat_run", *_REMOTE],
        True,
    ),
    (
        "report",
        cmd_report,
        "which kernel every op of MODEL gets, and the runtime layout transforms",
        ["model", "input_layout", "output_layout"],
        True,
    ),
    (
        "bench",
        cmd_bench,
        "time MODEL on accel against other runtimes, same thread count, here or on a remote device",
        ["model", "vs", "repeat_bench", "tuning_db_bench", "plot", *_REMOTE, *_TARGET],
        True,
    ),
    (
        "tune",
        cmd_tune,
        "grid-search the schedule of every accel conv2d of MODEL by the model's time, save what it keeps",
        ["model", "db", "input_layout", "limit", "parallel", *_REMOTE, "timeout", *_TARGET],
        True,
    ),
    ("demo", cmd_demo, "compile a bundled model for accel, check it, report, compare with stock TVM", [], False),
]


def build_parser() -> argparse.ArgumentParser:
    """The accel-tvm parser: a subcommand per row of COMMANDS, with its ARGUMENTS, plus
    --debug and --threads (and --json where the row says so)."""
    parser = argparse.ArgumentParser(
        prog="accel-tvm", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    for name, handler, help_text, arguments, json_output in COMMANDS:
        sub = commands.add_parser(name, help=help_text, description=help_text)
        for argument in arguments:
            flags, options = ARGUMENTS[argument]
            sub.add_argument(*flags, **options)
        if json_output:
            sub.add_argument("--json", action="store_true", help="print the result as JSON")
        sub.add_argument("--debug", action="store_true", help="show the Python traceback of an error")
        sub.add_argument("--threads", type=_positive, help="threads for every runtime (default: every core)")
        sub.set_defaults(handler=handler)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.threads:
        os.environ["TVM_NUM_THREADS"] = str(args.threads)  # before the pool first runs
    try:
        return args.handler(args)
    except Exception as err:
        if args.debug:
            raise
        print(f"accel-tvm: error: {_one_line(err)}", file=sys.stderr)
        return 1
