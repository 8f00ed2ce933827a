"""Whole models from PyTorch through accel_target.build, against PyTorch, as a new user would."""

import pytest
import torch
import tvm

import accel_target
from tests.helpers import assert_close, run_executable
from tests.models.zoo import MODELS, make

pytestmark = pytest.mark.slow
IMAGE_MODELS = [name for name, (_, _, image) in MODELS.items() if image]
CONV_KERNELS = {"conv2d_nhwc_ohwi.accel": "conv2d_nhwc_ohwi", "conv2d_winograd.accel": "conv2d_winograd"}


def _executable_calls(executable, prefix: str) -> int:
    """Kernels whose name contains `prefix` (fused_conv2d_nhwc_ohwi3_add_relu too) that main
    calls, counted from the bytecode here, not by the report."""
    main = executable.as_text().split("@main:")[1].split("\n@")[0]
    names = [line.split()[1] for line in main.splitlines() if line.strip().startswith("call")]
    return sum(prefix in name for name in names)


def _check_report(executable, report):
    rows = report.rows
    convs = [r for r in rows if r.op == "relax.nn.conv2d"]
    dense = [r for r in rows if r.op == "relax.matmul" and len(r.inputs) == 2 and r.inputs[1].count(",") == 1]
    # every conv2d and every dense with a 2-D weight on an accel kernel
    assert all(r.kind == "accel" and r.kernel in CONV_KERNELS for r in convs)
    assert all(r.kind == "accel" and r.kernel == "dense_kn.accel" for r in dense)
    # the report agrees with what the executable calls
    for implementation, kernel in CONV_KERNELS.items():
        assert _executable_calls(executable, kernel) == sum(r.kernel == implementation for r in convs)
    assert _executable_calls(executable, "dense_kn") - _executable_calls(executable, "batch_dense_kn") == len(dense)
    # (products with a constant batch of weights: relative position tables)
    constant_batches = [r for r in rows if r.kernel == "batch_dense_kn.accel"]
    assert _executable_calls(executable, "batch_dense_kn") == len(constant_batches)
    batched = [r for r in rows if r.kernel == "batch_matmul_kn.accel"]
    assert _executable_calls(executable, "batch_matmul_kn") == len(batched)
    accel = len(convs) + len(dense) + len(constant_batches) + len(batched)
    assert report.kernels.accel == accel == report.count("accel")
    assert report.kernels.weight_transforms == 0
    return convs, dense


@pytest.mark.parametrize("name", MODELS)
def test_model_nchw_input(name):
    model, x, image = make(name)
    executable = accel_target.build(accel_target.from_torch(model, (x,)))
    assert_close(run_executable(executable, x.numpy()), model(x).detach().numpy())
    report = accel_target.report(executable)
    convs, dense = _check_report(executable, report)
    assert len(convs) + len(dense) > 0
    if image:
        assert report.kernels.activation_transforms <= 2
    summary = str(report)
    assert f"{report.kernels.weight_transforms} of weights" in summary
    assert ("nn.conv2d" in summary) == bool(convs)


@pytest.mark.parametrize("name", IMAGE_MODELS)
def test_image_model_nhwc_input(name):
    model, x, _ = make(name)
    executable = accel_target.build(accel_target.from_torch(model, (x,)), input_layout="NHWC")
    out = run_executable(executable, x.permute(0, 2, 3, 1).contiguous().numpy())
    assert_close(out, model(x).detach().numpy())
    report = accel_target.report(executable)
    _check_report(executable, report)
    assert report.kernels.activation_transforms == 0
    assert report.to_dict()["runtime"]["activation_transforms"] == 0


@pytest.mark.parametrize("name", IMAGE_MODELS)
def test_channels_last_pytorch_model(name):
    model, x, _ = make(name)
    model = model.to(memory_format=torch.channels_last)
    x = x.to(memory_format=torch.channels_last)
    executable = accel_target.build(accel_target.from_torch(model, (x,)), input_layout="NHWC")
    # a channels_last tensor's memory, as is, is the NHWC input
    nhwc = x.permute(0, 2, 3, 1)
    assert nhwc.is_contiguous()
    assert_close(run_executable(executable, nhwc.numpy()), model(x).detach().numpy())
    assert accel_target.report(executable).kernels.layout_transforms == 0


def test_params_as_inputs_give_the_same_folded_module():
    model, x, _ = make("residual_cnn")
    folded = accel_target.optimize(accel_target.from_torch(model, (x,)))
    mod, params = accel_target.from_torch(model, (x,), keep_params_as_input=True)
    assert len(mod["main"].params) == 1 + len(params)
    bound = accel_target.optimize(mod, params)
    tvm.ir.assert_structural_equal(bound, folded)
    assert_close(run_executable(accel_target.build(mod, params), x.numpy()), model(x).detach().numpy())


def test_registered_pipeline_matches_build():
    model, x, _ = make("depthwise_separable_cnn")
    mod = accel_target.from_torch(model, (x,))
    executable = tvm.compile(mod, target="accel", relax_pipeline="accel")
    assert_close(run_executable(executable, x.numpy()), model(x).detach().numpy())
    assert accel_target.report(executable).kernels.calls == accel_target.report(accel_target.build(mod)).kernels.calls


def test_transformer_attention_matmuls_run_on_batch_matmul_kernel():
    model, x, _ = make("transformer_encoder")
    executable = accel_target.build(accel_target.from_torch(model, (x,)), strict=True)
    report = accel_target.report(executable)
    batched = [r for r in report.rows if r.kernel == "batch_matmul_kn.accel"]
    assert len(batched) == 2 and report.count("fallback") == 0
    assert _executable_calls(executable, "batch_matmul_kn") == 2


class _Segmenter(torch.nn.Module):
    """Image to image: a strided encoder, bilinear upsampling back, per-pixel logits (NCHW)."""

    def __init__(self, classes=5):
        super().__init__()
        nn = torch.nn
        self.encoder = nn.Sequential(
            nn.Conv2d(3, 16, 3, 2, 1), nn.BatchNorm2d(16), nn.ReLU(), nn.Conv2d(16, 32, 3, 1, 1), nn.ReLU()
        )
        self.head = nn.Conv2d(32, classes, 1)

    def forward(self, x):
        logits = self.head(self.encoder(x))
        return torch.nn.functional.interpolate(logits, size=x.shape[2:], mode="bilinear", align_corners=False)


@pytest.mark.parametrize("output_layout", [None, "NHWC"])
def test_image_to_image_model_in_and_out_channels_last(output_layout):
    torch.manual_seed(0)
    model, x = _Segmenter().eval(), torch.randn(1, 3, 32, 24)
    mod = accel_target.from_torch(model, (x,))
    executable = accel_target.build(mod, input_layout="NHWC", output_layout=output_layout)
    out = run_executable(executable, x.permute(0, 2, 3, 1).contiguous().numpy())
    ref = model(x).detach()
    assert_close(out, (ref.permute(0, 2, 3, 1) if output_layout else ref).numpy())
    # NCHW logits cost one transpose at the end; channels-last ones none at all
    assert accel_target.report(executable).kernels.layout_transforms == (0 if output_layout else 1)


def test_output_layout_needs_an_image_output():
    model, x, _ = make("residual_cnn")
    with pytest.raises(ValueError, match=r"output_layout='NHWC' needs a 4-D NCHW image output"):
        accel_target.build(accel_target.from_torch(model, (x,)), output_layout="NHWC")
