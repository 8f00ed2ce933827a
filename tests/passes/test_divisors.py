"""Integer division by zero (accel_target/passes/division.py): an error naming the op, as
PyTorch's ZeroDivisionError, where the CPU's division instruction took the process down."""

import numpy as np
import pytest
import torch

import accel_target
from tests.helpers import run_outputs


class Op(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, a, b):
        return self.fn(a, b)


@pytest.mark.parametrize(
    "fn, op",
    [
        (lambda a, b: torch.div(a, b, rounding_mode="floor"), "floor_divide"),
        (lambda a, b: torch.div(a, b, rounding_mode="trunc"), "divide"),
        (lambda a, b: a // b[1], "floor_divide"),  # a 0-d divisor
        (torch.remainder, "floor_mod"),
        (torch.fmod, "mod"),
    ],
    ids=["floor", "trunc", "scalar", "remainder", "fmod"],
)
def test_integer_division_by_zero_fails_the_call_and_the_next_runs(fn, op):
    a, b = torch.tensor([7, -7, 5, -9]), torch.tensor([2, 3, -4, 1])
    executable = accel_target.build(accel_target.from_torch(Op(fn).eval(), (a, b)))
    zero = np.array([2, 0, -4, 1])
    with pytest.raises(RuntimeError):
        fn(a, torch.from_numpy(zero))
    with pytest.raises(RuntimeError, match=f"{op}: an integer division by zero"):
        run_outputs(executable, a.numpy(), zero)
    (ours,) = run_outputs(executable, a.numpy(), b.numpy())
    np.testing.assert_array_equal(ours, fn(a, b).numpy())


def test_a_constant_divisor_without_zeros_is_not_checked():
    model = Op(lambda a, b: a // 3 + b % 4).eval()
    mod = accel_target.optimize(accel_target.from_torch(model, (torch.tensor([7, -7]), torch.tensor([5, 6]))))
    assert "check_indices" not in mod.script()


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("fn", [lambda a, b: a // b, torch.remainder, torch.fmod], ids=["floor", "remainder", "fmod"])
def test_the_least_integer_by_minus_one_matches_pytorch(fn, dtype):
    """The CPU's division traps on it too; PyTorch's floor division wraps to the least integer."""
    a, b = torch.tensor([7, -7], dtype=dtype), torch.tensor([2, 3], dtype=dtype)
    executable = accel_target.build(accel_target.from_torch(Op(fn).eval(), (a, b)))
    least, minus_one = torch.tensor([torch.iinfo(dtype).min, 9], dtype=dtype), torch.tensor([-1, -1], dtype=dtype)
    (ours,) = run_outputs(executable, least.numpy(), minus_one.numpy())
    np.testing.assert_array_equal(ours, fn(least, minus_one).numpy())
