"""Maxima and minima that propagate NaN, as PyTorch computes them.

TVM writes a floating ``max(a, b)`` as ``a > b ? a : b``: a NaN `a` gives `b`, so relu(NaN) =
max(NaN, 0) was 0, relu6 and clip of NaN a bound, and a max pool or amax over a NaN the other
values' maximum, where PyTorch gives NaN (ONNX Runtime too, but for its max pool). A NaN is how
a model says that its input or its arithmetic went wrong; a number in its place is a wrong
answer. `propagate_nan` writes each floating max and min of a kernel so that a NaN operand
gives NaN:

- against a constant (relu, relu6, hardtanh, clip: the bound is not NaN), max(a, c) as
  ``a < c ? c : a``, which x86 computes in one instruction as before (its max returns the
  second operand where one is NaN), and min(a, c) as ``c < a ? c : a``;
- of two values (torch.maximum, max pooling, amax), max(a, b) as ``b < a or isnan(a) ? a : b``
  and min(a, b) as ``a < b or isnan(a) ? a : b``: a NaN `b` fails the comparison and is taken.
"""

from __future__ import annotations

import tvm_ffi
from tvm import tirx


def _constant(expr) -> bool:
    return isinstance(expr, tirx.FloatImm) or (isinstance(expr, tirx.Broadcast) and _constant(expr.value))


def _nan_propagating(node):
    if not str(node.ty).startswith("float"):
        return node
    is_max = isinstance(node, tirx.Max)
    a, b = node.a, node.b
    if _constant(a) and not _constant(b):
        a, b = b, a
    if _constant(b):
        return tirx.Select(tirx.LT(a, b) if is_max else tirx.LT(b, a), b, a)
    first = tirx.LT(b, a) if is_max else tirx.LT(a, b)
    return tirx.Select(tirx.Or(first, tirx.isnan(a)), a, b)


def propagate_nan(func: tirx.PrimFunc) -> tirx.PrimFunc | None:
    """`func` with each floating max and min propagating NaN; None if it has none."""
    body = func.body
    for kind in (tirx.Max, tirx.Min):
        body = tvm_ffi.structural_map(body, (kind, _nan_propagating), order="post")
    return None if body.same_as(func.body) else func.with_body(body)
