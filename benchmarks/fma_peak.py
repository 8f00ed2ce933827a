"""The FMA peak of this machine: a loop of register-only vector FMAs, on N threads at once.

    python benchmarks/fma_peak.py [--threads N] [--repeat R]

What the GFLOP/s of the other benchmarks' matrix products and convolutions are read against:
each thread runs 12 independent chains of fused multiply-adds (enough to cover the FMA latency
of current x86 cores) on 256-bit vectors where accel's target for this host has AVX2 and FMA,
and on 512-bit ones where it has AVX-512; no loads, no stores. The threads start together and
each times its own loop; a run takes the slowest. The C source is compiled as pool.c is
(`tvm.support.cc`, `CC`, default gcc). Threads: `--threads`, else TVM_NUM_THREADS, else every
core this process may use. Prints the median and the best of R runs of about 0.2 s, in GFLOP/s
for all threads together (the host's speed states show as a spread between them).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys
import tempfile

CHAINS = 12  # independent FMA chains a thread runs: more than FMA latency x FMA pipes
MAX_THREADS = 256
SOURCE = r"""
#include <immintrin.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

/* CHAINS and MAX_THREADS: defined by the compiler's command line, from the Python names */
static atomic_int go; /* the threads start their loops together, once all have started */
typedef struct { long iterations; double seconds; float sink; } job;

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

/* Seconds that the slowest of `threads` threads took for `iterations` steps of CHAINS FMAs on
 * `bits`-bit vectors (the caller knows the CPU has them), or -1 if a thread did not start. */
double fma_seconds(int threads, long iterations, int bits) {
  pthread_t tid[MAX_THREADS];
  job jobs[MAX_THREADS];
  if (threads < 1 || threads > MAX_THREADS) return -1;
  atomic_store(&go, 0);
  int started = 0;
  while (started < threads) {
    jobs[started] = (job){iterations, 0, 0};
    if (pthread_create(&tid[started], NULL, bits == 512 ? loop512 : loop256, &jobs[started])) break;
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
  return started == threads ? slowest : -1;
}
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


def flops_per_iteration(bits: int) -> int:
    """FLOP a thread does in one step of its loop: CHAINS FMAs (2 FLOP) on bits / 32 lanes."""
    return CHAINS * (bits // 32) * 2


def fma_peak(threads: int, repeat: int = 10, seconds: float = 0.2) -> dict[int, list[float]]:
    """{vector bits: GFLOP/s of each of `repeat` runs of about `seconds`} for `widths()`."""
    from tvm.support import cc

    if not 1 <= threads <= MAX_THREADS:
        raise ValueError(f"fma_peak: threads={threads}; supported: 1 to {MAX_THREADS}")
    bits_here = widths()
    if not bits_here:
        return {}

    with tempfile.TemporaryDirectory(prefix="accel_fma_") as scratch:
        source, built = os.path.join(scratch, "fma.c"), os.path.join(scratch, "fma.so")
        with open(source, "w", encoding="utf-8") as f:
            f.write(SOURCE)
        options = ["-O2", "-pthread", f"-DCHAINS={CHAINS}", f"-DMAX_THREADS={MAX_THREADS}"]
        cc.create_shared(built, [source], options=options, cc=os.environ.get("CC", "gcc"))
        lib = ctypes.CDLL(built)
    lib.fma_seconds.restype = ctypes.c_double
    lib.fma_seconds.argtypes = [ctypes.c_int, ctypes.c_long, ctypes.c_int]

    def gflops(iterations: int, bits: int) -> float:
        took = lib.fma_seconds(threads, iterations, bits)
        if took <= 0:
            raise RuntimeError(f"fma_peak: could not start {threads} threads")
        return threads * iterations * flops_per_iteration(bits) / took * 1e-9

    results = {}
    for bits in bits_here:
        rate = gflops(100_000, bits)  # a probe, to size the runs
        iterations = max(1, int(seconds * rate * 1e9 / threads / flops_per_iteration(bits)))
        results[bits] = [gflops(iterations, bits) for _ in range(repeat)]
    return results


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
    if not results:
        sys.exit("no FMA here: accel's target for this host has no AVX2 + FMA")
    for bits, runs in results.items():
        name = "AVX2 + FMA (256-bit)" if bits == 256 else "AVX-512 (512-bit)"
        print(
            f"{name}: {statistics.median(runs):.1f} GFLOP/s median, {max(runs):.1f} best "
            f"of {len(runs)} run(s), {threads} thread(s) ({max(runs) / threads:.1f} a thread at best)"
        )


if __name__ == "__main__":
    main()
