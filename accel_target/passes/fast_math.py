"""FastMath: GELU and softmax on float32 with TVM's vectorizable fast_erf / fast_exp."""

from __future__ import annotations

import tvm
from tvm import relax, topi
from tvm.relax.expr_functor import PyExprMutator, mutator

from .relax_util import op_name, rewrite_functions

GELU = "relax.nn.gelu"
SOFTMAX = "relax.nn.softmax"
SQRT_HALF = 0.7071067811865476  # 1 / sqrt(2)


@mutator
class _FastMath(PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        name = op_name(call)
        if name not in (GELU, SOFTMAX) or str(call.ty.dtype) != "float32":
            return call
        x = call.args[0]
        if name == SOFTMAX:
            return self.builder_.call_te(
                topi.nn.fast_softmax, x, int(call.attrs.axis), primfunc_name_hint="fast_softmax"
            )
        scaled = self.builder_.emit(relax.op.multiply(x, relax.const(SQRT_HALF, "float32")))
        erf = self.builder_.emit(self.builder_.call_te(topi.fast_erf, scaled, primfunc_name_hint="fast_erf"))
        half_x = self.builder_.emit(relax.op.multiply(x, relax.const(0.5, "float32")))
        return relax.op.multiply(half_x, relax.op.add(erf, relax.const(1.0, "float32")))


@tvm.transform.module_pass(opt_level=0, name="FastMath")
class FastMath:
    """GELU and softmax of float32 tensors with TVM's vectorizable fast_erf / fast_exp
    (topi.fast_erf, topi.nn.fast_softmax) instead of libm's scalar erff / expf.

    GELU stays exact in form, x * (1 + erf(x / sqrt(2))) / 2 (fast_erf's max abs error is
    3.7e-7), as elementwise ops that become the epilogue of the dense kernel before them.
    TVM's own FastMathTransform also swaps every exp and tanh; this keeps to the two ops that
    run over whole activations (softmax over attention scores [batch, heads, seq, seq])."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return rewrite_functions(_FastMath, mod)
