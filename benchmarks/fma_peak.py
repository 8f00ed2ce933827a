"""The FMA peak of this machine, and how much of it a register tile fed from L1 gets, on N threads.

    python benchmarks/fma_peak.py [--threads N] [--repeat R]

What the GFLOP/s of the other benchmarks' matrix products and convolutions are read against:
each thread runs 12 independent chains of fused multiply-adds (enough to cover the FMA latency
of current x86 cores) on 256-bit vectors where accel's target for this host has AVX2 and FMA,
and on 512-bit ones where it has AVX-512; no loads, no stores ("registers only").

Then the same widths as a matrix product's inner loop runs them ("tile from L1"): ROWS x 2
vectors of accumulators (6 x 2 ymm, 12 x 2 zmm), each step loading two vectors of one operand
and broadcasting ROWS floats of the other, from buffers that fit in L1 (at most 22 KB).
That is the mix of loads and FMAs accel's kernels run, AVX2 code with twice the loads per FLOP
of AVX-512 code. A tile's rate well below the registers-only rate is a host whose cores leave
loads less bandwidth than usual (on a VM, perhaps the core's other hardware thread running
another guest, which this guest cannot see); AVX2 code lost more than AVX-512 code in such a
state (benchmarks/README.md, 2026-12-03), and benchmark figures taken then say as much about the
host as about the kernels.

The threads start together and each times its own loop; a run takes the slowest. The C source
is compiled as pool.c is (`tvm.support.cc`, `CC`, default gcc). Threads: `--threads`, else
TVM_NUM_THREADS, else every core this process may use. Prints the median and the best of R runs
of about 0.2 s, in GFLOP/s for all threads together (the host's speed states show as a spread
between them).
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import os
import statistics
import sys
import tempfile

CHAINS = 12  # independent FMA chains a thread runs: more than FMA latency x FMA pipes
TILE_ROWS = {256: 6, 512: 12}  # the tile loop's rows: 2 x rows accumulators, of 16 ymm / 32 zmm
TILE_STEPS = 128  # the tile loop's steps over its buffers: 11 KB (256-bit) or 22 KB (512-bit)
LOOPS = ("registers", "tile")
MAX_THREADS = 256
SOURCE = r"""
#include <immintrin.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

/* CHAINS, TILE_STEPS, TILE_ROWS_256, TILE_ROWS_512 and MAX_THREADS: defined by the compiler's
 * command line, from the Python names */
static atomic_int go; /* the threads start their loops together, once all have started */
typedef struct { long iterations; double seconds; float sink; } job;
static float first_sink; /* the first thread's sum of its accumulators' first lanes, last run */

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

/* A thread's loop: CHAINS independent chains a = a * c + b on VEC vectors, all in registers. */
#define FMA_LOOP(NAME, TARGET, VEC, SET1, FMADD, ADD, FIRST)                  \
  __attribute__((target(TARGET))) static void* NAME(void* arg) {             \
    job* j = arg;                                                            \
    VEC a[CHAINS], b = SET1(1e-7f), c = SET1(0.9999999f);                    \
    for (int k = 0; k < CHAINS; ++k) a[k] = SET1((float)k);                  \
    while (!atomic_load(&go)) _mm_pause();                                   \
    double start = now();                                                    \
    for (long i = 0; i < j->iterations; ++i) {                               \
      _Pragma("GCC unroll 64") for (int k = 0; k < CHAINS; ++k) a[k] = FMADD(a[k], c, b); \
    }                                                                        \
    j->seconds = now() - start;                                              \
    for (int k = 1; k < CHAINS; ++k) a[0] = ADD(a[0], a[k]);                 \
    j->sink = FIRST(a[0]);                                                   \
    return NULL;                                                             \
  }

FMA_LOOP(loop256, "avx2,fma", __m256, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_add_ps, _mm256_cvtss_f32)
FMA_LOOP(loop512, "avx512f", __m512, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_add_ps, _mm512_cvtss_f32)

/* A thread's loop as a matrix product's inner loop: ROWS x 2 accumulators; each of TILE_STEPS
 * steps loads two vectors of `b` and broadcasts ROWS floats of `a`, both on this thread's stack
 * (in L1); an iteration is TILE_STEPS steps. */
#define TILE_LOOP(NAME, TARGET, VEC, LANES, ROWS, SET1, LOAD, FMADD, ADD, FIRST)        \
  __attribute__((target(TARGET))) static void* NAME(void* arg) {                       \
    job* j = arg;                                                                      \
    _Alignas(64) float a[TILE_STEPS * ROWS], b[TILE_STEPS * 2 * LANES];                \
    for (int i = 0; i < TILE_STEPS * ROWS; ++i) a[i] = 1e-7f * (i % 7);                \
    for (int i = 0; i < TILE_STEPS * 2 * LANES; ++i) b[i] = 1e-7f;                     \
    VEC c[ROWS][2];                                                                    \
    for (int r = 0; r < ROWS; ++r) c[r][0] = c[r][1] = SET1(0.0f);                     \
    while (!atomic_load(&go)) _mm_pause();                                             \
    double start = now();                                                              \
    for (long i = 0; i < j->iterations; ++i) {                                         \
      for (int k = 0; k < TILE_STEPS; ++k) {                                           \
        VEC b0 = LOAD(b + 2 * LANES * k), b1 = LOAD(b + 2 * LANES * k + LANES);        \
        _Pragma("GCC unroll 64") for (int r = 0; r < ROWS; ++r) {                      \
          VEC x = SET1(a[ROWS * k + r]);                                               \
          c[r][0] = FMADD(x, b0, c[r][0]);                                             \
          c[r][1] = FMADD(x, b1, c[r][1]);                                             \
        }                                                                              \
      }                                                                                \
    }                                                                                  \
    j->seconds = now() - start;                                                        \
    c[0][0] = ADD(c[0][0], c[0][1]); /* every accumulator, or gcc drops its FMAs */    \
    for (int r = 1; r < ROWS; ++r) c[0][0] = ADD(c[0][0], ADD(c[r][0], c[r][1]));      \
    j->sink = FIRST(c[0][0]);                                                          \
    return NULL;                                                                       \
  }

TILE_LOOP(tile256, "avx2,fma", __m256, 8, TILE_ROWS_256, _mm256_set1_ps, _mm256_load_ps, _mm256_fmadd_ps, _mm256_add_ps,
          _mm256_cvtss_f32)
TILE_LOOP(tile512, "avx512f", __m512, 16, TILE_ROWS_512, _mm512_set1_ps, _mm512_load_ps, _mm512_fmadd_ps, _mm512_add_ps,
          _mm512_cvtss_f32)

/* Seconds that the slowest of `threads` threads took for `iterations` iterations of a loop on
 * `bits`-bit vectors (the caller knows the CPU has them): the registers-only loop, or the tile
 * loop if `tile`; -1 if a thread did not start. */
double fma_seconds(int threads, long iterations, int bits, int tile) {
  void* (*loop)(void*) = bits == 512 ? (tile ? tile512 : loop512) : (tile ? tile256 : loop256);
  pthread_t tid[MAX_THREADS];
  job jobs[MAX_THREADS];
  if (threads < 1 || threads > MAX_THREADS) return -1;
  atomic_store(&go, 0);
  int started = 0;
  while (started < threads) {
    jobs[started] = (job){iterations, 0, 0};
    if (pthread_create(&tid[started], NULL, loop, &jobs[started])) break;
    ++started;
  }
  if (started < threads) /* the started ones wait for `go`: let them go, with nothing to do */
    for (int t = 0; t < started; ++t) jobs[t].iterations = 0;
  atomic_store(&go, 1);
  double slowest = 0;
  for (int t = 0; t < started; ++t) {
    pthread_join(tid[t], NULL);
    if (jobs[t].seconds > slowest) slowest = jobs[t].seconds;
  }
  first_sink = jobs[0].sink;
  return started == threads ? slowest : -1;
}

/* The first thread's sink of the last run: what its FMAs computed (the tests check it). */
float fma_first_sink(void) { return first_sink; }
"""


def widths() -> list[int]:
    """The vector widths (bits) that accel's target for this host has FMAs for: 256 with AVX2
    and FMA, 512 with AVX-512 (the host as accel sees it, so `cpuid_cap.py` can hide AVX-512)."""
    import tvm
    from tvm.target import codegen

    import accel_target  # noqa: F401  (registers the "accel" tag)

    target = tvm.target.Target("accel")
    needs = ((256, ["avx2", "fma"]), (512, ["avx512f"]))
    return [bits for bits, features in needs if codegen.llvm_cpu_has_features(features, target)]


def flops_per_iteration(bits: int, loop: str = "registers") -> int:
    """FLOP a thread does in one iteration of its loop, 2 an FMA on bits / 32 lanes: CHAINS FMAs
    (registers only), or TILE_STEPS steps of TILE_ROWS x 2 (the tile loop)."""
    fmas = CHAINS if loop == "registers" else TILE_STEPS * TILE_ROWS[bits] * 2
    return fmas * (bits // 32) * 2


@functools.cache
def library() -> ctypes.CDLL:
    """SOURCE compiled and loaded (once a process): `fma_seconds(threads, iterations, bits,
    tile)` and `fma_first_sink()`."""
    from tvm.support import cc

    with tempfile.TemporaryDirectory(prefix="accel_fma_") as scratch:
        source, built = os.path.join(scratch, "fma.c"), os.path.join(scratch, "fma.so")
        with open(source, "w", encoding="utf-8") as f:
            f.write(SOURCE)
        # -O3: at -O2 gcc keeps the tile loop's accumulators in memory
        defines = {"CHAINS": CHAINS, "TILE_STEPS": TILE_STEPS, "MAX_THREADS": MAX_THREADS}
        defines.update({f"TILE_ROWS_{bits}": rows for bits, rows in TILE_ROWS.items()})
        options = ["-O3", "-pthread"] + [f"-D{name}={value}" for name, value in defines.items()]
        cc.create_shared(built, [source], options=options, cc=os.environ.get("CC", "gcc"))
        lib = ctypes.CDLL(built)
    lib.fma_seconds.restype = ctypes.c_double
    lib.fma_seconds.argtypes = [ctypes.c_int, ctypes.c_long, ctypes.c_int, ctypes.c_int]
    lib.fma_first_sink.restype = ctypes.c_float
    lib.fma_first_sink.argtypes = []
    return lib


def fma_peak(
    threads: int, repeat: int = 10, seconds: float = 0.2, loops: tuple[str, ...] = LOOPS
) -> dict[str, dict[int, list[float]]]:
    """{loop: {vector bits: GFLOP/s of each of `repeat` runs of about `seconds`}} for `widths()`;
    the loops ("registers", "tile") take turns run by run, so their i-th runs are next in time."""
    if not 1 <= threads <= MAX_THREADS:
        raise ValueError(f"fma_peak: threads={threads}; supported: 1 to {MAX_THREADS}")
    for loop in loops:
        if loop not in LOOPS:
            raise ValueError(f"fma_peak: loop={loop!r}; supported: {', '.join(LOOPS)}")
    bits_here = widths()
    if not bits_here:
        return {loop: {} for loop in loops}

    lib = library()

    def gflops(loop: str, bits: int, iterations: int) -> float:
        took = lib.fma_seconds(threads, iterations, bits, loop == "tile")
        if took <= 0:
            raise RuntimeError(f"fma_peak: could not start {threads} threads")
        return threads * iterations * flops_per_iteration(bits, loop) / took * 1e-9

    def sized(loop: str, bits: int) -> int:
        """Iterations for a run of about `seconds`, from a probe."""
        flops = flops_per_iteration(bits, loop)
        rate = gflops(loop, bits, max(1, 1_000_000 // flops))
        return max(1, int(seconds * rate * 1e9 / threads / flops))

    results = {loop: {} for loop in loops}
    for bits in bits_here:
        iterations = {loop: sized(loop, bits) for loop in loops}
        for loop in loops:
            results[loop][bits] = []
        for _ in range(repeat):
            for loop in loops:
                results[loop][bits].append(gflops(loop, bits, iterations[loop]))
    return results


def paired_share(tile: list[float], registers: list[float]) -> float:
    """The median over runs of the tile loop's rate / the registers-only loop's in the run next
    to it. Pairs, not two medians: a run of either loop that the host slows (a thread held off
    its core) spoils one pair, not the share."""
    return statistics.median(t / r for t, r in zip(tile, registers))


def tile_shares(threads: int, repeat: int = 5, seconds: float = 0.1) -> dict[int, float]:
    """{vector bits: `paired_share`}, a reading (about 2 s) of how much of the FMA rate the host
    leaves to loads from L1 now."""
    results = fma_peak(threads, repeat, seconds)
    return {bits: paired_share(results["tile"][bits], runs) for bits, runs in results["registers"].items()}


def host_note(before: dict[int, float], after: dict[int, float]) -> str:
    """A benchmark header's clause: `tile_shares` before and after its runs ("" without FMA)."""
    if not before:
        return ""
    shares = ", ".join(f"{bits}-bit {before[bits]:.0%} / {after[bits]:.0%}" for bits in before)
    return f"; fma_peak.py's tile from L1, share of the registers-only rate before / after the runs: {shares}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, help=f"1 to {MAX_THREADS} (default: TVM_NUM_THREADS, else every core)")
    parser.add_argument("--repeat", type=int, default=10, help="runs of each width (default 10)")
    args = parser.parse_args()
    import accel_target  # sets TVM_NUM_THREADS to every core unless set

    threads = args.threads if args.threads is not None else accel_target.num_threads()
    if args.repeat < 1:
        parser.error(f"--repeat {args.repeat}: at least 1")
    try:
        results = fma_peak(threads, args.repeat)
    except ValueError as err:
        parser.error(str(err))
    if not results["registers"]:
        sys.exit("no FMA here: accel's target for this host has no AVX2 + FMA")
    for bits, runs in results["registers"].items():
        name = "AVX2 + FMA (256-bit)" if bits == 256 else "AVX-512 (512-bit)"
        print(
            f"{name}, registers only: {statistics.median(runs):.1f} GFLOP/s median, {max(runs):.1f} best "
            f"of {len(runs)} run(s), {threads} thread(s) ({max(runs) / threads:.1f} a thread at best)"
        )
        tile = results["tile"][bits]
        print(
            f"{name}, {TILE_ROWS[bits]} x 2-vector tile from L1: {statistics.median(tile):.1f} GFLOP/s median, "
            f"{max(tile):.1f} best ({paired_share(tile, runs):.0%} of the "
            "registers-only rate, median of the runs side by side)"
        )


if __name__ == "__main__":
    main()
