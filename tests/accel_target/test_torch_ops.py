"""Converters accel adds to TVM's PyTorch importer (accel_target/frontends/torch_ops.py and the
modules it draws on), against PyTorch."""

import re

import numpy as np
import pytest
import torch
import tvm

import accel_target
from accel_target.frontends import UnsupportedModelError
from tests.helpers import assert_close, run_executable, run_outputs


class _Unfold(torch.nn.Module):
    def __init__(self, dim, size, step):
        super().__init__()
        self.args = dim, size, step

    def forward(self, x):
        return x.unfold(*self.args) * 2


@pytest.mark.parametrize(
    "shape, dim, size, step",
    [
        ((2, 32, 3), 1, 8, 8),  # PatchTST's patches
        ((2, 30, 3), 1, 8, 4),  # overlapping windows, the last 2 elements in none
        ((1, 2, 5, 7), -1, 3, 2),  # the last axis, counted back
        ((10, 4), 0, 4, 3),
    ],
)
def test_unfold_windows_as_pytorch(shape, dim, size, step):
    model, x = _Unfold(dim, size, step), torch.randn(*shape)
    executable = accel_target.build(accel_target.from_torch(model, (x,)))
    assert_close(run_executable(executable, x.numpy()), model(x).numpy())


class _Extremum(torch.nn.Module):
    def __init__(self, op, **kwargs):
        super().__init__()
        self.op, self.kwargs = op, kwargs

    def forward(self, x):
        return self.op(x, **self.kwargs) + 1


@pytest.mark.parametrize("op", [torch.amax, torch.amin], ids=["amax", "amin"])
@pytest.mark.parametrize("kwargs", [{"dim": -1}, {"dim": (0, 2), "keepdim": True}, {}], ids=["last", "two", "all"])
def test_amax_and_amin_as_pytorch(op, kwargs):
    model, x = _Extremum(op, **kwargs), torch.randn(3, 4, 5)
    executable = accel_target.build(accel_target.from_torch(model, (x,)))
    assert_close(run_executable(executable, x.numpy()), model(x).numpy())


class _Elementwise(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x, y, z):
        return self.fn(x, y, z)


# x, y: int64 (negative too), z: float32. TVM's converters gave a Python scalar the tensor's
# dtype and kept integer true division integral: every case but the last two of each group
# came back wrong (integers) or failed to import before.
PROMOTION_CASES = {
    "int + float scalar": lambda x, y, z: x + 1.5,
    "int * float scalar": lambda x, y, z: x * 1.5,
    "float scalar - int": lambda x, y, z: 1.5 - x,
    "int - int scalar, alpha": lambda x, y, z: torch.sub(x, y, alpha=3),
    "bool * float scalar": lambda x, y, z: (x > 0) * 1.5,
    "bool + int scalar": lambda x, y, z: (x > 0) + 1,
    "int / int scalar": lambda x, y, z: x / 2,
    "int / int": lambda x, y, z: x / y,
    "int scalar / int": lambda x, y, z: 10 / y,
    "int32 / int scalar": lambda x, y, z: x.int() / 2,
    "trunc division by int scalar": lambda x, y, z: torch.div(x, 2, rounding_mode="trunc"),
    "floor division by int scalar": lambda x, y, z: torch.div(x, 2, rounding_mode="floor"),
    "int // int scalar": lambda x, y, z: x // 3,
    "trunc division of floats": lambda x, y, z: torch.div(z, 0.75, rounding_mode="trunc"),
    "int < float scalar": lambda x, y, z: x < 1.5,
    "int == float scalar": lambda x, y, z: x == 5.0,
    "bool == bool": lambda x, y, z: (x > 0) == (y > 0),
    "bool * bool, bool + bool": lambda x, y, z: ((x > 0) * (y > 0)) + ((x < 0) + (y < 0)),
    "max and min of bools": lambda x, y, z: torch.maximum(x > 0, y > 0) ^ torch.minimum(x < 0, y < 0),
    "clamp of int to float bounds": lambda x, y, z: torch.clamp(x, min=-2.5, max=4),
    "clamp of int to a tensor bound": lambda x, y, z: torch.clamp(x, max=z),
    "int mean of a sum": lambda x, y, z: x.sum() / 4,
    "int % float scalar": lambda x, y, z: x % 2.5,
    "fmod of int by float scalar": lambda x, y, z: torch.fmod(x, 2.5),
    "remainder and fmod of floats": lambda x, y, z: z % -0.75 + torch.fmod(z, 0.75),
    "int ** float scalar": lambda x, y, z: y.abs() ** 0.5,
    "int scalar ** int": lambda x, y, z: 2 ** y.abs(),
    "int ** float": lambda x, y, z: y.abs() ** z,
    "exp of int": lambda x, y, z: torch.exp(x),
    "reciprocal of int": lambda x, y, z: torch.reciprocal(y),
    "sigmoid of bool": lambda x, y, z: torch.sigmoid((x > 0).float()) + torch.sqrt(y.abs()),
    "where of a float and an int": lambda x, y, z: torch.where(x > 0, z, y),
    # (as before)
    "int * int scalar": lambda x, y, z: x * 2,
    "int + float": lambda x, y, z: x + z,
    "float ** int scalar": lambda x, y, z: z**2 + z**3,
}


@pytest.mark.parametrize("case", PROMOTION_CASES)
def test_elementwise_ops_promote_types_as_pytorch(case):
    """Operands cast to the dtype PyTorch computes in, Python scalars too: dtype and values."""
    x, y = torch.tensor([-7, -6, -1, 0, 5, 7]), torch.tensor([2, -4, 3, 3, -2, 2])
    z = torch.tensor([0.5, -1.25, 2.0, 3.0, 1.5, -2.0])
    model = _Elementwise(PROMOTION_CASES[case])
    expected = model(x, y, z).numpy()
    mod = accel_target.from_torch(model, (x, y, z))
    out = run_executable(tvm.compile(mod, "llvm"), x.numpy(), y.numpy(), z.numpy())
    assert out.dtype == expected.dtype
    np.testing.assert_allclose(out, expected, rtol=1e-6)


class _TopKMask(torch.nn.Module):
    """The k largest (or smallest) of each row as a mask, and their sum: what a router reads
    of an unsorted top-k, whose order PyTorch leaves unspecified."""

    def __init__(self, largest):
        super().__init__()
        self.largest = largest

    def forward(self, x):
        values, indices = torch.topk(x, 3, dim=-1, largest=self.largest, sorted=False)
        return torch.zeros_like(x).scatter(-1, indices, 1.0) + values.sum(-1, keepdim=True)


@pytest.mark.parametrize("largest", [True, False])
def test_unsorted_topk_picks_the_same_elements_as_pytorch(largest):
    x = torch.randn(4, 9)
    model = _TopKMask(largest)
    executable = accel_target.build(accel_target.from_torch(model, (x,)))
    assert_close(run_executable(executable, x.numpy()), model(x).numpy())


class _GridSample(torch.nn.Module):
    """A conv (its output goes channels-last), then F.grid_sample."""

    def __init__(self, **kwargs):
        super().__init__()
        self.conv, self.kwargs = torch.nn.Conv2d(3, 4, 3, padding=1), kwargs

    def forward(self, x, grid):
        return torch.nn.functional.grid_sample(self.conv(x), grid, **self.kwargs)


@pytest.mark.parametrize(
    "grid_shape, kwargs",
    [
        ((1, 3, 5, 2), {"mode": "bilinear", "padding_mode": "zeros", "align_corners": False}),
        ((2, 4, 4, 2), {"mode": "bilinear", "padding_mode": "border", "align_corners": True}),  # square
        ((1, 6, 2, 2), {"mode": "nearest", "padding_mode": "zeros", "align_corners": False}),
        ((1, 5, 3, 2), {"mode": "bilinear", "padding_mode": "reflection", "align_corners": False}),
    ],
)
def test_grid_sample_reads_pytorch_grids(grid_shape, kwargs):
    """PyTorch's grid is [N, H_out, W_out, 2] (x, y last); TVM's converter gave the wrong shape,
    or wrong values for a square grid."""
    torch.manual_seed(0)
    model = _GridSample(**kwargs).eval()
    x = torch.randn(grid_shape[0], 3, 8, 8)
    grid = torch.rand(*grid_shape) * 2.4 - 1.2  # some points outside, for the padding mode
    with torch.no_grad():
        expected = model(x, grid).numpy()
    executable = accel_target.build(accel_target.from_torch(model, (x, grid)))
    assert_close(run_executable(executable, x.numpy(), grid.numpy()), expected)


class _ExtremumDim(torch.nn.Module):
    def __init__(self, op, dim, keepdim):
        super().__init__()
        self.op, self.dim, self.keepdim = op, dim, keepdim

    def forward(self, x):
        values, indices = self.op(x, self.dim, keepdim=self.keepdim)
        return values * 2, indices


@pytest.mark.parametrize("op", [torch.max, torch.min])
@pytest.mark.parametrize("dim, keepdim", [(1, False), (-1, True)])
def test_max_and_min_along_a_dim_index_the_first_extremum(op, dim, keepdim):
    """Values and indices as PyTorch gives them, ties (rounded inputs) at their first index."""
    x = torch.round(torch.randn(3, 7, 5))  # few distinct values: ties in every row
    model = _ExtremumDim(op, dim, keepdim)
    executable = accel_target.build(accel_target.from_torch(model, (x,)))
    values, indices = tvm.relax.VirtualMachine(executable, tvm.cpu())["main"](tvm.runtime.tensor(x.numpy()))
    expected_values, expected_indices = model(x)
    np.testing.assert_array_equal(values.numpy(), expected_values.numpy())
    np.testing.assert_array_equal(indices.numpy(), expected_indices.numpy())


class _Lambda(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *inputs):
        return self.fn(*inputs)


def _power_spectrogram(x):  # torch.stft: a window over frames (unfold), rfft, permute, abs
    return torch.stft(x, 16, hop_length=4, window=torch.hann_window(16), return_complex=True).abs() ** 2


def _complex_shapes(x):  # unsqueeze, view, select, permute and abs of complex values
    spectrum = torch.fft.fft(x).unsqueeze(1).reshape(2, 3, 2, 4)[:, 1].permute(2, 0, 1)
    return torch.view_as_real(spectrum) + spectrum.abs().unsqueeze(-1)


def _autocorrelation(q, k):  # Autoformer's
    return torch.fft.irfft(torch.fft.rfft(q, dim=1) * torch.conj(torch.fft.rfft(k, dim=1)), n=q.shape[1], dim=1)


@pytest.mark.parametrize(
    "fn, shapes",
    [
        (lambda x: torch.fft.fftn(x, dim=(1, 2)).real, [(2, 6, 8)]),  # FNet's mixing
        (lambda x: torch.view_as_real(torch.fft.fft(x, dim=-1)) * 1.0, [(3, 5)]),
        (_autocorrelation, [(2, 6, 4), (2, 6, 4)]),
        (lambda x: torch.view_as_real(torch.fft.rfft(x, dim=1, norm="ortho")) + 0, [(2, 7, 3)]),  # odd length
        (lambda x: torch.fft.irfft(torch.fft.rfft(x), n=7, norm="forward"), [(2, 7)]),
        (lambda x: torch.fft.ifft(torch.fft.fft(x, dim=0) * 2 + x, dim=0).imag, [(5, 3)]),  # complex + real
        (lambda x: torch.fft.irfft2(torch.fft.rfft2(x) * 0.5, s=x.shape[-2:]), [(2, 4, 6)]),
        (lambda x: torch.fft.irfft(torch.fft.fft(x) * 1j, n=6), [(2, 6)]),  # input cut (a complex slice)
        (lambda x: torch.fft.irfft(torch.fft.rfft(x), n=10), [(2, 6)]),  # input padded
        (_power_spectrogram, [(2, 64)]),
        (_complex_shapes, [(2, 3, 8)]),
    ],
    ids=[
        "fftn",
        "fft",
        "autocorrelation",
        "rfft-odd-ortho",
        "irfft-odd-forward",
        "ifft",
        "rfft2-irfft2",
        "irfft-cut",
        "irfft-padded",
        "stft-power",
        "complex-shape-ops",
    ],
)
def test_ffts_match_pytorch(fn, shapes):
    """torch.fft's transforms (aten._fft_r2c, _fft_c2c, _fft_c2r), complex values carried as
    (real, imaginary) pairs and the DFTs products with constant matrices, on accel's kernels.
    TVM's importer has no complex dtype and no FFT: FNet and Autoformer did not import."""
    inputs = [torch.randn(*shape) for shape in shapes]
    model = _Lambda(fn)
    executable = accel_target.build(accel_target.from_torch(model, tuple(inputs)))
    assert_close(run_executable(executable, *[x.numpy() for x in inputs]), model(*inputs).numpy())
    report = accel_target.report(executable)
    assert report.declines == ()
    assert not [row for row in report.rows if row.op == "relax.matmul" and row.kind == "fallback"]


class _Rotary(torch.nn.Module):
    """DeepSeek-V2's rotary embedding: pairs of features as complex numbers, turned by a
    complex table computed from no input."""

    def forward(self, x):
        angles = torch.outer(torch.arange(x.shape[1]).float(), 1 / 10000 ** (torch.arange(0, 8, 2).float() / 8))
        turns = torch.polar(torch.ones_like(angles), angles)
        pairs = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(pairs * turns).flatten(2) + torch.view_as_real(torch.conj(pairs) * 3).flatten(2)


def test_complex_products_with_a_complex_constant_match_pytorch():
    x = torch.randn(2, 5, 8)
    executable = accel_target.build(accel_target.from_torch(_Rotary(), (x,)))
    assert_close(run_executable(executable, x.numpy()), _Rotary()(x).numpy())


@pytest.mark.parametrize(
    "fn, x, message",
    [
        (lambda x: torch.view_as_real(torch.fft.fft(x).sum(-1)), torch.randn(2, 4), "sum.dim_IntList of complex"),
        (lambda x: torch.fft.fft(x), torch.randn(2, 4), "returns a complex tensor; return torch.view_as_real"),
        (
            lambda x: torch.view_as_real(x * 2),
            torch.randn(2, 4, dtype=torch.complex64),
            "is complex (torch.complex64); accel takes real inputs",
        ),
    ],
    ids=["an op not carried", "a complex result", "a complex input"],
)
def test_complex_values_accel_does_not_carry_are_an_error(fn, x, message):
    """Never a computation on the (real, imaginary) pairs as if they were real values."""
    with pytest.raises(UnsupportedModelError, match=re.escape(message)):
        accel_target.from_torch(_Lambda(fn), (x,))


class _ByZero(torch.nn.Module):
    def forward(self, x):
        divided = torch.cat([x / 0, x / -0.0, torch.floor_divide(x, 0.0), torch.div(x, 0.0, rounding_mode="trunc")])
        return torch.nan_to_num(x / 0), divided, torch.remainder(x, 0.0), torch.fmod(x, -0.0), x * 0, -0.0 * x


def test_float_arithmetic_with_a_constant_zero_as_pytorch():
    """IEEE 754's x / 0 (an infinity of the signs' product, NaN for 0 and NaN), a remainder by
    zero NaN, and x * 0 NaN for NaN and inf: building x / 0.0 stopped on TVM's constant folder's
    "Divide by zero" check, and that folder took x * 0.0 as 0."""
    x = torch.tensor([[1.0, -2.0, 0.0, -0.0, np.nan, np.inf, -np.inf]])
    executable = accel_target.build(accel_target.from_torch(_ByZero(), (x,)))
    for ours, theirs in zip(run_outputs(executable, x.numpy()), _ByZero()(x)):
        np.testing.assert_array_equal(ours, theirs.numpy())


class _IntegerByZero(torch.nn.Module):
    def forward(self, x):
        return torch.div(x, 0, rounding_mode="floor")


def test_integer_division_by_a_constant_zero_is_an_error():
    mod = accel_target.from_torch(_IntegerByZero(), (torch.tensor([3, 4]),))
    with pytest.raises(ValueError, match=r"floor_divide: divides int64 values by the constant 0.*ZeroDivisionError"):
        accel_target.build(mod)


class _NonFiniteFills(torch.nn.Module):
    def forward(self, x):
        rows = x.shape[0]
        mask = torch.full((rows, rows), float("-inf")).triu(1)  # a causal mask of a symbolic size
        return mask @ torch.ones(rows, 1) + x.new_full((rows, 1), float("nan")) * 0, torch.full_like(x, float("inf"))


def test_fills_with_an_infinity_or_nan_of_a_symbolic_size():
    """torch.full of -inf, NaN or inf that is not folded (its size symbolic): TVM's legalization
    of full stopped the build ("argument of type 'PrimType' is not iterable")."""
    x = torch.randn(4, 3)
    mod = accel_target.from_torch(_NonFiniteFills(), (x,), dynamic_shapes=({0: torch.export.Dim("rows", min=2)},))
    executable = accel_target.build(mod)
    for rows in (2, 5):
        x = torch.randn(rows, 3)
        for ours, theirs in zip(run_outputs(executable, x.numpy()), _NonFiniteFills()(x), strict=True):
            np.testing.assert_array_equal(ours, theirs.numpy())


class _SameOperands(torch.nn.Module):
    def forward(self, x):
        y = x + 1
        return x != x, (x + 1) != y, torch.logical_not(x == x), torch.nanmean(x, 1), torch.isnan(x) == (x != x)


def test_comparisons_of_an_operand_with_itself_see_nan():
    """x != x is how PyTorch finds NaN (its nanmean too); TVM's simplifier took it for false,
    also of two equal expressions in one kernel, and nanmean divided by every element."""
    x = torch.tensor([[0.0, np.nan, 1.0, -np.inf, np.inf, -0.0], [1.0, 2.0, np.nan, np.nan, 3.0, 4.0]])
    executable = accel_target.build(accel_target.from_torch(_SameOperands(), (x,)))
    for ours, theirs in zip(run_outputs(executable, x.numpy()), _SameOperands()(x), strict=True):
        np.testing.assert_array_equal(ours, theirs.numpy())
