"""The tuner times candidates in the model: its kernel calls matched to the convs, the winners
chosen with a margin, and a set of them kept only if the whole model is faster with it."""

import dataclasses
import json

import pytest
import torch
import tvm
from tvm import relax

import accel_target
import topi_accel
from accel_target import launches, tuner
from accel_target.torch_ops import import_program
from tests.helpers import assert_close, run_executable


class Block(torch.nn.Module):
    """A 3x3 conv, a pointwise conv written over a residual, a strided depthwise conv."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.point = torch.nn.Conv2d(16, 16, 1)
        self.depthwise = torch.nn.Conv2d(16, 16, 3, stride=2, padding=1, groups=16)

    def forward(self, x):
        y = torch.relu(self.stem(x))
        return self.depthwise(y + self.point(y))


@pytest.fixture(scope="module")
def block():
    torch.manual_seed(0)
    model = Block().eval()
    x = torch.randn(1, 3, 12, 12)
    return model, x, accel_target.from_torch(model, (x,))


def _geometries(mod) -> list:
    return tuner.direct_convs(mod, None, tvm.target.Target("accel"))


def test_every_conv_is_found_among_the_kernel_calls(block):
    """Each conv's kernel call, epilogues fused (bias, ReLU, the residual it writes over), is
    matched to its geometry by the shapes of its arguments, and timed."""
    _, _, mod = block
    geometries = _geometries(mod)
    assert len(geometries) == 3 and {tuner._family(g) for g in geometries} == {"spatial", "pointwise", "grouped"}
    with launches.disabled():
        executable = accel_target.build(mod)
    vm = relax.VirtualMachine(executable, tvm.cpu())
    convs = {tuner._conv_shapes(g): g for g in geometries}
    times = tuner.conv_times(vm, tuner._random_inputs(executable), convs, runs=3)
    assert set(times) == set(geometries) and all(ms > 0 for ms in times.values())


def test_a_call_is_matched_by_its_data_as_it_is_before_reading_it_nchw():
    """A grouped conv's NHWC data whose rows are as many as its channels a group is not taken
    for NCHW data; a first conv reading the image NCHW is found by its NHWC shapes."""
    grouped = topi_accel.Conv2DGeometry(1, 8, 8, 16, 16, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 2)
    stem = topi_accel.Conv2DGeometry(1, 32, 32, 3, 16, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1)
    convs = {tuner._conv_shapes(g): g for g in (grouped, stem)}
    assert tuner._conv_of_call(convs, [(1, 8, 8, 16), (2, 3, 3, 8, 8), (1, 8, 8, 16)]) == grouped
    assert tuner._conv_of_call(convs, [(1, 3, 32, 32), (2, 3, 3, 3, 8), (1, 32, 32, 16)]) == stem
    assert tuner._conv_of_call(convs, [(1, 32, 32, 3), (2, 3, 3, 3, 8), (1, 32, 32, 16)]) == stem
    assert tuner._conv_of_call(convs, [(1, 16), (16, 16)]) is None


def test_choose_keeps_the_heuristic_unless_another_is_faster_by_the_margin():
    assert tuner.choose({0: [1.0, 1.1, 1.0], 1: [0.5, 0.6, 0.5], 2: [0.7]}) == 1
    assert tuner.choose({0: [1.0], 1: [0.99]}, margin=0.03) == 0  # within the margin
    assert tuner.choose({0: [1.0], 1: [1.5]}) == 0
    assert tuner.choose({1: [0.5]}) is None  # the heuristic's config never timed


def _fake_times(monkeypatch, fastest_set: str):
    """Candidate 1 the fastest of every conv in the kernels' timing; `fastest_set` the fastest
    in the whole model's (the heuristic's configs at 1.0)."""
    builds = {}

    def conv_times(vm, inputs, convs, runs):
        index = builds.setdefault(id(vm), len(builds))  # the first turn takes the builds in order
        return {g: 1.0 if index == 1 else 2.0 for g in convs.values()}

    def model_times(vms, turns, runs):
        assert "the heuristic's" in vms and "every conv's winner" in vms
        return {name: [0.8 if name == fastest_set else 1.0] * turns for name in vms}

    monkeypatch.setattr(tuner, "conv_times", conv_times)
    monkeypatch.setattr(tuner, "model_times", model_times)


@pytest.mark.parametrize(
    "fastest_set, winners_in",
    [
        ("every conv's winner", {"spatial", "pointwise", "grouped"}),
        ("the pointwise convs' winners", {"pointwise"}),
        ("the heuristic's", set()),
    ],
)
def test_tune_keeps_the_set_of_winners_the_whole_model_runs_fastest_with(
    block, tmp_path, monkeypatch, fastest_set, winners_in
):
    model, x, mod = block
    _fake_times(monkeypatch, fastest_set)
    said = []
    db = accel_target.tune(mod, tmp_path / "tuning.json", limit=2, number=1, progress=said.append)
    entries = json.loads((tmp_path / "tuning.json").read_text())
    assert len(entries) == len(db.entries) == 3
    target = tvm.target.Target("accel")
    for g in _geometries(mod):
        with target:
            candidates = topi_accel.conv2d_candidates(g, target)
        assert len(candidates) >= 2
        kept = db.get(topi_accel.conv2d_key(g, target))
        expected = candidates[1] if tuner._family(g) in winners_in else candidates[0]
        assert kept == dataclasses.asdict(expected), (tuner._family(g), kept)
    assert any(line.startswith("the whole model, against the heuristic's configs") for line in said)
    executable = accel_target.build(mod, tuning_db=tmp_path / "tuning.json")
    assert_close(run_executable(executable, x.numpy()), model(x).detach().numpy())


def test_a_model_of_symbolic_input_shapes_is_refused(block, tmp_path):
    model, x, _ = block
    batch = torch.export.Dim("batch", min=1, max=8)
    with torch.no_grad():
        program = torch.export.export(model, (torch.cat([x, x]),), dynamic_shapes=({0: batch},))
    with pytest.raises(ValueError, match=r"tune times the model on random inputs: inputs \['.*'\] have symbolic"):
        accel_target.tune(import_program(program), tmp_path / "tuning.json", limit=1)
    assert not (tmp_path / "tuning.json").exists()
