"""WidenHalfTypes: a float16 / bfloat16 model computes in float32; its inputs stay in its dtype,
its outputs are rounded to it.

accel's kernels are float32 (and int8). TVM's kernels of a half type convert every element on
each read and write and run tens of times slower, and a half type's value rounded between every
two ops loses what folding and fusion keep in float32 (a batch norm after a conv is no longer
folded into its weights). So every half-type value of a function becomes float32: its weights
are widened at compile time (exact), its inputs once on entry, its outputs rounded in the block
that makes them (in the last kernel's write-back); a cast to a half type, an op's half ``dtype``
/ ``out_dtype``, a match_cast's type become float32. What cannot change its type (a call of a compiled kernel or a
packed function) takes its half-type operands rounded, as before, and its result is widened.

Numerically the model is then what PyTorch computes in float32 from the same weights and inputs,
rounded once at its outputs: at least as close to the exact result of its weights and inputs as
PyTorch's run in the half type (which rounds after each op, and overflows past 65504 in
float16). ONNX Runtime's CPU provider does the same for the float16 nodes it has no float16
kernel for: it casts them to float32 and back.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from strategy.layout import array_constant, constant_array

HALF = ("float16", "bfloat16")
# calls whose result type the call states (a kernel's output, a packed function's), not an op's
# inference from its operands
_OPAQUE = ("relax.call_tir", "relax.call_dps_packed", "relax.call_pure_packed", "relax.call_inplace_packed")


def _is_half(ty) -> bool:
    return isinstance(ty, relax.TensorType) and str(ty.dtype) in HALF


def _has_half(ty) -> bool:
    return _is_half(ty) or (isinstance(ty, relax.TupleType) and any(_has_half(field) for field in ty.fields))


def _float32(ty):
    """`ty` with each half-type tensor in it float32 (tuples of them too)."""
    if _is_half(ty):
        return relax.TensorType(ty.shape, "float32", ndim=-1 if ty.shape is not None else ty.ndim)
    if isinstance(ty, relax.TupleType):
        return relax.TupleType([_float32(field) for field in ty.fields])
    return ty


def _widened_attrs(attrs):
    """`attrs` with each field naming a half type naming float32 (None when there is none)."""
    if attrs is None or not hasattr(type(attrs), "__tvm_ffi_type_info__"):
        return None
    info = type(attrs).__tvm_ffi_type_info__
    fields = {field.name: getattr(attrs, field.name) for field in info.fields}
    half = [name for name, value in fields.items() if isinstance(value, (str, tvm.DataType)) and str(value) in HALF]
    if not half:
        return None
    return tvm.ir.make_node(info.type_key, **{**fields, **dict.fromkeys(half, "float32")})


def _uses_half(func: relax.Function) -> bool:
    found = []
    relax.analysis.post_order_visit(func, lambda e: found.append(True) if _is_half(getattr(e, "ty", None)) else None)
    return bool(found)


@mutator
class _Widen(PyExprMutator):
    def visit_generic_const_(self, const) -> relax.Expr:
        if not _is_half(const.ty):
            return const
        return array_constant(constant_array(const).astype(np.float32))

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        if isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.astype":
            # (a cast to a half type is one to float32; one to the dtype a value has now is none)
            data, dtype = self.visit_expr(call.args[0]), str(call.attrs.dtype)
            dtype = "float32" if dtype in HALF else dtype
            return data if str(data.ty.dtype) == dtype else relax.op.astype(data, dtype)
        if not isinstance(call.op, tvm.ir.Op) or call.op.name in _OPAQUE:
            return self._opaque(call)
        new = super().visit_call_(call)
        attrs = _widened_attrs(new.attrs)
        return new if attrs is None else relax.Call(new.op, new.args, attrs, new.ty_args)

    def _opaque(self, call: relax.Call) -> relax.Expr:
        """`call` as it was, its half-type operands rounded back; its result widened."""
        args = [_narrowed(self.visit_expr(arg), arg.ty) for arg in call.args]
        found = self.builder_.normalize(relax.Call(call.op, args, call.attrs, call.ty_args))
        return relax.op.astype(found, "float32") if _is_half(found.ty) else found

    def visit_match_cast_(self, binding: relax.MatchCast) -> None:
        value = self.visit_expr(binding.value)
        ty = _float32(binding.var.ty)
        var = (relax.DataflowVar if isinstance(binding.var, relax.DataflowVar) else relax.Var)(binding.var.name, ty)
        self.builder_.emit_normalized(relax.MatchCast(var, value, ty))
        self.set_var_remap(binding.var, var)


def _narrowed(expr: relax.Expr, ty) -> relax.Expr:
    """`expr` (widened) cast back to `ty`, what it was (the fields of a tuple of operands too)."""
    if _is_half(ty) and not _is_half(expr.ty):
        return relax.op.astype(expr, str(ty.dtype))
    if isinstance(expr, relax.Tuple) and isinstance(ty, relax.TupleType):
        return relax.Tuple([_narrowed(field, was) for field, was in zip(expr.fields, ty.fields, strict=True)])
    return expr


def _rounded(expr: relax.Expr, ty, bindings: list) -> relax.Expr:
    """`expr` (float32 where `ty` has a half type) rounded to `ty`, its casts added to `bindings`."""
    if _is_half(ty):
        var = relax.Var("rounded", ty)
        bindings.append(relax.VarBinding(var, relax.op.astype(expr, str(ty.dtype))))
        return var
    if isinstance(ty, relax.TupleType) and _has_half(ty):
        fields = [_rounded(relax.TupleGetItem(expr, i), field, bindings) for i, field in enumerate(ty.fields)]
        return relax.Tuple(fields)
    return expr


def _widen(widen: _Widen, func: relax.Function) -> relax.Function:
    entry = []
    for param in func.params:
        if _is_half(param.ty):
            wide = relax.Var(param.name, _float32(param.ty))
            entry.append(relax.VarBinding(wide, relax.op.astype(param, "float32")))
            widen.set_var_remap(param, wide)
    body = widen.visit_expr(func.body)
    leave = []
    result = _rounded(body.body, func.body.ty, leave)
    blocks = [relax.BindingBlock(entry), *body.blocks]
    if isinstance(blocks[-1], relax.DataflowBlock):  # (the casts out in the block of what they read)
        blocks[-1] = relax.DataflowBlock([*blocks[-1].bindings, *leave])
    else:
        blocks.append(relax.BindingBlock(leave))
    blocks = [b for b in blocks if b.bindings]
    return relax.Function(func.params, relax.SeqExpr(blocks, result), func.ret_ty, func.is_pure, func.attrs)


@tvm.transform.module_pass(opt_level=0, name="WidenHalfTypes")
def widen_half_types(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    """Every Relax function of `mod` that has a float16 / bfloat16 value computes in float32."""
    widen = _Widen(mod)
    for gvar, func in mod.functions_items():
        if isinstance(func, relax.Function) and _uses_half(func):
            widen.builder_.update_func(gvar, widen.builder_.normalize(_widen(widen, func)))
    return widen.builder_.get()
