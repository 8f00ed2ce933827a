"""Converters accel adds to TVM's PyTorch importer (accel_target/torch_ops.py), against PyTorch."""

import pytest
import torch

import accel_target
from tests.helpers import assert_close, run_executable


class _Unfold(torch.nn.Module):
    def __init__(self, dim, size, step):
        super().__init__()
        self.args = dim, size, step

    def forward(self, x):
        return x.unfold(*self.args) * 2


@pytest.mark.parametrize(
    "shape, dim, size, step",
    [
        ((2, 32, 3), 1, 8, 8),  # PatchTST's patches
        ((2, 30, 3), 1, 8, 4),  # overlapping windows, the last 2 elements in none
        ((1, 2, 5, 7), -1, 3, 2),  # the last axis, counted back
        ((10, 4), 0, 4, 3),
    ],
)
def test_unfold_windows_as_pytorch(shape, dim, size, step):
    model, x = _Unfold(dim, size, step), torch.randn(*shape)
    executable = accel_target.build(accel_target.from_torch(model, (x,)))
    assert_close(run_executable(executable, x.numpy()), model(x).numpy())


class _Extremum(torch.nn.Module):
    def __init__(self, op, **kwargs):
        super().__init__()
        self.op, self.kwargs = op, kwargs

    def forward(self, x):
        return self.op(x, **self.kwargs) + 1


@pytest.mark.parametrize("op", [torch.amax, torch.amin], ids=["amax", "amin"])
@pytest.mark.parametrize("kwargs", [{"dim": -1}, {"dim": (0, 2), "keepdim": True}, {}], ids=["last", "two", "all"])
def test_amax_and_amin_as_pytorch(op, kwargs):
    model, x = _Extremum(op, **kwargs), torch.randn(3, 4, 5)
    executable = accel_target.build(accel_target.from_torch(model, (x,)))
    assert_close(run_executable(executable, x.numpy()), model(x).numpy())
