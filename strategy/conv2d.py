"""relax.nn.conv2d implementations for the accel target."""

from __future__ import annotations

import tvm
from tvm import relax

import topi_accel

from .dispatch import kernel_call
from .layout import (
    KernelDims,
    constant_in,
    dtype_reason,
    is_permutation,
    pack_weight,
    static_shape,
    symbolic_axes,
    tensor_shape,
    to_layout,
)
from .registry import register

SUPPORTED_DTYPES = topi_accel.conv2d.SUPPORTED_DTYPES


def layout_reason(call: relax.Call, data_axes: str, kernel_axes: str) -> str | None:
    """None when a convolution `call` has any plain order of `data_axes` / `kernel_axes`
    (its output too), else why not."""
    attrs = call.attrs
    for what, layout, axes in (
        ("data_layout", attrs.data_layout, data_axes),
        ("kernel_layout", attrs.kernel_layout, kernel_axes),
        ("out_layout", attrs.out_layout, data_axes),
    ):
        if not is_permutation(str(layout), axes):
            return f"{what} {layout} is not a plain order of {axes} (blocked layouts are not supported)"
    return None


def plain_layout_condition(call: relax.Call, data_axes: str, kernel_axes: str) -> str | None:
    """None when a convolution `call` has any plain order of `data_axes` / `kernel_axes`
    (its output too), float32 data, a static kernel and static data but for a symbolic
    batch (N); else why not."""
    reason = layout_reason(call, data_axes, kernel_axes) or dtype_reason(call, SUPPORTED_DTYPES)
    if reason is not None:
        return reason
    data, kernel = call.args
    return shape_reason(data, kernel, str(call.attrs.data_layout))


def shape_reason(data: relax.Expr, kernel: relax.Expr, data_layout: str) -> str | None:
    """None when `kernel`'s shape is static and `data`'s is but for its batch axis, else why not."""
    data_shape = tensor_shape(data)
    if data_shape is None or static_shape(kernel) is None:
        return "symbolic kernel shapes or data of unknown shape are not supported"
    symbolic = [data_layout[a] for a in symbolic_axes(data_shape)]
    if symbolic and symbolic != ["N"]:
        dims = ", ".join(f"{data_layout[a]}={data_shape[a]}" for a in symbolic_axes(data_shape))
        return f"symbolic data axes ({dims}) are not supported (only a symbolic batch N)"
    return None


def conv2d_condition(call: relax.Call) -> str | None:
    """conv2d_nhwc_ohwi.accel takes any plain layout of float32 data with static shapes but
    for a symbolic batch."""
    return plain_layout_condition(call, "NCHW", "OIHW")


def batch_of(call: relax.Call):
    """The batch of a convolution call's data (axis N of its data layout): an int, or the PrimExpr
    of a symbolic batch."""
    return tensor_shape(call.args[0])[str(call.attrs.data_layout).index("N")]


def static_data_shape(call: relax.Call) -> list[int]:
    """The data's shape with a symbolic batch taken as REPRESENTATIVE_BATCH (the kernel's tiles
    are those of that static size)."""
    shape = tensor_shape(call.args[0])
    n = str(call.attrs.data_layout).index("N")
    return [
        topi_accel.symbolic.REPRESENTATIVE_BATCH if a == n and not isinstance(d, int) else d
        for a, d in enumerate(shape)
    ]


def nhwc_ohwi_shapes(call: relax.Call) -> tuple[list[int], list[int]]:
    """The NHWC data and OHWI kernel shapes of a conv2d call in any plain layout (a symbolic
    batch as REPRESENTATIVE_BATCH)."""
    data_shape, kernel_shape = static_data_shape(call), static_shape(call.args[1])
    data_layout, kernel_layout = str(call.attrs.data_layout), str(call.attrs.kernel_layout)
    data = [data_shape[data_layout.index(axis)] for axis in "NHWC"]
    kernel = [kernel_shape[kernel_layout.index(axis)] for axis in "OHWI"]
    return data, kernel


def geometry_of(call: relax.Call) -> topi_accel.Conv2DGeometry:
    """The conv2d_nhwc_ohwi geometry of a conv2d call in any plain layout (a symbolic batch
    as REPRESENTATIVE_BATCH)."""
    attrs = call.attrs
    return topi_accel.conv2d_geometry(
        *nhwc_ohwi_shapes(call),
        attrs.strides,
        attrs.padding,
        attrs.dilation,
        attrs.groups,
        str(call.args[0].ty.dtype),
    )


def kernel_batch(call: relax.Call, dims: KernelDims):
    """The batch argument of the kernel builders: None for a static batch, else the graph's
    batch expression as `dims` copies it."""
    batch = batch_of(call)
    return None if isinstance(batch, int) else dims(batch)


def nhwc_call(
    bb: relax.BlockBuilder,
    call: relax.Call,
    geo,
    make_weights,
    func,
    name: str,
    dims: KernelDims,
    out_dtype: str | None = None,
    data_layout: str = "NHWC",
) -> relax.Expr:
    """Convert data to `data_layout` (the one `func` takes), call kernel `func` (named `name`)
    on it and the weight arguments from `make_weights()` (emitted after the data's transpose),
    convert the result (`out_dtype`, default the data's; NHWC) to out_layout."""
    attrs = call.attrs
    data = call.args[0]
    if str(attrs.data_layout) != data_layout:
        data = bb.emit(to_layout(data, str(attrs.data_layout), data_layout, bb))
    dtype = out_dtype or str(data.ty.dtype)
    out = kernel_call(
        bb,
        func,
        name,
        f"{name}.accel",
        [data, *make_weights(), *dims.scalar_args(func)],
        relax.TensorType([batch_of(call), geo.out_h, geo.out_w, geo.out_c], dtype),
    )
    if str(attrs.out_layout) == "NHWC":
        return out
    return to_layout(bb.emit(out), "NHWC", str(attrs.out_layout), bb)


def reads_nchw(call: relax.Call) -> bool:
    """Whether conv2d_nhwc_ohwi.accel's kernel reads this call's data as it is, NCHW, with no
    transpose before it (topi_accel.nchw_data_reason: a model's first conv, on the image)."""
    return str(call.attrs.data_layout) == "NCHW" and topi_accel.nchw_data_reason(geometry_of(call)) is None


@register("relax.nn.conv2d", "conv2d_nhwc_ohwi.accel", condition=conv2d_condition)
def conv2d_nhwc_ohwi_accel(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """Convert data to NHWC (unless the kernel `reads_nchw`) and weights to the packed OHWI
    kernel layout, call the kernel, convert the result to out_layout."""
    geo = geometry_of(call)
    cfg = topi_accel.conv2d_config(geo)
    dims = KernelDims()
    layout = "NCHW" if reads_nchw(call) else "NHWC"
    func = topi_accel.conv2d_nhwc_ohwi_func(geo, cfg, str(call.args[0].ty.dtype), kernel_batch(call, dims), layout)
    return nhwc_call(
        bb,
        call,
        geo,
        lambda: [pack_weight(bb, call.args[1], str(call.attrs.kernel_layout), "OHWI", topi_accel.kernel_pack_map(cfg))],
        func,
        "conv2d_nhwc_ohwi",
        dims,
        data_layout=layout,
    )


def winograd_condition(call: relax.Call) -> str | None:
    """conv2d_winograd.accel takes what conv2d_nhwc_ohwi.accel takes, when the conv is 3x3,
    stride 1, undilated and ungrouped, its output is large enough for the transforms to pay
    (topi_accel.winograd_condition), and the weights are a constant (transformed at compile time)."""
    reason = conv2d_condition(call)
    if reason is not None:
        return reason
    if not isinstance(call.args[1], tvm.ir.expr.Constant):
        return "the weights are not a constant (Winograd transforms them at compile time)"
    return topi_accel.winograd_condition(geometry_of(call))


@register("relax.nn.conv2d", "conv2d_winograd.accel", condition=winograd_condition, plevel=15)
def conv2d_winograd_accel(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """Transform the constant weights now (Winograd's G g G^T, packed), call the kernel."""
    geo, dims = geometry_of(call), KernelDims()
    batch = kernel_batch(call, dims)
    cfg = topi_accel.winograd_config(geo, symbolic_batch=batch is not None)
    ohwi = constant_in(call.args[1], str(call.attrs.kernel_layout), "OHWI")
    func = topi_accel.conv2d_winograd_func(geo, cfg, str(call.args[0].ty.dtype), batch)
    return nhwc_call(
        bb, call, geo, lambda: [relax.const(topi_accel.transform_kernel(ohwi, cfg))], func, "conv2d_winograd", dims
    )
