"""The replacements QuantizeQDQ builds for the QDQ forms that quantize_patterns reads.

Each builder takes the rewritten operands (``data``: the integer activation as the new function
names it) and a BlockBuilder, emits the intermediate values and returns the last expression
unbound, for the rewriter to bind to the variable it replaces.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from .quantize_patterns import FLOAT, MATMUL, IntegerKernel, Movement, QParams, Requantize, integer_limits


def channel_const(values: np.ndarray, kernel: IntegerKernel) -> tvm.ir.expr.Constant:
    """Per-output-channel values as a constant broadcasting over the output ([1, oc, 1, 1] in NCHW, [oc] last)."""
    shape = [-1]
    if kernel.channel_axis != kernel.out_ndim - 1:
        shape = [1] * kernel.out_ndim
        shape[kernel.channel_axis] = -1
    return relax.const(np.ascontiguousarray(values, dtype=FLOAT).reshape(shape))


def emit_accumulator(bb: relax.BlockBuilder, kernel: IntegerKernel, data: relax.Expr) -> relax.Expr:
    """The int32 conv2d / matmul of the integer activation `data` and the int8 weight (emitted);
    a conv's padding becomes an explicit pad with the activation's zero point."""
    weight = relax.const(kernel.weight)
    call = kernel.call
    if call.op.name == MATMUL:
        return bb.emit(relax.op.matmul(data, weight, out_dtype="int32"))
    attrs, padding = call.attrs, [int(p) for p in call.attrs.padding]
    zero_point = kernel.x.zp
    if zero_point != 0 and any(padding):
        layout = str(attrs.data_layout)
        widths = {"H": (padding[0], padding[2]), "W": (padding[1], padding[3])}
        pad_width = [w for axis in layout for w in widths.get(axis, (0, 0))]
        data = bb.emit(relax.op.nn.pad(data, pad_width, pad_value=float(zero_point)))
        padding = [0, 0, 0, 0]
    conv = relax.op.nn.conv2d(
        data,
        weight,
        strides=attrs.strides,
        padding=padding,
        dilation=attrs.dilation,
        groups=attrs.groups,
        data_layout=attrs.data_layout,
        kernel_layout=attrs.kernel_layout,
        out_layout=attrs.out_layout,
        out_dtype="int32",
    )
    return bb.emit(conv)


def dequantized_result(
    bb: relax.BlockBuilder, kernel: IntegerKernel, data: relax.Expr, bias: np.ndarray, divisor: float = 1.0
) -> relax.Expr:
    """(astype(acc) * scale + bias') / divisor as astype -> multiply -> add, float32: the kernel's
    float result with `bias` (per output channel) added, the zero point's zp_x * sum(w) folded
    into bias'."""
    scale = kernel.x.s * kernel.w_scale.astype(np.float64)
    folded = bias - kernel.x.zp * scale * kernel.w_sum
    acc = emit_accumulator(bb, kernel, data)
    as_float = bb.emit(relax.op.astype(acc, FLOAT))
    scaled = bb.emit(relax.op.multiply(as_float, channel_const(scale / divisor, kernel)))
    return relax.op.add(scaled, channel_const(folded / divisor, kernel))


def requantized(bb: relax.BlockBuilder, plan: Requantize, data: relax.Expr) -> relax.Expr:
    """The kernel's result in `plan.y`'s integers: round -> + zp_y -> clip(lo, hi) -> astype."""
    y = plan.y
    value = bb.emit(dequantized_result(bb, plan.kernel, data, plan.bias, y.s))
    rounded = bb.emit(relax.op.round(value))
    shifted = rounded
    if y.zp != 0:
        shifted = bb.emit(relax.op.add(rounded, relax.const(float(y.zp), FLOAT)))
    clipped = bb.emit(relax.op.clip(shifted, float(plan.lo), float(max(plan.lo, plan.hi))))
    return relax.op.astype(clipped, y.dtype)


def integer_movement(plan: Movement, sources: list, args: list) -> relax.Expr:
    """The op of `plan` on the integer `sources` (rewritten), its other operands `args`
    (rewritten); a pad pads with its value quantized (zero: the zero point)."""
    op, y = plan.op, plan.y
    if op is None:
        return sources[0]
    if op.op.name == "relax.concat":
        return relax.op.concat(relax.Tuple(sources), axis=op.attrs.axis)
    if op.op.name == "relax.nn.pad":
        attrs = op.attrs
        quantized = np.round(float(attrs.pad_value) / y.s) + y.zp
        pad_value = float(np.clip(quantized, *integer_limits(y.dtype)))
        return relax.op.nn.pad(sources[0], [int(w) for w in attrs.pad_width], str(attrs.pad_mode), pad_value)
    return relax.Call(op.op, [sources[0]] + args, op.attrs)


def quantize_elementwise(bb: relax.BlockBuilder, data: relax.Expr, y: QParams) -> relax.Expr:
    """clip(round(x / scale) + zp, dtype limits) -> astype, as elementwise ops."""
    ndim = data.ty.ndim
    scaled = bb.emit(relax.op.divide(data, relax.const(y.along(y.scale, ndim), FLOAT)))
    rounded = bb.emit(relax.op.round(scaled))
    shifted = rounded
    if y.zero_point.any():
        zero_point = relax.const(y.along(y.zero_point, ndim).astype(FLOAT))
        shifted = bb.emit(relax.op.add(rounded, zero_point))
    lo, hi = integer_limits(y.dtype)
    return relax.op.astype(bb.emit(relax.op.clip(shifted, float(lo), float(hi))), y.dtype)


def dequantize_elementwise(bb: relax.BlockBuilder, data: relax.Expr, params: QParams, out_dtype: str) -> relax.Expr:
    """(astype(x) - zp) * scale as elementwise ops, cast to `out_dtype`."""
    ndim = data.ty.ndim
    as_float = bb.emit(relax.op.astype(data, FLOAT))
    centred = as_float
    if params.zero_point.any():
        zero_point = relax.const(params.along(params.zero_point, ndim).astype(FLOAT))
        centred = bb.emit(relax.op.subtract(as_float, zero_point))
    result = relax.op.multiply(centred, relax.const(params.along(params.scale, ndim), FLOAT))
    return result if out_dtype == FLOAT else relax.op.astype(bb.emit(result), out_dtype)
