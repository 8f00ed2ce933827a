"""Maxima and minima that propagate NaN, as PyTorch computes them.

TVM's LLVM code for a floating ``max(a, b)`` is ``a > b ? a : b``: a NaN `a` gives `b`, so
relu(NaN) = max(NaN, 0) was 0, relu6 and clip of NaN a bound, and a max pool or amax over a
NaN the other values' maximum, where PyTorch gives NaN. A NaN is how a model says that its
input or its arithmetic went wrong; a number in its place is a wrong answer. `propagate_nan`
writes each floating max and min of a kernel so that a NaN operand gives NaN, reading each
operand once (a rewrite that reads one twice doubles a chain of clamps at every step):

- against a constant (relu, relu6, hardtanh, clip, the clamps of the fast exponentials; the
  bound is not NaN), the constant first: ``max(c, a)`` is ``c > a ? c : a``, which is `a` when
  `a` is NaN, and x86 computes it in one instruction as before;
- of two values (torch.maximum, max pooling, amax), LLVM's ``llvm.maximum`` and
  ``llvm.minimum``, IEEE 754's NaN-propagating maximum and minimum, which TVM vectorizes
  (five AVX2 instructions a vector, in kernels that memory bounds).

TVM's max reductions (amax, max pooling) also start from the lowest finite value rather than
-inf, so the maximum of -infs was -3.4e38: a buffer that a kernel accumulates a maximum in
starts from -inf (a minimum: +inf).
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx


def _constant(expr) -> bool:
    return isinstance(expr, tirx.FloatImm) or (isinstance(expr, tirx.Broadcast) and _constant(expr.value))


def _nan_propagating(node):
    dtype = str(node.ty)
    if not dtype.startswith(("float", "bfloat")):
        return node
    is_max = isinstance(node, tirx.Max)
    a, b = node.a, node.b
    if _constant(b):
        a, b = b, a
    if _constant(a):
        if _constant(b) or node.a.same_as(a):
            return node
        return tirx.Max(a, b) if is_max else tirx.Min(a, b)
    return tirx.call_llvm_pure_intrin(dtype, "llvm.maximum" if is_max else "llvm.minimum", a, b)


def _accumulators(body) -> dict:
    """{buffer: Max or Min} of each floating buffer that a store of `body` updates with the
    max (min) of its own element and another value."""
    found = {}

    def visit(store):
        value = store.value
        if isinstance(value, (tirx.Max, tirx.Min)) and str(value.ty).startswith(("float", "bfloat")):
            for operand in (value.a, value.b):
                if isinstance(operand, tvm.ir.expr.TensorLoad) and operand.source.same_as(store.buffer):
                    found[store.buffer] = type(value)
        return store

    tvm_ffi.structural_map(body, (tirx.BufferStore, visit), order="post")
    return found


def _infinite_starts(body):
    """`body` with each store of the lowest (highest) finite value into a maximum's (minimum's)
    accumulator storing -inf (+inf)."""
    accumulators = _accumulators(body)

    def visit(store):
        kind = accumulators.get(store.buffer)
        value = store.value
        if kind is None or not isinstance(value, tirx.FloatImm):
            return store
        dtype = str(value.ty)
        bound, infinity = (
            (tirx.min_value(dtype), -float("inf")) if kind is tirx.Max else (tirx.max_value(dtype), float("inf"))
        )
        if value.value != bound.value:
            return store
        return tirx.BufferStore(store.buffer, tirx.const(infinity, dtype), store.indices)

    return tvm_ffi.structural_map(body, (tirx.BufferStore, visit), order="post") if accumulators else body


def propagate_nan(func: tirx.PrimFunc) -> tirx.PrimFunc | None:
    """`func` with each floating max and min propagating NaN, and each maximum (minimum)
    accumulated from -inf (+inf); None if it has none."""
    body = _infinite_starts(func.body)
    for kind in (tirx.Max, tirx.Min):
        body = tvm_ffi.structural_map(body, (kind, _nan_propagating), order="post")
    return None if body.same_as(func.body) else func.with_body(body)
