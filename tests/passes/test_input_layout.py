"""`input_layout="NHWC"` means: the 4-D inputs the model reads as NCHW are given channels-last.
A Keras export, whose input already is [N, H, W, C] and which permutes it to NCHW itself, is left
as it is (the option cannot turn [1, 8, 8, 3] into [1, 8, 3, 8]); a PyTorch model's NCHW input
becomes NHWC; an input read with its channels elsewhere is a clear error."""

import numpy as np
import pytest
import torch

import accel_target
from accel_target.passes.io_layouts import channel_axis, convert_input_layout
from tests.helpers import assert_close, run_executable

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

RNG = np.random.default_rng(0)
WEIGHT = RNG.standard_normal((4, 3, 3, 3)).astype("float32")  # OIHW
MEAN, SCALE = np.array([0.5, 0.4, 0.3], "float32"), np.array([2.0, 3.0, 4.0], "float32")


def _keras_like(shape=(1, 8, 8, 3), perm=(0, 3, 1, 2)) -> "onnx.ModelProto":
    """A TF/Keras export: image [N, H, W, C], normalized channels-last (Sub, Mul on the last
    axis), Transpose to NCHW, Conv, Relu, global average pool, Flatten."""
    nodes = [
        helper.make_node("Sub", ["image", "mean"], ["centered"]),
        helper.make_node("Mul", ["centered", "scale"], ["scaled"]),
        helper.make_node("Transpose", ["scaled"], ["nchw"], perm=list(perm)),
        helper.make_node("Conv", ["nchw", "w"], ["conv"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["conv"], ["relu"]),
        helper.make_node("GlobalAveragePool", ["relu"], ["pooled"]),
        helper.make_node("Flatten", ["pooled"], ["out"]),
    ]
    along = [3] + [1] * (3 - perm[1])  # the constants' shape, along the input's channel axis
    consts = (("w", WEIGHT), ("mean", MEAN.reshape(along)), ("scale", SCALE.reshape(along)))
    weights = [numpy_helper.from_array(a, n) for n, a in consts]
    graph = helper.make_graph(
        nodes,
        "keras_like",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 4])],
        weights,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _reference(image_nhwc: np.ndarray) -> np.ndarray:
    x = torch.from_numpy((image_nhwc - MEAN) * SCALE).permute(0, 3, 1, 2)
    return torch.relu(torch.nn.functional.conv2d(x, torch.from_numpy(WEIGHT), padding=1)).mean(dim=(2, 3)).numpy()


@pytest.mark.parametrize("input_layout", [None, "NHWC"])
def test_a_keras_export_takes_its_nhwc_input_with_or_without_the_option(input_layout):
    mod = accel_target.from_onnx(_keras_like())
    param = mod["main"].params[0]
    assert channel_axis(mod["main"], param) == 3  # the model reads its last axis as channels
    assert convert_input_layout(mod, "NHWC") is mod  # already channels-last: left as it is
    executable = accel_target.build(mod, input_layout=input_layout)
    image = RNG.random((1, 8, 8, 3), dtype="float32")
    assert_close(run_executable(executable, image), _reference(image))
    # the model's own Transpose cancels against the conv's NHWC
    assert accel_target.report(executable).kernels.activation_transforms == 0


def test_an_input_read_with_its_channels_elsewhere_is_a_clear_error():
    # [N, H, C, W], permuted to NCHW by the model: neither NCHW nor NHWC
    mod = accel_target.from_onnx(_keras_like(shape=(1, 8, 3, 8), perm=(0, 2, 1, 3)))
    with pytest.raises(ValueError, match=r"input image of shape \[1, 8, 3, 8\] is read with its channels on axis 2"):
        accel_target.build(mod, input_layout="NHWC")


class _TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        return torch.relu(self.conv((x - 0.5) * 2.0)).mean(dim=(2, 3))


def test_a_pytorch_model_s_nchw_input_becomes_nhwc():
    torch.manual_seed(0)
    model, x = _TorchNet().eval(), torch.randn(1, 3, 8, 6)
    mod = accel_target.from_torch(model, (x,))
    assert channel_axis(mod["main"], mod["main"].params[0]) == 1
    converted = convert_input_layout(mod, "NHWC")
    assert [int(d) for d in converted["main"].params[0].ty.shape] == [1, 8, 6, 3]
    executable = accel_target.build(mod, input_layout="NHWC")
    out = run_executable(executable, x.permute(0, 2, 3, 1).contiguous().numpy())
    assert_close(out, model(x).detach().numpy())
    assert accel_target.report(executable).kernels.activation_transforms == 0
