"""Indexing that TVM's importers leave unchecked, bounded after import.

Every ``relax.take`` the importers emit (embeddings, ``index.Tensor``, ``index_select``,
ONNX Gather) reads in mode "fast", which trusts its indices to lie in [0, n). PyTorch's
indices may be negative: Falcon picks its key and value heads with ``qkv[..., [-2], :]``,
and the torch importer's take reads before the tensor (stock TVM and accel both returned
logits 34% off PyTorch's, and such a read may as well crash). A token id past the
vocabulary, from any importer, reads past the tensor the same way.

`bounded_takes` rewrites every take in mode "fast":

- constant indices: a negative one becomes the index it counts back to (x[-2] is x[n - 2]);
  one outside [-n, n) is an error naming it (PyTorch rejects those at export too);
- indices known at run time only (token ids): one in [-n, 0) counts from the end, as in
  PyTorch, and one outside [-n, n) gives NaN where the data is floating point (mode "nan"),
  else wraps around (mode "wrap": integers have no NaN) -- never a read outside the tensor;
- an axis of symbolic size: mode "wrap", for constant indices too.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.ir.expr import Constant
from tvm.relax.expr_functor import PyExprMutator, mutator

from strategy.layout import constant_array


def _extent(data: relax.Expr, axis) -> tuple[int | None, int]:
    """(size of the taken axis, None when symbolic; the axis, non-negative)."""
    shape = data.ty.shape
    axis = 0 if axis is None else int(axis) % len(shape)
    size = shape[axis]
    return (int(size) if isinstance(size, tvm.tirx.IntImm) else None), axis


def _constant_indices(data: relax.Expr, indices: np.ndarray, size: int, axis: int) -> np.ndarray:
    outside = indices[(indices < -size) | (indices >= size)]
    if outside.size:
        raise ValueError(
            f"take: constant index {int(outside[0])} is outside [-{size}, {size}) on axis {axis} "
            f"of a tensor of shape {[int(d) for d in data.ty.shape]}"
        )
    return np.where(indices < 0, indices + size, indices).astype(indices.dtype)


@mutator
class _Bound(PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.take") or str(call.attrs.mode) != "fast":
            return call
        data, indices = call.args
        if getattr(data.ty, "shape", None) is None:  # rank unknown: nothing to bound against
            return call
        size, axis = _extent(data, call.attrs.axis)
        if size is None:  # a symbolic axis: "wrap" counts negative indices back from its size
            return relax.op.take(data, indices, call.attrs.axis, "wrap")
        if isinstance(indices, Constant):
            bounded = _constant_indices(data, constant_array(indices), size, axis)
            return relax.op.take(data, relax.const(bounded), call.attrs.axis, "fast")
        if not str(data.ty.dtype).startswith(("float", "bfloat")):
            return relax.op.take(data, indices, call.attrs.axis, "wrap")
        dtype = str(indices.ty.dtype)
        counted_back = relax.op.where(
            relax.op.less(indices, relax.const(0, dtype)), relax.op.add(indices, relax.const(size, dtype)), indices
        )
        return relax.op.take(data, self.builder_.emit(counted_back, "index"), call.attrs.axis, "nan")


def bounded_takes(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with every take in mode "fast" bounded (see the module's docstring)."""
    rewriter = _Bound(mod)
    for gvar, func in mod.functions.items():
        if isinstance(func, relax.Function):
            rewriter.builder_.update_func(gvar, rewriter.visit_expr(func))
    return rewriter.builder_.get()
