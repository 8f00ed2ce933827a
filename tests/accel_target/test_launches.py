"""SharedLaunches (accel_target.launches): a model's consecutive kernels run in one launch
of the thread pool, with the same bits as the kernels one by one, the report unchanged."""

import numpy as np
import pytest
import torch
import tvm
from torch import nn
from tvm import tirx

import accel_target
import topi_accel
from accel_target import launches, pipeline
from accel_target.torch_ops import import_program
from tests.helpers import assert_close, isa_params, run_executable
from topi_accel import workshare


class Blocks(nn.Module):
    """Convs large enough to run on both cores, a residual add written in place, a pool, a
    reshape and a dense: kernels, allocations, views and releases between them."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(16, 32, 3, padding=1), nn.Conv2d(32, 32, 3, padding=1)
        self.c, self.fc = nn.Conv2d(32, 64, 1), nn.Linear(64, 10)

    def forward(self, x):
        y = torch.relu(self.a(x))
        y = torch.relu(self.c(y + self.b(y)))
        return self.fc(y.mean((2, 3)))


@pytest.fixture(scope="module", name="blocks")
def _blocks():
    torch.manual_seed(0)
    model, x = Blocks().eval(), torch.randn(1, 16, 32, 32)
    with torch.no_grad():
        ref = model(x).numpy()
    return accel_target.from_torch(model, (x,)), x.numpy(), ref


def _unshared(mod, target="accel"):
    """`mod` built without SharedLaunches."""
    with launches.disabled():
        return accel_target.build(mod, target=target)


def _called(executable) -> list[str]:
    return [line.split()[1] for line in executable.as_text().splitlines() if line.strip().startswith("call ")]


def test_consecutive_kernels_share_one_launch(blocks):
    mod, x, ref = blocks
    shared, unshared = accel_target.build(mod), _unshared(mod)
    launches = [name for name in _called(shared) if name.startswith("shared_launch")]
    assert len(launches) == 1, _called(shared)
    members = topi_accel.shared_launch.member_names(launches[0])
    assert len(members) >= 4 and not any(name.startswith("shared_launch") for name in _called(unshared))
    # the report counts the kernels that run, whether they share a launch or not
    assert shared.report.kernels == unshared.report.kernels
    assert set(members) <= set(shared.report.kernels.calls)
    out = run_executable(shared, x)
    assert np.array_equal(out, run_executable(unshared, x))
    assert_close(out, ref)


def test_a_shared_launch_survives_separate_weights_save_and_load(blocks, tmp_path):
    mod, x, ref = blocks
    executable = accel_target.build(mod, weights="separate")
    assert any(name.startswith("shared_launch") for name in _called(executable))
    accel_target.save(executable, tmp_path / "blocks.so")
    assert_close(accel_target.load(tmp_path / "blocks.so")(x).numpy(), ref)


def test_a_run_that_fails_to_merge_is_left_as_it_was(blocks, monkeypatch):
    mod, x, ref = blocks
    monkeypatch.setattr(topi_accel.shared_launch, "merge", lambda members: 1 / 0)
    executable = accel_target.build(mod)
    assert not any(name.startswith("shared_launch") for name in _called(executable))
    declines = executable.report.declines
    assert [d.step for d in declines] == ["SharedLaunches"] and declines[0].reason.startswith("ZeroDivisionError")
    assert declines[0].where in executable.report.kernels.calls
    assert_close(run_executable(executable, x), ref)


def test_a_build_that_fails_with_shared_launches_is_made_without_them(blocks, monkeypatch):
    mod, x, ref = blocks
    compile_ = tvm.compile

    def failing_with_shared_launches(final, *args, **kwargs):
        if launches.shares(final):
            raise RuntimeError("boom")
        return compile_(final, *args, **kwargs)

    monkeypatch.setattr(tvm, "compile", failing_with_shared_launches)
    executable = accel_target.build(mod)
    assert not any(name.startswith("shared_launch") for name in _called(executable))
    assert [(d.step, d.where, d.reason) for d in executable.report.declines] == [
        ("SharedLaunches", "module", "RuntimeError: boom")
    ]
    assert_close(run_executable(executable, x), ref)


def test_kernels_of_a_symbolic_batch_share_a_launch():
    torch.manual_seed(0)
    model = Blocks().eval()
    batch = torch.export.Dim("batch", min=1, max=16)
    with torch.no_grad():
        program = torch.export.export(model, (torch.randn(2, 16, 32, 32),), dynamic_shapes=({0: batch},))
    mod = import_program(program)
    shared, unshared = accel_target.build(mod), _unshared(mod)
    launched = [name for name in _called(shared) if name.startswith("shared_launch")]
    assert len(launched) == 1 and len(topi_accel.shared_launch.member_names(launched[0])) >= 4, _called(shared)
    for size in (1, 3, 8):
        x = torch.randn(size, 16, 32, 32)
        with torch.no_grad():
            ref = model(x).numpy()
        out = run_executable(shared, x.numpy())
        assert np.array_equal(out, run_executable(unshared, x.numpy()))
        assert_close(out, ref)


@pytest.mark.parametrize("target", isa_params())
def test_kernels_too_small_to_wake_the_pool_for_run_in_parallel_in_a_shared_launch(target):
    """At 4x4, SerialSmallKernels makes the convolutions serial on every ISA (waking the pool
    for one costs more than it saves; at 8x8 the narrower vectors' kernels are large enough);
    in a launch, where the pool is awake anyway, they run in parallel."""
    torch.manual_seed(0)
    model, x = Blocks().eval(), torch.randn(1, 16, 4, 4)
    with torch.no_grad():
        ref = model(x).numpy()
    mod = accel_target.from_torch(model, (x,))
    target = tvm.target.Target(target)
    with launches.disabled():
        unshared = pipeline.run_phases(mod, target)["lowering"]
    shared = pipeline.run_phases(mod, target)["lowering"]
    kernels = {
        g.name_hint: f for m in (unshared, shared) for g, f in m.functions_items() if isinstance(f, tirx.PrimFunc)
    }
    convs = [name for name in kernels if "conv2d" in name and not name.startswith("shared_launch")]
    assert convs and not any("T.parallel" in kernels[name].script() for name in convs)
    merged = [name for name in kernels if name.startswith("shared_launch")]
    assert len(merged) == 1 and set(convs) <= set(topi_accel.shared_launch.member_names(merged[0]))
    assert kernels[merged[0]].script().count(workshare.CLAIM_RESET) >= len(convs)  # (each conv claimed)
    out = run_executable(accel_target.build(mod, target=target), x.numpy())
    assert np.array_equal(out, run_executable(_unshared(mod, target), x.numpy()))
    assert_close(out, ref)


class _SegmentSum(nn.Module):
    """Mamba2's segment sum (transformers' segment_sum: Bamba, Mamba2): a masked running sum
    along the second last axis, TVM's scan kernel, whose input buffer sits at an offset of a
    variable."""

    def forward(self, x):
        n = x.size(-1)
        spread = x[..., None].expand(*x.size(), n)
        spread = spread.masked_fill(~torch.tril(torch.ones(n, n, dtype=torch.bool), diagonal=-1), 0)
        sums = torch.cumsum(spread, dim=-2)
        sums = sums.masked_fill(~torch.tril(torch.ones(n, n, dtype=torch.bool), diagonal=0), -torch.inf)
        return torch.exp(sums).sum(-1)


def test_a_kernel_whose_buffer_sits_at_a_variable_offset_launches_alone():
    """It does not join a shared launch, which would leave its offset unbound: the module's
    SharedLaunches failed ("variables (elem_offset,) are used, but are not passed in as API
    arguments"; declined) and no kernel of the model shared a launch."""
    model, x = _SegmentSum(), torch.randn(1, 4, 2, 64)
    executable = accel_target.build(accel_target.from_torch(model, (x,)))
    assert executable.report.declines == ()
    assert "cumsum" in _called(executable)
    assert_close(run_executable(executable, x.numpy()), model(x).numpy())
