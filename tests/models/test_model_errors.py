"""Bad input to the whole-model path: a clear error naming what is wrong."""

import numpy as np
import onnx
import pytest
import torch
import tvm
from onnx import TensorProto, helper
from tvm import relax

import accel_target
from accel_target.frontends import UnsupportedModelError, torch_ops
from tests.models.zoo import make


def _onnx_model(op: str, inputs=("x",)) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node(op, list(inputs), ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])],
    )
    return helper.make_model(graph)


def test_malformed_onnx_file(tmp_path):
    path = tmp_path / "garbage.onnx"
    path.write_bytes(b"\x08\x07not a protobuf at all\xff\xfe")
    with pytest.raises(ValueError, match="garbage.onnx' is not a valid ONNX model"):
        accel_target.from_onnx(path)


def test_missing_onnx_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothere.onnx"):
        accel_target.from_onnx(tmp_path / "nothere.onnx")


def test_onnx_with_unknown_op():
    with pytest.raises(ValueError, match="No Op registered for NoSuchOp"):
        accel_target.from_onnx(_onnx_model("NoSuchOp"))


def test_onnx_with_op_tvm_cannot_import():
    with pytest.raises(UnsupportedModelError, match="not supported for frontend ONNX: Det"):
        accel_target.from_onnx(_onnx_model("Det"))


def test_onnx_model_builds_and_matches_numpy(tmp_path):
    model = _onnx_model("Relu")
    path = tmp_path / "relu.onnx"
    onnx.save(model, path)
    x = np.array([[-1.0, 2.0], [3.0, -4.0]], "float32")
    vm = relax.VirtualMachine(accel_target.build(accel_target.from_onnx(path)), tvm.cpu())
    np.testing.assert_array_equal(vm["main"](tvm.runtime.tensor(x)).numpy(), np.maximum(x, 0))


def test_wrong_input_shape_at_run_time():
    model, x, _ = make("residual_cnn")
    vm = relax.VirtualMachine(accel_target.build(accel_target.from_torch(model, (x,))), tvm.cpu())
    with pytest.raises(RuntimeError) as err:
        vm["main"](tvm.runtime.tensor(np.zeros((1, 3, 30, 32), "float32")))
    message = str(err.value)
    assert "R.Tensor((1, 3, 32, 32)" in message and "30 vs. 32" in message


@pytest.mark.parametrize(
    "array,words",
    [
        (np.zeros((1, 3, 32, 32), "float64"), "expect Tensor with dtype float32 but get float64"),
        (np.zeros((3, 32, 32), "float32"), "expect Tensor with ndim 4 but get 3"),
    ],
)
def test_wrong_input_dtype_or_rank_at_run_time(array, words):
    """The VM checks the model's inputs at main's entry (its kernels skip checking again)."""
    model, x, _ = make("residual_cnn")
    vm = relax.VirtualMachine(accel_target.build(accel_target.from_torch(model, (x,))), tvm.cpu())
    with pytest.raises(ValueError, match=words):
        vm["main"](tvm.runtime.tensor(array))


def test_weights_passed_at_run_time_are_checked():
    """main's weight parameters (after its "num_input") are not checked by the VM: the kernels
    keep their checks of their arguments, and a weight of the wrong shape is an error."""
    model, x, _ = make("mlp")
    mod, params = accel_target.from_torch(model, (x,), keep_params_as_input=True)
    vm = relax.VirtualMachine(accel_target.build(mod), tvm.cpu())
    weights = [tvm.runtime.tensor(w) for w in params.values()]
    data = tvm.runtime.tensor(x.numpy())
    np.testing.assert_allclose(vm["main"](data, *weights).numpy(), model(x).detach().numpy(), rtol=1e-5, atol=1e-5)
    first = next(iter(params.values()))
    wrong = tvm.runtime.tensor(np.zeros((first.shape[0] + 1, *first.shape[1:]), first.dtype))
    with pytest.raises(ValueError, match="shape"):
        vm["main"](data, wrong, *weights[1:])


def test_input_layout_that_does_not_fit_the_model():
    model, x, _ = make("mlp")
    mod = accel_target.from_torch(model, (x,))
    with pytest.raises(
        ValueError, match=r"input_layout='NHWC' needs a 4-D NCHW image input, but main\(\) takes \(x: \[4, 64\]\)"
    ):
        accel_target.build(mod, input_layout="NHWC")
    with pytest.raises(ValueError, match="input_layout='CHWN' is not supported; supported: None, NCHW, NHWC"):
        accel_target.build(mod, input_layout="CHWN")


def test_params_that_are_not_inputs():
    model, x, _ = make("mlp")
    mod, params = accel_target.from_torch(model, (x,), keep_params_as_input=True)
    with pytest.raises(ValueError, match=r"params \['bogus'\] are not inputs of main"):
        accel_target.build(mod, {"bogus": np.zeros(3, "float32")})


def test_strict_build_rejects_fallbacks():
    with pytest.raises(
        accel_target.StrictModeError, match=r"relax.matmul on float32\[2, 4, 8\], float32\[1, 8, 5\].*batch axes"
    ):
        accel_target.build(_broadcast_batch_matmul(), strict=True)


def test_unexportable_torch_model_gives_clear_error():
    """torch.export cannot trace Python control flow on a tensor's values: the error says so and
    names the way in that runs it (tests/frontends/test_dynamo.py: graph breaks)."""

    class DataDependent(torch.nn.Module):
        def forward(self, x):
            return x * 2 if x.sum() > 0 else x - 1

    with pytest.raises(
        UnsupportedModelError, match=r"cannot import DataDependent: .*data-dependent.*torch\.compile\(model, backend="
    ):
        accel_target.from_torch(DataDependent(), (torch.randn(4),))


def test_an_import_error_names_the_op_it_stopped_at(monkeypatch):
    """A converter that fails with a message of its own (here made to): the error names the op."""

    def failing(node, importer):
        raise TypeError("unsupported operand type(s) for +: 'Node' and 'int'")

    monkeypatch.setitem(torch_ops.CONVERTERS, "cumsum.default", failing)

    class Cumulative(torch.nn.Module):
        def forward(self, x):
            return torch.cumsum(x, 0)

    with pytest.raises(UnsupportedModelError, match=r"cannot import Cumulative: cumsum\.default: unsupported operand"):
        accel_target.from_torch(Cumulative(), (torch.randn(6),))


def _broadcast_batch_matmul():
    bb = relax.BlockBuilder()
    a = relax.Var("a", relax.TensorType([2, 4, 8], "float32"))
    with bb.function("main", [a]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.matmul(a, relax.const(np.ones((1, 8, 5), "float32"))))
        bb.emit_func_output(out)
    return bb.get()


def test_build_follows_enclosing_strict_and_recording_blocks():
    with accel_target.strict(), pytest.raises(accel_target.StrictModeError):
        accel_target.build(_broadcast_batch_matmul())
    with accel_target.recording() as log:
        accel_target.build(_broadcast_batch_matmul())
    assert len(log) == 1 and log[0].fallback
