"""Indexing that TVM's importers and kernels leave unchecked, checked after import.

Every op that reads or writes at indices -- ``take`` (embeddings, ``x[idx]``,
``index_select``, ONNX Gather), ``gather_elements`` (``torch.gather``, GatherElements),
``gather_nd``, ``scatter_elements`` (``scatter``, ScatterElements), ``scatter_nd``,
``index_put`` and ``index_tensor`` -- trusts its indices in TVM: one outside its axis reads
or writes outside the tensor (a gather at 2^40 took the process down), and ``take``
reads before it at a negative one (Falcon picks its key and value heads with
``qkv[..., [-2], :]``: stock TVM's logits were 34% off PyTorch's).

`checked_indexing` gives every such op indices inside the tensor:

- constant indices (sizes known): checked at import; a negative one becomes the index it
  counts back to where the op allows it (x[-2] is x[n - 2]), one outside is an error naming
  the op, the index, the axis and the shape (PyTorch rejects those at export too);
- indices known at run time (token ids), or an axis of symbolic size: a small kernel before
  the op, ``check_indices``, counts negative indices back where the op allows it and fails
  the call with an error naming the op, the axis and its range when an index lies outside
  -- the VM raises it before anything reads or writes with that index, and runs on
  afterwards. It is serial: the assertion must not sit in a task of the thread pool.

What a negative index means depends on the op and the importer (PYTORCH, ONNX below):
PyTorch counts it back for indexing (``x[-1]``, ``index_put``) and rejects it for
``gather`` and ``scatter``; TVM's ONNX converters count it back themselves (all but
ScatterElements'), so one still negative after them was outside the axis.

It runs after both importers and again at the start of `accel_target.build` (PyTorch's
meaning, for modules from TVM's own importers, but for indices the module counts back itself,
``where(x < 0, x + n, x)``, as TVM's ONNX converters do); indices it checked once it leaves
alone.
Ops whose index shapes are unknown (no rank) are left as they are, as are takes in a mode
other than "fast" ("clip", "wrap" and "nan" never read outside).
"""

from __future__ import annotations

import math
import re

import numpy as np
import tvm
from tvm import relax, tirx
from tvm.ir.expr import Constant
from tvm.relax.expr_functor import PyExprMutator, mutator
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from strategy.layout import constant_array, tensor_shape

KERNEL = "check_indices"
_OPAQUE = 8  # TVM's OpPatternKind kOpaque: FuseOps leaves the check a kernel of its own


def check_indices_func(components: int, dtype: str, message: str, count_back: bool) -> tvm.tirx.PrimFunc:
    """indices [rows, components], sizes [components] -> the indices, negatives counted back
    from their component's size if `count_back`; an index then outside [0, size) fails the
    call with `message` (a RuntimeError from the VM). Serial: index tensors are small, and
    the assertion must not sit in a task of the thread pool. Built with TVM's IR builder
    (TVMScript's parser would read this file's source at every build)."""
    zero = tirx.const(0, dtype)
    with IRBuilder() as builder:
        with T.prim_func(private=True):
            T.func_name(KERNEL)
            T.func_attr({"tirx.noalias": True, "op_pattern": _OPAQUE})
            indices_handle = T.arg("var_indices", T.handle())
            sizes = T.arg("sizes", T.Buffer((components,), "int64"))
            out_handle = T.arg("var_out", T.handle())
            rows = tirx.Var("rows", "int64")
            indices = IRBuilder.name("indices", T.match_buffer(indices_handle, (rows, components), dtype))
            out = IRBuilder.name("out", T.match_buffer(out_handle, (rows, components), dtype))
            outside = IRBuilder.name("outside", T.alloc_buffer((1,), "int32"))
            T.buffer_store(outside, tirx.const(0, "int32"), [0])
            with T.grid(rows, components) as (i, j):
                IRBuilder.name_many(["i", "j"], [i, j])
                index, size = indices[i, j], tirx.Cast(dtype, sizes[j])
                T.buffer_store(out, tirx.Select(index < zero, index + size, index) if count_back else index, [i, j])
                found = tirx.Cast("int32", (out[i, j] < zero) | (out[i, j] >= size))
                T.buffer_store(outside, outside[0] | found, [0])
            with T.Assert(outside[0] == 0, message):  # (a statement of its own: no body)
                pass
    return builder.get()


def _static(sizes: list) -> bool:
    return all(isinstance(s, int) for s in sizes)


# What a negative index means, per op and importer:
COUNT_BACK = "count back"  # x[-1] is x[n - 1], counted back here (PyTorch's take, index_put, index.Tensor)
COUNTED_BACK = "counted back"  # the importer counted [-n, 0) back; one left is an error (ONNX)
NONE = "none"  # an error (PyTorch's gather and scatter)


def _low(size, negatives: str):
    """The least index the user may give."""
    return f"-{size}" if negatives != NONE else "0"


def constant_indices(
    op: str, indices: np.ndarray, sizes: list[int], axes: list, shape: list, negatives: str = COUNT_BACK
) -> np.ndarray:
    """Constant `indices` (components along the last axis when there are several sizes),
    negatives counted back if `negatives` says so; a ValueError names the first outside its
    axis."""
    columns, size = indices.reshape(-1, len(sizes)), np.array(sizes, dtype=indices.dtype)
    if negatives == COUNT_BACK:
        columns = np.where(columns < 0, columns + size, columns)
    outside = (columns < 0) | (columns >= size)
    if outside.any():
        row, component = np.argwhere(outside)[0]
        n = sizes[component]
        raise ValueError(
            f"{op}: constant index {int(indices.reshape(columns.shape)[row, component])} is outside "
            f"[{_low(n, negatives)}, {n}) on axis {axes[component]} of a tensor of shape {shape}"
        )
    return columns.reshape(indices.shape)


def _message(op: str, sizes: list, axes: list[int] | None, shape: list, negatives: str) -> str:
    if len(sizes) > 1:
        where = f"outside its axis (the last axis of the indices runs over axes {axes[0]}-{axes[-1]})"
    else:
        where = f"outside [{_low(sizes[0], negatives)}, {sizes[0]}) " + (
            "of the flattened tensor" if axes is None else f"on axis {axes[0]}"
        )
    return f"{op}: an index known at run time is {where} of a tensor of shape {shape}"


def check(
    bb: relax.BlockBuilder,
    op: str,
    indices: relax.Expr,
    data_shape: list,
    axes: list[int] | None,
    negatives: str = COUNT_BACK,
    message: str | None = None,
) -> relax.Expr:
    """`indices` into axes `axes` of a tensor of shape `data_shape` (their components along
    the last axis when there are several axes; None: the flattened tensor), negatives as
    `negatives` says, checked as the module's docstring says (an index outside fails the call
    with `message`, by default one naming `op`, the axis and the shape); bindings emitted into
    `bb`. Indices of unknown rank or of no integer type come back as they are."""
    shape, dtype = tensor_shape(indices), str(getattr(indices.ty, "dtype", ""))
    if shape is None or not dtype.startswith(("int", "uint")):
        return indices
    sizes = [math.prod(data_shape)] if axes is None else [data_shape[a] for a in axes]
    if isinstance(indices, Constant) and _static(sizes):
        named = axes if axes is not None else ["(flattened)"]
        array = constant_indices(op, constant_array(indices), sizes, named, data_shape, negatives)
        return relax.const(array, dtype)
    components = len(sizes)
    rows = math.prod(shape[:-1] if components > 1 else shape)
    message = message or _message(op, sizes, axes, data_shape, negatives)
    kernel = bb.add_func(check_indices_func(components, dtype, message, negatives == COUNT_BACK), KERNEL)
    if _static(sizes):
        sizes_tensor = relax.const(np.array(sizes, "int64"), "int64")
    else:
        sizes_tensor = bb.emit(relax.op.shape_to_tensor(relax.ShapeExpr(sizes)))
    table = bb.emit(relax.op.reshape(indices, (rows, components)))
    checked = bb.emit(relax.call_tir(kernel, [table, sizes_tensor], relax.TensorType((rows, components), dtype)))
    return bb.emit(relax.op.reshape(checked, shape), "index")


@mutator
class _Check(PyExprMutator):
    def __init__(self, mod: tvm.IRModule, negatives: dict[str, str]):
        super().__init__(mod)
        self.negatives = negatives

    def _bound(self, expr: relax.Expr, op: str) -> relax.Call | None:
        """The call to `op` that the variable `expr` is bound to, if it is one."""
        value = self.lookup_binding(expr) if isinstance(expr, relax.Var) else None
        return value if isinstance(value, relax.Call) and value.op == tvm.ir.Op.get(op) else None

    def _is_checked(self, indices: relax.Expr) -> bool:
        """Whether `indices` are `check`'s result: a check_indices kernel's output (the module's
        second such kernel is check_indices1), reshaped back."""
        reshaped = self._bound(indices, "relax.reshape")
        kernel = None if reshaped is None else self._bound(reshaped.args[0], "relax.call_tir")
        return kernel is not None and re.fullmatch(KERNEL + r"\d*", kernel.args[0].name_hint) is not None

    def _counted_back(self, indices: relax.Expr) -> bool:
        """Whether `indices` are ``where(x < 0, x + n, x)``: negatives counted back already (TVM's
        ONNX converters do so), whatever the importer's policy says; once more would take -7
        on an axis of 5 as 3."""
        where = self._bound(indices, "relax.where")
        if where is None:
            return False
        less, add = self._bound(where.args[0], "relax.less"), self._bound(where.args[1], "relax.add")
        x = where.args[2]
        return (
            less is not None
            and add is not None
            and less.args[0].same_as(x)
            and add.args[0].same_as(x)
            and isinstance(less.args[1], Constant)
            and not constant_array(less.args[1]).any()
        )

    def _checked(self, op: str, indices: relax.Expr, data_shape: list, axes: list[int] | None) -> relax.Expr:
        if self._is_checked(indices):
            return indices
        negatives = COUNTED_BACK if self._counted_back(indices) else self.negatives.get(op, NONE)
        return check(self.builder_, op, indices, data_shape, axes, negatives)

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not isinstance(call.op, tvm.ir.Op) or not call.op.name.startswith("relax."):
            return call
        op = call.op.name[len("relax.") :]
        data_shape = tensor_shape(call.args[0]) if call.args else None
        if op not in _INDEX_ARGS or data_shape is None:
            return call
        args = list(call.args)
        for position, axes in _INDEX_ARGS[op](call, len(data_shape)):
            if isinstance(position, tuple):  # a tuple of index tensors: one per axis
                tuple_at, item = position
                items = list(args[tuple_at].fields)
                items[item] = self._checked(op, items[item], data_shape, axes)
                args[tuple_at] = relax.Tuple(items)
            else:
                args[position] = self._checked(op, args[position], data_shape, axes)
        if all(new.same_as(old) for new, old in zip(args, call.args, strict=True)):
            return call
        return relax.Call(call.op, args, call.attrs)


def _take(call, rank):
    if str(call.attrs.mode) != "fast":
        return []
    return [(1, None if call.attrs.axis is None else [int(call.attrs.axis) % rank])]  # None: flattened


def _elements(call, rank):
    return [(1, [int(call.attrs.axis) % rank])]


def _nd(call, rank):
    """gather_nd / scatter_nd: the last axis of the indices runs over the data's axes from
    batch_dims (gather_nd's; 0 for scatter_nd)."""
    components = tensor_shape(call.args[1])
    if not components or not isinstance(components[-1], int):
        return []
    first = int(getattr(call.attrs, "batch_dims", 0))
    return [(1, list(range(first, first + components[-1])))]


def _per_axis(call, rank):
    indices = call.args[1]
    if not isinstance(indices, relax.Tuple):
        return []
    return [((1, axis), [axis]) for axis in range(len(indices.fields))]


# op -> (call, data rank) -> [(position of an index argument, or (tuple, item); the data axes
# its indices run over, None for the flattened data)]
_INDEX_ARGS = {
    "take": _take,
    "gather_elements": _elements,
    "scatter_elements": _elements,
    "gather_nd": _nd,
    "scatter_nd": _nd,
    "index_put": _per_axis,
    "index_tensor": _per_axis,
}


# What negative indices mean in the modules of each importer (ops not named: NONE)
PYTORCH = {"take": COUNT_BACK, "index_put": COUNT_BACK, "index_tensor": COUNT_BACK}  # gather, scatter: errors
# TVM's ONNX converters count negative indices back themselves, but for ScatterElements'
ONNX = {op: COUNTED_BACK for op in _INDEX_ARGS} | {"scatter_elements": COUNT_BACK}


def checked_indexing(mod: tvm.IRModule, negatives: dict[str, str] = PYTORCH) -> tvm.IRModule:
    """`mod` with the indices of every indexing op checked (see the module's docstring);
    `negatives`: what a negative index of each op means (PYTORCH, or ONNX for a module from
    TVM's ONNX importer)."""
    rewriter = _Check(mod, negatives)
    for gvar, func in mod.functions.items():
        if isinstance(func, relax.Function):
            rewriter.builder_.update_func(gvar, rewriter.visit_expr(func))
    return rewriter.builder_.get()


@tvm.transform.module_pass(opt_level=0, name="CheckIndexing")
def check_indexing(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    """`checked_indexing` as the build's first pass: a module from TVM's own importers gets
    the checks too, negative indices as in PyTorch, but for indices that the module counted
    back itself (TVM's ONNX converters; a module from `from_torch` or `from_onnx` has its
    checks already)."""
    return checked_indexing(mod)
