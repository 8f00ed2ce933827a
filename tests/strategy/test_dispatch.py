"""The dispatcher: selection by priority and condition, fallbacks, strict mode, llvm untouched."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
import tvm
from tvm import relax

import accel_target
import strategy
from strategy import registry
from strategy.dispatch import kernel_call
from tests.helpers import assert_close, conv2d_module, legalized, matmul_module, rand, run_relax, single_op_module


def _int8_conv():
    x = np.ones((1, 3, 8, 8), "int8")
    w = np.ones((4, 3, 3, 3), "int8")
    return single_op_module(
        lambda data, weight: relax.op.nn.conv2d(data, weight, out_dtype="int32"), {"data": x, "weight": w}, {}
    ), [x, w]


def test_fallback_is_recorded_with_reason_and_still_correct():
    mod, inputs = _int8_conv()
    with accel_target.recording() as log:
        out = run_relax(mod, inputs)
    (decision,) = log
    assert decision.fallback and decision.op == "relax.nn.conv2d"
    assert "int8" in decision.reason and "float32" in decision.reason
    assert decision.inputs == ("int8[1, 3, 8, 8]", "int8[4, 3, 3, 3]")
    np.testing.assert_array_equal(out, np.full((1, 4, 6, 6), 27, "int32"))
    fallback_funcs = [f for f in legalized(mod).functions.values() if "accel.fallback" in (f.attrs or {})]
    assert len(fallback_funcs) == 1 and "int8" in fallback_funcs[0].attrs["accel.fallback"]


def test_broadcast_batch_matmul_falls_back_with_every_reason():
    a, b = rand(2, 4, 8), rand(1, 8, 5)
    mod = single_op_module(lambda x, y: relax.op.matmul(x, y), {"x": a, "y": b}, {})
    with accel_target.recording() as log:
        out = run_relax(mod, [a, b])
    assert_close(out, a @ b)
    assert log[0].fallback
    assert dict(log[0].skipped) == {
        "strassen.accel": "not asked for (build(..., strassen=True))",
        "batch_dense_kn.accel": "the right operand is not a constant "
        "(batch_dense_kn packs its weights at compile time)",
        "dense_kn.accel": "right operand has rank 3; dense_kn needs a 2-D [in, out] weight",
        "batch_matmul_kn.accel": "batch axes [2] and [1] differ (broadcasting is not supported)",
        "dense_kn_int8.accel": "data float32 x weight float32 -> float32 is not supported "
        "(supported: uint8 or int8 data x int8 weight -> int32)",
    }


def test_symbolic_shape_falls_back():
    """A symbolic K (the weight's rows) has no accel kernel (symbolic rows do: tests/topi/test_dynamic_shapes.py)."""
    n = tvm.tirx.Var("n", "int64")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([4, n], "float32"))
    w = relax.Var("w", relax.TensorType([n, 8], "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.matmul(x, w))
        bb.emit_func_output(out)
    with accel_target.recording() as log:
        legalized(bb.get())
    assert log[0].fallback and "symbolic" in log[0].reason


def test_strict_mode_raises_naming_op_input_and_reason():
    mod, _ = _int8_conv()
    with accel_target.strict(), pytest.raises(accel_target.StrictModeError) as err:
        tvm.compile(mod, target="accel")
    message = str(err.value)
    assert "relax.nn.conv2d" in message and "int8[1, 3, 8, 8]" in message and "float32" in message


def test_strict_mode_accepts_supported_ops():
    x, w = rand(2, 16), rand(16, 4)
    with accel_target.strict():
        assert_close(run_relax(matmul_module(x, w, True), [x]), x @ w)


def test_higher_priority_implementation_wins_when_its_condition_holds(monkeypatch):
    monkeypatch.setattr(registry, "_IMPLEMENTATIONS", {k: list(v) for k, v in registry._IMPLEMENTATIONS.items()})

    def tvm_conv(bb, call):  # TVM's kernel, added as this implementation's
        made = strategy.dispatch.tvm_legalize(call)(bb, call)
        func, args = bb.get()[made.args[0]], list(made.args[1].fields)
        return kernel_call(bb, func, "conv2d_groups3", "conv2d_groups3_test.accel", args, made.ty_args[0])

    strategy.register(
        "relax.nn.conv2d",
        "conv2d_groups3_test.accel",
        plevel=20,
        condition=lambda call: None if int(call.attrs.groups) == 3 else f"groups={call.attrs.groups}, needs 3",
    )(tvm_conv)
    grouped = conv2d_module(rand(1, 6, 8, 8), rand(6, 2, 3, 3), True, groups=3)
    plain = conv2d_module(rand(1, 6, 8, 8), rand(6, 6, 3, 3), True)
    with accel_target.recording() as log:
        legalized(grouped)
        legalized(plain)
    assert log[0].implementation == "conv2d_groups3_test.accel"
    assert log[1].implementation == "conv2d_nhwc_ohwi.accel"
    assert log[1].skipped[0] == ("conv2d_groups3_test.accel", "groups=1, needs 3")
    assert [name for name, _ in log[1].skipped] == ["conv2d_groups3_test.accel", "conv2d_winograd.accel"]


LLVM_SCRIPT = textwrap.dedent(
    """
    import sys, numpy as np, tvm
    from tvm import relax
    if sys.argv[1] == "import":
        import accel_target
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([1, 3, 8, 8], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, relax.const(np.ones((4, 3, 3, 3), "float32"))))
            z = bb.emit(relax.op.reshape(y, [1, 144]))
            out = bb.emit_output(relax.op.matmul(z, relax.const(np.ones((144, 5), "float32"))))
        bb.emit_func_output(out)
    with tvm.target.Target("llvm"):
        print(relax.transform.LegalizeOps()(bb.get()).script())  # show_meta=True segfaults in 0.27
    vm = relax.VirtualMachine(tvm.compile(bb.get(), target="llvm"), tvm.cpu())
    print(vm["main"](tvm.runtime.tensor(np.arange(192, dtype="float32").reshape(1, 3, 8, 8))).numpy().tolist())
    """
)


def test_llvm_target_unchanged_by_import():
    runs = [
        subprocess.run([sys.executable, "-c", LLVM_SCRIPT, arg], capture_output=True, text=True, check=True).stdout
        for arg in ("plain", "import")
    ]
    assert "conv2d_nhwc_ohwi" not in runs[1] and "dense_kn" not in runs[1]
    assert runs[0] == runs[1]


def test_llvm_target_records_nothing_and_matches_torch():
    x, w = rand(1, 3, 10, 10), rand(4, 3, 3, 3)
    with accel_target.recording() as log:
        out = run_relax(conv2d_module(x, w, True), [x], target="llvm")
    assert log == []
    assert_close(out, torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w)).numpy())
