"""relax.matmul implementations for the accel target.

A matmul whose right operand is a 2-D [in, out] matrix is a dense layer:
PyTorch's nn.Linear arrives as ``matmul(x, permute_dims(W))``, which is
exactly that once the transpose of the constant W is folded. A matmul of two
batches of matrices (attention's Q @ K^T and P @ V) is a batch_matmul_kn; one whose
right operand is a constant batch [B, K, N] a batch_dense_kn, its weights packed at compile
time (the kernel strategy.strassen runs Strassen's seven products on).
"""

from __future__ import annotations

import contextvars
import math
from dataclasses import dataclass

import tvm
from tvm import relax

import topi_accel

from .dispatch import kernel_call
from .layout import KernelDims, dtype_reason, pack_weight, reshape, same_dims, static_shape, tensor_shape
from .registry import register

SUPPORTED_DTYPES = topi_accel.dense.SUPPORTED_DTYPES


def _call(bb: relax.BlockBuilder, func, dims: KernelDims, name: str, args, out_type) -> relax.Expr:
    """kernel_call of `func` with the graph's shape variables its scalar parameters take."""
    return kernel_call(bb, func, name, f"{name}.accel", [*args, *dims.scalar_args(func)], out_type)


def dense_condition(call: relax.Call) -> str | None:
    """dense_kn.accel takes float32 x [..., K] @ w [K, N] with K and the weight static; the
    rows (x's leading axes) may be symbolic."""
    data, weight = call.args
    data_shape, weight_shape = tensor_shape(data), static_shape(weight)
    if data_shape is None or weight_shape is None:
        return "a symbolic weight shape or data of unknown shape is not supported"
    if len(weight_shape) != 2:
        return f"right operand has rank {len(weight_shape)}; dense_kn needs a 2-D [in, out] weight"
    if not isinstance(data_shape[-1], int):
        return f"symbolic in_features K={data_shape[-1]} is not supported (only symbolic rows)"
    return dtype_reason(call, SUPPORTED_DTYPES)


def on_rows(bb: relax.BlockBuilder, data: relax.Expr, k: int, n: int, cfg, call_kernel) -> relax.Expr:
    """`call_kernel(x, rows)` on data [*rows, K] as it is, so that an epilogue (a residual add)
    fuses into the kernel; on data flattened to [M, K] (and the result reshaped to [*rows, N])
    only where `keeps_rows` says a register tile of rows would span two of its leading axes,
    or a symbolic axis is not the first."""
    rows = tensor_shape(data)[:-1]
    if topi_accel.dense.keeps_rows(rows, cfg):
        return call_kernel(data, tuple(rows))
    m = math.prod(rows)
    out = call_kernel(bb.emit(reshape(bb, data, [m, k])), (m,))
    return reshape(bb, bb.emit(out), [*rows, n])


@register("relax.matmul", "dense_kn.accel", condition=dense_condition)
def dense_kn_accel(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """Pack w and call the kernel on x's rows (`on_rows`)."""
    data, weight = call.args
    data_shape = tensor_shape(data)
    k, n = static_shape(weight)
    m = math.prod(data_shape[:-1])
    dtype = str(data.ty.dtype)
    topi_accel.check_dense([m, data_shape[-1]], [k, n], dtype)
    cfg = topi_accel.dense_config(m, n, rows=tuple(data_shape[:-1]))
    dims = KernelDims()

    def dense_kn(x: relax.Expr, rows: tuple) -> relax.Expr:
        packed = pack_weight(bb, weight, "KN", "KN", topi_accel.weight_pack_map(cfg))
        func = topi_accel.dense_kn_func(tuple(dims(r) for r in rows), k, n, cfg, dtype=dtype)
        return _call(bb, func, dims, "dense_kn", [x, packed], relax.TensorType([*rows, n], dtype))

    return on_rows(bb, data, k, n, cfg, dense_kn)


def batch_dense_condition(call: relax.Call) -> str | None:
    """batch_dense_kn.accel takes float32 x [B, M, K] @ w [B, K, N] with w a constant (B
    weights, packed at compile time) and every extent static."""
    data, weight = call.args
    if not isinstance(weight, tvm.ir.expr.Constant):
        return "the right operand is not a constant (batch_dense_kn packs its weights at compile time)"
    data_shape, weight_shape = static_shape(data), static_shape(weight)
    if data_shape is None or len(data_shape) != 3 or len(weight_shape) != 3:
        return f"operands {data_shape} x {weight_shape} are not [B, M, K] x [B, K, N] of static extents"
    if data_shape[0] != weight_shape[0] or data_shape[2] != weight_shape[1]:
        return f"operands {data_shape} x {weight_shape} differ in the batch or the inner dimension"
    return dtype_reason(call, SUPPORTED_DTYPES)


@register("relax.matmul", "batch_dense_kn.accel", condition=batch_dense_condition, plevel=11)
def batch_dense_kn_accel(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """Pack the B weights (each as dense_kn's) and call the kernel."""
    data, weight = call.args
    (batch, m, k), n = static_shape(data), static_shape(weight)[2]
    dtype = str(data.ty.dtype)
    cfg = topi_accel.dense_config(m, n)
    packed = pack_weight(bb, weight, "BKN", "BKN", topi_accel.weight_pack_map(cfg, batch_axes=1))
    func = topi_accel.batch_dense_kn_func(batch, m, k, n, cfg, dtype)
    return _call(bb, func, KernelDims(), "batch_dense_kn", [data, packed], relax.TensorType([batch, m, n], dtype))


def batch_matmul_condition(call: relax.Call) -> str | None:
    """batch_matmul_kn.accel takes float32 a [..., M, K] @ b [..., K, N] with equal batch axes;
    any of them, M, K and N may be symbolic."""
    a, b = call.args
    a_shape, b_shape = tensor_shape(a), tensor_shape(b)
    if a_shape is None or b_shape is None:
        return "operands of unknown shape are not supported"
    if len(b_shape) < 3:
        return f"right operand has rank {len(b_shape)}; batch_matmul_kn needs a batch of matrices"
    if not same_dims(a_shape[:-2], b_shape[:-2]):
        return f"batch axes {a_shape[:-2]} and {b_shape[:-2]} differ (broadcasting is not supported)"
    if not same_dims(a_shape[-1:], b_shape[-2:-1]):
        return f"inner dimensions {a_shape[-1]} and {b_shape[-2]} differ"
    return dtype_reason(call, SUPPORTED_DTYPES)


@dataclass
class MatmulViews:
    """What accel_target's FoldViews asks of one batch matmul's legalization: an operand read
    through layout ops from another tensor, as (source, steps of topi_accel.views.View), and
    the result written with its axes permuted, as (batch axes, permutation). `permuted`: set
    when the kernel made writes its result so (it may still read an operand as a copy, where
    its view would divide the kernel's indices)."""

    a: tuple | None = None
    b: tuple | None = None
    out: tuple | None = None
    permuted: bool = False


# the views asked of the matmul being legalized (set around that one dispatch)
REQUESTED_VIEWS: contextvars.ContextVar[MatmulViews | None] = contextvars.ContextVar("accel_views", default=None)


def _kernel_view(source: relax.Expr, steps: tuple, shape: tuple, dims: KernelDims) -> topi_accel.View:
    """A View of `source` whose `steps` end in `shape` (the kernel's 3-D operand), the graph's
    shape variables as the kernel's (`dims`)."""
    mapped = tuple(
        (step[0], tuple(dims(d) for d in step[1])) if step[0] in ("reshape", "broadcast_to") else step for step in steps
    )
    view = topi_accel.View(tuple(dims(d) for d in tensor_shape(source)), mapped)
    return view.then(("reshape", shape))


def _read_views(
    bb: relax.BlockBuilder, requested: MatmulViews, operands: list, shapes: list, dims: KernelDims
) -> tuple[list, list]:
    """(the kernel's arguments, the View of each or None): a requested view where the kernel
    reads it without dividing its indices (topi_accel.views.reads), else the operand
    flattened to 3-D as it is."""
    args, views = [], []
    for operand, requested_view, shape in zip(operands, (requested.a, requested.b), shapes):
        view = None
        if requested_view is not None:
            source, steps = requested_view
            candidate = _kernel_view(source, steps, tuple(dims(d) for d in shape), dims)
            if topi_accel.views.reads(candidate).direct:
                view, operand = candidate, source
        if view is None and len(tensor_shape(operand)) != 3:
            operand = bb.emit(reshape(bb, operand, list(shape)))
        args.append(operand)
        views.append(view)
    return args, views


@register("relax.matmul", "batch_matmul_kn.accel", condition=batch_matmul_condition)
def batch_matmul_kn_accel(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """Flatten the operands' batch axes (views); the kernel writes the result with them, so
    that an epilogue (attention's scaling) fuses into it. Where FoldViews asks (REQUESTED_VIEWS),
    the kernel reads an operand from the tensor it is a view of and writes its result permuted."""
    a, b = call.args
    a_shape, b_shape = tensor_shape(a), tensor_shape(b)
    (m, k), n = a_shape[-2:], b_shape[-1]
    batch = a_shape[:-2]
    bs = math.prod(batch)
    dtype = str(a.ty.dtype)
    requested = REQUESTED_VIEWS.get() or MatmulViews()
    dims = KernelDims()
    (a, b), (a_view, b_view) = _read_views(bb, requested, [a, b], [(bs, m, k), (bs, k, n)], dims)
    out_batch, out_axes = requested.out if requested.out is not None else (batch, None)
    shape = [*out_batch, m, n]
    out_shape = shape if out_axes is None else [shape[axis] for axis in out_axes]
    cfg = topi_accel.batch_matmul_config(m, n)
    func = topi_accel.batch_matmul_kn_func(
        tuple(dims(d) for d in out_batch),
        dims(m),
        dims(k),
        dims(n),
        cfg,
        dtype,
        a_view,
        b_view,
        None if out_axes is None else tuple(out_axes),
    )
    requested.permuted = out_axes is not None
    return _call(bb, func, dims, "batch_matmul_kn", [a, b], relax.TensorType(out_shape, dtype))
