"""benchmarks/fma_peak.py: the FMA loop compiles, runs on the widths this host runs code for
and no other, counts its FLOP right and reports a rate within what the threads can do."""

import importlib.util
import math
import pathlib

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


def test_fma_peak_runs_the_widths_the_host_has():
    results = fma_peak.fma_peak(threads=2, repeat=2, seconds=0.01)
    expected = {
        bits for bits, cpu in ((256, "haswell"), (512, "skylake-avx512")) if runs_here({"kind": "llvm", "mcpu": cpu})
    }
    assert set(results) == expected
    for runs in results.values():
        assert len(runs) == 2
        assert all(math.isfinite(r) and 0 < r < 2 * MOST_GFLOPS_PER_THREAD for r in runs), runs
