"""relax.nn.conv1d under Target("accel"): every plain layout runs on conv1d_nwc_owi (the
conv2d_nhwc_ohwi kernel at H = 1); the rest falls back with its reason."""

import numpy as np
import pytest
import torch
import tvm
from torch import nn
from tvm import relax, s_tir

import accel_target
import strategy
from accel_target.reporting import calls_of
from strategy.conv1d import conv1d_condition
from tests.helpers import assert_close, called_kernels, legalized, rand, run_executable, run_relax, single_op_module

LAYOUTS = {"N": 0, "C": 1, "W": 2}
KERNEL_AXES = {"O": 0, "I": 1, "W": 2}


def _to(array, canonical_axes, layout):
    return np.ascontiguousarray(array.transpose([canonical_axes[a] for a in layout]))


def conv1d_module(x, w, const_weight: bool, **attrs) -> tvm.IRModule:
    """A module with one relax.nn.conv1d; `w` is a parameter or a bound constant."""
    call = lambda data, weight: relax.op.nn.conv1d(data, weight, **attrs)  # noqa: E731
    if const_weight:
        return single_op_module(call, {"data": x}, {"weight": w})
    return single_op_module(call, {"data": x, "weight": w}, {})


# (data_layout, kernel_layout, out_layout)
LAYOUT_CASES = [
    ("NWC", "OWI", "NWC"),
    ("NCW", "OIW", "NCW"),
    ("NWC", "WIO", "NWC"),
    ("NCW", "OIW", "NWC"),
    ("NWC", "OIW", "NCW"),
]
# (batch, channels, width, out_channels, kernel, strides, padding, dilation, groups)
ATTR_CASES = [
    (1, 16, 40, 32, 3, 1, 1, 1, 1),
    (2, 6, 23, 10, 3, 2, (1, 2), 1, 2),
    (1, 8, 30, 8, 5, 1, 4, 2, 8),
]


def _case(layouts, attrs, const_weight):
    data_layout, kernel_layout, out_layout = layouts
    n, c, w, o, k, strides, padding, dilation, groups = attrs
    x, wt = rand(n, c, w), rand(o, c // groups, k)
    left, right = padding if isinstance(padding, tuple) else (padding, padding)
    xp = torch.nn.functional.pad(torch.from_numpy(x), (left, right))
    ref = torch.nn.functional.conv1d(xp, torch.from_numpy(wt), stride=strides, dilation=dilation, groups=groups).numpy()
    x_in, w_in = _to(x, LAYOUTS, data_layout), _to(wt, KERNEL_AXES, kernel_layout)
    mod = conv1d_module(
        x_in,
        w_in,
        const_weight,
        strides=strides,
        padding=padding,
        dilation=dilation,
        groups=groups,
        data_layout=data_layout,
        kernel_layout=kernel_layout,
        out_layout=out_layout,
    )
    inputs = [x_in] + ([] if const_weight else [w_in])
    return mod, inputs, _to(ref, LAYOUTS, out_layout)


@pytest.mark.parametrize("const_weight", [True, False], ids=["const_w", "runtime_w"])
@pytest.mark.parametrize("attrs", ATTR_CASES, ids=str)
@pytest.mark.parametrize("layouts", LAYOUT_CASES, ids="-".join)
def test_conv1d_layouts_run_on_accel_kernel(layouts, attrs, const_weight):
    mod, inputs, ref = _case(layouts, attrs, const_weight)
    with accel_target.recording() as log:
        out = run_relax(mod, inputs)
    assert_close(out, ref)
    assert [d.implementation for d in log] == ["conv1d_nwc_owi.accel"]

    kernels = called_kernels(legalized(mod))
    assert sum(name.startswith("conv2d_nhwc_ohwi") for name in kernels) == 1
    # activations: one visible transpose per side not in NWC
    assert sum(name.startswith("transpose") for name in kernels) == (layouts[0] != "NWC") + (layouts[2] != "NWC")
    # weights: packed at compile time when constant, by one visible layout_transform otherwise
    assert sum("layout_transform" in name for name in kernels) == (0 if const_weight else 1)
    assert len(kernels) == 1 + (layouts[0] != "NWC") + (layouts[2] != "NWC") + (not const_weight)


def test_conv1d_primfunc_named_after_kernel_and_tagged():
    mod, _, _ = _case(LAYOUT_CASES[0], ATTR_CASES[1], True)
    lowered = legalized(mod)
    (gvar,) = [g for g in lowered.functions if g.name_hint.startswith("conv2d")]
    assert gvar.name_hint == "conv2d_nhwc_ohwi"
    assert lowered[gvar].attrs["accel.impl"] == "conv1d_nwc_owi.accel"
    # the weight, packed at compile time: [O/ob, K, I/groups, ob], no KH axis (5 channels a
    # group: scalar lanes, in blocks of 2, as no vector may span two groups)
    (call,) = [c for c in calls_of(lowered, ("relax.call_tir",)) if c.args[0].same_as(gvar)]
    data, weight = call.args[1].fields
    assert isinstance(weight, tvm.ir.expr.Constant) and [int(d) for d in weight.ty.shape] == [5, 3, 3, 2]
    assert [int(d) for d in data.ty.shape] == [2, 23, 6] and [int(d) for d in call.ty.shape] == [2, 12, 10]


def _call(data_shape, weight_shape, dtype="float32", **attrs) -> relax.Call:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(data_shape, dtype))
    w = relax.Var("w", relax.TensorType(weight_shape, dtype))
    return bb.normalize(relax.op.nn.conv1d(x, w, **attrs))


N = tvm.tirx.Var("n", "int64")
FALLBACKS = [
    # (data shape, weight shape, dtype, attrs, reason)
    ((1, 8, 10), (4, 8, 3), "int8", {"out_dtype": "int32"}, "dtype int32/int8 is not supported (supported: float32)"),
    ((1, 8, 10), (4, 8, 3), "float16", {}, "dtype float16 is not supported (supported: float32)"),
    ((1, 2, 10, 4), (8, 8, 3), "float32", {"data_layout": "NCW4c"}, "data_layout NCW4c is not a plain order of NCW"),
    ((1, 8, 10), (4, 8, 3), "float32", {"out_layout": "NCW2c"}, "out_layout NCW2c is not a plain order of NCW"),
    ((1, 8, N), (4, 8, 3), "float32", {}, "symbolic data axes (W=n) are not supported"),
]


@pytest.mark.parametrize("data, weight, dtype, attrs, reason", FALLBACKS, ids=lambda v: str(v)[:20])
def test_conv1d_unsupported_calls_name_their_reason(data, weight, dtype, attrs, reason):
    call = _call(data, weight, dtype, **attrs)
    assert reason in conv1d_condition(call)
    impl, skipped = strategy.select(call, ["accel"])
    assert impl is None and skipped[0][0] == "conv1d_nwc_owi.accel" and reason in skipped[0][1]


def _int8_conv1d():
    x, w = np.ones((1, 3, 8), "int8"), np.ones((4, 3, 3), "int8")
    mod = single_op_module(
        lambda data, weight: relax.op.nn.conv1d(data, weight, out_dtype="int32"), {"data": x, "weight": w}, {}
    )
    return mod, [x, w]


def test_conv1d_fallback_is_recorded_and_still_correct():
    mod, inputs = _int8_conv1d()
    with accel_target.recording() as log:
        out = run_relax(mod, inputs)
    (decision,) = log
    assert decision.fallback and decision.op == "relax.nn.conv1d"
    assert "int8" in decision.reason and "float32" in decision.reason
    np.testing.assert_array_equal(out, np.full((1, 4, 6), 9, "int32"))
    fallback_funcs = [f for f in legalized(mod).functions.values() if "accel.fallback" in (f.attrs or {})]
    assert len(fallback_funcs) == 1 and "int8" in fallback_funcs[0].attrs["accel.fallback"]


def test_conv1d_strict_mode_raises_naming_op_and_reason():
    mod, _ = _int8_conv1d()
    with accel_target.strict(), pytest.raises(accel_target.StrictModeError) as err:
        tvm.compile(mod, target="accel")
    assert "relax.nn.conv1d" in str(err.value) and "int8[1, 3, 8]" in str(err.value)


def test_conv1d_llvm_target_records_nothing_and_matches_torch():
    x, w = rand(1, 3, 12), rand(4, 3, 3)
    with accel_target.recording() as log:
        out = run_relax(conv1d_module(x, w, True), [x], target="llvm")
    assert log == []
    assert_close(out, torch.nn.functional.conv1d(torch.from_numpy(x), torch.from_numpy(w)).numpy())


class Conv1dBlock(nn.Module):
    """NCW conv1d stem, then conv1d + bias, GELU, residual add: the epilogue of an audio model's conv."""

    # 32 channels: whole channel blocks (a padded channel block keeps the epilogue a loop
    # nest of its own, conv2d_nhwc_ohwi's limit too); the width leaves a column tail
    def __init__(self, channels=32, groups=1):
        super().__init__()
        self.stem = nn.Conv1d(8, channels, 5, stride=2)
        self.conv = nn.Conv1d(channels, channels, 3, padding=1, groups=groups)

    def forward(self, x):
        h = self.stem(x)
        return nn.functional.gelu(self.conv(h)) + h


@pytest.mark.parametrize("groups", [1, 4])
def test_conv1d_model_converted_to_nwc_and_epilogue_fused(groups):
    model, x = Conv1dBlock(groups=groups).eval(), torch.randn(2, 8, 77)
    mod = accel_target.from_torch(model, (x,))
    executable = accel_target.build(mod)
    assert_close(run_executable(executable, x.numpy()), model(x).detach().numpy())
    report = accel_target.report(executable)
    rows = [r for r in report.rows if r.op == "relax.nn.conv1d"]
    # ConvertLayout (DESIRED_LAYOUTS) made the convs NWC/OWI; their weights were folded and packed
    assert len(rows) == 2 and all(r.kind == "accel" and r.kernel == "conv1d_nwc_owi.accel" for r in rows)
    assert all("data_layout=NWC kernel_layout=OWI out_layout=NWC" in r.layouts for r in rows)
    assert report.kernels.weight_transforms == 0 and report.kernels.activation_transforms == 2
    # transpose in, stem (+ bias), conv (+ bias, GELU, residual add), transpose out
    assert report.kernels.accel == 2 and len(report.kernels.calls) == 4
    kernel = report.kernels.calls[2]
    assert kernel.startswith("fused_conv2d_nhwc_ohwi") and "add" in kernel and "erf" in kernel
    lowered = accel_target.optimize(mod)
    (func,) = [f for g, f in lowered.functions_items() if g.name_hint == kernel.removesuffix("_in_place")]
    sch = s_tir.Schedule(func)
    stages = [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]
    assert all(name.startswith("conv2d_nhwc_ohwi") for name in stages), stages  # no loop nest of its own
