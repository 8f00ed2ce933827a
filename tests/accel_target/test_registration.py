"""One registration makes a kernel accel's: a toy kernel registered here, through
`strategy.register` and `kernel_call` only, gets the epilogue, writes in place and counts as
accel in the report, without being listed anywhere else."""

import numpy as np
import pytest
import tvm
from tvm import relax, te, topi

import accel_target
import strategy
from strategy import registry
from strategy.dispatch import kernel_call
from strategy.layout import static_shape
from tests.helpers import assert_close
from topi_accel.epilogue import IMPL

KEY = "accel_toy"
IMPL_NAME = "toy_pool.test"


def toy_pool_func(shape, dtype):
    """3x3 max pooling, stride 1, padding 1, NHWC: a reduction "toy_pool_acc", then the
    write-back "toy_pool" (what the epilogue is inlined into); not scheduled."""
    data = te.placeholder(shape, dtype, name="data")
    padded = topi.nn.pad(data, [0, 1, 1, 0], [0, 1, 1, 0], float("-inf"), name="toy_pool_pad")
    rh, rw = te.reduce_axis((0, 3), name="rh"), te.reduce_axis((0, 3), name="rw")
    acc = te.compute(shape, lambda b, y, x, c: te.max(padded[b, y + rh, x + rw, c], axis=[rh, rw]), name="toy_acc")
    out = te.compute(shape, lambda *i: acc[i], name="toy_pool")
    return te.create_prim_func([data, out], index_dtype_override="int64")


def toy_condition(call: relax.Call) -> str | None:
    attrs = call.attrs
    same = [int(v) for v in attrs.pool_size] == [3, 3] and [int(v) for v in attrs.padding] == [1, 1, 1, 1]
    return None if str(attrs.layout) == "NHWC" and same else "not a 3x3 NHWC pool with padding 1"


def toy_pool(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    data = call.args[0]
    shape, dtype = static_shape(data), str(data.ty.dtype)
    return kernel_call(
        bb, toy_pool_func(tuple(shape), dtype), "toy_pool", IMPL_NAME, [data], relax.TensorType(shape, dtype)
    )


def no_kernel_call(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """Legalizes, but not through kernel_call: not a kernel of ours."""
    return strategy.dispatch.tvm_legalize(call)(bb, call)


@pytest.fixture(scope="module")
def toy_target():
    """A target with the toy implementations; they are registered in a copy of the registry,
    dropped when this module's tests end."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(registry, "_IMPLEMENTATIONS", {op: list(impls) for op, impls in registry._IMPLEMENTATIONS.items()})
        strategy.register("relax.nn.max_pool2d", IMPL_NAME, key=KEY, condition=toy_condition)(toy_pool)
        strategy.register("relax.nn.avg_pool2d", "no_kernel_call.test", key=KEY, condition=lambda call: None)(
            no_kernel_call
        )
        tvm.target.register_tag(KEY, {**accel_target.target_config(), "keys": [KEY, "accel", "cpu"]}, override=True)
        strategy.install()
        yield KEY


def _two_pools_added(shape):
    """main(x, y) = relu(max_pool2d(x) + max_pool2d(y) + 1)"""
    bb = relax.BlockBuilder()
    x, y = (relax.Var(n, relax.TensorType(shape, "float32")) for n in "xy")
    pool = {"pool_size": (3, 3), "strides": (1, 1), "padding": (1, 1), "layout": "NHWC"}
    with bb.function("main", [x, y]):
        with bb.dataflow():
            a = bb.emit(relax.op.nn.max_pool2d(x, **pool))
            b = bb.emit(relax.op.nn.max_pool2d(y, **pool))
            s = bb.emit(relax.op.add(relax.op.add(a, b), relax.const(1.0, "float32")))
            out = bb.emit_output(relax.op.nn.relu(s))
        bb.emit_func_output(out)
    return bb.get()


def _reference(x, y):
    def pool(v):
        padded = np.pad(v, [(0, 0), (1, 1), (1, 1), (0, 0)], constant_values=-np.inf)
        windows = [padded[:, i : i + v.shape[1], j : j + v.shape[2]] for i in range(3) for j in range(3)]
        return np.max(windows, axis=0)

    return np.maximum(pool(x) + pool(y) + 1, 0)


def test_a_registered_kernel_gets_epilogue_in_place_and_report(toy_target):
    shape = (1, 6, 7, 16)
    rng = np.random.default_rng(0)
    x, y = (rng.standard_normal(shape).astype("float32") for _ in range(2))
    mod = _two_pools_added(shape)
    executable = accel_target.build(mod, target=toy_target, strict=True)
    vm = relax.VirtualMachine(executable, tvm.cpu())
    assert_close(vm["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(y)).numpy(), _reference(x, y))

    report = accel_target.report(executable)
    # both pools are the toy kernel; the adds and the relu run in one of them (epilogue)
    assert [(r.op, r.kind, r.kernel) for r in report.rows] == [
        ("relax.nn.max_pool2d", "accel", IMPL_NAME),
        ("relax.nn.max_pool2d", "accel", IMPL_NAME),
        ("relax.add", "fused", f"fused into {IMPL_NAME}"),
        ("relax.add", "fused", f"fused into {IMPL_NAME}"),
        ("relax.nn.relu", "fused", f"fused into {IMPL_NAME}"),
    ]
    assert report.kernels.accel == len(report.kernels.calls) == 2
    assert f"fused into {IMPL_NAME}" in str(report)

    lowered = accel_target.optimize(mod, target=toy_target)
    (in_place,) = [c for c in lowered["main"].body.blocks[0].bindings if "inplace" in c.value.op.name]
    fused = lowered[in_place.value.args[0]]
    assert fused.attrs[IMPL] == IMPL_NAME
    # the epilogue is inside the write-back: no block of the fused function but the toy's own
    assert all(name.startswith("toy_") for name in _block_names(fused)), _block_names(fused)


def _block_names(func) -> list[str]:
    names = []
    sch = tvm.s_tir.Schedule(func)
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        names.append(sch.get(block).name_hint)
    return names


def test_an_implementation_without_kernel_call_is_declined(toy_target):
    shape = (1, 6, 6, 8)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.avg_pool2d(x, (3, 3), (1, 1), (1, 1), layout="NHWC"))
        bb.emit_func_output(out)
    report = accel_target.report(accel_target.build(bb.get(), target=toy_target))
    assert [d.step for d in report.declines] == ["no_kernel_call.test"]
    assert "made no kernel through strategy.dispatch.kernel_call" in report.declines[0].reason
    (row,) = report.rows
    assert row.kind == "fallback" and row.skipped[0][0] == "no_kernel_call.test"
    with pytest.raises(accel_target.StrictModeError, match="no_kernel_call.test"):
        accel_target.build(bb.get(), target=toy_target, strict=True)
