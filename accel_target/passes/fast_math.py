"""FastMath: GELU, softmax, sigmoid, SiLU, tanh, erf, softplus, Mish and exp(x) - 1 (ELU,
SELU, CELU) on float32 with TVM's vectorizable fast_erf / fast_exp / fast_tanh."""

from __future__ import annotations

import math

import tvm
import tvm_ffi
from tvm import relax, te, tirx, topi
from tvm.relax.expr_functor import PyExprMutator, mutator

from strategy.layout import constant_array, same_dims, tensor_shape
from topi_accel.views import is_tensor_load

from .relax_util import op_name, rewrite_functions

GELU = "relax.nn.gelu"
SOFTMAX = "relax.nn.softmax"
SOFTPLUS = "relax.nn.softplus"
SQRT_HALF = 0.7071067811865476  # 1 / sqrt(2)
LOG1P_TERMS = 8  # of 2 atanh(t), t <= 1/3: the first term left out is below 2e-9 of the sum
MISH_LINEAR = 20.0  # the exponent's clamp: above it, n / (n + 2) is 1 in float32
MISH_THRESHOLD = 9.0  # a softplus threshold from which on tanh(x) and tanh(softplus(x)) are 1 in float32
EXPM1_SERIES = 0.5  # |x| below which exp(x) - 1 is its Taylor series (above, the difference loses < 2 bits)
EXPM1_TERMS = 8  # of the series: the first left out is below 2e-8 of the sum for |x| < 0.5


def _let(value: tirx.PrimExpr, body) -> tirx.Let:
    """body(v) with v bound to `value`: `value` computed once however often body reads v."""
    var = tirx.Var("v", value.ty.dtype)
    return tirx.Let(var, value, body(var))


def _elementwise(x: te.Tensor, scalar, name: str) -> te.Tensor:
    """scalar(v) of each element v of `x`, which it reads once."""
    return te.compute(x.shape, lambda *i: _let(x(*i), scalar), name=name, tag=topi.tag.ELEMWISE)


def scalar_form(op, value: tirx.PrimExpr) -> tirx.PrimExpr:
    """TOPI's elementwise `op` (topi.fast_exp, fast_tanh, fast_erf: one output, each stage
    reading its input at its own element) of the scalar `value`, which it reads once, TOPI's
    intermediate tensors let-bound. TOPI's forms read their input many times (fast_exp 18
    times); a Winograd conv's output (its inverse transform) inlined into each read grew past
    what epilogue inlining takes (topi_accel.tir_passes.blocks.MAX_INLINED_NODES), and the
    activation stayed a serial loop nest after the kernel. Bind the result to a variable where
    it is read more than once (its own variables are defined once)."""
    dtype = str(value.ty.dtype)
    source = te.placeholder((1,), dtype, name="value")
    stages: list[tuple[tirx.Var, tirx.PrimExpr]] = []
    names: dict = {}

    def stage(tensor) -> tirx.Var:
        if tensor.op.same_as(source.op):
            return names.setdefault(source.op, tirx.Var("value", dtype))
        if tensor.op not in names:
            if tensor.op.num_outputs != 1:
                raise ValueError(f"scalar_form: {tensor.op.name} has {tensor.op.num_outputs} outputs; one is supported")
            read = lambda node: stage(node.args[0]) if is_tensor_load(node) else node  # noqa: E731
            body = tvm_ffi.structural_map(tensor.op.body[0], (object, read), order="post")
            names[tensor.op] = tirx.Var(tensor.op.name, tensor.dtype)
            stages.append((names[tensor.op], body))
        return names[tensor.op]

    stage(op(source))
    result = stages[-1][1]
    for var, body in reversed(stages[:-1]):
        result = tirx.Let(var, body, result)
    return tirx.Let(names[source.op], value, result)


def _exp(value: tirx.PrimExpr) -> tirx.PrimExpr:
    return scalar_form(topi.fast_exp, value)


def read_once(op):
    """TOPI's elementwise `op` as a TE op of one stage that reads each element once
    (`scalar_form`)."""
    return lambda x: _elementwise(x, lambda v: scalar_form(op, v), f"T_{op.__name__}")


def fast_sigmoid(x: te.Tensor) -> te.Tensor:
    """1 / (1 + exp(-x)) with topi.fast_exp (max relative error 1.2e-6, absolute 9e-8, on
    [-30, 30]; fast_exp clamps its argument to +-88.38, so the tails are 1 and ~4e-39)."""
    return _elementwise(x, lambda v: 1.0 / (1.0 + _exp(-v)), "T_fast_sigmoid")


def fast_silu(x: te.Tensor) -> te.Tensor:
    """x * sigmoid(x), computed as x / (1 + exp(-x)) with `fast_sigmoid`'s exp."""
    return _elementwise(x, lambda v: v / (1.0 + _exp(-v)), "T_fast_silu")


def _log1p_unit(u: tirx.PrimExpr) -> tirx.PrimExpr:
    """log(1 + u) for u in [0, 1], as 2 atanh(t) = 2 (t + t^3/3 + t^5/5 + ...), t = u / (2 + u)."""

    def series(t):
        s = t * t
        total = tirx.const(1.0 / (2 * LOG1P_TERMS - 1), "float32")
        for k in range(LOG1P_TERMS - 2, -1, -1):
            total = total * s + tirx.const(1.0 / (2 * k + 1), "float32")
        return 2.0 * t * total

    return _let(u / (2.0 + u), series)


def fast_softplus(x: te.Tensor, beta: float = 1.0, threshold: float = 20.0) -> te.Tensor:
    """log(1 + exp(beta x)) / beta, x where beta x > threshold (topi.nn.softplus), as
    max(beta x, 0) + log1p(exp(-|beta x|)) with topi.fast_exp and `_log1p_unit`: max relative
    error 2.5e-7 against float64 where the result is above 1e-30 (beta x > -69; PyTorch's:
    1.2e-7); below beta x = -87, fast_exp's underflow makes it 0 (absolute error < 1e-37)."""

    def softplus(v):
        z = v * beta
        soft = _let(_exp(-tirx.abs(z)), lambda e: (tirx.max(z, 0.0) + _log1p_unit(e)) / beta)
        return tirx.Select(z > threshold, v, soft)

    return _elementwise(x, softplus, "T_fast_softplus")


def fast_mish(x: te.Tensor) -> te.Tensor:
    """x tanh(softplus(x)) as x n / (n + 2), n = e^x (e^x + 2) (tanh(log(1 + e^x)) spelt out),
    e^x by topi.fast_exp of min(x, 20): max relative error 3e-7 against float64 where the
    result is above 1e-30 in size (x > -65; PyTorch's: 2.6e-7); below x = -87, fast_exp's
    underflow makes it 0 (absolute error < 1e-36)."""

    def mish(v):
        n = _let(_exp(tirx.min(v, MISH_LINEAR)), lambda e: e * (e + 2.0))
        return v * _let(n, lambda n: n / (n + 2.0))

    return _elementwise(x, mish, "T_fast_mish")


def fast_expm1(x: te.Tensor, sign: float = 1.0) -> te.Tensor:
    """sign * (exp(x) - 1): a Taylor series where |x| < 0.5 (exp(x) - 1 would lose the digits
    of a small result to the subtraction), else e * e - 1 with e = topi.fast_exp(x / 2), which
    overflows to inf where exp(x) does (fast_exp clamps its argument to +-88.38). Max relative
    error against float64 4.2e-7 (libm's expf(x) - 1 loses a small result's digits: 7% off at
    x = 1e-6)."""

    def expm1(z):
        series = tirx.const(1.0 / math.factorial(EXPM1_TERMS), "float32")
        for k in range(EXPM1_TERMS - 1, 0, -1):  # z (1 + z (1/2! + z (1/3! + ...)))
            series = tirx.const(1.0 / math.factorial(k), "float32") + z * series
        whole = _let(_exp(z * 0.5), lambda e: e * e - 1.0)
        return sign * tirx.Select(tirx.abs(z) < EXPM1_SERIES, z * series, whole)

    return _elementwise(x, expm1, "T_fast_expm1")


def expm1_parts(var2val: dict, call) -> tuple[relax.Expr, float] | None:
    """(x, sign) where `call` is exp(x) - 1 (sign 1; PyTorch's ELU, SELU and CELU) or 1 - exp(x)
    (sign -1; TVM's ONNX Elu and Selu), else None."""
    if op_name(call) != "relax.subtract":
        return None
    for exp_at, sign in ((0, 1.0), (1, -1.0)):
        exp = _bound(var2val, call.args[exp_at], "relax.exp")
        if exp is not None and _scalar(call.args[1 - exp_at]) == 1.0:
            return exp.args[0], sign
    return None


# an elementwise op -> its vector form (erf itself: GELU as ONNX exporters spell it out)
ELEMENTWISE = {
    "relax.sigmoid": (fast_sigmoid, "fast_sigmoid"),
    "relax.nn.silu": (fast_silu, "fast_silu"),
    "relax.tanh": (read_once(topi.fast_tanh), "fast_tanh"),
    "relax.erf": (read_once(topi.fast_erf), "fast_erf"),
}


def _scalar(expr) -> float | None:
    """The value of a scalar float constant, else None."""
    if not isinstance(expr, tvm.ir.expr.Constant) or (value := constant_array(expr)).size != 1:
        return None
    return float(value.reshape(()))


def _bound(var2val: dict, expr, op: str) -> relax.Call | None:
    """What `expr` is bound to, if that is a call of `op`."""
    value = var2val.get(expr)
    return value if op_name(value) == op else None


def _log1p_exp_of(var2val: dict, call) -> relax.Expr | None:
    """z where `call` is log(1 + exp(z)) (either order of the sum)."""
    if op_name(call) != "relax.log" or (total := _bound(var2val, call.args[0], "relax.add")) is None:
        return None
    one, exp = total.args if _scalar(total.args[0]) == 1.0 else total.args[::-1]
    exp = _bound(var2val, exp, "relax.exp")
    return exp.args[0] if _scalar(one) == 1.0 and exp is not None else None


def softplus_parts(var2val: dict, call) -> tuple[relax.Expr, float, float] | None:
    """(x, beta, threshold) where `call` computes softplus(x): relax.nn.softplus; PyTorch's
    decomposition, where(beta x > threshold, x, log(1 + exp(beta x)) / beta); or any
    log(1 + exp(x)) (TVM's ONNX Mish and Softplus spell it so; no threshold: infinite, and
    x itself where exp(x) would overflow to inf)."""
    name = op_name(call)
    if name == SOFTPLUS:
        return call.args[0], float(call.attrs.beta), float(call.attrs.threshold)
    if name == "relax.log":
        z = _log1p_exp_of(var2val, call)
        return None if z is None else (z, 1.0, float("inf"))
    if name != "relax.where" or (greater := _bound(var2val, call.args[0], "relax.greater")) is None:
        return None
    z, threshold, x, soft = greater.args[0], _scalar(greater.args[1]), call.args[1], var2val.get(call.args[2])
    divisor = 1.0
    if op_name(soft) == "relax.divide":
        divisor, soft = _scalar(soft.args[1]), var2val.get(soft.args[0])
    # where(z > t, z, log1p(exp(z))) is beta 1 whatever z is (z may itself be a product: Mish(2x))
    x_of_z, beta = (x, 1.0) if z.same_as(x) else _scaled(var2val, z)
    if threshold is None or divisor != beta or not x_of_z.same_as(x) or not _same(_log1p_exp_of(var2val, soft), z):
        return None
    return x, beta, threshold


def _scaled(var2val: dict, z) -> tuple[relax.Expr, float]:
    """(x, beta) where `z` is x * beta or beta * x of a scalar constant beta, else (z, 1)."""
    product = _bound(var2val, z, "relax.multiply")
    for x, beta in () if product is None else (product.args, product.args[::-1]):
        if (value := _scalar(beta)) is not None:
            return x, value
    return z, 1.0


def _same(a, b) -> bool:
    return a is not None and a.same_as(b)


def _same_shape(call: relax.Call, x: relax.Expr) -> bool:
    """Whether `call`'s result has x's shape (a constant of shape [1, 1] in the sum broadcasts)."""
    shape, x_shape = tensor_shape(call), tensor_shape(x)
    return shape is not None and x_shape is not None and same_dims(shape, x_shape)


def mish_input(var2val: dict, call: relax.Call) -> relax.Expr | None:
    """x where `call` is x * tanh(softplus(x)) (softplus as `softplus_parts` finds it, beta 1 and
    a threshold past which tanh is 1 in float32); else None."""
    if op_name(call) != "relax.multiply":
        return None
    for x, gate in (call.args, call.args[::-1]):
        tanh = _bound(var2val, gate, "relax.tanh")
        parts = None if tanh is None else softplus_parts(var2val, var2val.get(tanh.args[0]))
        if parts is not None and parts[0].same_as(x) and parts[1] == 1.0 and parts[2] >= MISH_THRESHOLD:
            return x
    return None


@mutator
class _FastMath(PyExprMutator):
    def __init__(self, mod: tvm.IRModule):
        super().__init__(mod)
        self.var2val = {}  # the bindings as they were: what Mish's ops read
        for func in mod.functions.values():
            if isinstance(func, relax.Function):
                self.var2val.update(relax.analysis.get_var2val(func))

    def _of_bfloat16(self, x: relax.Expr) -> bool:
        """Whether `x` is a bfloat16 tensor cast to float32: its producer fuses into the kernel,
        inside the let that binds the input, where TVM's bfloat16 legalization does not reach
        (Falcon-Mamba's softplus(dt + bias) in bfloat16 reached LLVM as a bfloat16 add). After
        WidenHalfTypes no such value is left; this holds where that pass was declined."""
        value = self.var2val.get(x) if isinstance(x, relax.Var) else None
        return op_name(value) == "relax.astype" and str(getattr(value.args[0].ty, "dtype", "")) == "bfloat16"

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        if str(getattr(call.ty, "dtype", "")) == "float32":  # Mish and softplus, found in the original bindings
            fits = lambda x: _same_shape(call, x) and not self._of_bfloat16(x)  # noqa: E731
            if (x := mish_input(self.var2val, call)) is not None and fits(x):
                return self.builder_.call_te(fast_mish, self.visit_expr(x), primfunc_name_hint="fast_mish")
            if (parts := softplus_parts(self.var2val, call)) is not None and fits(parts[0]):
                x, beta, threshold = parts
                return self.builder_.call_te(
                    fast_softplus, self.visit_expr(x), beta, threshold, primfunc_name_hint="fast_softplus"
                )
            if (parts := expm1_parts(self.var2val, call)) is not None and fits(parts[0]):
                x, sign = parts
                return self.builder_.call_te(fast_expm1, self.visit_expr(x), sign, primfunc_name_hint="fast_expm1")
        of_bfloat16 = bool(call.args) and self._of_bfloat16(call.args[0])  # (the bindings as they were)
        call = self.visit_expr_post_order(call)
        name = op_name(call)
        if name not in (GELU, SOFTMAX, *ELEMENTWISE) or str(call.ty.dtype) != "float32" or of_bfloat16:
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
        fast_erf = ELEMENTWISE["relax.erf"][0]
        erf = self.builder_.emit(self.builder_.call_te(fast_erf, scaled, primfunc_name_hint="fast_erf"))
        half_x = self.builder_.emit(relax.op.multiply(x, relax.const(0.5, "float32")))
        return relax.op.multiply(half_x, relax.op.add(erf, relax.const(1.0, "float32")))


@tvm.transform.module_pass(opt_level=0, name="FastMath")
class FastMath:
    """GELU, softmax, sigmoid, SiLU, tanh, erf, softplus, Mish and exp(x) - 1 of float32 tensors with TVM's
    vectorizable fast_erf / fast_exp / fast_tanh (topi.fast_erf, topi.nn.fast_softmax,
    topi.fast_exp, topi.fast_tanh) instead of libm's scalar erff / expf / tanhf / logf, which
    LLVM calls one lane at a time.

    These are the ops that run over whole activations, as the epilogue of the conv or dense
    kernel before them: GELU (x * (1 + erf(x / sqrt(2))) / 2, exact in form; fast_erf's max
    abs error is 3.7e-7), softmax over attention scores, the sigmoid of SiLU/swish and of
    squeeze-excite gates, softplus (any log(1 + exp(x)) among its forms: `softplus_parts`)
    and Mish (x tanh(softplus(x)), matched whole: `mish_input`), and exp(x) - 1 (ELU's
    negative side, in either order: `expm1_parts`). TVM's own FastMathTransform
    also swaps every exp; any other exp or log keeps libm's, whose overflow to inf and log of
    0 some models rely on."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return rewrite_functions(_FastMath, mod)
