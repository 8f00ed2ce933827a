"""Single layers at batch 1: a representative set of ResNet-50 and MobileNetV2 convolutions (fed
NHWC, OHWI weights for accel, channels-last for PyTorch) and BERT-base / classifier dense layers
(weights [in, out] for accel), each a one-layer PyTorch model with random weights and no bias."""

import functools

import pytest
import torch
from contenders import Case
from torch import nn

# convolutions: (name, (H=W, C, O, kernel, stride, groups))
CONVS = [
    # ResNet-50: the 7x7 stem, a 1x1 expansion, 3x3s at each resolution, a late 1x1 reduction
    ("conv7x7s2_224x224x3_64", (224, 3, 64, 7, 2, 1)),
    ("conv1x1_56x56x64_256", (56, 64, 256, 1, 1, 1)),
    ("conv3x3_56x56x64_64", (56, 64, 64, 3, 1, 1)),
    ("conv3x3_28x28x128_128", (28, 128, 128, 3, 1, 1)),
    ("conv1x1_14x14x1024_256", (14, 1024, 256, 1, 1, 1)),
    ("conv3x3_7x7x512_512", (7, 512, 512, 3, 1, 1)),
    # MobileNetV2: depthwise 3x3, at stride 1 and 2
    ("depthwise3x3_112x112x32", (112, 32, 32, 3, 1, 32)),
    ("depthwise3x3s2_56x56x144", (56, 144, 144, 3, 2, 144)),
]
# dense layers: (name, (M, K, N)): a classifier head's GEMV, BERT-base's FFN at sequence 128
DENSES = [
    ("dense_1x2048x1000", (1, 2048, 1000)),
    ("dense_128x768x3072", (128, 768, 3072)),
    ("dense_128x3072x768", (128, 3072, 768)),
]


def _conv(h, c, o, k, stride, groups):
    torch.manual_seed(0)
    return nn.Conv2d(c, o, k, stride, k // 2, groups=groups, bias=False).eval(), (torch.randn(1, c, h, h),)


def _dense(m, k, n):
    torch.manual_seed(0)
    return nn.Linear(k, n, bias=False).eval(), (torch.randn(m, k),)


CASES = [Case(name, functools.partial(_conv, *shape), channels_last=True, source=__file__) for name, shape in CONVS]
CASES += [Case(name, functools.partial(_dense, *shape), source=__file__) for name, shape in DENSES]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_kernel(measure, case):
    measure(case)
