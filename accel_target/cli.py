"""accel-tvm: compile, run, report and benchmark models for the accel target.

    accel-tvm compile MODEL -o OUT.so [--input-layout NHWC] [--output-layout NHWC] [--strict] [--report]
                      [--weights separate]
    accel-tvm run OUT.so --input x.npy [...] [--output y.npy]
    accel-tvm report MODEL
    accel-tvm bench MODEL [--vs tvm,torch,onnxruntime] [--tuning-db tuning.json] [--plot out.png]
    accel-tvm tune MODEL --db tuning.json [--limit N]   (then bench --tuning-db, compile --tuning-db)
    accel-tvm demo

MODEL is an ONNX file (.onnx) or a program saved with torch.export.save (.pt2).
A symbolic input dimension (an ONNX dim_param such as "batch", a torch.export Dim) stays
symbolic: compile writes one library for every size, its signature (OUT.so.json) names the
dimension, and run takes any size from 1 for it, the same in every input that names it;
a wrong rank, fixed size, dtype or a disagreeing shared dimension is an error naming the
input and the dimension.
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


def _load(path: str, input_layout: str | None):
    from . import frontend, transforms

    _progress(f"importing {path}")
    mod = frontend.load_model(path)
    return mod, _inputs_of(transforms.convert_input_layout(mod, input_layout))


def _build(mod, input_layout, strict, tuning_db=None, weights="embedded", output_layout=None):
    from .pipeline import build

    _progress("building for accel (layout conversion, weight folding, kernels, LLVM)")
    started = time.perf_counter()
    executable = build(
        mod,
        input_layout=input_layout,
        output_layout=output_layout,
        strict=strict,
        tuning_db=tuning_db,
        weights=weights,
    )
    _progress(f"built in {time.perf_counter() - started:.1f} s")
    return executable


def cmd_compile(args) -> int:
    from .deploy import executable_inputs, save, symbolic_dims
    from .pipeline import report

    mod, _ = _load(args.model, args.input_layout)
    executable = _build(mod, args.input_layout, args.strict, args.tuning_db, args.weights, args.output_layout)
    meta = {
        "model": os.path.abspath(args.model),
        "input_layout": args.input_layout,
        "output_layout": args.output_layout,
    }
    written = save(executable, args.output, meta=meta)
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

    from .deploy import load
    from .target import num_threads

    if not os.path.isfile(args.library):
        raise CLIError(f"library {args.library!r} does not exist")
    arrays = []
    for path in args.input:
        if not os.path.isfile(path):
            raise CLIError(f"input file {path!r} does not exist")
        arrays.append(np.load(path))
    model = load(args.library)  # with its signature (LIBRARY.json): a missing or stale one is an error
    tensors = model.check_inputs(arrays)  # count, dtype, shape, NaN/Inf: errors name the input
    result = model(*tensors)
    outputs = [result] if isinstance(result, tvm.runtime.Tensor) else list(result)
    ms = model.time_ms(*tensors, number=args.repeat)
    shapes = [list(o.shape) for o in outputs]
    if args.output:
        for i, out in enumerate(outputs):
            np.save(args.output if len(outputs) == 1 else f"{os.path.splitext(args.output)[0]}_{i}.npy", out.numpy())
    threads = num_threads()
    if args.json:
        print(json.dumps({"outputs": shapes, "ms": ms, "threads": threads}))
    else:
        print(f"outputs: {', '.join(str(s) for s in shapes)}; {ms:.3f} ms per run ({threads} threads)")
    return 0


def cmd_report(args) -> int:
    from .pipeline import report

    mod, _ = _load(args.model, args.input_layout)
    rep = report(_build(mod, args.input_layout, False, output_layout=args.output_layout))
    print(rep.to_json() if args.json else rep)
    return 0


def cmd_tune(args) -> int:
    from .tuner import tune

    mod, _ = _load(args.model, args.input_layout)
    _progress(f"tuning every accel conv2d (up to {args.limit or 'all'} candidates each) into {args.db}")
    db = tune(mod, args.db, input_layout=args.input_layout, limit=args.limit, progress=_progress)
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
    from . import benchmark

    mod, inputs = _load(args.model, None)
    contenders = [c.strip() for c in args.vs.split(",") if c.strip()]
    results = benchmark.compare(
        args.model, mod, inputs, contenders, args.repeat, progress=_progress, tuning_db=args.tuning_db
    )
    if args.plot:
        benchmark.plot(results, args.plot, title=os.path.basename(args.model))
        _progress(f"wrote {args.plot}")
    print(json.dumps(results, indent=2) if args.json else benchmark.table(results))
    return 0


def cmd_demo(args) -> int:
    from . import demo

    return demo.run()


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive number")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="accel-tvm", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)

    def command(name, handler, help_text, json_output=True):
        sub = commands.add_parser(name, help=help_text, description=help_text)
        if json_output:
            sub.add_argument("--json", action="store_true", help="print the result as JSON")
        sub.add_argument("--debug", action="store_true", help="show the Python traceback of an error")
        sub.add_argument("--threads", type=_positive, help="threads for every runtime (default: every core)")
        sub.set_defaults(handler=handler)
        return sub

    layout_help = "make main take channels-last (NHWC) image inputs instead of the model's NCHW"
    output_layout_help = "make main return channels-last (NHWC) image outputs instead of the model's NCHW"
    sub = command(
        "compile",
        cmd_compile,
        "compile MODEL for accel into a deployable library; symbolic input dimensions stay symbolic",
    )
    sub.add_argument("model", help="an .onnx file or a torch.export .pt2 file")
    sub.add_argument(
        "-o", "--output", required=True, help="library to write (.so); its input signature goes to OUT.so.json"
    )
    sub.add_argument("--input-layout", choices=["NCHW", "NHWC"], help=layout_help)
    sub.add_argument("--output-layout", choices=["NCHW", "NHWC"], help=output_layout_help)
    sub.add_argument("--strict", action="store_true", help="fail instead of falling back to TVM's kernel")
    sub.add_argument("--report", action="store_true", help="print which kernel every op got")
    sub.add_argument("--tuning-db", help="JSON file written by 'accel-tvm tune': its schedules replace the defaults")
    sub.add_argument(
        "--weights",
        choices=["embedded", "separate"],
        default="embedded",
        help="keep the weights in the library (default) or write them beside it to OUT.so.params "
        "(a code-only library; loading holds one copy of the weights, not several)",
    )

    sub = command("run", cmd_run, "run a compiled library on .npy inputs, checked against its signature (LIBRARY.json)")
    sub.add_argument("library", help="a library written by 'accel-tvm compile' (its LIBRARY.params are loaded too)")
    sub.add_argument(
        "--input",
        action="append",
        default=[],
        required=True,
        help=".npy file, once per model input, in order; a symbolic dimension takes any size from 1, "
        "the same in every input that names it",
    )
    sub.add_argument("--output", help="write the output to this .npy file")
    sub.add_argument("--repeat", type=_positive, default=10, help="runs to average the time over (default 10)")

    sub = command("report", cmd_report, "which kernel every op of MODEL gets, and the runtime layout transforms")
    sub.add_argument("model", help="an .onnx file or a torch.export .pt2 file")
    sub.add_argument("--input-layout", choices=["NCHW", "NHWC"], help=layout_help)
    sub.add_argument("--output-layout", choices=["NCHW", "NHWC"], help=output_layout_help)

    sub = command("bench", cmd_bench, "time MODEL on accel against other runtimes, same thread count")
    sub.add_argument("model", help="an .onnx file or a torch.export .pt2 file")
    sub.add_argument(
        "--vs",
        default="tvm,torch,onnxruntime",
        help="comma-separated: tvm (stock TVM), torch (.pt2 only), onnxruntime (.onnx only); '' for none",
    )
    sub.add_argument("--repeat", type=_positive, default=20, help="timed runs per contender (default 20)")
    sub.add_argument(
        "--tuning-db",
        help="also time accel built with this tuning database ('accel-tvm tune'): 'accel, tuned'",
    )
    sub.add_argument("--plot", help="also write a bar chart to this PNG file")

    sub = command(
        "tune", cmd_tune, "grid-search the schedule of every accel conv2d of MODEL in the model, save what it keeps"
    )
    sub.add_argument("model", help="an .onnx file or a torch.export .pt2 file")
    sub.add_argument("--db", required=True, help="JSON tuning database to create or extend")
    sub.add_argument("--input-layout", choices=["NCHW", "NHWC"], help=layout_help)
    sub.add_argument("--limit", type=_positive, help="at most this many candidates per shape (default: all)")

    command(
        "demo",
        cmd_demo,
        "compile a bundled model for accel, check it, report, compare with stock TVM",
        json_output=False,
    )
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
