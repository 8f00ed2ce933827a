"""claim_iterations: every iteration of a parallel loop runs exactly once, whatever the
chunking, the number of slices and the threads."""

import numpy as np
import pytest
import torch
import tvm
from tvm import te, topi
from tvm.script import tirx as T

import accel_target
import topi_accel
from tests.helpers import ISAS, assert_close, conv2d_module, rand, run_primfunc


def _count_calls(n) -> tvm.tirx.PrimFunc:
    # a[i] += 1 for every i < n, over a parallel loop (TVMScript misreads a docstring here)
    @T.prim_func(s_tir=True)
    def count(a: T.Buffer((n,), "int32")):
        for i in T.parallel(n):
            with T.sblock("count"):
                vi = T.axis.spatial(n, i)
                a[vi] = a[vi] + 1

    return count


def _run_in_place(func, a: np.ndarray, calls: int) -> np.ndarray:
    lib = tvm.compile(tvm.IRModule({"main": func}), tvm.target.Target("accel")).jit()
    buf = tvm.runtime.tensor(a)
    for _ in range(calls):
        lib(buf)
    return buf.numpy()


# extents below, at and above the 32 claims of a loop (chunks of 1, 2, 4 and a tail chunk),
# with fewer, as many and more slices than chunks and threads
@pytest.mark.parametrize("n", [2, 5, 32, 33, 100, 1001])
@pytest.mark.parametrize("slices", [1, 2, 3, 8])
def test_every_iteration_runs_once_per_call(n, slices):
    func = topi_accel.claim_iterations(_count_calls(n), slices)
    text = func.script()
    assert topi_accel.workshare.CLAIM in text and "T.parallel(" in text
    # three calls: the counters start from zero at every call
    assert (_run_in_place(func, np.zeros(n, "int32"), 3) == 3).all()


def test_a_symbolic_extent_runs_every_iteration_once_at_any_size():
    """A symbolic loop's chunks are computed at run time: size 0 (no chunks, not a division by
    zero), below, at and above the claims of a loop."""
    func = topi_accel.claim_iterations(_count_calls(tvm.tirx.Var("n", "int64")), 2)
    assert topi_accel.workshare.CLAIM in func.script()
    lib = tvm.compile(tvm.IRModule({"main": func}), tvm.target.Target("accel")).jit()
    for size in [0, 1, 31, 97]:
        buf = tvm.runtime.tensor(np.zeros(size, "int32"))
        lib(buf)
        lib(buf)
        assert (buf.numpy() == 2).all(), size


def test_a_function_without_parallel_loops_is_left_alone():
    x = te.placeholder((4, 8))
    assert topi_accel.claim_iterations(te.create_prim_func([x, topi.exp(x)]), 2) is None
    assert topi_accel.claim_iterations(_count_calls(1), 2) is None  # lowering drops a loop of one iteration


def test_claimed_kernels_compute_what_they_did():
    # a conv (register tiles, a padded copy: two parallel loops) and a row-by-row softmax
    geo = topi_accel.conv2d_geometry((1, 9, 11, 16), (40, 3, 3, 16), 1, 1)
    with tvm.target.Target("accel") as target:
        cfg = topi_accel.conv2d_config(geo, target)
    claimed = topi_accel.claim_iterations(topi_accel.conv2d_nhwc_ohwi_func(geo, cfg), 2)
    assert claimed.script().count(topi_accel.workshare.CLAIM) == 4  # two loops, two claims each
    x, w = rand(1, 9, 11, 16), rand(40, 3, 3, 16)
    o_pad = topi_accel.conv2d.packed_out_channels(geo, cfg)
    packed = np.zeros((o_pad, 3, 3, 16), "float32")
    packed[:40] = w
    packed = packed.reshape(o_pad // cfg.oc_block, cfg.oc_block, 3, 3, 16).transpose(0, 2, 3, 4, 1).copy()
    ref = torch.nn.functional.conv2d(
        torch.from_numpy(x).permute(0, 3, 1, 2), torch.from_numpy(w).permute(0, 3, 1, 2), padding=1
    )
    assert_close(run_primfunc(claimed, [x, packed], (1, 9, 11, 40)), ref.permute(0, 2, 3, 1).numpy())

    a = rand(3, 50, 128)
    xp = te.placeholder(a.shape)
    softmax = topi_accel.parallelize(te.create_prim_func([xp, topi.nn.softmax(xp, -1)]))
    e = np.exp(a - a.max(-1, keepdims=True))
    assert_close(run_primfunc(topi_accel.claim_iterations(softmax, 2), [a], a.shape), e / e.sum(-1, keepdims=True))


def _lowered_kernels(mod, target) -> list[str]:
    with target:
        optimized = accel_target.optimize(mod, target=target)
        lowered = accel_target.pipeline.run_phases(optimized, target, "lowering", "lowering")["lowering"]
    return [f.script() for _, f in lowered.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]


def test_the_build_claims_every_parallel_loop_unless_single_core():
    # 28x28x64 -> 64, 3x3: 29M multiply-adds, parallel on any ISA
    mod = conv2d_module(
        rand(1, 28, 28, 64), rand(64, 3, 3, 64), True, padding=1, data_layout="NHWC", kernel_layout="OHWI"
    )
    for target, claimed in (
        (tvm.target.Target("accel"), True),
        (tvm.target.Target({"tag": "accel", "num-cores": 1}), False),
    ):
        kernels = _lowered_kernels(mod, target)
        assert kernels and all((topi_accel.workshare.CLAIM in k) == claimed for k in kernels if "T.parallel" in k)
        assert any("T.parallel" in k for k in kernels) == claimed


# (module, multiply-adds): a 8x8x16 -> 16 3x3 conv, below every ISA's threshold; a 64x256x32
# Linear, whose kernel fuses the bias and prefetches its weight panels (lowered before this
# step): below AVX-512's threshold (16 lanes), not AVX2's or SSE's
KERNELS = {
    "conv2d": (
        lambda: conv2d_module(
            rand(1, 8, 8, 16), rand(16, 3, 3, 16), True, padding=1, data_layout="NHWC", kernel_layout="OHWI"
        ),
        8 * 8 * 16 * 9 * 16,
    ),
    "dense": (lambda: accel_target.from_torch(torch.nn.Linear(256, 32).eval(), (torch.randn(64, 256),)), 64 * 256 * 32),
}


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("isa", ISAS)
def test_the_build_runs_a_small_kernel_on_the_calling_thread(isa, kernel):
    make, work = KERNELS[kernel]
    target = tvm.target.Target({**ISAS[isa], "num-cores": 2})
    serial = work < topi_accel.tuning.MIN_PARALLEL_WORK_PER_LANE * topi_accel.cpu_knobs(target).lanes
    kernels = _lowered_kernels(make(), target)
    assert kernels and any("T.parallel" in k for k in kernels) != serial
    if kernel == "dense":
        assert all("prefetch" in k.lower() for k in kernels)


# (extent, work per iteration, threshold, made serial)
SERIAL_CASES = [
    (100, 1, 101, True),  # 100 iterations, below 101
    (100, 1, 100, False),  # at the threshold: parallel
    (100, 64, 6401, True),  # an inner loop of 64 counts too
    (100, 64, 6400, False),
]


@pytest.mark.parametrize("n,inner,threshold,serial", SERIAL_CASES)
def test_serial_when_small(n, inner, threshold, serial):
    @T.prim_func(s_tir=True)
    def count(a: T.Buffer((n, inner), "int32")):
        for i in T.parallel(n):
            for j in range(inner):
                with T.sblock("count"):
                    vi, vj = T.axis.remap("SS", [i, j])
                    a[vi, vj] = a[vi, vj] + 1

    func = topi_accel.workshare.serial_when_small(count, threshold)
    assert (func is not None) == serial
    if serial:
        assert "T.parallel" not in func.script()
        lib = tvm.compile(tvm.IRModule({"main": func}), tvm.target.Target("accel")).jit()
        buf = tvm.runtime.tensor(np.zeros((n, inner), "int32"))
        lib(buf)
        assert (buf.numpy() == 1).all()
        # its parallel version, for shared launches, where the pool is awake anyway
        parallel = topi_accel.workshare.parallel_again(func, 2)
        assert topi_accel.workshare.CLAIM in parallel.script() and "T.parallel" in parallel.script()
        tvm.compile(tvm.IRModule({"main": parallel}), tvm.target.Target("accel")).jit()(buf)
        assert (buf.numpy() == 2).all()
    assert topi_accel.workshare.parallel_again(count, 2) is None  # (no loop made serial)


def test_serial_when_small_leaves_a_symbolic_loop_parallel():
    count = _count_calls(tvm.tirx.Var("n", "int64"))
    assert topi_accel.workshare.serial_when_small(count, 1 << 30) is None
