"""benchmarks/fma_peak.py: both FMA loops (registers only, and the tile fed from L1) compile,
run on the widths this host runs code for and no other, count their FLOP right and report a
rate within what the threads can do."""

import importlib.util
import math
import pathlib

import numpy as np
import pytest

from tests.helpers import runs_here

ROOT = pathlib.Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("fma_peak", ROOT / "benchmarks" / "fma_peak.py")
fma_peak = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fma_peak)

# FLOP a core does per cycle, at most, with the widest FMA units in x86 so far (two 512-bit
# pipes: 2 x 16 lanes x 2), at a clock of at most 6 GHz
MOST_GFLOPS_PER_THREAD = 64 * 6


def test_flops_per_iteration():
    # 12 chains of one FMA (a multiply and an add) on 8 or 16 float32 lanes
    assert fma_peak.flops_per_iteration(256) == 12 * 8 * 2
    assert fma_peak.flops_per_iteration(512) == 12 * 16 * 2
    # 128 steps of a 6 x 2-vector (ymm) or 12 x 2-vector (zmm) tile of FMAs
    assert fma_peak.flops_per_iteration(256, "tile") == 128 * 6 * 2 * 8 * 2
    assert fma_peak.flops_per_iteration(512, "tile") == 128 * 12 * 2 * 16 * 2


@pytest.mark.parametrize("loop", fma_peak.LOOPS)
def test_the_loops_compute_every_fma_they_count(loop):
    # what the first thread's accumulators hold after 3 iterations, from numpy: a loop whose
    # compiler dropped FMAs (an accumulator nothing reads) would time less work than it counts
    lib, iterations = fma_peak.library(), 3
    for bits in fma_peak.widths():
        assert lib.fma_seconds(1, iterations, bits, loop == "tile") > 0
        if loop == "registers":  # CHAINS chains a = a * c + b, from a = chain number
            chains = np.arange(fma_peak.CHAINS, dtype=np.float64)
            for _ in range(iterations):
                chains = chains * np.float32(0.9999999) + np.float32(1e-7)
            expected = chains.sum()
        else:  # ROWS x 2 accumulators of a[step, row] * b (1e-7), a = 1e-7 * (index % 7)
            rows = fma_peak.TILE_ROWS[bits]
            a = np.float32(1e-7) * (np.arange(fma_peak.TILE_STEPS * rows) % 7)
            expected = iterations * 2 * float(np.float32(1e-7)) * a.astype(np.float64).sum()
        np.testing.assert_allclose(lib.fma_first_sink(), expected, rtol=1e-4, err_msg=f"{loop}, {bits}-bit")


def test_fma_peak_names_the_loops_it_has():
    with pytest.raises(ValueError, match="loop='gemm'; supported: registers, tile"):
        fma_peak.fma_peak(threads=1, loops=("registers", "gemm"))


def test_fma_peak_runs_the_widths_the_host_has():
    results = fma_peak.fma_peak(threads=2, repeat=2, seconds=0.01)
    expected = {
        bits for bits, cpu in ((256, "haswell"), (512, "skylake-avx512")) if runs_here({"kind": "llvm", "mcpu": cpu})
    }
    assert set(results) == set(fma_peak.LOOPS)
    for loop, rates in results.items():
        assert set(rates) == expected, loop
        for runs in rates.values():
            assert len(runs) == 2
            assert all(math.isfinite(r) and 0 < r < 2 * MOST_GFLOPS_PER_THREAD for r in runs), (loop, runs)


def test_fma_peak_without_fma_returns_no_rates(monkeypatch):
    # a host whose target has no AVX2 + FMA: no widths, every loop empty, no share to read
    monkeypatch.setattr(fma_peak, "widths", lambda: [])
    assert fma_peak.fma_peak(threads=1) == {"registers": {}, "tile": {}}
    assert fma_peak.tile_shares(threads=1) == {}


def test_tile_shares_and_the_header_clause():
    shares = fma_peak.tile_shares(threads=1, repeat=3, seconds=0.01)
    assert set(shares) == set(fma_peak.widths())
    # a ratio of two rates of the same FMA units: near 1 on a quiet host; the bound leaves room
    # for runs that a busy host (the suite's other worker) slows
    assert all(math.isfinite(share) and 0 < share < 4 for share in shares.values()), shares
    assert fma_peak.host_note({256: 0.81, 512: 0.95}, {256: 0.9, 512: 0.96}) == (
        "; fma_peak.py's tile from L1, share of the registers-only rate before / after the runs: "
        "256-bit 81% / 90%, 512-bit 95% / 96%"
    )
    assert fma_peak.host_note({}, {}) == ""
