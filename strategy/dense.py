"""relax.matmul implementations for the accel target.

A matmul whose right operand is a 2-D [in, out] matrix is a dense layer:
PyTorch's nn.Linear arrives as ``matmul(x, permute_dims(W))``, which is
exactly that once the transpose of the constant W is folded.
"""

from __future__ import annotations

import math

from tvm import relax, topi

import topi_accel

from .dispatch import kernel_call
from .layout import pack_weight, static_shape
from .registry import register

SUPPORTED_DTYPES = topi_accel.dense.SUPPORTED_DTYPES


def dense_condition(call: relax.Call) -> str | None:
    """dense_kn.accel takes float32 x [..., K] @ w [K, N] with static shapes."""
    data, weight = call.args
    data_shape, weight_shape = static_shape(data), static_shape(weight)
    if data_shape is None or weight_shape is None:
        return "symbolic shapes are not supported"
    if len(weight_shape) != 2:
        return f"right operand has rank {len(weight_shape)}; dense_kn needs a 2-D [in, out] weight"
    dtypes = {str(data.ty.dtype), str(weight.ty.dtype)}
    if call.attrs.out_dtype is not None and str(call.attrs.out_dtype) not in ("", "void"):
        dtypes.add(str(call.attrs.out_dtype))
    if not dtypes <= set(SUPPORTED_DTYPES):
        return f"dtype {'/'.join(sorted(dtypes))} is not supported (supported: {', '.join(SUPPORTED_DTYPES)})"
    return None


def _reshape(bb: relax.BlockBuilder, x: relax.Expr, shape: list[int]) -> relax.Expr:
    """A reshape kernel call, which the VM turns into a view (RewriteDataflowReshape)."""
    return bb.call_te(topi.reshape, x, shape, primfunc_name_hint="reshape")


@register("relax.matmul", "dense_kn.accel", condition=dense_condition)
def dense_kn_accel(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """Flatten the rows of x to 2-D, pack w, call the kernel, restore the leading axes."""
    data, weight = call.args
    data_shape = static_shape(data)
    k, n = static_shape(weight)
    m = math.prod(data_shape[:-1])
    dtype = str(data.ty.dtype)
    topi_accel.check_dense([m, data_shape[-1]], [k, n], dtype)
    if len(data_shape) != 2:
        data = bb.emit(_reshape(bb, data, [m, k]))
    cfg = topi_accel.dense_config(m, n)
    packed = pack_weight(bb, weight, "KN", "KN", topi_accel.weight_pack_map(cfg))
    out = kernel_call(
        bb,
        topi_accel.dense_kn_func(m, k, n, cfg, dtype=dtype),
        "dense_kn",
        "dense_kn.accel",
        [data, packed],
        relax.TensorType([m, n], dtype),
    )
    if len(data_shape) == 2:
        return out
    return _reshape(bb, bb.emit(out), data_shape[:-1] + [n])
