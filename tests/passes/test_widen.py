"""float16 / bfloat16 models compute in float32 (accel_target/passes/widen.py): on accel's
float32 kernels, where TVM's kernels of a half type ran tens of times slower, and at least as
close to the exact result of the model's half-type weights and inputs as PyTorch in that type."""

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn
from tvm import relax, topi

import accel_target
from tests.helpers import run_outputs

HALF = [torch.float16, torch.bfloat16]


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.norm = nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16)
        self.conv2, self.head = nn.Conv2d(16, 16, 3, padding=1, groups=4), nn.Linear(16, 10)

    def forward(self, x):
        x = torch.relu(self.norm(self.conv1(x)))
        x = x + torch.sigmoid(self.conv2(x))
        return self.head(x.mean((2, 3)))


def _built(mod, **options):
    """`mod` built, every step of accel's taken (WidenHalfTypes declined would hide behind
    TVM's kernels)."""
    executable = accel_target.build(mod, **options)
    assert accel_target.report(executable).declines == ()
    return executable


def _made(dtype):
    torch.manual_seed(0)
    model, x = Block().eval(), torch.randn(1, 3, 16, 16)
    model.norm.running_mean.uniform_(-0.5, 0.5)
    model.norm.running_var.uniform_(0.5, 2.0)
    model, x = model.to(dtype), x.to(dtype)
    with torch.no_grad():  # (the exact result of the rounded weights and input)
        exact = Block.forward(model.double(), x.double()).numpy()
    return model.to(dtype), x, exact


def _kernels(model, x):
    return accel_target.report(_built(accel_target.from_torch(model, (x,)), input_layout="NHWC")).kernels


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_a_half_type_cnn_runs_the_float32_models_kernels(dtype):
    """Every conv and the linear on accel's float32 kernels, the same kernels as the float32
    model's and one more, the input's cast in (the output's cast out runs in the last kernel's
    write-back)."""
    wide = _kernels(*_made(torch.float32)[:2])
    kernels = _kernels(*_made(dtype)[:2])
    assert kernels.accel == wide.accel >= 3
    assert len(kernels.calls) == len(wide.calls) + 1, kernels.calls
    assert kernels.activation_transforms == kernels.weight_transforms == 0


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_a_half_type_model_is_at_least_as_accurate_as_pytorch_in_that_type(dtype):
    model, x, exact = _made(dtype)
    with torch.no_grad():
        theirs = model(x)
    ours = torch.from_dlpack(_built(accel_target.from_torch(model, (x,)))(x))
    assert ours.dtype == dtype
    error = lambda y: float(np.abs(y.double().numpy() - exact).max())  # noqa: E731
    assert error(ours) <= error(theirs)


class Overflow(nn.Module):
    """An intermediate past float16's largest value (65504), the result inside its range."""

    def forward(self, x):
        return (x * 1000.0) * 1000.0 / 1e6


def test_float16_values_past_its_range_between_ops_stay_finite():
    """PyTorch in float16 gives inf here; float32 between ops gives PyTorch's float32 result."""
    x = torch.tensor([100.0, -3.0, 0.5]).half()
    ours = torch.from_dlpack(_built(accel_target.from_torch(Overflow(), (x,)))(x))
    assert torch.isinf(Overflow()(x)).any()
    assert torch.equal(ours, Overflow()(x.float()).half())


class Selected(nn.Module):
    def forward(self, x):
        return x[x > 0] * 3


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_a_size_the_data_gives_keeps_its_values_in_a_half_type(dtype):
    """x[mask] binds its length by a match_cast of the half type: widened with the rest."""
    x = torch.tensor([1.5, -2.0, 0.25, 3.0, -1.0]).to(dtype)
    ours = torch.from_dlpack(_built(accel_target.from_torch(Selected(), (x,)))(x))
    assert torch.equal(ours, Selected()(x))


def test_a_kernel_call_on_half_type_values_gets_them_in_their_type():
    """A call of a compiled kernel states its types: its operands are rounded back to float16,
    its result widened."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([4], "float16"))
    with bb.function("main", [x]):
        with bb.dataflow():
            doubled = bb.emit(relax.op.multiply(x, relax.const(np.float16(2.0))))
            summed = bb.emit_te(topi.add, doubled, x)  # a call_tir of a float16 kernel
            out = bb.emit_output(relax.op.subtract(summed, relax.const(np.float16(0.5))))
        bb.emit_func_output(out)
    values = np.array([1.0, -2.5, 0.125, 7.0], np.float16)
    (ours,) = run_outputs(_built(bb.get()), values)
    assert ours.dtype == np.float16
    np.testing.assert_array_equal(ours, values * 3 - np.float16(0.5))


def test_a_float16_onnx_conv_runs_on_accels_kernel():
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((8, 4, 3, 3)).astype(np.float16)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["conv"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["conv"], ["y"])],
        "conv16",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, 4, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [1, 8, 8, 8])],
        [numpy_helper.from_array(weight, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    executable = _built(accel_target.from_onnx(model))
    assert accel_target.report(executable).kernels.accel >= 1
    x = rng.standard_normal((1, 4, 8, 8)).astype(np.float16)
    exact = torch.relu(nn.functional.conv2d(torch.from_numpy(x).double(), torch.from_numpy(weight).double(), padding=1))
    ours = executable(x).numpy()
    assert ours.dtype == np.float16
    # float32 products rounded once: within half a float16 step of the exact result
    np.testing.assert_allclose(ours.astype(np.float64), exact.numpy(), rtol=2**-11, atol=1e-6)
    onnx.checker.check_model(model)


class Head(nn.Module):
    """A decoder's head: the logits of [tokens, vocabulary] reshaped to [1, tokens, vocabulary]."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 100, bias=False)

    def forward(self, x):
        return self.proj(x.reshape(-1, 16)).reshape(1, -1, 100)


def test_the_cast_out_of_a_reshaped_output_is_taken_by_every_pass():
    """The output's cast sat after the dataflow block: SimplifyLayouts moved it before the
    reshape, reading the block's variable outside it, and was declined (GPT-NeoX, Qwen3)."""
    torch.manual_seed(0)
    model, x = Head().eval().bfloat16(), torch.randn(1, 8, 16).bfloat16()
    ours = torch.from_dlpack(_built(accel_target.from_torch(model, (x,)))(x))
    with torch.no_grad():
        exact = Head.forward(model.double(), x.double())
    assert float((ours.double() - exact).abs().max()) <= 2**-8 * float(exact.abs().max())


class SoftCapped(nn.Module):
    """Gemma 2's logits: tanh(logits / 30) * 30, the model's last op."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 100, bias=False)

    def forward(self, x):
        return torch.tanh(self.proj(x) / 30.0) * 30.0


def test_a_bfloat16_output_rounded_after_a_fast_activation_builds():
    """The output's cast runs in the last kernel's write-back, after FastMath's let-bound tanh:
    TVM's bfloat16 legalization copied the lets into each read of the cast's operand, and its
    VectorizeLoop refused the copies (topi_accel/tir_passes/casts.py)."""
    torch.manual_seed(0)
    model, x = SoftCapped().eval().bfloat16(), (torch.randn(8, 16) * 8).bfloat16()
    ours = torch.from_dlpack(_built(accel_target.from_torch(model, (x,)))(x))
    with torch.no_grad():
        exact = SoftCapped.forward(model.double(), x.double())
    assert float((ours.double() - exact).abs().max()) <= 2**-8 * float(exact.abs().max())
