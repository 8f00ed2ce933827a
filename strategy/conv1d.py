"""relax.nn.conv1d implementations for the accel target."""

from __future__ import annotations

from tvm import relax

import topi_accel

from .conv2d import batch_of, kernel_batch, plain_layout_condition, static_data_shape
from .dispatch import kernel_call
from .layout import KernelDims, pack_weight, static_shape, to_layout
from .registry import register

# the kernel's name: conv1d runs on conv2d_nhwc_ohwi (H = 1), whose write-back takes the epilogues
KERNEL = "conv2d_nhwc_ohwi"


def conv1d_condition(call: relax.Call) -> str | None:
    """conv1d_nwc_owi.accel takes any plain layout of float32 data with static shapes but for
    a symbolic batch."""
    return plain_layout_condition(call, "NCW", "OIW")


def geometry_of(call: relax.Call) -> topi_accel.Conv2DGeometry:
    """The conv1d_nwc_owi geometry (a conv2d with H = 1) of a conv1d call in any plain layout
    (a symbolic batch as REPRESENTATIVE_BATCH)."""
    attrs = call.attrs
    data_shape, kernel_shape = static_data_shape(call), static_shape(call.args[1])
    data_layout, kernel_layout = str(attrs.data_layout), str(attrs.kernel_layout)
    return topi_accel.conv1d_geometry(
        [data_shape[data_layout.index(axis)] for axis in "NWC"],
        [kernel_shape[kernel_layout.index(axis)] for axis in "OWI"],
        attrs.strides,
        attrs.padding,
        attrs.dilation,
        attrs.groups,
        str(call.args[0].ty.dtype),
    )


@register("relax.nn.conv1d", "conv1d_nwc_owi.accel", condition=conv1d_condition)
def conv1d_nwc_owi_accel(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """Convert data to NWC and weights to the packed OWI kernel layout ([O/ob, K, I, ob], at
    compile time for constants), call the kernel, convert the result to out_layout."""
    attrs = call.attrs
    geo = geometry_of(call)
    cfg = topi_accel.conv1d_config(geo)
    data = call.args[0]
    if str(attrs.data_layout) != "NWC":
        data = bb.emit(to_layout(data, str(attrs.data_layout), "NWC", bb))
    kernel = pack_weight(bb, call.args[1], str(attrs.kernel_layout), "OWI", topi_accel.conv1d_kernel_pack_map(cfg))
    dtype = str(data.ty.dtype)
    dims = KernelDims()
    func = topi_accel.conv1d_nwc_owi_func(geo, cfg, dtype, kernel_batch(call, dims))
    out = kernel_call(
        bb,
        func,
        KERNEL,
        "conv1d_nwc_owi.accel",
        [data, kernel, *dims.scalar_args(func)],
        relax.TensorType([batch_of(call), geo.out_w, geo.out_c], dtype),
    )
    if str(attrs.out_layout) == "NWC":
        return out
    return to_layout(bb.emit(out), "NWC", str(attrs.out_layout), bb)
