"""Timing contenders in processes of their own (accel_target/tools/timing.py: the demo and
``accel-tvm bench``)."""

import numpy as np
import pytest
import tvm

import accel_target
from accel_target.tools.timing import TimingProcess, save_inputs, speedups, take_turns, turn_order
from tests.helpers import conv2d_module


def test_the_rounds_take_every_order_of_three_contenders():
    """Rotations, then the rotations reversed: six rounds, the six orders."""
    orders = ["".join(turn_order(["a", "b", "c"], n)) for n in range(6)]
    assert orders == ["abc", "bca", "cab", "cba", "acb", "bac"]
    assert turn_order(["x"], 5) == ["x"]
    assert [turn_order(["p", "q"], n) for n in range(4)] == [["p", "q"], ["q", "p"], ["q", "p"], ["p", "q"]]


def test_a_runner_that_fails_is_an_error_naming_the_contender(tmp_path):
    spec = {"kind": "onnxruntime", "path": str(tmp_path / "missing.onnx"), "inputs": str(tmp_path / "x.npz")}
    with TimingProcess("mine", threads=1) as process, pytest.raises(RuntimeError, match="timing mine: "):
        process.median_ms(spec, 1)


def test_accel_and_stock_libraries_time_in_their_processes(tmp_path):
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((1, 8, 8, 16), "float32"), rng.standard_normal((32, 3, 3, 16), "float32")
    mod = conv2d_module(x, w, True, padding=1, data_layout="NHWC", kernel_layout="OHWI")
    accel_target.save(accel_target.build(mod), tmp_path / "accel.so")
    tvm.compile(mod, target="llvm").export_library(str(tmp_path / "stock.so"))
    data = save_inputs(str(tmp_path / "x.npz"), [x])
    specs = {
        "accel": {"kind": "accel", "path": str(tmp_path / "accel.so"), "inputs": data},
        "stock TVM": {"kind": "tvm", "path": str(tmp_path / "stock.so"), "inputs": data},
    }
    times = take_turns(specs, threads=2, repeat=2, rounds=2)
    assert all(len(t) == 2 and min(t) > 0 for t in times.values()), times


def test_a_speed_up_is_the_median_of_the_rounds_ratios():
    # a slow spell took accel's turn in round 1 and the other's in round 2; the ratio of the
    # medians (0.571 / 0.884) would say 0.65x
    rounds = {"accel": [0.884, 0.910, 0.533], "torch": [0.571, 1.098, 0.550]}
    ups = speedups(rounds)
    assert ups["accel"] == 1.0
    assert ups["torch"] == pytest.approx(0.550 / 0.533)
