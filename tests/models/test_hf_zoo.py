"""Hugging Face transformers architectures (small configs, random weights) through
accel_target.build: every one builds where stock TVM does, matches PyTorch eager, runs
every conv2d and matmul on an accel kernel, and no step of ours declines anything."""

import pytest

import accel_target
from tests.helpers import assert_close, run_executable
from tests.models.hf_zoo import MODELS
from tests.models.test_models import _check_report

pytestmark = pytest.mark.slow
# convolutional networks: with NHWC input, not one layout transform at run time
CONV_NETS = ["efficientnet", "regnet", "poolformer", "convnext", "convnextv2"]


def _check_kernels(executable):
    report = accel_target.report(executable)
    _check_report(executable, report)
    # batched matmuls (attention) too
    assert all(r.kind == "accel" for r in report.rows if r.op in ("relax.nn.conv2d", "relax.matmul")), str(report)
    assert report.declines == (), str(report)
    return report


@pytest.mark.parametrize("name", MODELS)
def test_hf_model_builds_and_matches_pytorch(name):
    model, x = MODELS[name]()
    executable = accel_target.build(accel_target.from_torch(model, (x,)))
    assert_close(run_executable(executable, x.numpy()), model(x).detach().numpy())
    report = _check_kernels(executable)
    assert report.count("accel") > 0


@pytest.mark.parametrize("name", CONV_NETS)
def test_hf_conv_net_with_nhwc_input_has_no_layout_transform(name):
    model, x = MODELS[name]()
    executable = accel_target.build(accel_target.from_torch(model, (x,)), input_layout="NHWC")
    out = run_executable(executable, x.permute(0, 2, 3, 1).contiguous().numpy())
    assert_close(out, model(x).detach().numpy())
    report = _check_kernels(executable)
    transforms = [k for k in report.kernels.calls if "transpose" in k or "layout_transform" in k]
    assert report.kernels.layout_transforms == 0, transforms
