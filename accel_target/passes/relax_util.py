"""Small Relax helpers that several graph passes share: op names, floating dtypes, what a variable is bound to,
permutes, a conv2d like another, and copies of a module with one function changed. (Which ops
are elementwise is not a list here: `op_kinds.is_elementwise` reads it from TVM.)
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator

PERMUTE = "relax.permute_dims"
RESHAPE = "relax.reshape"
PAD = "relax.nn.pad"
CONV2D = "relax.nn.conv2d"


def is_floating(expr: relax.Expr) -> bool:
    """Whether `expr` is a tensor (or scalar) of a floating dtype (float16/32/64, bfloat16)."""
    return str(expr.ty.dtype).startswith(("float", "bfloat"))


def op_name(expr) -> str | None:
    """The name of the op `expr` calls ("relax.add"), None when it is no call of an op."""
    if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
        return expr.op.name
    return None


def rewrite_functions(mutator_class, mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with every Relax function rewritten by a fresh `mutator_class` (a PyExprMutator)."""
    mutator = mutator_class(mod)
    for gvar, func in mod.functions_items():
        if isinstance(func, relax.Function):
            mutator.builder_.update_func(gvar, mutator.visit_expr(func))
    return mutator.builder_.get()


def bindings(func: relax.Function) -> list[relax.VarBinding]:
    """The variable bindings of `func`'s body, block after block."""
    return [b for block in func.body.blocks for b in block.bindings if isinstance(b, relax.VarBinding)]


def bound(mutator: PyExprMutator, expr):
    """What a variable is bound to in `mutator`'s builder (None for a non-variable)."""
    return mutator.lookup_binding(expr) if isinstance(expr, relax.Var) else None


def resolve(mutator: PyExprMutator, expr):
    """`expr`, or what it is bound to if it is a bound variable (a weight constant, say)."""
    value = bound(mutator, expr)
    return expr if value is None else value


def permute_axes(call: relax.Call) -> list[int]:
    """The axes of a permute_dims call, its default (all axes reversed) spelled out."""
    ndim = call.args[0].ty.ndim
    return list(range(ndim))[::-1] if call.attrs.axes is None else [int(a) for a in call.attrs.axes]


def moves_only_unit_axes(shape: list[int], axes: list[int]) -> bool:
    """Whether permuting `shape` by `axes` keeps the order of every axis longer than 1."""
    kept = [a for a in axes if shape[a] != 1]
    return kept == sorted(kept)


def conv_padding_of_pad(pad: relax.Call, layout: str) -> list[int] | None:
    """[top, left, bottom, right] of a zero pad of only the H and W axes of `layout`, else None."""
    widths = [int(v) for v in pad.attrs.pad_width]
    if str(pad.attrs.pad_mode) != "constant" or float(pad.attrs.pad_value) != 0.0 or len(widths) != 2 * len(layout):
        return None
    h, w = layout.index("H"), layout.index("W")
    if min(widths) < 0 or any(widths[2 * a] or widths[2 * a + 1] for a in range(len(layout)) if a not in (h, w)):
        return None
    return [widths[2 * h], widths[2 * w], widths[2 * h + 1], widths[2 * w + 1]]


def conv2d_like(call: relax.Call, data: relax.Expr, **changes) -> relax.Call:
    """A conv2d of `data` with `call`'s weight and attributes, but for `changes`."""
    names = ("strides", "padding", "dilation", "groups", "data_layout", "kernel_layout", "out_layout", "out_dtype")
    kwargs = {name: getattr(call.attrs, name) for name in names}
    return relax.op.nn.conv2d(data, call.args[1], **{**kwargs, **changes})


def num_inputs(func: relax.Function) -> int:
    """How many leading parameters of `func` are the model's inputs: its "num_input" attribute
    (weights imported as parameters, keep_params_as_input, follow them), else all."""
    if func.attrs is not None and "num_input" in func.attrs:
        return int(func.attrs["num_input"])
    return len(func.params)


def with_function(mod: tvm.IRModule, name, func) -> tvm.IRModule:
    """A copy of `mod` with `func` as `name` (a string or GlobalVar; `mod` itself is left as it is)."""
    out = mod.clone()
    out[name] = func
    return out
