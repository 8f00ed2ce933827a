"""Timing contenders in processes of their own (accel_target.timing), as the benchmarks do."""

import numpy as np
import pytest
import tvm

import accel_target
from accel_target.timing import TimingProcess, save_inputs, speedup_interval, speedups, take_turns, turn_order
from tests.helpers import conv2d_module


def _call(function: str, *args) -> dict:
    return {"kind": "call", "function": f"tests.timing_probes:{function}", "args": list(args)}


def test_contenders_take_turns_in_processes_of_their_own():
    specs = {"fast": _call("sleeper", 1.0), "slow": _call("sleeper", 5.0), "clean": _call("environment", "3")}
    times = take_turns(specs, threads=3, repeat=3, rounds=2)
    assert {name: len(t) for name, t in times.items()} == {"fast": 2, "slow": 2, "clean": 2}
    assert all(1.0 <= t < 4.0 for t in times["fast"]) and all(t >= 5.0 for t in times["slow"]), times


def test_the_rounds_take_every_order_of_three_contenders(tmp_path):
    """Rotations, then the rotations reversed: six rounds, the six orders (before: rotations
    alone, in which b follows a in two rounds of three and a never follows b)."""
    log = tmp_path / "calls"
    specs = {name: _call("logger", str(log), name) for name in ("a", "b", "c")}
    take_turns(specs, threads=1, repeat=1, rounds=7)

    def turns(calls):  # a turn is some calls of one contender (its warm-up's number varies)
        return [name for i, name in enumerate(calls) if i == 0 or calls[i - 1] != name]

    assert turns(log.read_text().split()) == turns("".join(["abc", "bca", "cab", "cba", "acb", "bac", "abc"]))
    assert turn_order(["x"], 5) == ["x"]
    assert [turn_order(["p", "q"], n) for n in range(4)] == [["p", "q"], ["q", "p"], ["q", "p"], ["p", "q"]]


def test_a_runner_that_fails_is_an_error_naming_the_contender():
    with (
        TimingProcess("mine", threads=1) as process,
        pytest.raises(RuntimeError, match="timing mine: ValueError: no such model"),
    ):
        process.median_ms(_call("broken"), 1)


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
    times = take_turns(specs, threads=2, repeat=2, rounds=1)
    assert all(len(t) == 1 and t[0] > 0 for t in times.values()), times


def test_a_speed_up_is_the_median_of_the_rounds_ratios():
    # a run of bench_kernels (56x56x64->256, ms): a slow spell took accel's turn in round 1 and
    # PyTorch's in round 2; the ratio of the medians (0.571 / 0.884) would say 0.65x
    rounds = {"accel": [0.884, 0.910, 0.533], "torch": [0.571, 1.098, 0.550]}
    ups = speedups(rounds)
    assert ups["accel"] == 1.0
    assert ups["torch"] == pytest.approx(0.550 / 0.533)


def test_a_speed_ups_interval_holds_its_median_and_narrows_with_more_rounds():
    rng = np.random.default_rng(1)

    def rounds(n):  # turns with independent noise of about 12%, the other contender 1.17x slower
        return {"accel": list(np.exp(rng.normal(0, 0.12, n))), "ort": list(1.17 * np.exp(rng.normal(0, 0.12, n)))}

    few, many = rounds(30), rounds(480)
    low, high = speedup_interval(few, "ort")
    assert low <= speedups(few)["ort"] <= high
    assert min(np.divide(few["ort"], few["accel"])) <= low < high <= max(np.divide(few["ort"], few["accel"]))
    many_low, many_high = speedup_interval(many, "ort")
    assert many_high - many_low < (high - low) / 2  # 16 times the rounds: about a quarter as wide
    assert many_low < 1.17 < many_high
    assert speedup_interval(few, "ort") == (low, high)  # seeded: the same rounds give the same range
    assert speedup_interval({"accel": [1.0, 2.0], "x": [1.5, 3.0]}, "x") == (1.5, 1.5)  # every round 1.5x
