"""relax.nn.conv2d under Target("accel"): every plain layout runs on conv2d_nhwc_ohwi or conv2d_winograd."""

import numpy as np
import pytest
import torch

import accel_target
from tests.helpers import assert_close, called_kernels, conv2d_module, legalized, rand, run_relax

LAYOUTS = {"N": 0, "C": 1, "H": 2, "W": 3}
KERNEL_AXES = {"O": 0, "I": 1, "H": 2, "W": 3}


def _to(array, canonical_axes, layout):
    return np.ascontiguousarray(array.transpose([canonical_axes[a] for a in layout]))


# (data_layout, kernel_layout, out_layout)
LAYOUT_CASES = [
    ("NHWC", "OHWI", "NHWC"),
    ("NCHW", "OIHW", "NCHW"),
    ("NHWC", "HWIO", "NHWC"),
    ("NCHW", "OIHW", "NHWC"),
    ("NHWC", "OIHW", "NCHW"),
]
# (batch, channels, height, width, out_channels, kernel, strides, padding, dilation, groups)
ATTR_CASES = [
    (1, 16, 14, 14, 32, 3, 1, 1, 1, 1),
    (2, 6, 11, 9, 10, 3, 2, (1, 0, 2, 1), 1, 2),
    (1, 8, 12, 12, 8, 3, 1, 2, 2, 8),
]


def _case(layouts, attrs, const_weight):
    data_layout, kernel_layout, out_layout = layouts
    n, c, h, w, o, k, strides, padding, dilation, groups = attrs
    x, wt = rand(n, c, h, w), rand(o, c // groups, k, k)
    pads = padding if isinstance(padding, tuple) else (padding,) * 4
    xp = torch.nn.functional.pad(torch.from_numpy(x), (pads[1], pads[3], pads[0], pads[2]))
    ref = torch.nn.functional.conv2d(xp, torch.from_numpy(wt), stride=strides, dilation=dilation, groups=groups).numpy()
    x_in, w_in = _to(x, LAYOUTS, data_layout), _to(wt, KERNEL_AXES, kernel_layout)
    mod = conv2d_module(
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
def test_conv2d_layouts_run_on_accel_kernel(layouts, attrs, const_weight):
    mod, inputs, ref = _case(layouts, attrs, const_weight)
    with accel_target.recording() as log:
        out = run_relax(mod, inputs)
    assert_close(out, ref)
    # the 3x3 stride-1 case runs on Winograd when its weights are constants
    winograd = const_weight and attrs == ATTR_CASES[0]
    implementation = "conv2d_winograd.accel" if winograd else "conv2d_nhwc_ohwi.accel"
    assert [d.implementation for d in log] == [implementation]
    if attrs == ATTR_CASES[0] and not const_weight:
        assert (
            dict(log[0].skipped)["conv2d_winograd.accel"]
            == "the weights are not a constant (Winograd transforms them at compile time)"
        )

    kernels = called_kernels(legalized(mod))
    assert sum(name.startswith(implementation.split(".")[0]) for name in kernels) == 1
    # activations: one visible transpose per side not in NHWC
    assert sum(name.startswith("transpose") for name in kernels) == (layouts[0] != "NHWC") + (layouts[2] != "NHWC")
    # weights: packed at compile time when constant, by one visible layout_transform otherwise
    assert sum("layout_transform" in name for name in kernels) == (0 if const_weight else 1)
    assert len(kernels) == 1 + (layouts[0] != "NHWC") + (layouts[2] != "NHWC") + (not const_weight)


@pytest.mark.parametrize("attrs, kernel", [(ATTR_CASES[0], "conv2d_winograd"), (ATTR_CASES[1], "conv2d_nhwc_ohwi")])
def test_accel_primfunc_named_after_compute_and_tagged(attrs, kernel):
    mod, _, _ = _case(LAYOUT_CASES[0], attrs, True)
    lowered = legalized(mod)
    (gvar,) = [g for g in lowered.functions if g.name_hint.startswith("conv2d")]
    assert kernel in gvar.name_hint
    assert lowered[gvar].attrs["accel.impl"] == f"{kernel}.accel"
