"""The int8 kernels, batch 1: accel int8 against accel's fp32 kernel and ONNX Runtime's int8 op.

    python benchmarks/bench_int8_kernels.py [--threads 2] [--number 20] [--shapes resnet50,mobilenet_v2,bert]

Each contender runs in a fresh process of its own with the same thread count (TVM_NUM_THREADS,
OMP_NUM_THREADS, ONNX Runtime's intra-op threads); a process builds one op and prints the median of
its per-call times in ms. Contenders, on the same shape:

- accel int8: ``relax.nn.conv2d`` (NHWC / OHWI, out_dtype int32) or ``relax.matmul`` (uint8 x int8
  -> int32) with constant weights through ``accel_target.build``: conv2d_nhwc_ohwi_int8 / dense_kn_int8;
- accel fp32: the same op on float32 through ``accel_target.build`` (conv2d_nhwc_ohwi, or
  conv2d_winograd where the strategy picks it; dense_kn);
- ONNX Runtime int8: a one-node model, QLinearConv (NCHW, uint8 x int8 -> uint8: its requantize
  included; ConvInteger, which stops at int32, is not one of its optimized kernels) or
  MatMulInteger (uint8 x int8 -> int32).

Prints a markdown table; "int8 vs fp32" is fp32's time divided by int8's (above 1: int8 is faster).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

# (name, kind, shape): conv shape (H, W, C, O, k, stride, pad, groups); dense shape (M, K, N)
SHAPES = {
    "resnet50": [
        ("conv1 7x7/2", "conv", (224, 224, 3, 64, 7, 2, 3, 1)),
        ("res2 3x3", "conv", (56, 56, 64, 64, 3, 1, 1, 1)),
        ("res2 1x1 expand", "conv", (56, 56, 64, 256, 1, 1, 0, 1)),
        ("res3 3x3", "conv", (28, 28, 128, 128, 3, 1, 1, 1)),
        ("res4 1x1 reduce", "conv", (14, 14, 1024, 256, 1, 1, 0, 1)),
        ("res5 3x3", "conv", (7, 7, 512, 512, 3, 1, 1, 1)),
        ("res5 1x1 expand", "conv", (7, 7, 512, 2048, 1, 1, 0, 1)),
    ],
    "mobilenet_v2": [
        ("dw 112x112x32", "conv", (112, 112, 32, 32, 3, 1, 1, 32)),
        ("dw 56x56x144 /2", "conv", (56, 56, 144, 144, 3, 2, 1, 144)),
        ("pw 56x56 24->144", "conv", (56, 56, 24, 144, 1, 1, 0, 1)),
        ("pw 7x7 960->320", "conv", (7, 7, 960, 320, 1, 1, 0, 1)),
    ],
    "bert": [
        ("qkv 128x768x768", "dense", (128, 768, 768)),
        ("ffn1 128x768x3072", "dense", (128, 768, 3072)),
        ("ffn2 128x3072x768", "dense", (128, 3072, 768)),
        ("gemv 1x768x3072", "dense", (1, 768, 3072)),
    ],
}
CONTENDERS = ("accel int8", "accel fp32", "onnxruntime int8")


def _inputs(kind: str, shape, dtype: str):
    """(data, weight) in accel's layouts (NHWC / OHWI, [K, N]), random."""
    import numpy as np

    rng = np.random.default_rng(0)
    if kind == "conv":
        h, w, c, o, k, _, _, groups = shape
        dshape, wshape = (1, h, w, c), (o, k, k, c // groups)
    else:
        m, k, n = shape
        dshape, wshape = (m, k), (k, n)
    if dtype == "float32":
        return rng.standard_normal(dshape).astype("float32"), rng.standard_normal(wshape).astype("float32")
    return rng.integers(0, 256, dshape).astype("uint8"), rng.integers(-128, 128, wshape).astype("int8")


def _accel(kind: str, shape, dtype: str):
    """A callable running the op once through an accel build."""
    from tvm import relax

    import accel_target
    from accel_target.benchmark import vm_runner

    x, w = _inputs(kind, shape, dtype)
    out_dtype = "int32" if dtype == "uint8" else "float32"
    bb = relax.BlockBuilder()
    data = relax.Var("data", relax.TensorType(x.shape, str(x.dtype)))
    with bb.function("main", [data]):
        with bb.dataflow():
            if kind == "conv":
                _, _, _, _, _, stride, pad, groups = shape
                call = relax.op.nn.conv2d(
                    data, relax.const(w), stride, pad, 1, groups, "NHWC", "OHWI", out_dtype=out_dtype
                )
            else:
                call = relax.op.matmul(data, relax.const(w), out_dtype=out_dtype)
            out = bb.emit_output(call)
        bb.emit_func_output(out)
    return vm_runner(accel_target.build(bb.get()), [x])


def _onnxruntime(kind: str, shape, threads: int):
    """A callable running a one-node QLinearConv / MatMulInteger model in ONNX Runtime."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from accel_target.benchmark import onnxruntime_runner

    x, w = _inputs(kind, shape, "uint8")
    consts = [numpy_helper.from_array(w, "w")]
    if kind == "conv":
        _, _, _, _, k, stride, pad, groups = shape
        x, w = np.ascontiguousarray(x.transpose(0, 3, 1, 2)), np.ascontiguousarray(w.transpose(0, 3, 1, 2))
        scales = {"xs": 0.02, "xz": 128, "ws": 0.01, "wz": 0, "ys": 0.05, "yz": 128}
        dtypes = {"xz": np.uint8, "wz": np.int8, "yz": np.uint8}
        consts = [numpy_helper.from_array(w, "w")] + [
            numpy_helper.from_array(np.array(v, dtypes.get(name, np.float32)), name) for name, v in scales.items()
        ]
        node = helper.make_node(
            "QLinearConv",
            ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"],
            ["y"],
            kernel_shape=[k, k],
            strides=[stride] * 2,
            pads=[pad] * 4,
            group=groups,
        )
        out_type = TensorProto.UINT8
    else:
        node = helper.make_node("MatMulInteger", ["x", "w"], ["y"])
        out_type = TensorProto.INT32
    graph = helper.make_graph(
        [node],
        "int8_op",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, list(x.shape))],
        [helper.make_tensor_value_info("y", out_type, None)],
        consts,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    return onnxruntime_runner(model.SerializeToString(), [x], threads)  # (a path or the model's bytes)


def worker(contender: str, kind: str, shape, threads: int, number: int) -> float:
    """Median ms of `number` calls of one contender (after warm-up), in this process."""
    from accel_target.benchmark import median_ms

    if contender == "onnxruntime int8":
        run = _onnxruntime(kind, shape, threads)
    else:
        run = _accel(kind, shape, "uint8" if contender == "accel int8" else "float32")
    return median_ms(run, number)


def _spawn(contender: str, kind: str, shape, threads: int, number: int) -> float | None:
    env = {**os.environ, "TVM_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)}
    args = [sys.executable, __file__, "--worker", json.dumps([contender, kind, list(shape), threads, number])]
    done = subprocess.run(args, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        print(f"{contender} on {shape} failed: {done.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return None
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--number", type=int, default=20)
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        contender, kind, shape, threads, number = json.loads(args.worker)
        print(worker(contender, kind, tuple(shape), threads, number))
        return
    print(f"{args.threads} threads per contender, each in its own process; median ms of {args.number} calls\n")
    print("| layer | " + " | ".join(CONTENDERS) + " | int8 vs fp32 | int8 vs ORT |")
    print("|---" * (len(CONTENDERS) + 3) + "|")
    for group in args.shapes.split(","):
        for name, kind, shape in SHAPES[group]:
            ms = {c: _spawn(c, kind, shape, args.threads, args.number) for c in CONTENDERS}
            cells = [f"{ms[c]:.3f}" if ms[c] is not None else "failed" for c in CONTENDERS]
            ratios = [
                f"{ms[other] / ms['accel int8']:.2f}x" if ms[other] and ms["accel int8"] else ""
                for other in ("accel fp32", "onnxruntime int8")
            ]
            print(f"| {group} {name} | " + " | ".join(cells + ratios) + " |", flush=True)


if __name__ == "__main__":
    main()
