"""F.interpolate as PyTorch computes it (accel_target/frontends/torch_resize.py): TVM's importer
took nearest with half-pixel coordinates rounded to the nearest index, any scale factor with
in / out coordinates, and antialias=True as no antialiasing."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import accel_target
from tests.helpers import assert_close

SIZES = [
    pytest.param({"size": (7, 7)}, id="3x4->7x7"),
    pytest.param({"size": (5, 9)}, id="3x4->5x9"),
    pytest.param({"size": (2, 2)}, id="down-2x2"),
    pytest.param({"size": (1, 1)}, id="down-1x1"),
    pytest.param({"size": (1, 5)}, id="3x4->1x5"),
    pytest.param({"scale_factor": 2}, id="x2"),
    pytest.param({"scale_factor": 2.5}, id="x2.5"),
    pytest.param({"scale_factor": (1.5, 3)}, id="x1.5,3"),
]
MODES = [("nearest", None), ("bilinear", False), ("bilinear", True), ("bicubic", False), ("nearest-exact", None)]


class Interpolate(nn.Module):
    def __init__(self, mode, align_corners, kwargs):
        super().__init__()
        self.mode, self.align_corners, self.kwargs = mode, align_corners, kwargs

    def forward(self, x):
        return F.interpolate(x, mode=self.mode, align_corners=self.align_corners, **self.kwargs)


@pytest.mark.parametrize("mode, align_corners", MODES, ids=[f"{m}-{a}" for m, a in MODES])
@pytest.mark.parametrize("kwargs", SIZES)
def test_interpolate_matches_pytorch(mode, align_corners, kwargs):
    model = Interpolate(mode, align_corners, kwargs).eval()
    x = torch.randn(1, 2, 3, 4)
    compiled = accel_target.build(accel_target.from_torch(model, (x,)))
    assert_close(compiled(x.numpy()).numpy(), model(x).numpy())


ANTIALIASED = [
    pytest.param(mode, align, kwargs, id=f"{mode}-{align}-{name}")
    for mode in ("bilinear", "bicubic")
    for align, kwargs, name in [
        (False, {"size": (3, 4)}, "7x9->3x4"),
        (False, {"size": (2, 9)}, "7x9->2x9"),
        (False, {"scale_factor": 0.45}, "x0.45"),
        (True, {"size": (4, 5)}, "7x9->4x5"),
        (False, {"size": (9, 11)}, "7x9->9x11"),
    ]
]


@pytest.mark.parametrize("mode, align_corners, kwargs", ANTIALIASED)
def test_antialiased_interpolate_matches_pytorch(mode, align_corners, kwargs):
    """TVM's importer resized without the antialiasing filter (bilinear) or not at all (bicubic)."""
    model = Interpolate(mode, align_corners, {**kwargs, "antialias": True}).eval()
    x = torch.randn(1, 2, 7, 9)
    compiled = accel_target.build(accel_target.from_torch(model, (x,)))
    assert_close(compiled(x.numpy()).numpy(), model(x).numpy())


def test_a_nearest_upsample_between_convs_runs_channels_last():
    """Where TVM's resize computes PyTorch's coordinates (a whole scale factor), it is used:
    it has layout inference, and a conv, upsample, conv model fed NHWC has no transform."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.Upsample(scale_factor=2), nn.Conv2d(8, 4, 1)).eval()
    x = torch.randn(1, 3, 8, 8)
    compiled = accel_target.build(accel_target.from_torch(model, (x,)), input_layout="NHWC", output_layout="NHWC")
    assert_close(compiled(x.permute(0, 2, 3, 1).numpy()).numpy(), model(x).permute(0, 2, 3, 1).detach().numpy())
    assert accel_target.report(compiled).kernels.layout_transforms == 0
