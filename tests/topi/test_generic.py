"""TVM's own kernels as topi_accel.generic schedules them and the build's kernel steps finish
them, against PyTorch."""

import numpy as np
import pytest
import torch
import tvm
from torch import nn
from tvm import relax

import accel_target
from tests.helpers import ISAS, assert_close, run_executable, runs_here


class RelativePositionBias(nn.Module):
    """SAM's decomposed relative-position bias (transformers' SamVisionAttention): the
    attention scores [b, h*w, h*w] plus a bias along the query rows and one along the columns.
    Fused, a row of the scores reads a row's slice of each bias, computed into a buffer of the
    kernel's own under the row loop."""

    def __init__(self):
        super().__init__()
        self.rel_h, self.rel_w = nn.Parameter(torch.randn(8, 8, 16)), nn.Parameter(torch.randn(8, 8, 16))

    def forward(self, attn, q):
        b, h, w, _ = q.shape
        rel_h = torch.einsum("bhwc,hkc->bhwk", q, self.rel_h)
        rel_w = torch.einsum("bhwc,wkc->bhwk", q, self.rel_w)
        attn = attn.reshape(b, h, w, h, w) + rel_h[:, :, :, :, None] + rel_w[:, :, :, None, :]
        return attn.reshape(b, h * w, h * w)


@pytest.mark.parametrize("isa", ISAS)
def test_a_row_by_row_kernel_with_buffers_of_its_own_is_right_on_every_call(isa):
    """Made serial as a small kernel, LLVM's loop vectorizer (AVX2 and AVX-512 code) read each
    row's slice of the bias buffers past its end: garbage (NaN on a first call, 1e19 after)."""
    torch.manual_seed(0)
    model, attn, q = RelativePositionBias().eval(), torch.randn(2, 64, 64), torch.randn(2, 8, 8, 16)
    executable = accel_target.build(accel_target.from_torch(model, (attn, q)), target=ISAS[isa])
    if not runs_here(ISAS[isa]):
        pytest.skip(f"built and checked only: this host cannot run {isa} code")
    vm = relax.VirtualMachine(executable, tvm.cpu())
    with torch.no_grad():
        expected = model(attn, q).numpy()
    for _ in range(2):
        out = vm["main"](tvm.runtime.tensor(attn.numpy()), tvm.runtime.tensor(q.numpy())).numpy()
        assert np.isfinite(out).all()
        assert_close(out, expected)


class GatedLeaky(nn.Module):
    """UnivNet's gate: tanh(a) * sigmoid(b) plus a residual, then a leaky ReLU, which reads its
    input twice (x > 0 ? x : 0.2 x). FastMath's sigmoid and tanh bind what they read several
    times with Let; inlined into both reads, each Let would define its variable twice."""

    def forward(self, x, c):
        h = (x + c).transpose(1, 2)
        return nn.functional.leaky_relu(torch.sigmoid(h[..., :8]) * torch.tanh(h[..., 8:]) + h[..., :8], 0.2)


def test_an_expression_with_let_read_twice_is_not_copied():
    x, c = torch.randn(1, 16, 32), torch.randn(1, 16, 32)
    executable = accel_target.build(accel_target.from_torch(GatedLeaky(), (x, c)))
    assert accel_target.report(executable).declines == ()  # Parallelize declined the ill-formed kernel
    assert_close(run_executable(executable, x.numpy(), c.numpy()), GatedLeaky()(x, c).numpy())
