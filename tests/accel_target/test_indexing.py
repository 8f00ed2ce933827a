"""Indexing after import (accel_target/indexing.py): PyTorch's negative indices count from the
end, and no index reads outside its tensor (TVM's importers emit every take in mode "fast").
References: PyTorch eager and numpy."""

import numpy as np
import pytest
import torch
import tvm
from tvm import relax

import accel_target
from accel_target.indexing import bounded_takes
from tests.helpers import run_executable, single_op_module


class ConstantIndices(torch.nn.Module):
    """Falcon's key and value heads: ``qkv[..., [-2], :]`` and ``[-1]``."""

    def forward(self, x):
        return x[:, :, [-2], :] * 2 + x[:, :, torch.tensor([-1]), :]


class RuntimeIndices(torch.nn.Module):
    def forward(self, x, index):
        return x[:, index] + 1


class Embedding(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.table = torch.nn.Embedding(10, 4)

    def forward(self, ids):
        return self.table(ids)


def _build(model, inputs):
    return accel_target.build(accel_target.from_torch(model, inputs))


def test_negative_constant_indices_count_from_the_end():
    x = torch.randn(2, 3, 4, 8)
    ex = _build(ConstantIndices(), (x,))
    np.testing.assert_allclose(run_executable(ex, x.numpy()), ConstantIndices()(x).numpy(), rtol=1e-6)


def test_negative_runtime_indices_count_from_the_end():
    x, index = torch.randn(2, 5), torch.tensor([1, -2, -5, 4])
    ex = _build(RuntimeIndices(), (x, index))
    for values in ([1, -2, -5, 4], [0, -1, 3, -3]):
        expected = RuntimeIndices()(x, torch.tensor(values)).numpy()
        np.testing.assert_array_equal(run_executable(ex, x.numpy(), np.array(values)), expected)


@pytest.mark.parametrize("outside", [5, -6, 1 << 40])
def test_a_runtime_index_outside_the_axis_gives_nan_not_a_read_past_the_tensor(outside):
    x = torch.randn(2, 5)
    ex = _build(RuntimeIndices(), (x, torch.tensor([0, 1])))
    with pytest.raises(IndexError):  # PyTorch's answer
        RuntimeIndices()(x, torch.tensor([3, outside]))
    out = run_executable(ex, x.numpy(), np.array([3, outside]))
    np.testing.assert_array_equal(out[:, 0], x.numpy()[:, 3] + 1)
    assert np.isnan(out[:, 1]).all()


def test_a_token_id_past_the_vocabulary_gives_nan():
    model, ids = Embedding().eval(), torch.tensor([[1, 9, 0]])
    ex = _build(model, (ids,))
    np.testing.assert_array_equal(run_executable(ex, ids.numpy()), model(ids).detach().numpy())
    out = run_executable(ex, np.array([[1, 10, 0]]))
    assert np.isnan(out[0, 1]).all() and not np.isnan(out[0, [0, 2]]).any()


def _take(data: np.ndarray, indices: np.ndarray | None, axis: int = 0) -> tvm.IRModule:
    """main(data[, indices]) = take(data, indices, axis, mode "fast"); constant indices when
    `indices` is given, a parameter named "indices" otherwise."""
    if indices is None:
        return single_op_module(
            lambda data, indices: relax.op.take(data, indices, axis),
            {"data": data, "indices": np.zeros(3, "int64")},
            {},
        )
    return single_op_module(lambda data, i: relax.op.take(data, i, axis), {"data": data}, {"i": indices})


def test_integer_data_wraps_an_index_outside_the_axis():
    data = np.arange(12, dtype="int64").reshape(4, 3)
    mod = bounded_takes(_take(data, None))
    out = run_executable(tvm.compile(mod, "accel"), data, np.array([-1, 4, 1], "int64"))
    np.testing.assert_array_equal(out, data[[3, 0, 1]])  # -1 counts back; 4 wraps to 0


def test_an_axis_of_symbolic_size_counts_negative_indices_back_from_its_size():
    n = tvm.tirx.Var("n", "int64")
    data = relax.Var("data", relax.TensorType((n, 3), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [data]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.take(data, relax.const(np.array([-1, 0], "int64")), axis=0))
        bb.emit_func_output(out)
    ex = tvm.compile(bounded_takes(bb.get()), "accel")
    for rows in (4, 6):
        x = np.arange(rows * 3, dtype="float32").reshape(rows, 3)
        np.testing.assert_array_equal(run_executable(ex, x), x[[-1, 0]])


def test_a_constant_index_outside_the_axis_is_an_error_naming_it():
    with pytest.raises(ValueError, match=r"take: constant index 7 is outside \[-5, 5\) on axis 1 .*\[2, 5\]"):
        bounded_takes(_take(np.zeros((2, 5), "float32"), np.array([0, 7], "int64"), axis=1))


def test_onnx_gather_outside_the_axis_gives_nan(tmp_path):
    onnx = pytest.importorskip("onnx")
    helper, TensorProto = onnx.helper, onnx.TensorProto
    graph = helper.make_graph(
        [helper.make_node("Gather", ["x", "i"], ["y"], axis=1)],
        "gather",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5]),
            helper.make_tensor_value_info("i", TensorProto.INT64, [3]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    ex = accel_target.build(accel_target.from_onnx(model))
    x = np.random.default_rng(0).standard_normal((2, 5)).astype("float32")
    out = run_executable(ex, x, np.array([-1, 7, 2], "int64"))
    np.testing.assert_array_equal(out[:, [0, 2]], x[:, [4, 2]])
    assert np.isnan(out[:, 1]).all()


class Zipped(torch.nn.Module):
    """Several index tensors pick elements jointly (accel_target.torch_ops.index_tensor)."""

    def __init__(self, where: str):
        super().__init__()
        self.where = where

    def forward(self, x, i, j):
        if self.where == "adjacent":
            return x[:, i, j] * 2  # [N, *broadcast(i, j), ...]
        return x[i, :, j] * 2  # apart: the broadcast axes lead


@pytest.mark.parametrize("where", ["adjacent", "apart"])
@pytest.mark.parametrize(
    "i, j",
    [([0, 1, 3], [2, 0, 1]), ([-1, 0, -4], [-3, 2, 0]), ([[0], [3]], [1, -1, 2])],
    ids=["zipped", "negative", "broadcast"],
)
def test_several_index_tensors_pick_elements_jointly(where, i, j):
    x = torch.randn(4, 4, 3, 2)
    i, j = torch.tensor(i), torch.tensor(j)
    expected = Zipped(where)(x, i, j).numpy()

    class Constants(torch.nn.Module):  # the same indices as constants of the model
        def forward(self, x):
            return Zipped(where)(x, i, j)

    constant = _build(Constants(), (x,))
    np.testing.assert_array_equal(run_executable(constant, x.numpy()), expected)
    runtime = _build(Zipped(where), (x, i, j))
    np.testing.assert_array_equal(run_executable(runtime, x.numpy(), i.numpy(), j.numpy()), expected)


def test_one_of_several_runtime_indices_outside_its_axis_gives_nan():
    x = torch.randn(2, 4, 3)
    ex = _build(Zipped("adjacent"), (x, torch.tensor([0, 1, 2]), torch.tensor([0, 1, 2])))
    out = run_executable(ex, x.numpy(), np.array([3, 0, 4]), np.array([2, 3, 0]))
    np.testing.assert_array_equal(out[:, 0], 2 * x.numpy()[:, 3, 2])
    assert np.isnan(out[:, 1:]).all()  # j = 3 of 3 columns, i = 4 of 4 rows


def test_unfold_imports_and_matches_pytorch():
    """nn.Unfold (ConvBERT's span convolution, MobileViTV2's patches) decomposes into
    index.Tensor with broadcasting indices, which TVM's converter cannot take."""
    model, x = torch.nn.Unfold((3, 2), padding=(1, 0), stride=(1, 2)), torch.randn(1, 4, 6, 4)
    np.testing.assert_allclose(run_executable(_build(model, (x,)), x.numpy()), model(x).numpy(), rtol=1e-6)
