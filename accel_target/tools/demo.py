"""The main job: compile a bundled model for accel, check it, report, compare with stock TVM.

Needs no network and no files: the model is a small ResNet written in
PyTorch (NCHW, batch norm, strided 1x1 shortcuts) with seeded random
weights. The reference output is PyTorch's; the speed is compared with stock
TVM (`tvm.compile(mod, target="llvm")`) and PyTorch on the same threads, each in a
process of its own, taking turns (`accel_target.tools.timing`).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

import numpy as np
import tvm

from ..compiler import build, report
from ..frontends import from_torch
from ..runtime.deploy import save
from ..target import num_threads
from .timing import save_inputs, speedups, take_turns

# turns each contender takes, and runs per turn (stock TVM: a few, its runs tens of times accel's)
ROUNDS, REPEAT, STOCK_REPEAT = 3, 20, 3


def bundled_model():
    """(model, example input): a ResNet-10 for 3x112x112 images, 100 classes, eval mode."""
    import torch
    from torch import nn

    def conv_bn(cin, cout, k, stride=1):
        return nn.Sequential(nn.Conv2d(cin, cout, k, stride, k // 2, bias=False), nn.BatchNorm2d(cout))

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.body = nn.Sequential(conv_bn(cin, cout, 3, stride), nn.ReLU(), conv_bn(cout, cout, 3))
            self.short = conv_bn(cin, cout, 1, stride) if stride != 1 or cin != cout else nn.Identity()

        def forward(self, x):
            return torch.relu(self.body(x) + self.short(x))

    torch.manual_seed(0)
    model = nn.Sequential(
        conv_bn(3, 32, 7, 2),
        nn.ReLU(),
        nn.MaxPool2d(3, 2, 1),
        Block(32, 32, 1),
        Block(32, 64, 2),
        Block(64, 128, 2),
        Block(128, 256, 2),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(256, 100),
    )
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.2, 0.2)
            m.running_var.uniform_(0.5, 1.5)
    return model.eval(), torch.randn(1, 3, 112, 112)


def run(out=sys.stdout) -> int:
    """Run the demo, print to `out`; return a process exit code (0 when the output matches)."""
    model, x = bundled_model()
    mod = from_torch(model, (x,))
    started = time.perf_counter()
    executable = build(mod)
    print(
        f"bundled model: ResNet-10, input NCHW {list(x.shape)}; accel build took "
        f"{time.perf_counter() - started:.1f} s\n",
        file=out,
    )
    print(report(executable), file=out)

    got, want = executable(x.numpy()).numpy(), model(x).detach().numpy()  # inputs checked, as load's models
    error = float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-30))
    ok = error < 1e-4
    print(f"\noutput vs PyTorch: max relative error {error:.1e} ({'ok' if ok else 'MISMATCH'})", file=out)

    threads = num_threads()
    with tempfile.TemporaryDirectory(prefix="accel_demo_") as tmp:
        data = save_inputs(os.path.join(tmp, "x.npz"), [x.numpy()])
        save(executable, os.path.join(tmp, "accel.so"))
        tvm.compile(mod, target="llvm").export_library(os.path.join(tmp, "stock.so"))
        specs = {
            "accel": {"kind": "accel", "path": os.path.join(tmp, "accel.so"), "inputs": data},
            "stock TVM": {"kind": "tvm", "path": os.path.join(tmp, "stock.so"), "inputs": data},
            "PyTorch": {"kind": "call", "function": "accel_target.tools.demo:eager_runner"},
        }
        repeats = {"accel": REPEAT, "stock TVM": STOCK_REPEAT, "PyTorch": REPEAT}
        times = take_turns(specs, threads, repeats, ROUNDS)
    t_accel, t_stock, t_torch = (float(np.median(times[name])) for name in specs)
    ups = speedups(times)
    print(
        f"speed, {threads} threads each, each in a process of its own: "
        f"accel {t_accel:.2f} ms | stock TVM {t_stock:.1f} ms ({ups['stock TVM']:.0f}x slower) | "
        f"PyTorch {t_torch:.2f} ms ({ups['PyTorch']:.2f}x accel's time)",
        file=out,
    )
    return 0 if ok else 1


def eager_runner():
    """The bundled model in eager PyTorch, a callable running it once (a timing process's runner)."""
    import torch

    model, x = bundled_model()

    def run():
        with torch.inference_mode():
            model(x)

    return run
