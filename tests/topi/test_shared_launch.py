"""Kernels merged into one launch of the thread pool (topi_accel.shared_launch): the same
results as the kernels called one after the other, against numpy."""

import numpy as np
import pytest
import tvm
from tvm import s_tir, te, tirx
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


def _symbolic(shape, compute):
    """A kernel made as the build makes them (TE, no buffer layouts), of an argument of `shape`
    (in terms of n) written in place by `compute(a, n)`, its first loop parallel."""
    n = tirx.Var("n", "int64")
    a = te.placeholder(shape(n), name="a")
    out = te.compute(shape(n), lambda *i: compute(a, n, *i), name="out")
    sch = s_tir.Schedule(te.create_prim_func([a, out]).with_attr("tirx.noalias", True))
    sch.parallel(sch.get_loops(sch.get_sblock("out"))[0])
    return sch.mod["main"]


copied = _symbolic(lambda n: (n,), lambda a, n, i: a[i])
reversed_ = _symbolic(lambda n: (n,), lambda a, n, i: a[n - 1 - i])
pairs = _symbolic(lambda n: (n, 2), lambda a, n, i, j: a[i, 1 - j])
triples = _symbolic(lambda n: (n, 3), lambda a, n, i, j: a[i, 2 - j])
doubled = _symbolic(lambda n: (n * 2,), lambda a, n, i: a[i] * 2)


@T.prim_func
def parsed(a: T.handle, b: T.handle):
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
    assert shared_launch.joining(doubled) is None  # (a dimension neither a number nor a variable)
    # (TVMScript's buffers carry a layout in terms of the shape variable, which the merge
    # would not rename with the shape)
    assert shared_launch.joining(parsed) is None


@T.prim_func
def checked_total(a: T.Buffer((N,), "float32"), t: T.Buffer((1,), "float32")):
    T.func_attr({"tirx.noalias": True})
    t[0] = T.float32(0)
    for i in range(N):
        t[0] = t[0] + a[i]
    assert t[0] >= T.float32(0), "a sum below zero"


def test_a_kernel_with_an_assertion_runs_on_its_own():
    """An assertion that failed in a task of a shared launch would leave the other tasks
    waiting at the next barrier (accel_target.indexing's check kernel has one)."""
    assert shared_launch.joining(total) is not None
    assert shared_launch.joining(checked_total) is None


def test_a_claimed_kernel_joins_as_claim_iterations_lowered_it():
    # (lowered once more, its claimed loops of a symbolic extent would cost the buffer
    # compaction tens of seconds in the build: a 3-conv model, 116 s)
    claimed = workshare.claim_iterations(copied, 2)
    assert shared_launch.joining(claimed).lowered.same_as(claimed)


def test_kernels_of_symbolic_shapes_share_their_shape_variables():
    claimed = workshare.claim_iterations(copied, 2)
    func, order = _merged([(claimed, ["a", "b"]), (reversed_, ["b", "c"]), (copied, ["c", "d"])])
    assert order == ["a", "b", "c", "d"]
    assert len({str(p.ty.shape[0]) for p in func.params}) == 1, func.script()  # (one n for all)
    kernel = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target="llvm")["main"]
    rng = np.random.default_rng(0)
    for n in (1, 7, 1000, N + 3):
        a = rng.standard_normal(n, "float32")
        tensors = [tvm.runtime.tensor(v) for v in (a, *[np.zeros(n, "float32")] * 3)]
        kernel(*tensors)
        np.testing.assert_array_equal(tensors[3].numpy(), a[::-1])


def test_kernels_that_disagree_on_a_shared_argument_are_not_merged():
    with pytest.raises(ValueError, match="differs"):
        _merged([(pairs, ["a", "b"]), (triples, ["b", "c"])])


def test_member_names_read_back_from_the_name():
    assert shared_launch.member_names("shared_launch3__conv__dense") == ["conv", "dense"]
    assert shared_launch.member_names("fused_conv2d_add") is None
