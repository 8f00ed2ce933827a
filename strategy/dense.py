"""relax.matmul implementations for the accel target.

A matmul whose right operand is a 2-D [in, out] matrix is a dense layer:
PyTorch's nn.Linear arrives as ``matmul(x, permute_dims(W))``, which is
exactly that once the transpose of the constant W is folded. A matmul of two
batches of matrices (attention's Q @ K^T and P @ V) is a batch_matmul_kn.
"""

from __future__ import annotations

import math

from tvm import relax, topi

import topi_accel

from .dispatch import kernel_call
from .layout import dtype_reason, pack_weight, static_shape
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
    return dtype_reason(call, SUPPORTED_DTYPES)


def _reshape(bb: relax.BlockBuilder, x: relax.Expr, shape: list[int]) -> relax.Expr:
    """A reshape kernel call, which the VM turns into a view (RewriteDataflowReshape)."""
    return bb.call_te(topi.reshape, x, shape, primfunc_name_hint="reshape")


@register("relax.matmul", "dense_kn.accel", condition=dense_condition)
def dense_kn_accel(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """Pack w and call the kernel on x's rows as they are, so that an epilogue (a residual add)
    fuses into it; x is flattened to 2-D (and the result reshaped) only where a register tile
    of rows would span two of its leading axes."""
    data, weight = call.args
    data_shape = static_shape(data)
    k, n = static_shape(weight)
    rows = data_shape[:-1]
    m = math.prod(rows)
    dtype = str(data.ty.dtype)
    topi_accel.check_dense([m, data_shape[-1]], [k, n], dtype)
    cfg = topi_accel.dense_config(m, n)
    flatten = not topi_accel.dense.keeps_rows(rows, cfg)
    kernel_rows = (m,) if flatten else tuple(rows)
    if flatten:
        data = bb.emit(_reshape(bb, data, [m, k]))
    packed = pack_weight(bb, weight, "KN", "KN", topi_accel.weight_pack_map(cfg))
    out = kernel_call(
        bb,
        topi_accel.dense_kn_func(kernel_rows, k, n, cfg, dtype=dtype),
        "dense_kn",
        "dense_kn.accel",
        [data, packed],
        relax.TensorType([*kernel_rows, n], dtype),
    )
    if not flatten:
        return out
    return _reshape(bb, bb.emit(out), rows + [n])


def batch_matmul_condition(call: relax.Call) -> str | None:
    """batch_matmul_kn.accel takes float32 a [..., M, K] @ b [..., K, N] with equal batch axes."""
    a, b = call.args
    a_shape, b_shape = static_shape(a), static_shape(b)
    if a_shape is None or b_shape is None:
        return "symbolic shapes are not supported"
    if len(b_shape) < 3:
        return f"right operand has rank {len(b_shape)}; batch_matmul_kn needs a batch of matrices"
    if a_shape[:-2] != b_shape[:-2]:
        return f"batch axes {a_shape[:-2]} and {b_shape[:-2]} differ (broadcasting is not supported)"
    return dtype_reason(call, SUPPORTED_DTYPES)


@register("relax.matmul", "batch_matmul_kn.accel", condition=batch_matmul_condition)
def batch_matmul_kn_accel(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """Flatten the operands' batch axes (views); the kernel writes the result with them, so
    that an epilogue (attention's scaling) fuses into it."""
    a, b = call.args
    a_shape, b_shape = static_shape(a), static_shape(b)
    (m, k), n = a_shape[-2:], b_shape[-1]
    batch = tuple(a_shape[:-2])
    dtype = str(a.ty.dtype)
    if len(batch) != 1:
        a = bb.emit(_reshape(bb, a, [math.prod(batch), m, k]))
        b = bb.emit(_reshape(bb, b, [math.prod(batch), k, n]))
    cfg = topi_accel.batch_matmul_config(m, n)
    return kernel_call(
        bb,
        topi_accel.batch_matmul_kn_func(batch, m, k, n, cfg, dtype),
        "batch_matmul_kn",
        "batch_matmul_kn.accel",
        [a, b],
        relax.TensorType([*batch, m, n], dtype),
    )
