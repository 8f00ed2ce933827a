"""ConvInteger and MatMulInteger from ONNX: the int8 kernels where the weights allow, exact
either way (against the same integer arithmetic in int64 by PyTorch and numpy: ONNX
Runtime's u8 x s8 products on an AVX2 host without VNNI saturate 16-bit pair sums, and are
off by thousands for these random operands)."""

import numpy as np
import pytest
import torch

import accel_target
from tests.helpers import run_executable

onnx = pytest.importorskip("onnx")
helper, TensorProto, numpy_helper = onnx.helper, onnx.TensorProto, onnx.numpy_helper

RNG = np.random.default_rng(11)


def _model(tmp_path, node, inputs, initializers, output_shape):
    graph = helper.make_graph(
        [node],
        "integer",
        [helper.make_tensor_value_info(name, dtype, shape) for name, dtype, shape in inputs],
        [helper.make_tensor_value_info("y", TensorProto.INT32, output_shape)],
        [numpy_helper.from_array(value, name) for name, value in initializers.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    return str(path)


def _compare(path, feeds: dict, expected: np.ndarray) -> dict:
    """accel's output equal to `expected`; the kernel each op ran on."""
    ex = accel_target.build(accel_target.from_onnx(path))
    np.testing.assert_array_equal(run_executable(ex, *feeds.values()), expected)
    return {row["op"].split(".")[-1]: row["kernel"] for row in accel_target.report(ex).to_dict()["ops"]}


@pytest.mark.parametrize("w_zero_point, int8_kernel", [(128, True), (100, False)])
def test_conv_integer(tmp_path, w_zero_point, int8_kernel):
    """uint8 weights with zero point 128 are int8 ones: the int8 kernel, x padded with its zero
    point; another weight zero point widens to int32 (TVM's kernel), exact too."""
    x = RNG.integers(0, 256, (1, 64, 9, 9)).astype("uint8")
    initializers = {
        "w": RNG.integers(0, 256, (32, 64, 3, 3)).astype("uint8"),
        "x_zp": np.array(7, "uint8"),
        "w_zp": np.array(w_zero_point, "uint8"),
    }
    node = helper.make_node("ConvInteger", ["x", "w", "x_zp", "w_zp"], ["y"], pads=[1, 1, 1, 1], strides=[1, 1])
    path = _model(tmp_path, node, [("x", TensorProto.UINT8, x.shape)], initializers, [1, 32, 9, 9])
    w = initializers["w"].astype(np.int64) - w_zero_point
    expected = torch.nn.functional.conv2d(torch.from_numpy(x.astype(np.int64) - 7), torch.from_numpy(w), padding=1)
    kernels = _compare(path, {"x": x}, expected.numpy().astype("int32"))
    assert ("conv2d_nhwc_ohwi_int8.accel" in kernels["conv2d"]) == int8_kernel, kernels


@pytest.mark.parametrize("b_zero_point, int8_kernel", [(0, True), (3, False)])
def test_matmul_integer(tmp_path, b_zero_point, int8_kernel):
    """int8 weights with zero point 0 and a runtime scalar zero point of the data (as
    DynamicQuantizeLinear gives it): the int8 kernel; another weight zero point: TVM's
    widened matmul, exact too."""
    a = RNG.integers(0, 256, (2, 6, 96)).astype("uint8")
    initializers = {"b": RNG.integers(-128, 128, (96, 40)).astype("int8"), "b_zp": np.array(b_zero_point, "int8")}
    node = helper.make_node("MatMulInteger", ["a", "b", "a_zp", "b_zp"], ["y"])
    inputs = [("a", TensorProto.UINT8, a.shape), ("a_zp", TensorProto.UINT8, [])]
    path = _model(tmp_path, node, inputs, initializers, [2, 6, 40])
    expected = (a.astype(np.int64) - 131) @ (initializers["b"].astype(np.int64) - b_zero_point)
    kernels = _compare(path, {"a": a, "a_zp": np.array(131, "uint8")}, expected.astype("int32"))
    assert ("dense_kn_int8.accel" in kernels["matmul"]) == int8_kernel, kernels
