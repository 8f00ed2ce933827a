"""strassen.accel: a large product with a constant weight as Strassen's seven half-size products.

Opt-in (``accel_target.build(..., strassen=True)``, `registry.Options`): the result differs
from the plain product by rounding (its error bound is a small multiple of the plain
product's), and the weight takes 7/4 of its memory.

``x @ W`` with x [*rows, K] (their product M) and W a constant [K, N], M, K and N even,
splits each operand into 2x2 blocks and computes

    P1 = (A11 + A22) (B11 + B22)    P2 = (A21 + A22) B11    P3 = A11 (B12 - B22)
    P4 = A22 (B21 - B11)            P5 = (A11 + A12) B22    P6 = (A21 - A11) (B11 + B12)
    P7 = (A12 - A22) (B21 + B22)

    C11 = P1 + P4 - P5 + P7    C12 = P3 + P5    C21 = P2 + P4    C22 = P1 - P2 + P3 + P6

seven products of an eighth of the work each instead of eight: 7/8 of the multiply-adds. The
weight's seven sums are computed once at compile time. Three kernels run: `strassen_lefts`
stacks the seven left operands [7, M/2, K/2] in one pass over x, `batch_dense_kn` computes the
seven products (each weight packed as dense_kn's), and `strassen_combine` sums them into the
four blocks of the result, [*rows, N], taking whatever elementwise op follows the product (a
bias, GELU, a residual add) into its write-back. One level only: each further level halves
the rows again, and the products get too small to keep the register tiles busy.
"""

from __future__ import annotations

import math

import numpy as np
import tvm
from tvm import relax

import topi_accel

from .dispatch import kernel_call
from .layout import KernelDims, array_constant, constant_array, pack_weight, static_shape
from .registry import options, register

IMPL = "strassen.accel"
# The least rows (the product of the data's leading axes) and the least inputs and outputs
# (K and N) of a product taken in Strassen's form: below them the seven products are too
# small for the register tiles to make up for the sums around them.
MIN_ROWS = 128
MIN_FEATURES = 768


def weight_sums(w: np.ndarray) -> list[np.ndarray]:
    """The seven right operands of Strassen's products, for W [K, N] (K, N even)."""
    k, n = w.shape[0] // 2, w.shape[1] // 2
    b11, b12, b21, b22 = w[:k, :n], w[:k, n:], w[k:, :n], w[k:, n:]
    return [b11 + b22, b11, b12 - b22, b21 - b11, b22, b11 + b12, b21 + b22]


def strassen_condition(call: relax.Call) -> str | None:
    """Asked for (`Options.strassen`); float32 x [*rows, K] @ a constant w [K, N], every extent
    static and even, at least MIN_ROWS x MIN_FEATURES x MIN_FEATURES."""
    if not options().strassen:
        return "not asked for (build(..., strassen=True))"
    data, weight = call.args
    if not isinstance(weight, tvm.ir.expr.Constant) or len(weight.ty.shape) != 2:
        return "the right operand is not a constant matrix"
    shape = static_shape(data)
    if shape is None or len(shape) < 2 or any(str(e.ty.dtype) != "float32" for e in (call, data, weight)):
        return "not float32 data of static shape"
    m, (k, n) = math.prod(shape[:-1]), (int(d) for d in weight.ty.shape)
    if any(v % 2 for v in (m, k, n)) or m < MIN_ROWS or min(k, n) < MIN_FEATURES:
        return f"{m}x{k}x{n} is not even or under {MIN_ROWS}x{MIN_FEATURES}x{MIN_FEATURES}"
    return None


@register("relax.matmul", IMPL, condition=strassen_condition, plevel=15)
def strassen_accel(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """The three kernels of the module's docstring, for x [*rows, K] @ w [K, N]."""
    x, weight = call.args
    shape, w, dtype = static_shape(x), constant_array(weight), str(x.ty.dtype)
    m, k, n = math.prod(shape[:-1]), shape[-1], w.shape[1]
    parallel = topi_accel.cpu_knobs().parallel  # (of the target in scope)
    flat = bb.emit(relax.op.reshape(x, [m, k])) if len(shape) > 2 else x
    lefts = topi_accel.strassen_lefts_func(m // 2, k // 2, dtype, parallel)
    stacked = bb.emit(
        kernel_call(bb, lefts, "strassen_lefts", IMPL, [flat], relax.TensorType([7, m // 2, k // 2], dtype))
    )
    cfg = topi_accel.dense_config(m // 2, n // 2)
    sums = array_constant(np.stack(weight_sums(w)))
    packed = pack_weight(bb, sums, "BKN", "BKN", topi_accel.weight_pack_map(cfg, batch_axes=1))
    func = topi_accel.batch_dense_kn_func(7, m // 2, k // 2, n // 2, cfg, dtype)
    args = [stacked, packed, *KernelDims().scalar_args(func)]
    products = bb.emit(
        kernel_call(bb, func, "batch_dense_kn", IMPL, args, relax.TensorType([7, m // 2, n // 2], dtype))
    )
    combine = topi_accel.strassen_combine_func(tuple(shape[:-1]), n, dtype, parallel)
    return kernel_call(bb, combine, "strassen_combine", IMPL, [products], relax.TensorType([*shape[:-1], n], dtype))
