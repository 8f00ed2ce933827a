"""Kernels merged into one launch of the thread pool (topi_accel.shared_launch): the same
results as the kernels called one after the other, against numpy."""

import numpy as np
import tvm
from tvm import tirx
from tvm.script import tirx as T

import accel_target  # (sets TVM_NUM_THREADS to every core before the pool starts)
from topi_accel import shared_launch, workshare

N = 1 << 16


@T.prim_func
def scale(a: T.Buffer((N,), "float32"), b: T.Buffer((N,), "float32")):
    T.func_attr({"tirx.noalias": True})
    for i in T.parallel(N):
        b[i] = a[i] * T.float32(2)


@T.prim_func
def add_reversed(b: T.Buffer((N,), "float32"), c: T.Buffer((N,), "float32")):
    T.func_attr({"tirx.noalias": True})
    # in place, and each task reads what the other one wrote in the kernel before
    for i in T.parallel(N):
        c[i] = c[i] + b[N - 1 - i]


@T.prim_func
def total(c: T.Buffer((N,), "float32"), t: T.Buffer((1,), "float32")):
    T.func_attr({"tirx.noalias": True})
    # no parallel loop: run by one task only, or the sum would be counted twice
    t[0] = t[0] + T.float32(1)
    for i in range(N):
        t[0] = t[0] + c[i]


@T.prim_func
def rows_in_turn(a: T.Buffer((4, N), "float32"), b: T.Buffer((4, N), "float32")):
    T.func_attr({"tirx.noalias": True})
    for r in range(4):  # a parallel loop inside a serial one: a launch per row
        for i in T.parallel(N):
            b[r, i] = a[r, i]


@T.prim_func
def symbolic(a: T.handle, b: T.handle):
    T.func_attr({"tirx.noalias": True})
    n = T.int64()
    A = T.match_buffer(a, (n,), "float32")
    B = T.match_buffer(b, (n,), "float32")
    for i in T.parallel(n):
        B[i] = A[i]


def _merged(calls):
    """The merged kernel of `calls` [(kernel, [argument names])] and the names of its arguments."""
    names = {}
    members = [
        (shared_launch.joining(kernel), [names.setdefault(n, tirx.Var(n, "handle")) for n in args])
        for kernel, args in calls
    ]
    func, args = shared_launch.merge(members)
    return func, [next(n for n, v in names.items() if v.same_as(a)) for a in args]


def test_merged_kernels_run_in_order_in_one_launch():
    assert accel_target.num_threads() == accel_target.host_cores() > 1  # (else there is nothing to share)
    claimed = workshare.claim_iterations(scale, 2)  # its counters zeroed before the launch
    calls = [(claimed, ["a", "b"]), (add_reversed, ["b", "c"]), (total, ["c", "t"]), (claimed, ["c", "d"])]
    func, order = _merged(calls)
    text = func.script()
    assert text.count("pragma_parallel_launch_point") == 1, text
    rng = np.random.default_rng(0)
    values = {"a": rng.standard_normal(N, "float32"), "b": np.zeros(N, "float32"), "d": np.zeros(N, "float32")}
    values.update(c=rng.standard_normal(N, "float32"), t=np.array([5.0], "float32"))
    tensors = {name: tvm.runtime.tensor(value) for name, value in values.items()}
    kernel = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target="llvm")["main"]
    for _ in range(3):  # (the counters start from zero on every call)
        for name, value in values.items():
            tensors[name].copyfrom(value)
        kernel(*[tensors[name] for name in order])
        b = values["a"] * 2
        c = values["c"] + b[::-1]
        np.testing.assert_array_equal(tensors["b"].numpy(), b)
        np.testing.assert_allclose(tensors["c"].numpy(), c, rtol=1e-6)
        np.testing.assert_allclose(tensors["t"].numpy(), [5 + 1 + c.astype("float64").sum()], rtol=1e-4)
        np.testing.assert_allclose(tensors["d"].numpy(), c * 2, rtol=1e-6)


def test_kernels_that_cannot_join_are_told_apart():
    assert shared_launch.joining(scale).parallel
    assert not shared_launch.joining(total).parallel
    assert shared_launch.joining(rows_in_turn) is None
    assert shared_launch.joining(symbolic) is None


def test_member_names_read_back_from_the_name():
    assert shared_launch.member_names("shared_launch3__conv__dense") == ["conv", "dense"]
    assert shared_launch.member_names("fused_conv2d_add") is None
