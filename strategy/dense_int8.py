"""relax.matmul on integers for the accel target: dense_kn_int8.

The calls that accel_target.passes.quantize makes of quantized dense layers: uint8 or int8
activations [..., in] times a constant int8 weight [in, out] (any transpose folded
already), ``out_dtype="int32"``. The requantize after it becomes the kernel's epilogue.
"""

from __future__ import annotations

import tvm
from tvm import relax

from topi_accel import dense_int8 as kernels

from .conv2d_int8 import INT8_PLEVEL, int8_dtype_reason
from .dense import on_rows
from .dispatch import kernel_call
from .layout import constant_array, map_array, static_shape
from .registry import register

IMPL = "dense_kn_int8.accel"


def dense_int8_condition(call: relax.Call) -> str | None:
    """dense_kn_int8.accel takes uint8/int8 x [..., K] @ a constant int8 w [K, N] -> int32,
    static shapes."""
    reason = int8_dtype_reason(call)
    if reason is not None:
        return reason
    data, weight = call.args
    data_shape, weight_shape = static_shape(data), static_shape(weight)
    if data_shape is None or weight_shape is None:
        return "symbolic shapes are not supported"
    if len(weight_shape) != 2:
        return f"right operand has rank {len(weight_shape)}; dense_kn_int8 needs a 2-D [in, out] weight"
    if not isinstance(weight, tvm.ir.expr.Constant):
        return "the weights are not a constant (int8 kernels are packed at compile time)"
    return None


@register("relax.matmul", IMPL, condition=dense_int8_condition, plevel=INT8_PLEVEL)
def dense_kn_int8_accel(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """Pack w (and, for int8 data on vpdpbusd or vpmaddubsw, its compensation) and call the kernel on x's
    rows (`strategy.dense.on_rows`)."""
    data, weight = call.args
    k, n = static_shape(weight)
    dtype = str(data.ty.dtype)
    m, _, _ = kernels.check_dense_int8(static_shape(data), [k, n], dtype, str(weight.ty.dtype))
    kn = constant_array(weight)  # read once
    cfg = kernels.dense_int8_config(m, n, narrow=kernels.narrow_weights(kn), k=k)
    args = [relax.const(map_array(kernels.weight_pack_map_int8(cfg), kn))]
    if kernels.needs_compensation(dtype, cfg.dot):
        args.append(relax.const(kernels.compensation(kn)))

    def dense_kn_int8(x: relax.Expr, rows: tuple) -> relax.Expr:
        func = kernels.dense_kn_int8_func(rows, k, n, cfg, dtype)
        return kernel_call(bb, func, "dense_kn_int8", IMPL, [x, *args], relax.TensorType([*rows, n], "int32"))

    return on_rows(bb, data, k, n, cfg, dense_kn_int8)
