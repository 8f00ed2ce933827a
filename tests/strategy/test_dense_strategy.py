"""relax.matmul with a 2-D right operand under Target("accel"): dense_kn."""

import pytest
import tvm
from tvm import relax

import accel_target
from tests.helpers import (
    ISAS,
    assert_close,
    called_kernels,
    legalized,
    matmul_module,
    rand,
    run_relax,
    runs_here,
    single_op_module,
)

# data shapes of rank 1 to 4 against a [K, N] weight
DATA_SHAPES = [(33,), (7, 33), (2, 5, 33), (2, 3, 4, 33)]


@pytest.mark.parametrize("const_weight", [True, False], ids=["const_w", "runtime_w"])
@pytest.mark.parametrize("data_shape", DATA_SHAPES, ids=str)
def test_matmul_runs_on_dense_kn(data_shape, const_weight):
    x, w = rand(*data_shape), rand(33, 1000)
    mod = matmul_module(x, w, const_weight)
    with accel_target.recording() as log:
        out = run_relax(mod, [x] if const_weight else [x, w])
    assert_close(out, x @ w)
    assert [d.implementation for d in log] == ["dense_kn.accel"]
    kernels = called_kernels(legalized(mod))
    assert sum(name.startswith("dense_kn") for name in kernels) == 1
    assert sum("layout_transform" in name for name in kernels) == (0 if const_weight else 1)


@pytest.mark.parametrize("shape, kept", [((2, 64, 32), True), ((10, 28, 32), False)], ids=str)
def test_a_padded_row_tile_does_not_cost_the_row_axes(shape, kept):
    """AVX2's full row tile (6 rows of two vectors: N = 40) pads 128 rows to 132, but [2, 64]
    keeps its axes with 4 rows (an epilogue then fuses), so it takes 4; [10, 28] is flattened
    with 5 rows as with 6, so it takes 6."""
    x, w = rand(*shape), rand(32, 40)
    mod = matmul_module(x, w, True)
    kernels = called_kernels(legalized(mod, ISAS["avx2"]))
    assert (kernels == ["dense_kn"]) == kept and sum(name.startswith("dense_kn") for name in kernels) == 1, kernels
    if runs_here(ISAS["avx2"]):
        assert_close(run_relax(mod, [x], tvm.target.Target(ISAS["avx2"])), x @ w)


def test_linear_layer_as_pytorch_exports_it():
    """nn.Linear arrives as matmul(x, permute_dims(W)) with W [out, in]."""
    x, w, b = rand(4, 64), rand(48, 64), rand(48)
    mod = single_op_module(
        lambda data, weight, bias: relax.op.add(relax.op.matmul(data, relax.op.permute_dims(weight)), bias),
        {"data": x},
        {"weight": w, "bias": b},
    )
    with accel_target.recording() as log:
        out = run_relax(mod, [x])
    assert_close(out, x @ w.T + b)
    assert [d.implementation for d in log] == ["dense_kn.accel"]


@pytest.mark.parametrize(
    "shapes", [((2, 4, 8), (2, 8, 5)), ((1, 3, 16, 8), (1, 3, 8, 32)), ((2, 3, 7, 5), (2, 3, 5, 16))], ids=str
)
def test_batched_matmul_runs_on_batch_matmul_kn(shapes):
    a, b = rand(*shapes[0]), rand(*shapes[1])
    mod = single_op_module(lambda x, y: relax.op.matmul(x, y), {"x": a, "y": b}, {})
    with accel_target.recording() as log:
        out = run_relax(mod, [a, b])
    assert_close(out, a @ b)
    assert [d.implementation for d in log] == ["batch_matmul_kn.accel"]
    assert [name for name, _ in log[0].skipped] == ["strassen.accel", "batch_dense_kn.accel", "dense_kn.accel"]
    assert "not a constant" in dict(log[0].skipped)["batch_dense_kn.accel"]


@pytest.mark.parametrize("weight_batch", [3, 1], ids=["batch", "broadcast"])
def test_a_batch_of_constant_weights_runs_on_batch_dense_kn(weight_batch):
    """Packed at compile time (no layout transform runs), each as dense_kn packs one; a
    weight broadcast over the data's batch is not taken (TVM's kernel computes it)."""
    a, w = rand(3, 7, 33), rand(weight_batch, 33, 40)
    mod = matmul_module(a, w, const_weight=True)
    with accel_target.recording() as log:
        out = run_relax(mod, [a])
    assert_close(out, a @ w)
    if weight_batch == 3:
        assert [d.implementation for d in log] == ["batch_dense_kn.accel"]
        assert not any("layout_transform" in name for name in called_kernels(legalized(mod)))
    else:
        reason = "operands [3, 7, 33] x [1, 33, 40] differ in the batch or the inner dimension"
        assert ("batch_dense_kn.accel", reason) in log[0].skipped
