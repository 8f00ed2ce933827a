"""FastMath's vector forms of softplus, Mish and exp(x) - 1 against float64 numpy, and each found
in the forms the importers write (accel_target/passes/fast_math.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import tvm
from torch import nn
from tvm import relax, te

import accel_target
from accel_target.passes.fast_math import fast_expm1, fast_mish, fast_softplus, read_once
from tests.helpers import assert_close, float_onnx_model, run_executable, run_primfunc

# from far in the negative tail, through 0 (finely), to past the linear thresholds
X = np.concatenate([np.linspace(-100, 100, 20001), np.linspace(-1e-3, 1e-3, 201)]).astype("float32")


def _softplus(x, beta=1.0, threshold=20.0):
    z = beta * x
    return np.where(z > threshold, x, np.logaddexp(0.0, z) / beta)


# (vector form, float64 reference, max relative error; PyTorch's own on float32 is 1.2e-7 / 2.6e-7)
CASES = {
    "softplus": (fast_softplus, _softplus, 5e-7),
    "softplus_beta": (lambda x: fast_softplus(x, 2.0, 5.0), lambda x: _softplus(x, 2.0, 5.0), 5e-7),
    "mish": (fast_mish, lambda x: x * np.tanh(_softplus(x)), 5e-7),
    "expm1": (fast_expm1, np.expm1, 5e-7),  # libm's expf(x) - 1: 7% off at x = 1e-6
    "one_minus_exp": (lambda x: fast_expm1(x, -1.0), lambda x: -np.expm1(x), 5e-7),
}


@pytest.mark.parametrize("name", CASES)
def test_vector_form_is_within_a_few_ulps_of_float64(name):
    compute, reference, max_relative = CASES[name]
    x = te.placeholder(X.shape, "float32", name="x")
    out = run_primfunc(te.create_prim_func([x, compute(x)]), [X], X.shape)
    with np.errstate(over="ignore"):
        expected = reference(X.astype(np.float64)).astype(np.float32).astype(np.float64)  # inf past float32
    assert not np.isnan(out).any()
    assert (np.isinf(out) == np.isinf(expected)).all()
    out, expected = out[np.isfinite(expected)], expected[np.isfinite(expected)]
    relevant = np.abs(expected) > 1e-30  # below x = -87 fast_exp underflows: the result is 0
    assert np.abs(out - expected)[~relevant].max() < 1e-36
    relative = np.abs(out - expected)[relevant] / np.abs(expected)[relevant]
    assert relative.max() < max_relative, X[relevant][np.argmax(relative)]


@pytest.mark.parametrize("op", ["fast_exp", "fast_tanh", "fast_erf"])
def test_read_once_form_is_topis_op_bit_for_bit(op):
    """`read_once(op)` (the input read once, TOPI's stages let-bound) computes what TOPI's op
    does, to the bit, NaN and the infinities included."""
    from tvm import topi

    x = te.placeholder(X.shape, "float32", name="x")
    values = X.copy()
    values[:3] = [np.nan, np.inf, -np.inf]
    ours = run_primfunc(te.create_prim_func([x, read_once(getattr(topi, op))(x)]), [values], X.shape)
    theirs = run_primfunc(te.create_prim_func([x, getattr(topi, op)(x)]), [values], X.shape)
    np.testing.assert_array_equal(ours.view(np.uint32), theirs.view(np.uint32))


def _kernel_names(executable) -> list[str]:
    return list(accel_target.report(executable).kernels.calls)


class _MishOfScaled(nn.Module):
    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return nn.functional.mish(self.scale * x)


@pytest.mark.parametrize("scale", [None, 2.0], ids=["mish", "mish_of_2x"])
def test_pytorch_mish_is_one_vector_op_in_the_conv_write_back(scale):
    """Also Mish of a scaled input: softplus's own beta must not be read into the scale."""
    torch.manual_seed(0)
    mish = nn.Mish() if scale is None else _MishOfScaled(scale)
    model, x = nn.Sequential(nn.Conv2d(4, 16, 3), mish).eval(), torch.randn(1, 4, 10, 10) * 8
    executable = accel_target.build(accel_target.from_torch(model, (x,)))
    with torch.no_grad():
        assert_close(run_executable(executable, x.numpy()), model(x).numpy())
    assert any("conv2d" in k and "fast_mish" in k for k in _kernel_names(executable)), _kernel_names(executable)


def test_onnx_mish_spelt_with_exp_and_log_is_found():
    import onnx
    from onnx import helper

    model = float_onnx_model([helper.make_node("Mish", ["x"], ["y"])], {"x": [2, 300]}, {"y": [2, 300]})
    model.opset_import[0].version = 18
    x = (np.random.default_rng(0).standard_normal((2, 300)) * 10).astype("float32")
    mod = accel_target.from_onnx(onnx.load_from_string(model.SerializeToString()))
    executable = accel_target.build(mod)
    assert_close(run_executable(executable, x), x * np.tanh(_softplus(x.astype(np.float64))))
    assert any("fast_mish" in k for k in _kernel_names(executable)), _kernel_names(executable)


@pytest.mark.parametrize(
    "op, attributes, reference",
    [
        ("Elu", {"alpha": 0.7}, lambda x: np.where(x > 0, x, 0.7 * np.expm1(x))),
        ("Selu", {}, lambda x: 1.0507009873554805 * np.where(x > 0, x, 1.6732632423543772 * np.expm1(x))),
    ],
    ids=["elu", "selu"],
)
def test_onnx_elu_spelt_with_one_minus_exp_is_found(op, attributes, reference):
    """TVM's ONNX Elu and Selu: -alpha * relu(1 - exp(x)) + relu(x), 1 - exp(x) computed as
    -expm1(x) (accurate near 0, where 1 - expf(x) is not)."""
    import onnx
    from onnx import helper

    model = float_onnx_model([helper.make_node(op, ["x"], ["y"], **attributes)], {"x": [2, 300]}, {"y": [2, 300]})
    x = np.concatenate([np.linspace(-1e-4, 1e-4, 300), np.linspace(-20, 20, 300)]).reshape(2, 300).astype("float32")
    executable = accel_target.build(accel_target.from_onnx(onnx.load_from_string(model.SerializeToString())))
    tvm.testing.assert_allclose(run_executable(executable, x), reference(x.astype(np.float64)), rtol=1e-6, atol=0)
    assert any("fast_expm1" in k for k in _kernel_names(executable)), _kernel_names(executable)


def test_a_softplus_read_by_something_else_is_kept():
    """tanh(softplus(x)) * x where softplus(x) is also an output: Mish is computed whole and the
    softplus stays for its other reader."""

    class Both(nn.Module):
        def forward(self, x):
            s = nn.functional.softplus(x)
            return x * torch.tanh(s), s

    x = torch.randn(3, 40) * 6
    executable = accel_target.build(accel_target.from_torch(Both(), (x,)))
    vm = relax.VirtualMachine(executable, tvm.cpu())
    mish, soft = vm["main"](tvm.runtime.tensor(x.numpy()))
    expected = Both()(x)
    assert_close(mish.numpy(), expected[0].numpy())
    assert_close(soft.numpy(), expected[1].numpy())
    kernels = _kernel_names(executable)
    assert any("fast_mish" in k for k in kernels) and any("fast_softplus" in k for k in kernels), kernels


def _where_softplus(numerator_scale: float, divisor: float) -> tvm.IRModule:
    """where(x > 20, x, log(1 + exp(s x)) / d): PyTorch's softplus decomposition when s = d."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 50), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            z = bb.emit(relax.op.multiply(x, relax.const(numerator_scale, "float32")))
            soft = bb.emit(relax.op.log(bb.emit(relax.op.add(bb.emit(relax.op.exp(z)), relax.const(1.0, "float32")))))
            soft = bb.emit(relax.op.divide(soft, relax.const(divisor, "float32")))
            big = bb.emit(relax.op.greater(z, relax.const(20.0, "float32")))
            out = bb.emit_output(relax.op.where(big, x, soft))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("scale, divisor", [(2.0, 2.0), (1.0, 2.0), (2.0, 1.0)])
def test_a_softplus_spelt_out_is_found_with_its_own_beta_alone(scale, divisor):
    x = (np.random.default_rng(1).standard_normal((4, 50)) * 5).astype("float32")
    executable = accel_target.build(_where_softplus(scale, divisor))
    z = scale * x.astype(np.float64)
    assert_close(run_executable(executable, x), np.where(z > 20, x, np.log1p(np.exp(z)) / divisor))
    # (a mismatched one still has its log(1 + exp(s x)) as a softplus of s x, inside the where)
    assert any("fast_softplus" in k for k in _kernel_names(executable))
