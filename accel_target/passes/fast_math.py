"""FastMath: GELU, softmax, sigmoid, SiLU, tanh and erf on float32 with TVM's vectorizable
fast_erf / fast_exp / fast_tanh."""

from __future__ import annotations

import tvm
from tvm import relax, te, topi
from tvm.relax.expr_functor import PyExprMutator, mutator

from .relax_util import op_name, rewrite_functions

GELU = "relax.nn.gelu"
SOFTMAX = "relax.nn.softmax"
SQRT_HALF = 0.7071067811865476  # 1 / sqrt(2)


def fast_sigmoid(x: te.Tensor) -> te.Tensor:
    """1 / (1 + exp(-x)) with topi.fast_exp (max relative error 1.2e-6, absolute 9e-8, on
    [-30, 30]; fast_exp clamps its argument to +-88.38, so the tails are 1 and ~4e-39)."""
    e = topi.fast_exp(topi.negative(x))
    return te.compute(x.shape, lambda *i: 1.0 / (1.0 + e(*i)), name="T_fast_sigmoid", tag=topi.tag.ELEMWISE)


def fast_silu(x: te.Tensor) -> te.Tensor:
    """x * sigmoid(x), the sigmoid as `fast_sigmoid`'s."""
    return topi.multiply(x, fast_sigmoid(x))


# an elementwise op -> its vector form (erf itself: GELU as ONNX exporters spell it out)
ELEMENTWISE = {
    "relax.sigmoid": (fast_sigmoid, "fast_sigmoid"),
    "relax.nn.silu": (fast_silu, "fast_silu"),
    "relax.tanh": (topi.fast_tanh, "fast_tanh"),
    "relax.erf": (topi.fast_erf, "fast_erf"),
}


@mutator
class _FastMath(PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        name = op_name(call)
        if name not in (GELU, SOFTMAX, *ELEMENTWISE) or str(call.ty.dtype) != "float32":
            return call
        x = call.args[0]
        if name in ELEMENTWISE:
            compute, hint = ELEMENTWISE[name]
            return self.builder_.call_te(compute, x, primfunc_name_hint=hint)
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
    """GELU, softmax, sigmoid, SiLU, tanh and erf of float32 tensors with TVM's vectorizable
    fast_erf / fast_exp / fast_tanh (topi.fast_erf, topi.nn.fast_softmax, topi.fast_exp,
    topi.fast_tanh) instead of libm's scalar erff / expf / tanhf, which LLVM calls one lane
    at a time.

    These are the ops that run over whole activations, as the epilogue of the conv or dense
    kernel before them: GELU (x * (1 + erf(x / sqrt(2))) / 2, exact in form; fast_erf's max
    abs error is 3.7e-7), softmax over attention scores, the sigmoid of SiLU/swish and of
    squeeze-excite gates. TVM's own FastMathTransform also swaps every exp; a plain exp keeps
    libm's, whose overflow to inf some models rely on."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return rewrite_functions(_FastMath, mod)
