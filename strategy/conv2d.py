"""relax.nn.conv2d implementations for the accel target."""

from __future__ import annotations

from tvm import relax

import topi_accel

from .dispatch import kernel_call
from .layout import dtype_reason, is_permutation, pack_weight, static_shape, to_layout
from .registry import register

SUPPORTED_DTYPES = topi_accel.conv2d.SUPPORTED_DTYPES


def conv2d_condition(call: relax.Call) -> str | None:
    """conv2d_nhwc_ohwi.accel takes any plain layout of float32 data with static shapes."""
    attrs = call.attrs
    data, kernel = call.args
    for what, layout, axes in (
        ("data_layout", attrs.data_layout, "NCHW"),
        ("kernel_layout", attrs.kernel_layout, "OIHW"),
        ("out_layout", attrs.out_layout, "NCHW"),
    ):
        if not is_permutation(str(layout), axes):
            return f"{what} {layout} is not a plain order of {axes} (blocked layouts are not supported)"
    reason = dtype_reason(call, SUPPORTED_DTYPES)
    if reason is not None:
        return reason
    if static_shape(data) is None or static_shape(kernel) is None:
        return "symbolic shapes are not supported"
    return None


def geometry_of(call: relax.Call) -> topi_accel.Conv2DGeometry:
    """The conv2d_nhwc_ohwi geometry of a conv2d call in any plain layout."""
    attrs = call.attrs
    data_shape, kernel_shape = static_shape(call.args[0]), static_shape(call.args[1])
    data_layout, kernel_layout = str(attrs.data_layout), str(attrs.kernel_layout)
    return topi_accel.conv2d_geometry(
        [data_shape[data_layout.index(axis)] for axis in "NHWC"],
        [kernel_shape[kernel_layout.index(axis)] for axis in "OHWI"],
        attrs.strides,
        attrs.padding,
        attrs.dilation,
        attrs.groups,
        str(call.args[0].ty.dtype),
    )


@register("relax.nn.conv2d", "conv2d_nhwc_ohwi.accel", condition=conv2d_condition)
def conv2d_nhwc_ohwi_accel(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """Convert data to NHWC and weights to the packed OHWI kernel layout, call the kernel,
    convert the result to out_layout."""
    attrs = call.attrs
    data_layout, kernel_layout, out_layout = str(attrs.data_layout), str(attrs.kernel_layout), str(attrs.out_layout)
    geo = geometry_of(call)
    data = call.args[0]
    if data_layout != "NHWC":
        data = bb.emit(to_layout(data, data_layout, "NHWC", bb))
    dtype = str(data.ty.dtype)
    cfg = topi_accel.conv2d_config(geo)
    kernel = pack_weight(bb, call.args[1], kernel_layout, "OHWI", topi_accel.kernel_pack_map(cfg))
    out = kernel_call(
        bb,
        topi_accel.conv2d_nhwc_ohwi_func(geo, cfg, dtype),
        "conv2d_nhwc_ohwi",
        "conv2d_nhwc_ohwi.accel",
        [data, kernel],
        relax.TensorType([geo.batch, geo.out_h, geo.out_w, geo.out_c], dtype),
    )
    if out_layout == "NHWC":
        return out
    return to_layout(bb.emit(out), "NHWC", out_layout, bb)
