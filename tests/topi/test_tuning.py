"""Schedule configs as data: every candidate a tuner may pick is correct; the database round-trips."""

import dataclasses
import json

import pytest
import torch
import tvm

import accel_target
import topi_accel
from tests.helpers import assert_close, conv2d_reference, pack, rand, run_executable, run_primfunc

# (data NHWC, kernel OHWI, stride, padding, groups): plain, tails, depthwise
SHAPES = [
    ((1, 14, 14, 32), (48, 3, 3, 32), 1, 1, 1),
    ((2, 9, 11, 5), (21, 3, 3, 5), 2, (1, 0, 2, 1), 1),
    ((1, 16, 16, 32), (32, 3, 3, 1), 2, 1, 32),
]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_every_candidate_config_is_correct(shape):
    data_shape, kernel_shape, stride, padding, groups = shape
    x, w = rand(*data_shape), rand(*kernel_shape)
    target = tvm.target.Target("accel")
    with target:
        geo = topi_accel.conv2d_geometry(data_shape, kernel_shape, stride, padding, 1, groups)
        candidates = topi_accel.conv2d_candidates(geo)
        assert candidates[0] == topi_accel.conv2d_config(geo)
    assert {c.channels_outer for c in candidates} == {True, False}  # both loop orders
    assert len({(c.oc_block, c.ow_block) for c in candidates}) >= 2
    ref = conv2d_reference(x, w, geo.stride, geo.pad, geo.dilation, groups)
    for cfg in candidates:
        out = run_primfunc(
            topi_accel.conv2d_nhwc_ohwi_func(geo, cfg), [x, pack(w, topi_accel.kernel_pack_map(cfg))], ref.shape, target
        )
        assert_close(out, ref)


def test_tune_writes_database_that_build_uses(tmp_path):
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 24, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(24, 24, 3, groups=24)
    ).eval()
    x = torch.randn(1, 3, 12, 12)
    mod = accel_target.from_torch(model, (x,))
    db_path = tmp_path / "tuning.json"
    db = accel_target.tune(mod, db_path, limit=3, number=1)
    entries = json.loads(db_path.read_text())
    assert len(entries) == len(db.entries) == 2
    assert all(e["ms"] > 0 and {"oc_block", "ow_block", "channels_outer"} <= set(e["config"]) for e in entries.values())

    # force a config the heuristic would not choose, and see the build use it
    key = next(k for k in entries if json.loads(k)["groups"] == 1)
    entries[key]["config"].update(oc_block=16, ow_block=3, channels_outer=False)
    db_path.write_text(json.dumps(entries))
    geo = topi_accel.Conv2DGeometry(
        **{
            k: tuple(v) if isinstance(v, list) else v
            for k, v in json.loads(key).items()
            if k in topi_accel.Conv2DGeometry.__dataclass_fields__
        }
    )
    with tvm.target.Target("accel"), topi_accel.tuning.using(topi_accel.tuning.TuningDB(db_path)):
        assert topi_accel.conv2d_config(geo).ow_block == 3
    with tvm.target.Target("accel"):
        assert topi_accel.conv2d_config(geo).ow_block != 3
    executable = accel_target.build(mod, tuning_db=db_path)
    assert_close(run_executable(executable, x.numpy()), model(x).detach().numpy())

    # a second run extends the database and skips what it holds
    assert len(accel_target.tune(mod, db_path, limit=1, number=1).entries) == 2


def test_a_tuned_config_without_row_chunks_takes_the_heuristics(tmp_path):
    """A database written before the row chunks existed (its configs have no such field): the
    tuner timed each kernel alone, where the chunks do not show, so the build takes the
    heuristic's chunks for the loop order the tuner chose; a config that names them keeps its own."""
    geo = topi_accel.conv2d_geometry((1, 16, 16, 64), (384, 1, 1, 64))  # 96 KB kernel, 16 rows
    target = tvm.target.Target({"tag": "accel", "num-cores": 2})
    with target:
        heuristic = topi_accel.conv2d_config(geo)
    assert heuristic.channels_outer and heuristic.row_chunks == 2
    db = topi_accel.tuning.TuningDB(tmp_path / "tuning.json")
    old = {k: v for k, v in dataclasses.asdict(heuristic).items() if k != "row_chunks"}
    for config, chunks in ((old, 2), ({**old, "channels_outer": False}, 1), ({**old, "row_chunks": 1}, 1)):
        db.entries[topi_accel.conv2d_key(geo, target)] = {"config": config, "ms": 1.0}
        with target, topi_accel.tuning.using(db):
            assert topi_accel.conv2d_config(geo).row_chunks == chunks, config


def test_build_refuses_a_tuning_db_that_does_not_exist(tmp_path):
    """A missing file is not an empty database: the build would take the heuristic's configs
    without a word (`accel-tvm compile --tuning-db` says the same)."""
    model = torch.nn.Conv2d(8, 16, 3, padding=1).eval()
    mod = accel_target.from_torch(model, (torch.randn(1, 8, 8, 8),))
    missing = tmp_path / "tuning.json"
    with pytest.raises(FileNotFoundError, match=r"tuning database '.*tuning\.json' does not exist"):
        accel_target.build(mod, tuning_db=missing)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        accel_target.optimize(mod, tuning_db=str(missing))


@pytest.mark.parametrize(
    "mcpu, parallel",
    [("skylake-avx512", False), ("znver4", True), ("haswell", True)],
)
def test_a_small_kernel_is_serial_by_the_time_its_fma_pipes_take(mcpu, parallel):
    """A 1x1 conv of 0.8M multiply-adds (7x7x64->256) takes 50K cycles of 16-lane FMA pipes
    (Skylake-SP's AVX-512): serial, a launch costs more than a second thread saves; 100K of
    8-lane ones (AVX2, and Zen 4's AVX-512, which runs a 512-bit FMA in two halves): parallel."""
    target = tvm.target.Target({"tag": "accel", "mcpu": mcpu, "num-cores": 2})
    with target:
        geo = topi_accel.conv2d_geometry((1, 7, 7, 64), (256, 1, 1, 64), 1, 0)
        func = topi_accel.conv2d_nhwc_ohwi_func(geo, topi_accel.conv2d_config(geo))
        func = func.with_attr(topi_accel.epilogue.IMPL, "conv2d_nhwc_ohwi.accel")  # as the strategy marks it
        knobs = topi_accel.knobs.cpu_knobs(target)
    assert knobs.lanes == (8 if mcpu == "haswell" else 16)
    assert (topi_accel.tuning.serial_when_small(func, knobs) is None) == parallel
