"""accel beside numpy and PyTorch in one process, at everyone's default settings: a call right
after their work slows down no more than ONNX Runtime's does (by 3x at most, a ratio measured
in one run: each runtime in a process of its own, in alternating turns)."""

import json
import os
import statistics
import subprocess
import sys

import numpy as np
import torch

import accel_target
from tests.runtime.coexistence import two_conv

ROUNDS = 3


def _slowdown(runtime: str, model: str, data: str) -> float:
    env = {k: v for k, v in os.environ.items() if k not in ("TVM_NUM_THREADS", "OMP_NUM_THREADS")}
    command = [sys.executable, "-m", "tests.runtime.coexistence", runtime, model, data]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, cwd=os.getcwd())
    assert done.returncode == 0, done.stderr[-2000:]
    times = json.loads(done.stdout.strip().splitlines()[-1])
    return times["after"] / times["alone"]


def test_a_call_after_numpy_and_pytorch_work_slows_no_more_than_3x_onnxruntimes(tmp_path):
    model, x = two_conv()
    library, onnx_file, data = str(tmp_path / "m.so"), str(tmp_path / "m.onnx"), str(tmp_path / "x.npy")
    accel_target.save(accel_target.build(accel_target.from_torch(model, (x,))), library)
    torch.onnx.export(model, (x,), onnx_file, dynamo=False, input_names=["x"])
    np.save(data, x.numpy())
    ratios = []
    for _ in range(ROUNDS):
        accel = _slowdown("accel", library, data)
        ratios.append(accel / _slowdown("onnxruntime", onnx_file, data))
    assert statistics.median(ratios) <= 3, ratios
