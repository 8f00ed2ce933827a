"""Quantized models, batch 1: accel int8 against ONNX Runtime int8 and accel's own fp32 build.

    python benchmarks/bench_int8.py [--models resnet50,mobilenet_v2,bert_base_2layers] [--threads 2]
                                    [--mcpu haswell] [--no-amx]

The models of benchmarks/models.py (random weights) are exported to ONNX and quantized with ONNX
Runtime's ``quantize_static`` as a user would: QDQ format, per-channel int8 weights, uint8
activations, random calibration data (BERT: its MatMul / Gemm layers only), ``reduce_range=True``
(7-bit weights, so that ONNX Runtime's u8s8 kernels do not saturate on a CPU without VNNI and the
two int8 results can be compared). Contenders, each timed in a fresh process of its own with the
same thread count:

- accel int8: ``accel_target.build(accel_target.from_onnx(qdq file))``;
- ONNX Runtime int8: an InferenceSession of the same QDQ file;
- accel fp32: ``accel_target.build(accel_target.from_torch(model))``.

Prints a markdown table (and --json rows); "agree" is the share of accel int8's outputs within one
quantization step of ONNX Runtime's.

On an AMX host (Sapphire Rapids and later) both accel and ONNX Runtime use AMX for int8.
``--no-amx`` measures a VNNI host without it on the same machine: accel built with
``mattr=["-amx-tile", "-amx-int8"]``, and ONNX Runtime's process refused the tile registers by a
seccomp filter (`deny_amx`), so that its MLAS takes its AVX-512 VNNI kernels.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # the repository: tests.models.quantized_onnx
CONTENDERS = ("accel int8", "ONNX Runtime int8", "accel fp32")
REPEAT = 30


def _quantize(name: str, folder: str) -> str:
    """The QDQ path (folder/qdq.onnx, beside float.onnx) of benchmark model `name`, and its input
    saved as x.npy."""
    import pathlib

    import numpy as np

    from tests.models.quantized_onnx import quantized_onnx

    sys.path.insert(0, HERE)
    from models import make

    model, x = make(name)
    np.save(os.path.join(folder, "x.npy"), x.numpy())
    ops = {"op_types_to_quantize": ["MatMul", "Gemm"]} if name.startswith("bert") else {}
    return quantized_onnx(model, tuple(x.shape), pathlib.Path(folder), count=4, **ops)


def deny_amx() -> None:
    """Make Linux refuse this process the AMX tile registers (a seccomp filter failing
    ``arch_prctl(ARCH_REQ_XCOMP_PERM)`` with EPERM), so that a library that asks for them
    first, as ONNX Runtime's MLAS does, falls back to its AVX-512 VNNI kernels: a VNNI host
    without AMX, on an AMX host."""
    import ctypes

    class Filter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Filter))]

    load, jump_eq, ret = 0x20, 0x15, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_RET|K
    program = [
        (load, 0, 0, 0),  # the syscall number
        (jump_eq, 0, 3, 158),  # arch_prctl
        (load, 0, 0, 16),  # its first argument (low half)
        (jump_eq, 0, 1, 0x1023),  # ARCH_REQ_XCOMP_PERM
        (ret, 0, 0, 0x00050001),  # SECCOMP_RET_ERRNO | EPERM
        (ret, 0, 0, 0x7FFF0000),  # SECCOMP_RET_ALLOW
    ]
    filters = (Filter * len(program))(*program)
    libc = ctypes.CDLL(None, use_errno=True)
    no_new_privs, set_seccomp, mode_filter = 38, 22, 2
    if libc.prctl(no_new_privs, 1, 0, 0, 0) or libc.prctl(
        set_seccomp, mode_filter, ctypes.byref(Program(len(program), filters)), 0, 0
    ):
        raise OSError(ctypes.get_errno(), "bench_int8 --no-amx: could not install the seccomp filter")


def _runner(contender: str, name: str, folder: str, threads: int, mcpu: str | None = None, no_amx: bool = False):
    """(run, output) for one contender, built or loaded in this process (accel for `mcpu`, if
    given; without AMX, and ONNX Runtime refused it, if `no_amx`)."""
    import numpy as np

    if no_amx:
        deny_amx()
    import accel_target
    from accel_target.benchmark import onnxruntime_runner, vm_runner

    target = {
        "tag": "accel",
        **({"mcpu": mcpu} if mcpu else {}),
        **({"mattr": ["-amx-tile", "-amx-int8"]} if no_amx else {}),
    }
    x = np.load(os.path.join(folder, "x.npy"))
    qdq_path = os.path.join(folder, "qdq.onnx")
    if contender == "ONNX Runtime int8":
        run = onnxruntime_runner(qdq_path, [x], threads)
        return run, lambda: run()[0]
    if contender == "accel int8":
        executable = accel_target.build(accel_target.from_onnx(qdq_path), target=target)
    else:
        import torch

        sys.path.insert(0, HERE)
        from models import make

        torch.set_num_threads(threads)
        model, _ = make(name)
        executable = accel_target.build(accel_target.from_torch(model, (torch.from_numpy(x),)), target=target)
    run = vm_runner(executable, [x])
    return run, lambda: run().numpy()


def measure(
    contender: str, name: str, folder: str, threads: int, mcpu: str | None = None, no_amx: bool = False
) -> dict:
    """Build (timed), run and time one contender; its output saved beside the model."""
    import numpy as np

    from accel_target.benchmark import median_ms

    started = time.perf_counter()
    try:
        run, output = _runner(contender, name, folder, threads, mcpu, no_amx)
    except Exception as err:  # a model this contender cannot build: say so in the table
        return {"error": f"{type(err).__name__}: {str(err).strip().splitlines()[0][:160]}"}
    row = {"build s": time.perf_counter() - started}
    np.save(os.path.join(folder, f"{contender.replace(' ', '_')}.npy"), output())
    row["ms"] = float(np.median([median_ms(run, REPEAT) for _ in range(3)]))
    return row


def _in_fresh_process(
    contender: str, name: str, folder: str, threads: int, mcpu: str | None, no_amx: bool, held: dict
) -> dict:
    env = dict(os.environ, TVM_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads), **held)
    command = [sys.executable, __file__, "--one", contender, "--models", name, "--dir", folder]
    command += ["--mcpu", mcpu] if mcpu else []
    command += ["--no-amx"] if no_amx else []
    out = subprocess.run(command + ["--threads", str(threads)], env=env, stdout=subprocess.PIPE, text=True)
    lines = out.stdout.strip().splitlines()
    return json.loads(lines[-1]) if out.returncode == 0 and lines else {"error": f"exit {out.returncode}"}


def _avx2_host_env(mcpu: str | None) -> dict:
    """Environment entries that run every contender as on an AVX2-only host, ONNX Runtime from
    a patched copy (benchmarks/cpuid_cap.py patched_env), when `mcpu` is an AVX2 CPU; else {}."""
    from accel_target.benchmark import isa

    if not mcpu or isa({"tag": "accel", "mcpu": mcpu}) != "avx2":
        return {}
    sys.path.insert(0, HERE)
    import cpuid_cap

    return cpuid_cap.patched_env("onnxruntime")


def _agreement(folder: str, qdq_path: str) -> float | None:
    """Share of accel int8's outputs within one output quantization step of ONNX Runtime's."""
    import numpy as np

    from tests.models.quantized_onnx import output_scale

    files = [os.path.join(folder, f"{c.replace(' ', '_')}.npy") for c in ("accel int8", "ONNX Runtime int8")]
    if not all(os.path.isfile(f) for f in files):
        return None
    step = output_scale(qdq_path)
    if step is None:  # a float output (BERT's layer norm): no step to count in
        return None
    accel, ort = (np.load(f) for f in files)
    return float((np.abs(accel - ort) <= step * 1.001).mean())


def markdown(rows: list[dict], threads: int, mcpu: str | None = None, no_amx: bool = False, held: bool = False) -> str:
    import onnxruntime
    import tvm

    import accel_target

    lines = [
        f"{threads} threads for every contender, each in a fresh process; CPU {accel_target.machine()}; "
        f"apache-tvm {tvm.__version__}, onnxruntime {onnxruntime.__version__}; batch 1, median of 3 medians "
        f"of {REPEAT} runs"
        + (f"; accel built for mcpu={mcpu}" if mcpu else "")
        + ("; ONNX Runtime held to AVX2 (benchmarks/cpuid_cap.py patched_env)" if held else "")
        + ("; no AMX (accel built without it, ONNX Runtime refused the tile registers)" if no_amx else ""),
        "",
        "| model | " + " | ".join(f"{c} ms" for c in CONTENDERS) + " | int8 vs ORT int8 | int8 vs fp32 | agree |",
        "|---" * (len(CONTENDERS) + 4) + "|",
    ]
    for r in rows:
        times = [r[c].get("ms") for c in CONTENDERS]
        cells = [f"{t:.2f}" if t is not None else r[c].get("error", "") for c, t in zip(CONTENDERS, times)]
        accel, ort, fp32 = times
        speedups = [f"{other / accel:.2f}x" if accel and other else "" for other in (ort, fp32)]
        agree = "" if r["agree"] is None else f"{100 * r['agree']:.1f} %"
        lines.append(f"| {r['model']} | " + " | ".join(cells + speedups + [agree]) + " |")
    lines += ["", "'int8 vs X' = X's time / accel int8's (above 1: accel int8 is faster)."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="resnet50,mobilenet_v2,bert_base_2layers")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", action="store_true", help="print the rows as JSON too")
    parser.add_argument(
        "--mcpu",
        help="build accel's contenders for this LLVM CPU (e.g. haswell: AVX2 code, which an AVX-512 host "
        "runs too); for an AVX2 CPU, every contender's process runs as on an AVX2-only host, ONNX Runtime "
        "from a copy whose CPUID and XGETBV report one (benchmarks/cpuid_cap.py patched_env)",
    )
    parser.add_argument(
        "--no-amx",
        action="store_true",
        help="a VNNI host without AMX on an AMX host: accel built without AMX, and ONNX Runtime's process "
        "refused the tile registers (seccomp), so that it takes its AVX-512 VNNI kernels",
    )
    parser.add_argument("--one", choices=CONTENDERS, help=argparse.SUPPRESS)  # one contender's row (internal)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, args.models, args.dir, args.threads, args.mcpu, args.no_amx)))
        return
    rows, held = [], _avx2_host_env(args.mcpu)
    for name in args.models.split(","):
        with tempfile.TemporaryDirectory(prefix="accel_int8_") as folder:
            print(f"[bench_int8] {name}: export and quantize", file=sys.stderr, flush=True)
            qdq_path = _quantize(name, folder)
            row = {"model": name}
            for contender in CONTENDERS:
                print(f"[bench_int8] {name}: {contender}", file=sys.stderr, flush=True)
                row[contender] = _in_fresh_process(contender, name, folder, args.threads, args.mcpu, args.no_amx, held)
            row["agree"] = _agreement(folder, qdq_path)
            rows.append(row)
    print(markdown(rows, args.threads, args.mcpu, args.no_amx, bool(held)))
    if args.json:
        print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
