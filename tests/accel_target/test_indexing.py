"""Indexing after import (accel_target/indexing.py): PyTorch's negative indices count from the
end, and an index outside its tensor is an error naming the op, never a read or a write
(TVM's kernels trust their indices). References: PyTorch eager and numpy."""

import re

import numpy as np
import pytest
import torch
import tvm
from tvm import relax

import accel_target
from accel_target.passes.indexing import checked_indexing
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


def _raises_outside(op: str, size: int, axis: int, shape: list, low: str | None = None):
    """pytest.raises for the run-time error of checked_indexing (`low`: the least index
    allowed, by default -size)."""
    shape, low = str(shape).replace("[", r"\[").replace("]", r"\]"), f"-{size}" if low is None else low
    return pytest.raises(RuntimeError, match=rf"{op}: an index .* outside \[{low}, {size}\) on axis {axis} .*{shape}")


@pytest.mark.parametrize("outside", [5, -6, 1 << 40])
def test_a_runtime_index_outside_the_axis_is_an_error_naming_the_op_and_the_call_after_runs(outside):
    x = torch.randn(2, 5)
    ex = _build(RuntimeIndices(), (x, torch.tensor([0, 1])))
    with pytest.raises(IndexError):  # PyTorch's answer
        RuntimeIndices()(x, torch.tensor([3, outside]))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    with _raises_outside("take", 5, 1, [2, 5]):
        vm["main"](tvm.runtime.tensor(x.numpy()), tvm.runtime.tensor(np.array([3, outside])))
    good = vm["main"](tvm.runtime.tensor(x.numpy()), tvm.runtime.tensor(np.array([3, -1]))).numpy()
    np.testing.assert_array_equal(good, RuntimeIndices()(x, torch.tensor([3, -1])).numpy())


def test_a_token_id_past_the_vocabulary_is_an_error():
    model, ids = Embedding().eval(), torch.tensor([[1, 9, 0]])
    ex = _build(model, (ids,))
    np.testing.assert_array_equal(run_executable(ex, ids.numpy()), model(ids).detach().numpy())
    with _raises_outside("take", 10, 0, [10, 4]):
        run_executable(ex, np.array([[1, 10, 0]]))


class ComputedIndex(torch.nn.Module):
    """An index computed from activations, between two layers the thread pool runs."""

    def __init__(self):
        super().__init__()
        self.first, self.table, self.last = torch.nn.Linear(16, 64), torch.nn.Embedding(8, 64), torch.nn.Linear(64, 64)

    def forward(self, x, scale):
        picked = self.table((self.first(x)[:, :4] * scale).long())
        return self.last(picked)


def test_an_index_computed_between_kernels_is_checked_where_it_is_computed():
    model, x = ComputedIndex().eval(), torch.rand(4, 16)
    scale = torch.tensor(0.0)  # every index 0
    ex = _build(model, (x, scale))
    expected = model(x, scale).detach().numpy()
    np.testing.assert_allclose(run_executable(ex, x.numpy(), scale.numpy()), expected, rtol=1e-5, atol=1e-6)
    with _raises_outside("take", 8, 0, [8, 64]):
        run_executable(ex, x.numpy(), np.array(1e6, "float32"))


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


def test_integer_data_counts_back_and_rejects_an_index_outside_the_axis():
    data = np.arange(12, dtype="int64").reshape(4, 3)
    ex = tvm.compile(checked_indexing(_take(data, None)), "accel")
    np.testing.assert_array_equal(run_executable(ex, data, np.array([-1, 3, 1], "int64")), data[[3, 3, 1]])
    with _raises_outside("take", 4, 0, [4, 3]):
        run_executable(ex, data, np.array([-1, 4, 1], "int64"))


def test_an_axis_of_symbolic_size_is_checked_against_its_size_at_run_time():
    n = tvm.tirx.Var("n", "int64")
    data = relax.Var("data", relax.TensorType((n, 3), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [data]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.take(data, relax.const(np.array([-1, 0, 5], "int64")), axis=0))
        bb.emit_func_output(out)
    ex = tvm.compile(checked_indexing(bb.get()), "accel")
    for rows in (6, 8):
        x = np.arange(rows * 3, dtype="float32").reshape(rows, 3)
        np.testing.assert_array_equal(run_executable(ex, x), x[[-1, 0, 5]])
    with pytest.raises(RuntimeError, match=r"take: an index .* outside \[-n, n\) on axis 0"):
        run_executable(ex, np.zeros((5, 3), "float32"))


def test_a_constant_index_outside_the_axis_is_an_error_naming_it():
    with pytest.raises(ValueError, match=r"take: constant index 7 is outside \[-5, 5\) on axis 1 .*\[2, 5\]"):
        checked_indexing(_take(np.zeros((2, 5), "float32"), np.array([0, 7], "int64"), axis=1))


def _onnx_model(op: str, inputs: dict[str, tuple], output: tuple, importer=None, **attrs):
    """A one-node ONNX model, imported (by `accel_target.from_onnx` unless `importer` is
    given) and built: inputs {name: (dtype, shape)}, output (dtype, shape)."""
    onnx = pytest.importorskip("onnx")
    helper, types = onnx.helper, {"float32": onnx.TensorProto.FLOAT, "int64": onnx.TensorProto.INT64}
    graph = helper.make_graph(
        [helper.make_node(op, list(inputs), ["y"], **attrs)],
        op,
        [helper.make_tensor_value_info(name, types[d], shape) for name, (d, shape) in inputs.items()],
        [helper.make_tensor_value_info("y", types[output[0]], output[1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    return accel_target.build((importer or accel_target.from_onnx)(model))


@pytest.mark.parametrize("importer", ["accel", "tvm"])
def test_onnx_gather_outside_the_axis_is_an_error(importer):
    from tvm.relax.frontend.onnx import from_onnx

    gather = {"x": ("float32", [2, 5]), "i": ("int64", [3])}
    ex = _onnx_model("Gather", gather, ("float32", [2, 3]), importer=from_onnx if importer == "tvm" else None, axis=1)
    x = np.random.default_rng(0).standard_normal((2, 5)).astype("float32")
    np.testing.assert_array_equal(run_executable(ex, x, np.array([-1, 4, 2], "int64")), x[:, [4, 4, 2]])
    # TVM's converter counts -7 back to -2: not again (x[:, 3]), though the build's own check of
    # a module from TVM's importer (importer "tvm") takes negative indices as PyTorch does
    for outside in (7, -7):
        with _raises_outside("take", 5, 1, [2, 5]):
            run_executable(ex, x, np.array([-1, outside, 2], "int64"))


def test_onnx_gather_elements_counts_back_and_rejects_an_index_outside():
    ex = _onnx_model("GatherElements", {"x": ("float32", [3, 4]), "i": ("int64", [3, 2])}, ("float32", [3, 2]), axis=1)
    x = np.random.default_rng(0).standard_normal((3, 4)).astype("float32")
    index = np.array([[0, -1], [3, -4], [2, 1]])
    np.testing.assert_array_equal(run_executable(ex, x, index), np.take_along_axis(x, index % 4, axis=1))
    for outside in (4, -5, 1 << 40):  # 1 << 40 crashed the process in stock TVM
        with _raises_outside("gather_elements", 4, 1, [3, 4]):
            run_executable(ex, x, np.array([[0, 1], [outside, 0], [2, 1]]))


def test_onnx_gather_nd_checks_each_component_on_its_own_axis():
    ex = _onnx_model("GatherND", {"x": ("float32", [3, 4, 2]), "i": ("int64", [5, 2])}, ("float32", [5, 2]))
    x = np.random.default_rng(0).standard_normal((3, 4, 2)).astype("float32")
    index = np.array([[0, 3], [-1, 0], [2, -4], [1, 1], [-3, 2]])
    np.testing.assert_array_equal(run_executable(ex, x, index), x[index[:, 0], index[:, 1]])
    # 3 is inside axis 1 (4) but not axis 0 (3); flattened, [3, 0] would still be inside x
    with pytest.raises(RuntimeError, match=r"gather_nd: an index .* outside its axis .*axes 0-1\) .*\[3, 4, 2\]"):
        run_executable(ex, x, np.array([[0, 3], [3, 0], [0, 0], [0, 0], [0, 0]]))


def test_onnx_scatter_nd_and_scatter_elements_reject_an_index_outside():
    rng = np.random.default_rng(0)
    x, updates = rng.standard_normal((4, 3)).astype("float32"), rng.standard_normal((2, 3)).astype("float32")
    nd = _onnx_model(
        "ScatterND",
        {"x": ("float32", [4, 3]), "i": ("int64", [2, 1]), "u": ("float32", [2, 3])},
        ("float32", [4, 3]),
    )
    expected = x.copy()
    expected[[3, 1]] = updates
    np.testing.assert_array_equal(run_executable(nd, x, np.array([[-1], [1]]), updates), expected)
    with _raises_outside("scatter_nd", 4, 0, [4, 3]):
        run_executable(nd, x, np.array([[4], [1]]), updates)
    elements = _onnx_model(
        "ScatterElements",
        {"x": ("float32", [4, 3]), "i": ("int64", [2, 3]), "u": ("float32", [2, 3])},
        ("float32", [4, 3]),
        axis=0,
    )
    index = np.array([[0, 1, 3], [2, -1, 1]])
    expected = x.copy()
    np.put_along_axis(expected, index % 4, updates, axis=0)
    np.testing.assert_array_equal(run_executable(elements, x, index, updates), expected)
    with _raises_outside("scatter_elements", 4, 0, [4, 3]):
        run_executable(elements, x, np.array([[0, 1, 3], [2, 9, 1]]), updates)


@pytest.mark.slow
def test_a_text_model_from_tvms_onnx_importer_counts_token_ids_back_once():
    """BERT exported to ONNX and imported by TVM's own importer, built by accel: the build's
    check sees the importer's counting back (ONNX: a token id of -101 is -1 there, an error)."""
    onnx = pytest.importorskip("onnx")
    import io

    from tvm.relax.frontend.onnx import from_onnx

    from tests.models import hf_zoo

    model, (ids,) = hf_zoo.ENCODERS["bert"].make()
    exported = io.BytesIO()
    torch.onnx.export(model.eval(), (ids,), exported, dynamo=False)
    vm = relax.VirtualMachine(accel_target.build(from_onnx(onnx.load_from_string(exported.getvalue()))), tvm.cpu())

    def run(token_ids):
        out = vm["main"](tvm.runtime.tensor(token_ids))
        return (out if isinstance(out, tvm.runtime.Tensor) else out[0]).numpy()

    with torch.no_grad():
        expected = model(ids).numpy()
    np.testing.assert_allclose(run(ids.numpy()), expected, rtol=1e-4, atol=1e-5)
    vocab, hidden = hf_zoo.VOCAB, expected.shape[-1]
    for outside in (vocab, -vocab - 1):  # -101 read row 99 when the build counted it back again
        bad = ids.numpy().copy()
        bad[0, 3] = outside
        with _raises_outside("take", vocab, 0, [vocab, hidden]):
            run(bad)


class GatherScatter(torch.nn.Module):
    """torch.gather, Tensor.scatter and index_put with indices given at run time."""

    def forward(self, x, index, rows, columns):
        gathered = torch.gather(x, 1, index)
        scattered = torch.zeros_like(x).scatter(1, index, gathered * 2)
        return scattered.index_put((rows, columns), torch.ones(rows.shape[0]))


def test_torch_gather_scatter_and_index_put_match_pytorch_and_reject_an_index_outside():
    x, index = torch.randn(3, 5), torch.tensor([[0, 4], [2, 2], [1, 3]])
    rows, columns = torch.tensor([2, -3]), torch.tensor([1, -1])  # index_put counts back, as x[-1] = v
    ex = _build(GatherScatter(), (x, index, rows, columns))
    given = [x.numpy(), index.numpy(), rows.numpy(), columns.numpy()]
    np.testing.assert_array_equal(run_executable(ex, *given), GatherScatter()(x, index, rows, columns).numpy())
    for bad in (5, -1):  # PyTorch's gather takes no negative index
        outside = np.array([[0, bad], [2, 2], [1, 3]])
        with pytest.raises(RuntimeError):  # PyTorch's answer
            GatherScatter()(x, torch.tensor(outside), rows, columns)
        with _raises_outside("gather_elements", 5, 1, [3, 5], low="0"):
            run_executable(ex, x.numpy(), outside, *given[2:])
    with _raises_outside("index_put", 3, 0, [3, 5]):
        run_executable(ex, *given[:2], np.array([2, 3]), given[3])


def test_the_build_checks_a_module_from_tvms_own_importer_once():
    from tvm.relax.frontend.torch import from_exported_program

    model, ids = Embedding().eval(), torch.tensor([[1, 9, 0]])
    mod = from_exported_program(torch.export.export(model, (ids,)))
    checks = lambda m: m.script().count("check_indices")  # noqa: E731
    assert checks(mod) == 0
    assert checks(accel_target.optimize(mod)) == checks(accel_target.optimize(accel_target.from_torch(model, (ids,))))
    assert not accel_target.build(accel_target.from_torch(model, (ids,))).report.declines  # checked ones left alone
    vm = relax.VirtualMachine(accel_target.build(mod), tvm.cpu())
    out = vm["main"](tvm.runtime.tensor(ids.numpy()))[0]  # TVM's importer returns a tuple
    np.testing.assert_array_equal(out.numpy(), model(ids).detach().numpy())
    with _raises_outside("take", 10, 0, [10, 4]):
        vm["main"](tvm.runtime.tensor(np.array([[1, 10, 0]])))


class TwoTables(torch.nn.Module):
    """Token and position embeddings: two index ops, two check kernels (the second one's name
    is check_indices1)."""

    def __init__(self):
        super().__init__()
        self.tokens, self.positions = torch.nn.Embedding(10, 4), torch.nn.Embedding(8, 4)

    def forward(self, ids, positions):
        return self.tokens(ids) + self.positions(positions)


def test_the_build_checks_each_index_once():
    inputs = (torch.tensor([[1, 9, 0]]), torch.tensor([[0, 1, 7]]))
    main = accel_target.optimize(accel_target.from_torch(TwoTables().eval(), inputs))["main"].script()
    assert len(re.findall(r"R\.call_tir\(check_indices\d*,", main)) == 2


class Zipped(torch.nn.Module):
    """Several index tensors pick elements jointly (accel_target.frontends.torch_ops.index_tensor)."""

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


def test_one_of_several_runtime_indices_outside_its_axis_is_an_error():
    x = torch.randn(2, 4, 3)
    ex = _build(Zipped("adjacent"), (x, torch.tensor([0, 1, 2]), torch.tensor([0, 1, 2])))
    # j = 3 of 3 columns: merged with i = 0 it would still be inside the tensor
    with _raises_outside("index.Tensor", 3, 2, [2, 4, 3]):
        run_executable(ex, x.numpy(), np.array([0, 0, 1]), np.array([2, 3, 0]))


def test_unfold_imports_and_matches_pytorch():
    """nn.Unfold (ConvBERT's span convolution, MobileViTV2's patches) decomposes into
    index.Tensor with broadcasting indices, which TVM's converter cannot take."""
    model, x = torch.nn.Unfold((3, 2), padding=(1, 0), stride=(1, 2)), torch.randn(1, 4, 6, 4)
    np.testing.assert_allclose(run_executable(_build(model, (x,)), x.numpy()), model(x).numpy(), rtol=1e-6)
