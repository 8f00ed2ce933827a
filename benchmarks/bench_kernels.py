"""conv2d_nhwc_ohwi and dense_kn against stock TVM, PyTorch channels-last conv and numpy matmul.

    python -m pytest benchmarks/bench_kernels.py

prints (and writes to benchmarks/results/kernels.md) the median time of each
contender per shape and accel's speed-up over each, all on the same threads.
"""

import numpy as np
import pytest
import torch
import tvm
from tvm import relax

from tests.helpers import conv2d_module, matmul_module

RNG = np.random.default_rng(0)

# ResNet-50 3x3 convolutions, one per stage: (H=W, C=O)
CONV_SHAPES = [(56, 64), (28, 128), (14, 256), (7, 512)]
# BERT-base dense layers (seq 128) and the classifier head: (M, K, N)
DENSE_SHAPES = [(128, 768, 768), (128, 768, 3072), (128, 3072, 768), (1, 2048, 1000)]


def _vm_call(mod, target, inputs):
    vm = relax.VirtualMachine(tvm.compile(mod, target=target), tvm.cpu())
    args = [tvm.runtime.tensor(a) for a in inputs]
    return lambda: vm["main"](*args)


def _dense_case(m, k, n):
    return RNG.standard_normal((m, k)).astype("float32"), RNG.standard_normal((k, n)).astype("float32")


def _conv_case(hw, c):
    x = RNG.standard_normal((1, hw, hw, c)).astype("float32")
    w = RNG.standard_normal((c, 3, 3, c)).astype("float32")
    mod = conv2d_module(x, w, True, padding=1, data_layout="NHWC", kernel_layout="OHWI")
    return x, w, mod


@pytest.mark.parametrize("shape", CONV_SHAPES, ids=lambda s: f"conv3x3_{s[0]}x{s[0]}x{s[1]}")
def test_accel(benchmark, shape):
    x, _, mod = _conv_case(*shape)
    benchmark.group = f"conv3x3 {shape[0]}x{shape[0]}x{shape[1]}"
    benchmark(_vm_call(mod, "accel", [x]))


@pytest.mark.parametrize("shape", CONV_SHAPES, ids=lambda s: f"conv3x3_{s[0]}x{s[0]}x{s[1]}")
def test_stock_tvm(benchmark, shape):
    x, _, mod = _conv_case(*shape)
    benchmark.group = f"conv3x3 {shape[0]}x{shape[0]}x{shape[1]}"
    benchmark.pedantic(_vm_call(mod, "llvm", [x]), rounds=3, warmup_rounds=1)


@pytest.mark.parametrize("shape", CONV_SHAPES, ids=lambda s: f"conv3x3_{s[0]}x{s[0]}x{s[1]}")
def test_torch(benchmark, shape):
    x, w, _ = _conv_case(*shape)
    xt = torch.from_numpy(x).permute(0, 3, 1, 2)  # NCHW view of NHWC memory: channels_last
    wt = torch.from_numpy(w).permute(0, 3, 1, 2)
    assert xt.is_contiguous(memory_format=torch.channels_last)
    benchmark.group = f"conv3x3 {shape[0]}x{shape[0]}x{shape[1]}"
    with torch.inference_mode():
        benchmark(lambda: torch.nn.functional.conv2d(xt, wt, padding=1))


@pytest.mark.parametrize("shape", DENSE_SHAPES, ids=lambda s: "dense_{}x{}x{}".format(*s))
def test_accel_dense(benchmark, shape):
    x, w = _dense_case(*shape)
    benchmark.group = "dense {}x{}x{}".format(*shape)
    benchmark(_vm_call(matmul_module(x, w, True), "accel", [x]))


@pytest.mark.parametrize("shape", DENSE_SHAPES, ids=lambda s: "dense_{}x{}x{}".format(*s))
def test_stock_tvm_dense(benchmark, shape):
    x, w = _dense_case(*shape)
    benchmark.group = "dense {}x{}x{}".format(*shape)
    benchmark.pedantic(_vm_call(matmul_module(x, w, True), "llvm", [x]), rounds=3, warmup_rounds=1)


@pytest.mark.parametrize("shape", DENSE_SHAPES, ids=lambda s: "dense_{}x{}x{}".format(*s))
def test_numpy_dense(benchmark, shape):
    x, w = _dense_case(*shape)
    benchmark.group = "dense {}x{}x{}".format(*shape)
    benchmark(lambda: x @ w)
