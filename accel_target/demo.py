"""The main job: compile a bundled model for accel, check it, report, compare with stock TVM.

Needs no network and no files: the model is a small image classifier written
in Relax with seeded random weights; the reference is the same module built
by stock TVM (`target="llvm"`).
"""

from __future__ import annotations

import sys
import time

import numpy as np
import tvm
from tvm import relax

from strategy import recording

from .report import format_table, runtime_kernels


def bundled_model(seed: int = 0) -> tuple[tvm.IRModule, np.ndarray]:
    """A 6-layer NHWC classifier (conv, depthwise conv, 1x1 convs, global pool, dense).

    Input 4-D NHWC [1, 112, 112, 3]; output [1, 100].
    """
    rng = np.random.default_rng(seed)

    def weight(*shape):
        fan_in = int(np.prod(shape[1:])) if len(shape) == 4 else shape[0]
        return relax.const((rng.standard_normal(shape) / np.sqrt(fan_in)).astype("float32"))

    def conv(bb, x, out_c, in_c, k, stride=1, groups=1):
        y = relax.op.nn.conv2d(x, weight(out_c, k, k, in_c // groups), strides=stride, padding=k // 2,
                               groups=groups, data_layout="NHWC", kernel_layout="OHWI")
        return bb.emit(relax.op.nn.relu(bb.emit(y)))

    bb = relax.BlockBuilder()
    data = relax.Var("data", relax.TensorType([1, 112, 112, 3], "float32"))
    with bb.function("main", [data]):
        with bb.dataflow():
            x = conv(bb, data, 32, 3, 3, stride=2)
            x = conv(bb, x, 32, 32, 3, groups=32)
            x = conv(bb, x, 64, 32, 1)
            x = conv(bb, x, 64, 64, 3, stride=2, groups=64)
            x = conv(bb, x, 128, 64, 1)
            x = bb.emit(relax.op.mean(x, axis=[1, 2]))
            out = bb.emit_output(relax.op.matmul(x, weight(128, 100)))
        bb.emit_func_output(out)
    return bb.get(), rng.standard_normal((1, 112, 112, 3)).astype("float32")


def _time_ms(vm: relax.VirtualMachine, args, repeat: int = 10) -> float:
    return vm.time_evaluator("main", tvm.cpu(), number=repeat, repeat=3)(*args).median * 1e3


def run(out=sys.stdout) -> int:
    """Run the demo, print to `out`; return a process exit code (0 when the output matches)."""
    mod, x = bundled_model()
    args = [tvm.runtime.tensor(x)]
    started = time.perf_counter()
    with recording() as decisions:
        accel = tvm.compile(mod, target="accel")
    print(f"compiled the bundled model for accel in {time.perf_counter() - started:.1f} s", file=out)
    stock = tvm.compile(mod, target="llvm")
    vm_accel, vm_stock = (relax.VirtualMachine(ex, tvm.cpu()) for ex in (accel, stock))
    got, want = vm_accel["main"](*args).numpy(), vm_stock["main"](*args).numpy()
    error = float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30))
    print(format_table(decisions), file=out)
    kernels = runtime_kernels(accel)
    print(f"runtime layout transforms: {kernels.layout_transforms} "
          f"(activations {kernels.activation_transforms}, weights {kernels.weight_transforms})", file=out)
    ok = error < 1e-4
    print(f"output vs stock TVM: max relative error {error:.1e} ({'ok' if ok else 'MISMATCH'})", file=out)
    t_accel, t_stock = _time_ms(vm_accel, args), _time_ms(vm_stock, args, repeat=1)
    threads = tvm.get_global_func("runtime.NumThreads")()
    print(f"speed ({threads} threads): accel {t_accel:.2f} ms, stock TVM {t_stock:.2f} ms, "
          f"{t_stock / t_accel:.1f}x faster", file=out)
    return 0 if ok else 1
