"""What the schedules read from the target: vector lanes and register budget."""

from __future__ import annotations

import os
from dataclasses import dataclass

import tvm
from tvm.target import codegen


@dataclass(frozen=True)
class CPUKnobs:
    """Target facts the schedules derive their tile sizes from.

    lanes: float32 elements in one vector register.
    fma_lanes: float32 multiply-adds one FMA pipe completes per cycle: `lanes`, except on
    CPUs whose FMA pipes are narrower than their vectors (HALF_WIDTH_FMA_CPUS), where a
    kernel's time follows its multiply-adds over this, not over `lanes`.
    accumulators: vector registers a register tile may keep live
    (the rest hold the weight vectors and the broadcast input).
    registers: vector registers of the ISA (32 with AVX-512, 16 with AVX2 or SSE).
    parallel: whether kernels split work across threads (target "num-cores" > 1).
    cores: the threads kernels are written for (target "num-cores", else this machine's cores).
    """

    lanes: int
    fma_lanes: int
    accumulators: int
    registers: int
    parallel: bool
    cores: int

    def column_block(self, n: int) -> int:
        """Columns of a register tile over `n` output columns: three vectors where they
        divide `n`, else two, one for `n` of a vector or less. A wider tile loads fewer
        operands per FMA: 8 rows x 48 columns on AVX-512 load 0.46 vectors per FMA where
        8 x 32 load 0.63 (4 x 24 on AVX2)."""
        if n % (3 * self.lanes) == 0:
            return 3 * self.lanes
        return 2 * self.lanes if n > self.lanes else self.lanes

    def tile_rows(self, columns: int, lanes: int | None = None) -> int:
        """Rows of a register tile `columns` elements wide (vectors of `lanes`, default the
        float32 lanes) whose accumulators fit the register budget; at least one."""
        vectors = max(columns // (lanes or self.lanes), 1)
        return max(self.accumulators // vectors, 1)


# LLVM CPUs with AVX-512 whose FMA pipes are 256 bits wide and run a 512-bit FMA in two
# halves (AMD Zen 4): their AVX-512 code multiply-adds 8 float32 a pipe and cycle, as AVX2's
# does. LLVM's target features do not tell them from CPUs with full-width pipes.
HALF_WIDTH_FMA_CPUS = ("znver4",)


def vector_bits(target: tvm.target.Target) -> int:
    """Widest float vector of `target`'s mcpu/mattr.

    Read from the CPU features: ``llvm_get_vector_width`` answers 512 for every
    x86 mcpu in TVM 0.27, so it cannot tell an AVX2 target from an AVX-512 one.
    """
    for bits, feature in ((512, "avx512f"), (256, "avx2"), (256, "avx")):
        if codegen.llvm_cpu_has_features([feature], target):
            return bits
    return 128


def cpu_knobs(target: tvm.target.Target | None = None) -> CPUKnobs:
    """Derive the knobs from `target` (default: the current target)."""
    target = target or tvm.target.Target.current(allow_none=True)
    if target is None:
        raise ValueError("topi_accel: no target given and none in scope; pass one or use `with Target(...)`")
    if target.kind.name != "llvm":
        raise ValueError(f"topi_accel: target {target} is not an LLVM CPU target; the accel kernels need one")
    bits = vector_bits(target)
    # AVX-512 has 32 vector registers, AVX2 and SSE 16: keep ~3/4 for accumulators.
    accumulators = 24 if bits >= 512 else 12
    cores = int(target.attrs.get("num-cores", 0) or 0)
    lanes = bits // tvm.DataType("float32").bits
    half_width = bits >= 512 and str(target.attrs.get("mcpu", "")) in HALF_WIDTH_FMA_CPUS
    return CPUKnobs(
        lanes=lanes,
        fma_lanes=lanes // 2 if half_width else lanes,
        accumulators=accumulators,
        registers=32 if bits >= 512 else 16,
        parallel=cores != 1,
        cores=cores or os.cpu_count() or 1,
    )


def largest_divisor(n: int, cap: int) -> int:
    """Largest divisor of `n` that is <= `cap`."""
    return max(d for d in range(1, min(n, cap) + 1) if n % d == 0)


def pick_block(n: int, cap: int) -> int:
    """A block size for an axis of extent `n`: a divisor when a good one exists, else `cap`.

    A block that does not divide `n` makes the kernel compute a padded tail
    that the write-back discards.
    """
    if n <= cap:
        return n
    div = largest_divisor(n, cap)
    return div if 2 * div >= cap else cap


# Padding, as a fraction of an axis, that a full register tile may compute instead of a divisor
# tile with fewer accumulators (`pads_little`).
MAX_PADDED_FRACTION = 0.1


def pads_little(n: int, block: int) -> bool:
    """Whether blocks of `block` cover `n` computing at most MAX_PADDED_FRACTION more."""
    return round_up(n, block) <= (1 + MAX_PADDED_FRACTION) * n


def ceil_div(n: int, d: int) -> int:
    """Blocks of `d` that cover `n`."""
    return -(-n // d)


def round_up(n: int, block: int) -> int:
    """`n` rounded up to a multiple of `block`."""
    return ceil_div(n, block) * block
