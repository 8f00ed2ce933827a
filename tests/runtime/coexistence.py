"""A model called right after numpy and PyTorch work, in a process of its own (run as
``python -m tests.runtime.coexistence RUNTIME MODEL INPUT``; prints one JSON line).

RUNTIME is "accel" (MODEL: a library from accel_target.save, at its defaults) or
"onnxruntime" (MODEL: an ONNX file, at its defaults). Each call's work before it: a 512x512
float32 numpy product and a PyTorch conv (16->32, 3x3 on 1x16x56x56). Prints the medians of
CALLS calls alone and right after that work, in ms.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

CALLS = 21
WARMUP = 4


def two_conv():
    """(model, input): conv 32->64 3x3, ReLU, conv 64->64 3x3, ReLU on 1x32x56x56."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    layers = [nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 64, 3, padding=1), nn.ReLU()]
    return nn.Sequential(*layers).eval(), torch.randn(1, 32, 56, 56)


class Work:
    """What the other libraries do before each call: a numpy product and a PyTorch conv."""

    def __init__(self):
        import numpy as np
        import torch

        self.torch = torch
        self.a = np.random.default_rng(0).standard_normal((512, 512)).astype("float32")
        self.conv, self.x = torch.nn.Conv2d(16, 32, 3, padding=1).eval(), torch.randn(1, 16, 56, 56)

    def __call__(self) -> None:
        self.a @ self.a
        with self.torch.inference_mode():
            self.conv(self.x)


def median_ms(call, before=None, calls: int = CALLS) -> float:
    """Median time of `calls` calls, each after `before()` if given, after WARMUP untimed ones
    and a pause in which every library's threads go idle."""
    time.sleep(0.3)
    times = []
    for i in range(WARMUP + calls):
        if before is not None:
            before()
        start = time.perf_counter()
        call()
        if i >= WARMUP:
            times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def runner(runtime: str, model: str, x):
    if runtime == "accel":
        import accel_target

        loaded = accel_target.load(model)
        return lambda: loaded(x)
    import onnxruntime

    session = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return lambda: session.run(None, {name: x})


def main(runtime: str, model: str, data: str) -> None:
    import numpy as np

    call = runner(runtime, model, np.load(data))
    work = Work()
    for _ in range(10):
        work()
        call()
    print(json.dumps({"alone": median_ms(call), "after": median_ms(call, work)}))


if __name__ == "__main__":
    main(*sys.argv[1:4])
