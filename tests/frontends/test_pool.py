"""Adaptive max pooling, pools with indices, average pools with a divisor override and group norm
without affine parameters as PyTorch computes them (accel_target/frontends/torch_pool.py,
torch_ops.group_norm): TVM's importer lacks the first, returns zeros for the second's indices,
ignores the third's divisor and crashes on the fourth."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import accel_target
from accel_target.frontends import UnsupportedModelError
from tests.helpers import assert_close


class AdaptiveMaxPool(nn.Module):
    def __init__(self, size, indices=False):
        super().__init__()
        self.size, self.indices = size, indices

    def forward(self, x):
        pool = F.adaptive_max_pool2d if x.dim() == 4 or isinstance(self.size, tuple) else F.adaptive_max_pool1d
        return pool(x, self.size, return_indices=self.indices)


@pytest.mark.parametrize(
    "shape, size",
    [
        pytest.param((1, 4, 8, 6), (4, 1), id="rows-divide"),  # timm's bilinear attention transform
        pytest.param((2, 3, 7, 9), (3, 5), id="uneven-cells"),
        pytest.param((2, 3, 7, 9), (1, 4), id="global-rows-uneven-columns"),
        pytest.param((3, 7, 9), (2, 2), id="no-batch"),
        pytest.param((1, 4, 10), 3, id="1d-uneven"),
        pytest.param((1, 4, 12), 4, id="1d-divides"),
    ],
)
def test_adaptive_max_pool_matches_pytorch(shape, size):
    model, x = AdaptiveMaxPool(size).eval(), torch.randn(*shape)
    compiled = accel_target.build(accel_target.from_torch(model, (x,)))
    assert_close(compiled(x.numpy()).numpy(), model(x).numpy())


@pytest.mark.parametrize("size", [(4, 1), (3, 5)], ids=["cells-divide", "uneven-cells"])
def test_adaptive_max_pool_between_convs_runs_in_nhwc(size):
    """The pool (a max_pool2d, or slices and maxima) follows the convs' NHWC: the output's
    transpose back to NCHW is the only one."""
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), AdaptiveMaxPool(size), nn.Conv2d(8, 8, 1)).eval()
    x = torch.randn(1, 3, 8, 6)
    compiled = accel_target.build(accel_target.from_torch(model, (x,)), input_layout="NHWC")
    with torch.no_grad():
        assert_close(compiled(x.permute(0, 2, 3, 1).numpy()).numpy(), model(x).numpy())
    assert accel_target.report(compiled).kernels.activation_transforms == 1


class MaxPoolIndices(nn.Module):
    def forward(self, x):
        values, indices = F.max_pool2d(x, 2, return_indices=True)
        return values, indices


@pytest.mark.parametrize(
    "model, op",
    [(AdaptiveMaxPool((2, 2), indices=True), "adaptive_max_pool2d"), (MaxPoolIndices(), "max_pool2d_with_indices")],
)
def test_pooling_indices_read_by_the_program_are_refused(model, op):
    """TVM's converters give zeros for the indices: refused, naming the op, rather than wrong."""
    with pytest.raises(UnsupportedModelError, match=f"{op}.* with its indices"):
        accel_target.from_torch(model, (torch.randn(1, 2, 4, 4),))


class AvgPool(nn.Module):
    def __init__(self, **options):
        super().__init__()
        self.options = options

    def forward(self, x):
        pool = F.avg_pool3d if x.dim() == 5 else F.avg_pool2d
        return pool(x, **self.options)


@pytest.mark.parametrize(
    "shape, options",
    [
        pytest.param((1, 3, 8, 8), dict(kernel_size=3, stride=2, padding=1, divisor_override=2), id="2d"),
        pytest.param(
            (2, 3, 8, 9), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, divisor_override=5), id="ceil"
        ),
        pytest.param((3, 7, 6), dict(kernel_size=(2, 3), divisor_override=4), id="no-batch"),
        pytest.param(
            (1, 2, 5, 6, 6), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, divisor_override=7), id="3d"
        ),
    ],
)
def test_avg_pool_divisor_override_matches_pytorch(shape, options):
    """TVM's converter divided by the window, ignoring divisor_override."""
    model, x = AvgPool(**options).eval(), torch.randn(*shape)
    compiled = accel_target.build(accel_target.from_torch(model, (x,)))
    assert_close(compiled(x.numpy()).numpy(), model(x).numpy())


@pytest.mark.parametrize("weight, bias", [(True, False), (False, True), (False, False)])
def test_group_norm_without_weight_or_bias_matches_pytorch(weight, bias):
    """timm's PoolFormerV2 normalizes with a weight and no bias."""
    norm = nn.GroupNorm(2, 6)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-0.5, 0.5)
    norm.weight = norm.weight if weight else None
    norm.bias = norm.bias if bias else None
    model, x = nn.Sequential(nn.Conv2d(3, 6, 3), norm).eval(), torch.randn(1, 3, 7, 7)
    compiled = accel_target.build(accel_target.from_torch(model, (x,)), input_layout="NHWC")
    with torch.no_grad():
        assert_close(compiled(x.permute(0, 2, 3, 1).numpy()).numpy(), model(x).numpy())
