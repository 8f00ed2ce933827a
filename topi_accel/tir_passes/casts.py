"""A value stored as bfloat16 is bound before the store.

TVM's bfloat16 legalization writes a cast of a float32 value to bfloat16 as integer
arithmetic on its bits (round half to even) that reads the value more than once, copying the
whole expression into each read. A value holding let expressions (FastMath's activations bind
their argument once, accel_target/passes/fast_math.py) then binds the same variables in each
copy, which TVM's VectorizeLoop refuses ("Let cannot bind the same var to two different
values"): a bfloat16 model whose last kernel ends in a tanh (Gemma 2's soft-capped logits,
rounded to bfloat16 in the kernel's write-back) had no code. `bound_stores` writes
``out[i] = cast(e)`` as ``t = e; out[i] = cast(t)``, so that each read is of ``t``.
"""

from __future__ import annotations

import tvm_ffi
from tvm import tirx


def _bound(store: tirx.BufferStore) -> tirx.Stmt:
    value = store.value
    if not isinstance(value, tirx.Cast) or str(value.ty.dtype) != "bfloat16" or isinstance(value.value, tirx.Var):
        return store
    wide = tirx.Var("to_bfloat16", value.value.ty.dtype)
    rounded = tirx.BufferStore(store.buffer, tirx.Cast("bfloat16", wide), store.indices)
    return tirx.SeqStmt([tirx.LetStmt(wide, value.value), rounded])


def bound_stores(func: tirx.PrimFunc) -> tirx.PrimFunc | None:
    """`func` with each store of a cast to bfloat16 storing a bound value; None if it has none."""
    body = tvm_ffi.structural_map(func.body, (tirx.BufferStore, _bound), order="post")
    return None if body.same_as(func.body) else func.with_body(body)
