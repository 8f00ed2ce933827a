"""relax.argmax and relax.argmin on floats for the accel target: arg_extremum.

topi_accel.search says why TVM's kernel is not enough: it loses a NaN and gives index -1 for
a row of -inf, where PyTorch and numpy give the NaN's (the first extremum's) index.
"""

from __future__ import annotations

from tvm import relax, te

import topi_accel
from topi_accel.search import arg_extremum

from .dispatch import kernel_call
from .registry import register

IMPL = "arg_extremum.accel"


def arg_extremum_condition(call: relax.Call) -> str | None:
    """arg_extremum.accel takes float tensors of a known rank."""
    ty = call.args[0].ty
    if not str(ty.dtype).startswith(("float", "bfloat")):
        return f"dtype {ty.dtype}: integers have no NaN, TVM's kernel serves them"
    if ty.shape is None:
        return "the input's rank is not known"
    return None


def _arg_extremum(bb: relax.BlockBuilder, call: relax.Call, largest: bool) -> relax.Expr:
    data = call.args[0]
    axis = None if call.attrs.axis is None else int(call.attrs.axis)
    keepdims = bool(call.attrs.keepdims)
    x = te.placeholder(list(data.ty.shape), str(data.ty.dtype), name="x")
    out = arg_extremum(x, axis, keepdims, largest)
    func = te.create_prim_func([x, out])
    func = topi_accel.parallelize(func) or func
    return kernel_call(bb, func, out.op.name, IMPL, [data], relax.TensorType(list(out.shape), "int64"))


@register("relax.argmax", IMPL, condition=arg_extremum_condition)
def argmax_accel(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """The first index of the largest value, NaN counting larger than every number."""
    return _arg_extremum(bb, call, largest=True)


@register("relax.argmin", IMPL, condition=arg_extremum_condition)
def argmin_accel(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """The first index of the smallest value, NaN counting smaller than every number."""
    return _arg_extremum(bb, call, largest=False)
