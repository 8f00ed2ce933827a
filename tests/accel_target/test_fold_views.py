"""FoldViews: attention's head split read in place by the batch matmuls, the head merge
written by them (accel_target/passes/fold_views.py, topi_accel/views.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import tvm
from torch import nn
from tvm import te, tirx

import accel_target
import topi_accel
from tests.helpers import assert_close, rand, run_executable, run_primfunc
from tests.models.classic import EncoderLayer
from topi_accel.views import View, apply, reads

QKV = (("reshape", (1, 16, 3, 2, 8)), ("transpose", (2, 0, 3, 1, 4)))  # [16, 48]: S 16, 2 heads of 8


def _slice(i):
    return ("strided_slice", (i,), (i + 1,), (1,), (0,), False), ("squeeze", (0,))


def _numpy_qkv(x):
    return x.reshape(1, 16, 3, 2, 8).transpose(2, 0, 3, 1, 4)


# (steps after QKV, the same in numpy on _numpy_qkv's result, reads directly, unit stride last)
CHAINS = [
    ((*_slice(0), ("reshape", (2, 16, 8))), lambda t: t[0, 0], True, True),  # Q
    # Kᵀ
    (
        (*_slice(1), ("transpose", (0, 1, 3, 2)), ("reshape", (2, 8, 16))),
        lambda t: t[1, 0].transpose(0, 2, 1),
        True,
        False,
    ),
    ((*_slice(2), ("reshape", (2, 16, 8))), lambda t: t[2, 0], True, True),  # V
    ((("reshape", (6, 16, 8)),), lambda t: t.reshape(6, 16, 8), True, True),  # Q, K, V heads: qkv's columns again
    ((("reshape", (3, 32, 8)),), lambda t: t.reshape(3, 32, 8), False, True),  # heads and rows merged: divides
]


@pytest.mark.parametrize("steps, reference, direct, unit_stride", CHAINS)
def test_view_reads_what_the_layout_ops_compute(steps, reference, direct, unit_stride):
    x = rand(16, 48)
    source, chain = te.placeholder((16, 48), "float32", name="x"), View((16, 48), QKV + steps)
    expected = reference(_numpy_qkv(x))
    func = te.create_prim_func([source, apply(chain, source)])
    np.testing.assert_array_equal(run_primfunc(func, [x], expected.shape), expected)
    assert reads(chain).direct == direct
    assert reads(chain).unit_stride_last == unit_stride


def test_a_symbolic_sequence_is_read_without_dividing_by_it():
    s = tirx.Var("s", "int64")
    split = (("reshape", (1, s, 3, 2, 8)), ("transpose", (2, 0, 3, 1, 4)), *_slice(2), ("reshape", (2, s, 8)))
    chain = View((s, 48), split)
    assert reads(chain).direct and reads(chain).unit_stride_last


def test_batch_matmul_reads_views_and_writes_its_result_permuted():
    x, p = rand(16, 48), rand(2, 16, 16)
    q, k, v = _numpy_qkv(x)[:, 0]
    view = lambda i, *more: View((16, 48), QKV + _slice(i) + more)  # noqa: E731
    with tvm.target.Target("accel"):
        scores = topi_accel.batch_matmul_kn_func(
            2,
            16,
            8,
            16,
            topi_accel.batch_matmul_config(16, 16),
            "float32",
            view(0, ("reshape", (2, 16, 8))),
            view(1, ("transpose", (0, 1, 3, 2)), ("reshape", (2, 8, 16))),
        )
        merged = topi_accel.batch_matmul_kn_func(
            (1, 2),
            16,
            16,
            8,
            topi_accel.batch_matmul_config(16, 8),
            "float32",
            None,
            view(2, ("reshape", (2, 16, 8))),
            (0, 2, 1, 3),
        )
    assert_close(run_primfunc(scores, [x, x], (2, 16, 16)), q @ k.transpose(0, 2, 1))
    assert_close(run_primfunc(merged, [p, x], (1, 16, 2, 8)), (p @ v)[None].transpose(0, 2, 1, 3))


def _encoder():
    torch.manual_seed(0)
    return EncoderLayer(dim=64, heads=4, ffn=128).eval()


def test_attention_runs_without_a_layout_transform():
    model, x = _encoder(), torch.randn(1, 24, 64)
    executable = accel_target.build(accel_target.from_torch(model, (x,)))
    assert_close(run_executable(executable, x.numpy()), model(x).detach().numpy())
    report = accel_target.report(executable)
    assert report.kernels.activation_transforms == 0, report.kernels.calls
    assert not any("transpose" in k or "strided_slice" in k for k in report.kernels.calls)
    # the report tells where they went: the head split and merge into the attention kernels
    assert all(r.kind == "accel" for r in report.rows if r.op == "relax.matmul"), str(report)
    moved = [r.kernel for r in report.rows if r.op in ("relax.permute_dims", "relax.strided_slice")]
    assert moved and set(moved) == {"fused into batch_matmul_kn.accel"}, str(report)


def test_attention_of_a_symbolic_sequence_runs_without_a_layout_transform():
    model = _encoder()
    seq = torch.export.Dim("seq", min=2, max=256)
    mod = accel_target.from_torch(model, (torch.randn(1, 24, 64),), dynamic_shapes=({1: seq},))
    executable = accel_target.build(mod)
    for length in (5, 24, 67):
        x = torch.randn(1, length, 64)
        assert_close(run_executable(executable, x.numpy()), model(x).detach().numpy())
    assert accel_target.report(executable).kernels.activation_transforms == 0


class _Views(nn.Module):
    """A matmul of a permuted operand (read in place, its two samples' rows regrouped into
    four matrices: a division of the matrix index alone) and of one whose reshape after the
    permute moves columns into rows (its reads divide the row index: it stays a copy)."""

    def forward(self, x, y, z):
        read_in_place = x.permute(1, 0, 2).reshape(6, 4, 16) @ y
        divided = x.permute(1, 0, 2).reshape(3, 16, 8) @ z
        return read_in_place, divided


def test_a_view_the_kernel_cannot_read_directly_stays_materialized():
    model, inputs = _Views(), (torch.randn(8, 3, 16), torch.randn(6, 16, 8), torch.randn(3, 8, 8))
    executable = accel_target.build(accel_target.from_torch(model, inputs))
    expected = model(*inputs)
    vm = tvm.relax.VirtualMachine(executable, tvm.cpu())
    got = vm["main"](*[tvm.runtime.tensor(x.numpy()) for x in inputs])
    for out, ref in zip(got, expected):
        assert_close(out.numpy(), ref.numpy())
    report = accel_target.report(executable)
    assert report.kernels.activation_transforms == 1  # the second product's permute alone


def test_multihead_attention_reads_its_unbound_heads_in_place():
    """torch's MultiheadAttention: QKV unbound with take (one index of an axis) after an
    expand_dims, heads of both samples on one axis: read in place; what is left is the
    model's own pair of batch-first permutes."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=0.0, batch_first=True).eval()
    x = torch.randn(2, 10, 32)
    executable = accel_target.build(accel_target.from_torch(layer, (x,)))
    with torch.no_grad():
        assert_close(run_executable(executable, x.numpy()), layer(x).numpy())
    report = accel_target.report(executable)
    assert report.kernels.activation_transforms <= 2, report.kernels.calls
    assert not any("take" in k or "strided_slice" in k for k in report.kernels.calls), report.kernels.calls


class _GroupedQueryAttention(nn.Module):
    """Llama's repeat_kv: 2 K/V heads, each read by 2 of the 4 query heads (expand + reshape)."""

    def forward(self, q, k, v):  # q [1, 4, S, 16], k and v [1, 2, S, 16]
        k, v = (t[:, :, None].expand(1, 2, 2, t.shape[2], 16).reshape(1, 4, t.shape[2], 16) for t in (k, v))
        return torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v


def test_grouped_query_heads_are_read_in_place():
    inputs = (torch.randn(1, 4, 12, 16), torch.randn(1, 2, 12, 16), torch.randn(1, 2, 12, 16))
    model = _GroupedQueryAttention()
    executable = accel_target.build(accel_target.from_torch(model, inputs))
    assert_close(run_executable(executable, *[x.numpy() for x in inputs]), model(*inputs).numpy())
    calls = accel_target.report(executable).kernels.calls
    assert accel_target.report(executable).kernels.activation_transforms == 0, calls
    assert not any("broadcast" in k for k in calls), calls


class _ResultReadTwice(nn.Module):
    """P @ V whose result is read by the head merge's permute and by a sum: the kernel writes it
    unpermuted and the permute stays."""

    def forward(self, p, v):
        out = p @ v
        return out.transpose(1, 2).reshape(1, 12, 32), out.sum()


def test_a_result_read_by_more_than_its_permute_is_written_as_it_is():
    inputs = (torch.randn(1, 4, 12, 12), torch.randn(1, 4, 12, 8))
    model = _ResultReadTwice()
    executable = accel_target.build(accel_target.from_torch(model, inputs))
    vm = tvm.relax.VirtualMachine(executable, tvm.cpu())
    got = vm["main"](*[tvm.runtime.tensor(x.numpy()) for x in inputs])
    for out, ref in zip(got, model(*inputs)):
        assert_close(out.numpy(), ref.numpy())
    assert accel_target.report(executable).kernels.activation_transforms == 1


class _SpatialTransform(nn.Module):
    """timm's bilinear attention transform (BAT-ResNeXt): per channel, p @ x @ q over the image's
    rows and columns, between convs. In NHWC the channels are x's last axis: the first product
    reads x in place, the second writes its [C, H, W] result as [1, H, W, C], the batch axis
    moved last."""

    def __init__(self, channels=16, size=8):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(3, channels, 1), nn.Conv2d(channels, channels, 1)
        self.p = nn.Parameter(torch.randn(channels, size, size))
        self.q = nn.Parameter(torch.randn(channels, size, size))

    def forward(self, x):
        x = self.conv1(x)
        gate = x.mean()  # p and q computed from the input, as BAT's are
        return self.conv2((self.p * gate).sigmoid() @ x @ (self.q * gate).sigmoid())


def test_a_result_permuted_with_its_columns_moved_is_written_so():
    torch.manual_seed(0)
    model, x = _SpatialTransform().eval(), torch.randn(1, 3, 8, 8)
    executable = accel_target.build(accel_target.from_torch(model, (x,)), input_layout="NHWC", output_layout="NHWC")
    out = run_executable(executable, x.permute(0, 2, 3, 1).contiguous().numpy())
    assert_close(out, model(x).detach().permute(0, 2, 3, 1).numpy())
    report = accel_target.report(executable)
    assert report.kernels.activation_transforms == 0, report.kernels.calls
