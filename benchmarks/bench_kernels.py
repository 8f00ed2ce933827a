"""conv2d_nhwc_ohwi and dense_kn against stock TVM, PyTorch channels-last conv and numpy matmul.

    python -m pytest benchmarks/bench_kernels.py

prints (and writes to benchmarks/results/<isa>/kernels.md and .png) the median time of
each contender per shape, accel's speed-up over each, and the geometric mean of
the speed-ups per family, all on the same threads.
"""

import numpy as np
import pytest
import torch
import tvm

from accel_target.benchmark import vm_runner
from tests.helpers import conv2d_module, matmul_module

RNG = np.random.default_rng(0)

# every distinct ResNet-50 convolution (v1.5: stride on the 3x3): (H=W, C, O, kernel, stride)
RESNET50_CONVS = [
    (224, 3, 64, 7, 2),
    (56, 64, 64, 1, 1),
    (56, 64, 64, 3, 1),
    (56, 64, 256, 1, 1),
    (56, 256, 64, 1, 1),
    (56, 256, 128, 1, 1),
    (56, 128, 128, 3, 2),
    (28, 128, 512, 1, 1),
    (56, 256, 512, 1, 2),
    (28, 512, 128, 1, 1),
    (28, 128, 128, 3, 1),
    (28, 512, 256, 1, 1),
    (28, 256, 256, 3, 2),
    (14, 256, 1024, 1, 1),
    (28, 512, 1024, 1, 2),
    (14, 1024, 256, 1, 1),
    (14, 256, 256, 3, 1),
    (14, 1024, 512, 1, 1),
    (14, 512, 512, 3, 2),
    (7, 512, 2048, 1, 1),
    (14, 1024, 2048, 1, 2),
    (7, 2048, 512, 1, 1),
    (7, 512, 512, 3, 1),
]
# every distinct MobileNetV2 depthwise convolution: (H=W, C, stride)
MOBILENET_DEPTHWISE = [
    (112, 32, 1),
    (112, 96, 2),
    (56, 144, 1),
    (56, 144, 2),
    (28, 192, 1),
    (28, 192, 2),
    (14, 384, 1),
    (14, 576, 1),
    (14, 576, 2),
    (7, 960, 1),
]
# FC layers from batch 1 (GEMV) to 256 rows: BERT-base (seq 128), classifier heads: (M, K, N)
DENSE_SHAPES = [
    (1, 2048, 1000),
    (1, 768, 3072),
    (16, 768, 768),
    (128, 768, 768),
    (128, 768, 3072),
    (128, 3072, 768),
    (256, 1024, 1000),
    (256, 768, 3072),
]

CONV_IDS = [f"conv{k}x{k}/{s} {h}x{h}x{c}->{o}" for h, c, o, k, s in RESNET50_CONVS]
DW_IDS = [f"depthwise3x3/{s} {h}x{h}x{c}" for h, c, s in MOBILENET_DEPTHWISE]
DENSE_IDS = ["dense {}x{}x{}".format(*s) for s in DENSE_SHAPES]


def _vm_call(mod, target, inputs):
    return vm_runner(tvm.compile(mod, target=target), inputs)


def _conv_case(h, c, o, k, stride, groups=1):
    """NHWC data, OHWI weights, as the module, and as PyTorch channels-last tensors."""
    x = RNG.standard_normal((1, h, h, c)).astype("float32")
    w = RNG.standard_normal((o, k, k, c // groups)).astype("float32")
    mod = conv2d_module(
        x, w, True, strides=stride, padding=k // 2, groups=groups, data_layout="NHWC", kernel_layout="OHWI"
    )
    xt, wt = torch.from_numpy(x).permute(0, 3, 1, 2), torch.from_numpy(w).permute(0, 3, 1, 2)
    assert xt.is_contiguous(memory_format=torch.channels_last)
    return x, mod, lambda: torch.nn.functional.conv2d(xt, wt, stride=stride, padding=k // 2, groups=groups)


# (the _conv_case arguments, benchmark group = test id)
CONV_CASES = list(zip(RESNET50_CONVS, CONV_IDS)) + [
    ((h, c, c, 3, s, c), name) for (h, c, s), name in zip(MOBILENET_DEPTHWISE, DW_IDS)
]
DENSE_CASES = list(zip(DENSE_SHAPES, DENSE_IDS))


@pytest.mark.parametrize("shape,group", CONV_CASES, ids=[c[1] for c in CONV_CASES])
def test_accel(benchmark, shape, group):
    x, mod, _ = _conv_case(*shape)
    benchmark.group = group
    benchmark(_vm_call(mod, "accel", [x]))


@pytest.mark.parametrize("shape,group", CONV_CASES, ids=[c[1] for c in CONV_CASES])
def test_stock_tvm(benchmark, shape, group):
    x, mod, _ = _conv_case(*shape)
    benchmark.group = group
    benchmark.pedantic(_vm_call(mod, "llvm", [x]), rounds=2, warmup_rounds=1)


@pytest.mark.parametrize("shape,group", CONV_CASES, ids=[c[1] for c in CONV_CASES])
def test_torch(benchmark, shape, group):
    _, _, run = _conv_case(*shape)
    benchmark.group = group
    with torch.inference_mode():
        benchmark(run)


def _dense_case(m, k, n):
    return RNG.standard_normal((m, k)).astype("float32"), RNG.standard_normal((k, n)).astype("float32")


@pytest.mark.parametrize("shape,group", DENSE_CASES, ids=DENSE_IDS)
def test_accel_dense(benchmark, shape, group):
    x, w = _dense_case(*shape)
    benchmark.group = group
    benchmark(_vm_call(matmul_module(x, w, True), "accel", [x]))


@pytest.mark.parametrize("shape,group", DENSE_CASES, ids=DENSE_IDS)
def test_stock_tvm_dense(benchmark, shape, group):
    x, w = _dense_case(*shape)
    benchmark.group = group
    benchmark.pedantic(_vm_call(matmul_module(x, w, True), "llvm", [x]), rounds=2, warmup_rounds=1)


@pytest.mark.parametrize("shape,group", DENSE_CASES, ids=DENSE_IDS)
def test_numpy_dense(benchmark, shape, group):
    x, w = _dense_case(*shape)
    benchmark.group = group
    benchmark(lambda: x @ w)
