"""Models in float64, float16 and bfloat16 (``model.to(dtype)``): TVM's PyTorch importer gave
every conv, matmul and linear a float32 result, so none imported; its layer and group norms
take float32 and float16 only (accel_target/tvm_private.torch_importer). Products accumulate
as PyTorch's do (float16 / bfloat16 in float32), norms of half types run in float32; inputs
and outputs keep the model's dtype, bfloat16 too (through DLPack)."""

import numpy as np
import pytest
import torch
from torch import nn

import accel_target

# the error allowed relative to the output's largest magnitude: a few of the dtype's steps
TOLERANCE = {torch.float64: 1e-12, torch.float16: 4e-3, torch.bfloat16: 3e-2}


class Convolutional(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.norm, self.head = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.Linear(8, 4)
        self.groups = nn.GroupNorm(2, 8)

    def forward(self, x):
        x = self.groups(nn.functional.gelu(self.norm(self.conv(x))))
        return self.head(x.mean((2, 3))).softmax(-1)


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)

    def forward(self, x):
        return self.layer(x)


@pytest.mark.parametrize("dtype", list(TOLERANCE), ids=str)
@pytest.mark.parametrize("model, shape", [(Convolutional, (1, 3, 8, 8)), (Encoder, (2, 5, 16))], ids=["cnn", "encoder"])
def test_a_model_in_another_float_dtype_matches_pytorch(model, shape, dtype):
    torch.manual_seed(0)
    model, x = model().eval(), torch.randn(shape)
    with torch.no_grad():
        exact = model.double()(x.double()).numpy()
        model, x = model.to(dtype), x.to(dtype)
        executable = accel_target.build(accel_target.from_torch(model, (x,)))
        ours = torch.from_dlpack(executable(x))
    assert accel_target.report(executable).declines == ()  # (ShareConstants read bfloat16 too)
    assert ours.dtype == dtype
    scale = float(np.abs(exact).max())
    assert float(np.abs(ours.double().numpy() - exact).max()) <= TOLERANCE[dtype] * scale


class Table(nn.Module):
    """A table that depends on no input (computed by PyTorch at import, in bfloat16)."""

    def forward(self, x):
        return x * torch.arange(1, x.shape[-1] + 1, dtype=x.dtype).exp()


def test_a_bfloat16_value_computed_at_import_matches_pytorch():
    x = torch.randn(2, 6).bfloat16()
    ours = torch.from_dlpack(accel_target.build(accel_target.from_torch(Table().eval(), (x,)))(x))
    assert torch.equal(ours, Table()(x))


class Reductions(nn.Module):
    def forward(self, x):
        return x.sum(-1, keepdim=True) + x.softmax(-1).cumsum(-1)[..., -1:] + x.mean(-1, keepdim=True)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_half_type_reductions_accumulate_in_float32_as_pytorchs(dtype):
    """A sum of 4096 half-type values accumulated in their own type drifts by hundreds of steps
    (TVM's did: a wav2vec-style model was 5x PyTorch's error in bfloat16)."""
    x = torch.rand(2, 4096)
    exact = Reductions()(x.double()).numpy()
    half = x.to(dtype)
    ours = torch.from_dlpack(accel_target.build(accel_target.from_torch(Reductions(), (half,)))(half))
    theirs = Reductions()(half)
    error = lambda y: float(np.abs(y.double().numpy() - exact).max())  # noqa: E731
    assert error(ours) <= 2 * error(theirs) + 1e-6


class Activations(nn.Module):
    """Mamba's time step, softplus(dt + bias) of bfloat16 values, computed in float32 by
    FastMath's form: the bfloat16 add fused inside the let that binds the form's input escaped
    TVM's bfloat16 legalization (Falcon-Mamba had no code)."""

    def __init__(self):
        super().__init__()
        self.proj, self.bias = nn.Linear(16, 16, bias=False), nn.Parameter(torch.linspace(-2, 2, 16))

    def forward(self, x):
        dt = self.proj(x).transpose(1, 2) + self.bias[:, None]  # [batch, channels, length]
        return nn.functional.softplus(dt.float()).unsqueeze(-1) * 2


def test_fast_activations_of_bfloat16_values_build_and_match_pytorch():
    x = torch.randn(1, 8, 16)
    model = Activations().eval()
    exact = model.double()(x.double()).detach().numpy()
    model, x = model.bfloat16(), x.bfloat16()
    with torch.no_grad():
        ours = torch.from_dlpack(accel_target.build(accel_target.from_torch(model, (x,)))(x))
        theirs = model(x)
    error = lambda y: float(np.abs(y.double().numpy() - exact).max())  # noqa: E731
    assert error(ours) <= 2 * error(theirs)


class Scaled(nn.Module):
    def forward(self, x):
        return x / 1e6, x * 0.1


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_a_python_number_beside_half_type_values_keeps_its_value(dtype):
    """PyTorch computes a half type's op with a number in float32 and rounds once; the number
    given the tensor's dtype made 1e6 inf in float16 (x / 1e6 all 0) and 0.1 0.10009765625 in
    bfloat16."""
    x = (torch.randn(1000, generator=torch.Generator().manual_seed(0)) * 1000).to(dtype)
    ours = accel_target.build(accel_target.from_torch(Scaled(), (x,)))(x)
    for found, expected in zip(ours, Scaled()(x), strict=True):
        assert torch.equal(torch.from_dlpack(found), expected)


def test_a_channels_last_bfloat16_model_imports_and_matches_pytorch():
    """TVM's importer converts a weight through DLPack, which refuses a strided one, then
    through numpy, which has no bfloat16."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU()).bfloat16().to(memory_format=torch.channels_last)
    x = torch.randn(1, 3, 8, 8).bfloat16()
    ours = torch.from_dlpack(accel_target.build(accel_target.from_torch(model, (x,)))(x))
    with torch.no_grad():
        exact = model.double()(x.double())
    assert float((ours.double() - exact).abs().max()) <= TOLERANCE[torch.bfloat16] * float(exact.abs().max())
