"""``aten.scaled_dot_product_attention`` as ``softmax(Q @ Kᵀ * scale + mask) @ V`` with plain
``relax.matmul`` (the accel ``batch_matmul_kn`` kernel), for bool or float masks, ``is_causal``
and grouped-query attention. TVM's own converter takes float masks only and emits
``nn.attention``, a kernel of its own.
"""

from __future__ import annotations

import math

import numpy as np
import tvm
from tvm import relax

from strategy.layout import array_constant, constant_array, same_dims, tensor_shape

from .torch_complex import node_arg


def _shape(expr: relax.Expr) -> list:
    """Shape of a tensor expression: ints, and the PrimExpr of a symbolic dimension (a batch, a
    sequence length)."""
    shape = tensor_shape(expr)
    if shape is None:
        raise ValueError(f"accel: scaled_dot_product_attention needs operands of known shape, got {expr.ty}")
    return shape


def _static(dims: list, what: str) -> list[int]:
    """`dims` as ints, else a ValueError naming `what` needs them static."""
    if any(not isinstance(d, int) for d in dims):
        raise ValueError(f"accel: scaled_dot_product_attention with {what} needs static sizes, got {dims}")
    return dims


def _causal_bias(bb: relax.BlockBuilder, length, kv_length, dtype: str) -> relax.Expr:
    """is_causal's additive mask [length, kv_length] (top left aligned, as PyTorch's): -inf above
    the diagonal. A constant for static sizes; for symbolic ones (a decoder exported with a
    symbolic sequence) computed from two aranges: column j masked in row i where j > i."""
    if isinstance(length, int) and isinstance(kv_length, int):
        allowed = np.tril(np.ones((length, kv_length), bool))
        return array_constant(np.where(allowed, 0.0, -np.inf).astype(dtype))
    rows = bb.emit(relax.op.reshape(bb.emit(relax.op.arange(0, length, 1, "int64")), [length, 1]))
    columns = bb.emit(relax.op.arange(0, kv_length, 1, "int64"))
    above = bb.emit(relax.op.greater(columns, rows))
    return bb.emit(relax.op.where(above, relax.const(-np.inf, dtype), relax.const(0.0, dtype)))


def _mask_bias(bb: relax.BlockBuilder, mask: relax.Expr, dtype: str) -> relax.Expr:
    """An attention mask as an additive bias: a bool mask keeps True, drops False
    (computed here when the mask is a constant)."""
    if isinstance(mask, tvm.ir.expr.Constant):
        array = constant_array(mask)
        return array_constant(np.where(array, 0.0, -np.inf).astype(dtype) if array.dtype == bool else array)
    if str(mask.ty.dtype) != "bool":
        return mask
    zero, minus_inf = relax.const(0.0, dtype), relax.const(-np.inf, dtype)
    return bb.emit(relax.op.where(mask, zero, minus_inf))


def _may_mask_whole_rows(bias: relax.Expr) -> bool:
    """Whether an additive bias can be -inf along a whole row (not when it is a constant
    without such a row)."""
    if not isinstance(bias, tvm.ir.expr.Constant):
        return True
    return bool(np.isneginf(constant_array(bias)).all(axis=-1).any())


def _safe_softmax(bb: relax.BlockBuilder, scores: relax.Expr, masked: bool) -> relax.Expr:
    """Softmax over the last axis; a row that is -inf throughout gives zeros, not NaN,
    as in PyTorch's scaled_dot_product_attention (aten._safe_softmax). (TVM's max starts
    from the lowest finite value: that is the maximum of a row of -inf.)"""
    probabilities = bb.emit(relax.op.nn.softmax(scores, axis=-1))
    if not masked:
        return probabilities
    dtype = str(scores.ty.dtype)
    row_max = bb.emit(relax.op.max(scores, axis=-1, keepdims=True))
    dead = bb.emit(relax.op.less_equal(row_max, relax.const(np.finfo(dtype).min, dtype)))
    return bb.emit(relax.op.where(dead, relax.const(0.0, dtype), probabilities))


def _match_heads(bb, query, key_or_value, enable_gqa: bool) -> relax.Expr:
    """Key/value with the query's batch axes: heads repeated (grouped-query attention:
    each kv head serves consecutive query heads) and other batch axes broadcast."""
    q_shape, shape = _shape(query), _shape(key_or_value)
    if enable_gqa and len(shape) >= 3 and not same_dims(shape[-3:-2], q_shape[-3:-2]):
        heads, kv_heads = _static([q_shape[-3], shape[-3]], "grouped-query attention (heads)")
        key_or_value = bb.emit(relax.op.repeat(key_or_value, heads // kv_heads, axis=-3))
        shape = _shape(key_or_value)
    batch = q_shape[:-2]
    if not same_dims(shape[:-2], batch):
        key_or_value = bb.emit(relax.op.broadcast_to(key_or_value, batch + shape[-2:]))
    return key_or_value


def scaled_dot_product_attention(node, importer) -> relax.Expr:
    """aten.scaled_dot_product_attention(q [..., L, E], k [..., S, E], v [..., S, Ev],
    attn_mask=None, dropout_p=0, is_causal=False, *, scale=None, enable_gqa=False)
    -> [..., L, Ev] as softmax(q @ kᵀ * scale + mask) @ v with relax.matmul."""
    bb, env = importer.block_builder, importer.env
    query, key, value = (env[a] for a in node.args[:3])
    mask = node_arg(node, 3, "attn_mask", None)
    dropout = node_arg(node, 4, "dropout_p", 0.0)
    if dropout != 0.0:
        raise ValueError(f"accel: scaled_dot_product_attention with dropout_p={dropout}; supported: 0.0 (inference)")
    dtype = str(query.ty.dtype)
    enable_gqa = node.kwargs.get("enable_gqa", False)
    key, value = (_match_heads(bb, query, t, enable_gqa) for t in (key, value))
    rank = len(_shape(key))
    key_t = bb.emit(relax.op.permute_dims(key, list(range(rank - 2)) + [rank - 1, rank - 2]))
    scores = bb.emit(relax.op.matmul(query, key_t))
    scale = node.kwargs.get("scale") or 1.0 / math.sqrt(_static(_shape(query)[-1:], "no scale (head size)")[0])
    scores = bb.emit(relax.op.multiply(scores, relax.const(scale, dtype)))
    masked = False
    if mask is not None:
        bias = _mask_bias(bb, env[mask], dtype)
        masked = _may_mask_whole_rows(bias)
        scores = bb.emit(relax.op.add(scores, bias))
    if node_arg(node, 5, "is_causal", False):  # masks no whole row: column 0 stays
        scores = bb.emit(relax.op.add(scores, _causal_bias(bb, *_shape(scores)[-2:], dtype)))
    probabilities = _safe_softmax(bb, scores, masked)
    return bb.emit(relax.op.matmul(probabilities, value))


__all__ = ["scaled_dot_product_attention"]
