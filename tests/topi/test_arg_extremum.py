"""arg_extremum (topi_accel/search.py) through relax.argmax / relax.argmin on the accel target,
against numpy, which like PyTorch counts NaN as the extremum and returns the first index."""

import numpy as np
import pytest
import torch
from tvm import relax

import accel_target
from tests.helpers import run_executable, run_outputs, run_relax, single_op_module

NAN, INF = np.nan, np.inf
ROWS = np.array(
    [
        [1.0, NAN, 3.0, NAN, 0.5],  # NaN, wherever a number follows it
        [-INF, -INF, -INF, -INF, -INF],  # no value above the start of TVM's reduction
        [INF, INF, INF, INF, INF],
        [2.0, 2.0, -1.0, -1.0, 0.0],  # ties: the first index
        [INF, 1.0, INF, -INF, -INF],
        [NAN, NAN, NAN, NAN, NAN],
        [0.25, -3.0, 7.0, -7.0, 7.0],
    ],
    dtype="float32",
)


def _reference(x, largest, axis, keepdims):
    if axis is None:  # numpy's argmax of the flattened array; keepdims keeps every axis
        index = (np.argmax if largest else np.argmin)(x)
        return np.full([1] * x.ndim, index) if keepdims else np.array(index)
    return (np.argmax if largest else np.argmin)(x, axis=axis, keepdims=keepdims)


# (input, axis): rows of edge cases along either axis, a 3-D tensor, every axis at once
CASES = [
    (ROWS, 1),
    (ROWS, 0),
    (ROWS, -1),
    (np.stack([ROWS, ROWS[::-1]]), 1),
    (ROWS, None),
    (ROWS[1:3], None),
]


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("largest", [True, False], ids=["argmax", "argmin"])
@pytest.mark.parametrize("x, axis", CASES, ids=[f"{c[0].shape}-axis{c[1]}" for c in CASES])
def test_arg_extremum_counts_nan_as_the_extremum(x, axis, largest, keepdims):
    op = relax.op.argmax if largest else relax.op.argmin
    mod = single_op_module(lambda data: op(data, axis, keepdims), {"data": x}, {})
    with accel_target.recording() as log:
        out = run_relax(mod, [x])
    assert [d.implementation for d in log] == ["arg_extremum.accel"]
    expected = _reference(x, largest, axis, keepdims)
    assert out.dtype == np.int64 and out.shape == expected.shape
    np.testing.assert_array_equal(out, expected)


class MaxWithIndices(torch.nn.Module):
    def forward(self, x):
        values, indices = torch.max(x, 1)
        return values, indices, torch.argmin(x, 0)


def test_torch_max_with_indices_matches_pytorch():
    """torch.max(x, dim): the values (a max reduction, NaN-propagating) and their indices agree."""
    x = torch.from_numpy(ROWS)
    executable = accel_target.build(accel_target.from_torch(MaxWithIndices().eval(), (x,)))
    for ours, theirs in zip(run_outputs(executable, ROWS), MaxWithIndices()(x)):
        np.testing.assert_array_equal(ours, theirs.numpy())


def test_integer_argmax_stays_with_tvm():
    x = np.array([[3, 1, 3], [-2, 5, 5]], dtype="int32")
    mod = single_op_module(lambda data: relax.op.argmax(data, 1), {"data": x}, {})
    with accel_target.recording() as log:
        out = run_executable(accel_target.build(mod), x)
    assert [d.implementation for d in log] == [None]
    np.testing.assert_array_equal(out, np.argmax(x, 1))
