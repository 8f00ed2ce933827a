"""relax.nn.conv2d on integers for the accel target: conv2d_nhwc_ohwi_int8.

The calls that accel_target.passes.quantize makes of quantized convolutions: uint8 or int8
activations, a constant int8 kernel, ``out_dtype="int32"``; any plain layout (ConvertLayout
makes them NHWC / OHWI), ungrouped or depthwise. The requantize after it is elementwise
Relax, which becomes the kernel's epilogue.
"""

from __future__ import annotations

import tvm
from tvm import relax

from topi_accel import conv2d_int8 as kernels
from topi_accel.dense_int8 import narrow_weights

from .conv2d import layout_reason, nhwc_call, nhwc_ohwi_shapes
from .layout import KernelDims, constant_in, map_array, static_shape
from .registry import register

IMPL = "conv2d_nhwc_ohwi_int8.accel"
# after the float implementations (which decline integers by dtype): a float call's record
# lists no int8 implementation among those skipped
INT8_PLEVEL = 5


def int8_dtype_reason(call: relax.Call) -> str | None:
    """None when `call` multiplies uint8/int8 data by an int8 weight into int32, else why not."""
    data, weight = call.args
    out_dtype = call.attrs.out_dtype  # None or "" (void): the data's dtype
    dtypes = (str(data.ty.dtype), str(weight.ty.dtype), str(out_dtype or "") or str(data.ty.dtype))
    if dtypes[0] not in kernels.DATA_DTYPES or dtypes[1:] != ("int8", "int32"):
        return (
            f"data {dtypes[0]} x weight {dtypes[1]} -> {dtypes[2]} is not supported "
            "(supported: uint8 or int8 data x int8 weight -> int32)"
        )
    return None


def conv2d_int8_condition(call: relax.Call) -> str | None:
    """conv2d_nhwc_ohwi_int8.accel takes uint8/int8 data x a constant int8 kernel -> int32 in
    any plain layout, with static shapes, ungrouped or depthwise."""
    reason = layout_reason(call, "NCHW", "OIHW") or int8_dtype_reason(call)
    if reason is not None:
        return reason
    attrs = call.attrs
    data, kernel = call.args
    data_shape = static_shape(data)
    if data_shape is None or static_shape(kernel) is None:
        return "symbolic shapes are not supported"
    if not isinstance(kernel, tvm.ir.expr.Constant):
        return "the weights are not a constant (int8 kernels are packed at compile time)"
    channels = data_shape[str(attrs.data_layout).index("C")]
    if int(attrs.groups) not in (1, channels):
        return f"groups={int(attrs.groups)} is not supported (supported: 1 and depthwise, groups = {channels})"
    return None


def geometry_of(call: relax.Call):
    """The conv2d_nhwc_ohwi_int8 geometry of a conv2d call in any plain layout."""
    attrs = call.attrs
    data, kernel = call.args
    return kernels.conv2d_int8_geometry(
        *nhwc_ohwi_shapes(call),
        attrs.strides,
        attrs.padding,
        attrs.dilation,
        attrs.groups,
        str(data.ty.dtype),
        str(kernel.ty.dtype),
    )


@register("relax.nn.conv2d", IMPL, condition=conv2d_int8_condition, plevel=INT8_PLEVEL)
def conv2d_nhwc_ohwi_int8_accel(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """Convert data to NHWC, pack the constant kernel (and, for int8 data on vpdpbusd or vpmaddubsw, its
    compensation), call the kernel, convert the int32 result to out_layout."""
    dtype = str(call.args[0].ty.dtype)
    geo = geometry_of(call)
    ohwi = constant_in(call.args[1], str(call.attrs.kernel_layout), "OHWI")  # read once
    cfg = kernels.conv2d_int8_config(geo, narrow=narrow_weights(ohwi))
    func = kernels.conv2d_nhwc_ohwi_int8_func(geo, cfg, dtype)
    weights = [relax.const(map_array(kernels.kernel_pack_map_int8(geo, cfg), ohwi))]
    if kernels.takes_compensation(geo, cfg, dtype):
        weights.append(relax.const(kernels.compensation(ohwi)))
    return nhwc_call(bb, call, geo, lambda: weights, func, kernels.NAME, KernelDims(), out_dtype="int32")
