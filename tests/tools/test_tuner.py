"""The tuner judges every conv's candidates by the whole model's time against one baseline:
a candidate kept only if it saves MARGIN of it, each conv's decision written as soon as it is
made (an interrupted tune resumes), measurements retried on another server when one hangs."""

import concurrent.futures
import dataclasses
import json
import os
import re
import threading

import pytest
import torch
import tvm

import accel_target
import topi_accel
from accel_target.frontends.torch_ops import import_program
from accel_target.runtime import remote
from accel_target.tools import tuner
from tests.helpers import assert_close


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


def test_every_distinct_conv_of_the_direct_kernel_is_found(block):
    _, _, mod = block
    assert [tuner._family(g) for g in _geometries(mod)] == ["spatial", "pointwise", "grouped"]


def test_choose_keeps_the_heuristic_unless_another_saves_the_margin():
    assert tuner.choose({1: 0.9, 2: 0.95}) == 1
    assert tuner.choose({1: 0.995}, margin=0.01) == 0  # within the margin
    assert tuner.choose({1: 1.2, 2: 1.01}) == 0
    assert tuner.choose({}) == 0  # a conv with the heuristic's config alone


def _fake_measurements(monkeypatch, ratios: dict, measured: list, stop_at=None):
    """time_libraries replaced: the model's time with candidate k of conv i is ratios[(i, k)]
    (1.0 where not given) times the baseline's 2.0 ms; `measured` lists the (i, k) timed; a
    measurement of conv `stop_at` raises KeyboardInterrupt (an interrupted tune)."""

    def time_libraries(libraries, session, *, number, rounds):
        assert session is None and set(libraries) <= {"baseline", "candidate"} and rounds == tuner.ROUNDS
        name = os.path.basename(libraries.get("candidate", "conv-1_candidate0.so"))
        conv, k = map(int, re.fullmatch(r"conv(-?\d+)_candidate(\d+)\.so", name).groups())
        if conv == stop_at:
            raise KeyboardInterrupt
        measured.append((conv, k))
        times = {"baseline": [2.0] * rounds}
        if "candidate" in libraries:
            times["candidate"] = [2.0 * ratios.get((conv, k), 1.0)] * rounds
        return times

    monkeypatch.setattr(tuner, "time_libraries", time_libraries)


def _candidate_counts(mod) -> list:
    """How many candidates each conv of `mod` has on the target (fewer where a vector spans
    every channel: the depthwise conv's 16 on AVX-512)."""
    target = tvm.target.Target("accel")
    with target:
        return [len(topi_accel.conv2d_candidates(g, target)) for g in _geometries(mod)]


def _kept(mod, db) -> dict:
    """{family: index of the candidate the database holds} of every conv of `mod`."""
    target = tvm.target.Target("accel")
    kept = {}
    for g in _geometries(mod):
        with target:
            candidates = [dataclasses.asdict(c) for c in topi_accel.conv2d_candidates(g, target)]
        kept[tuner._family(g)] = candidates.index(db.get(topi_accel.conv2d_key(g, target)))
    return kept


def test_a_candidate_is_kept_when_the_model_is_faster_by_the_margin(block, tmp_path, monkeypatch):
    """The pointwise conv's candidate 2 saves 10% of the model's time, the grouped conv's 0.5%
    (within the margin): only the first is kept; the database has the model's ms with each."""
    model, x, mod = block
    measured, said = [], []
    _fake_measurements(monkeypatch, {(1, 2): 0.9, (2, 1): 0.995}, measured)
    db = accel_target.tune(mod, tmp_path / "tuning.json", limit=3, number=1, progress=said.append)
    assert sorted(measured) == [(c, k) for c, n in enumerate(_candidate_counts(mod)) for k in range(1, min(n, 3))]
    assert _kept(mod, db) == {"spatial": 0, "pointwise": 2, "grouped": 0}
    assert sorted(e["ms"] for e in json.loads((tmp_path / "tuning.json").read_text()).values()) == [1.8, 2.0, 2.0]
    assert any("candidate 3, the model in 0.900 of the time" in line for line in said), said
    executable = accel_target.build(mod, tuning_db=tmp_path / "tuning.json")
    assert_close(executable(x.numpy()).numpy(), model(x).detach().numpy())


def test_an_interrupted_tune_resumes_where_it_stopped(block, tmp_path, monkeypatch):
    """Interrupted while measuring the third conv: the database holds the first two, and the
    next run measures the third alone."""
    _, _, mod = block
    measured = []
    _fake_measurements(monkeypatch, {(0, 1): 0.5}, measured, stop_at=2)
    with pytest.raises(KeyboardInterrupt):
        accel_target.tune(mod, tmp_path / "tuning.json", limit=2, number=1)
    assert len(json.loads((tmp_path / "tuning.json").read_text())) == 2 and sorted(measured) == [(0, 1), (1, 1)]
    measured.clear()
    _fake_measurements(monkeypatch, {}, measured)
    db = accel_target.tune(mod, tmp_path / "tuning.json", limit=2, number=1)
    assert measured == [(0, 1)]  # the third conv, now the only one: the first of this run
    assert _kept(mod, db) == {"spatial": 1, "pointwise": 0, "grouped": 0}


def test_a_measurement_that_hangs_is_tried_again_on_another_server(monkeypatch):
    """Two servers; the first try of one measurement never answers: after the timeout it is
    tried again and gets its times; one that fails on every try ends as its error."""
    monkeypatch.setattr(remote.Device, "status", lambda self: {"registered": 2, "free": 2, "pending": 0})
    monkeypatch.setattr(remote.Device, "session", lambda self: object())
    said, results, release = [], {}, threading.Event()
    farm = tuner._Farm(remote.Device("127.0.0.1", 9, "k"), timeout=0.5, say=said.append)
    tries = {"hangs": 0, "fails": 0, "answers": 0}

    def measure(libraries, session):
        tries[libraries["baseline"]] += 1
        if libraries["baseline"] == "hangs" and tries["hangs"] == 1:
            release.wait(30)
        if libraries["baseline"] == "fails":
            raise ConnectionError("the server went away")
        return libraries["baseline"]

    def built(path):
        future = concurrent.futures.Future()
        future.set_result(path)
        return future

    geometry = topi_accel.Conv2DGeometry(1, 8, 8, 16, 16, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1)
    jobs = [tuner._Job(geometry, 0, {"baseline": built(name)}) for name in ("hangs", "fails", "answers")]
    farm.run(jobs, measure, lambda job, result: results.setdefault(job.builds["baseline"].result(), result))
    release.set()
    assert results["hangs"] == "hangs" and results["answers"] == "answers" and tries["hangs"] == 2
    assert isinstance(results["fails"], ConnectionError) and tries["fails"] == tuner.ATTEMPTS
    assert any("no answer from a server of 'k' at 127.0.0.1:9 within 0.5 s; trying again" in s for s in said), said


def test_a_model_of_symbolic_input_shapes_is_refused(block, tmp_path):
    model, x, _ = block
    batch = torch.export.Dim("batch", min=1, max=8)
    with torch.no_grad():
        program = torch.export.export(model, (torch.cat([x, x]),), dynamic_shapes=({0: batch},))
    with pytest.raises(ValueError, match=r"tune times the model on random inputs: inputs \['.*'\] have symbolic"):
        accel_target.tune(import_program(program), tmp_path / "tuning.json", limit=1)
    assert not (tmp_path / "tuning.json").exists()
