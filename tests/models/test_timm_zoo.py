"""The timm zoo (tests/models/timm_zoo.py) through accel_target.build with NHWC input: every model
builds, matches PyTorch eager, runs every conv and matmul on an accel kernel, no step of ours
declines anything, no weight is transformed at run time, and the runtime transposes are at most
the model's own + its allowance in EXTRA_TRANSPOSES."""

import numpy as np
import pytest
import torch

import accel_target
from tests.helpers import assert_close, run_executable
from tests.models.test_hf_zoo import check_kernels, own_transposes, transpose_kernels
from tests.models.timm_zoo import TIMM, make

pytestmark = pytest.mark.slow
pytest.importorskip("timm")  # (it imports torchvision: tests/conftest.py installed the shim it needs)
# runtime transposes beyond the model's own, at most: what the layout clean-up cannot yet move
# past (none in this zoo). Add an entry, with its reason, only for what it cannot:
EXTRA_TRANSPOSES: dict[str, int] = {}


@pytest.mark.parametrize("name", list(TIMM))
def test_timm_model_with_nhwc_input_builds_and_matches_pytorch(name):
    model, (x,) = make(name)
    mod = accel_target.from_torch(model, (x,))
    executable = accel_target.build(mod, input_layout="NHWC")
    with torch.no_grad():
        expected = model(x).numpy()
    assert np.isfinite(expected).all() and expected.std() > 0
    assert_close(run_executable(executable, x.permute(0, 2, 3, 1).contiguous().numpy()), expected)
    report = check_kernels(executable)
    assert any(r.op == "relax.nn.conv2d" for r in report.rows)
    allowed = own_transposes(mod) + EXTRA_TRANSPOSES.get(name, 0)
    assert report.kernels.activation_transforms <= allowed, transpose_kernels(report)
    assert report.kernels.weight_transforms == 0
