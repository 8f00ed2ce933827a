"""The kernel counts read from an executable, and the demo (the README's main job)."""

import subprocess
import sys

import tvm

from accel_target.reporting import runtime_kernels
from tests.helpers import conv2d_module, rand


def test_runtime_kernels_counts_transforms_by_kind():
    x, w = rand(1, 3, 8, 8), rand(4, 3, 3, 3)
    runtime_w = runtime_kernels(tvm.compile(conv2d_module(x, w, False), target="accel"))
    assert runtime_w.accel == 1 and runtime_w.activation_transforms == 2 and runtime_w.weight_transforms == 1
    assert [c.rstrip("0123456789") for c in runtime_w.calls] == [
        "transpose",
        "weight_layout_transform",
        "conv2d_nhwc_ohwi",
        "transpose",
    ]
    const_w = runtime_kernels(tvm.compile(conv2d_module(x, w, True), target="accel"))
    assert const_w.weight_transforms == 0 and const_w.activation_transforms == 2


def test_demo_command_line_checks_output_and_reports():
    result = subprocess.run([sys.executable, "-m", "accel_target", "demo"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    text = result.stdout
    rows = [line.split() for line in text.splitlines()]
    kernels = [line.rsplit("  ", 1)[-1] for line in text.splitlines()]
    # 12 convolutions: the three 3x3 stride-1 ones at 14x14 and 28x28 on Winograd
    assert kernels.count("conv2d_nhwc_ohwi.accel") == 9 and kernels.count("conv2d_winograd.accel") == 3
    assert kernels.count("dense_kn.accel") == 1
    # every bias, residual add and relu runs in a kernel's write-back
    epilogue = [row for row in rows if row and row[0] in ("add", "nn.relu")]
    # (12 conv biases, 4 residuals, the dense bias; the stem relu and two per block)
    assert len(epilogue) == 17 + 9 and all(row[-3:-1] == ["fused", "into"] for row in epilogue), epilogue
    # the stem reads the NCHW image as it is (ReadInputNCHW); the rest is NHWC, pooled to a dense layer
    assert "runtime layout transforms: 0 of activations, 0 of weights" in text
    assert "output vs PyTorch" in text and "(ok)" in text and "stock TVM" in text
    assert "speed, " in text
