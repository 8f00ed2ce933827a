"""Quantized graphs (quantize / dequantize, "QDQ") to the integer kernels' calls, before layout conversion.

`QuantizeQDQ` rewrites every Relax function of a module:

- ``conv2d(dequantize(x_q), dequantize(w_q))`` [``+ bias``] [``-> relu / clip``] [``-> quantize``]
  into ``conv2d(x_q, w_q, out_dtype="int32")`` and an elementwise requantize after it:
  ``astype(float32) * scale[oc] + bias'[oc]``, then, when a quantize follows, ``round -> + zp_y
  -> clip(lo, hi) -> astype(uint8 / int8)`` (a ReLU or clip before the quantize becomes the
  clip's bounds). The activation's zero point is padded explicitly (``nn.pad`` with
  ``pad_value=zp_x``, the conv's padding 0) and its ``zp_x * sum(w)`` is folded into ``bias'``;
- ``matmul(dequantize(x_q), dequantize(w_q))`` likewise into ``matmul(x_q, w_q, out_dtype="int32")``,
  the weight folded to int8 ``[in, out]`` (a transpose of it is applied at compile time);
- ``quantize(op(dequantize(x_q)))`` with the same scale and zero point on both sides, for an op
  that only moves or selects values (max pooling, pad, reshape, permute, squeeze, concat),
  into ``op(x_q)``: the tensor stays integer (a pad pads with the zero point);
- every other quantize / dequantize into plain elementwise ops (``(astype(x) - zp) * scale``,
  ``clip(round(x / scale) + zp)``), which have layout inference.

Weights must be constants with per-output-channel (or per-tensor) scales and zero point 0 (or
one that keeps ``w - zp`` in int8); activations per-tensor uint8 or int8. Anything else stays
float: a conv on dequantized (folded) weights, shown as float32 in the report. Never wrong.

The forms are `relax.dpl` patterns read against the function as imported
(quantize_patterns: what each match means), the replacements small builders
(quantize_builders); the rewriter here only dispatches on the op of each call.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from strategy.layout import array_constant

from ..reporting import calls_of
from .quantize_builders import (
    dequantize_elementwise,
    dequantized_result,
    integer_movement,
    quantize_elementwise,
    requantized,
)
from .quantize_patterns import (
    CONV2D,
    DEQUANTIZE,
    MATMUL,
    PERMUTE,
    QUANTIZE,
    QUANTIZED_PERMUTE,
    FunctionView,
    QParams,
    movement_plan,
    requantize_plan,
)
from .relax_util import op_name, rewrite_functions


@mutator
class _QDQRewriter(PyExprMutator):
    """Matching reads the function as it was (`self.view`); what is emitted refers to the
    rewritten variables (`self.visit_expr(original var)`)."""

    def __init__(self, mod: tvm.IRModule):
        super().__init__(mod)
        self.view: FunctionView | None = None

    def visit_function_(self, func: relax.Function) -> relax.Expr:
        self.view = FunctionView(func)
        return super().visit_function_(func)

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        rewrite = {
            CONV2D: self._float_kernel,
            MATMUL: self._float_kernel,
            QUANTIZE: self._quantize,
            DEQUANTIZE: self._dequantize,
        }.get(op_name(call))
        new = None if rewrite is None else rewrite(call)
        return self.visit_expr_post_order(call) if new is None else new

    def _float_kernel(self, call: relax.Call) -> relax.Expr | None:
        """An integer conv2d / matmul with the float result of `call` (dequantized operands)."""
        kernel = self.view.kernel(call)
        if kernel is None:
            return None
        return dequantized_result(self.builder_, kernel, self.visit_expr(kernel.data), np.zeros(len(kernel.w_scale)))

    def _quantize(self, call: relax.Call) -> relax.Expr | None:
        y = self.view.qparams(call)
        if y is None:
            return None
        if y.per_tensor:
            new = self._quantize_per_tensor(call, y)
            if new is not None:
                return new
        return quantize_elementwise(self.builder_, self.visit_expr(call.args[0]), y)

    def _quantize_per_tensor(self, call: relax.Call, y: QParams) -> relax.Expr | None:
        """A requantized kernel, values moved in integers, or a permute quantized first (it may
        then cancel); None for none of these forms."""
        plan = requantize_plan(self.view, call, y)
        if plan is not None:
            return requantized(self.builder_, plan, self.visit_expr(plan.kernel.data))
        moved = movement_plan(self.view, call, y)
        if moved is not None:
            sources = [self.visit_expr(s) for s in moved.sources]
            args = [] if moved.op is None else [self.visit_expr(a) for a in moved.op.args[1:]]
            return integer_movement(moved, sources, args)
        matched = self.view.match(QUANTIZED_PERMUTE, call)
        if matched is None:
            return None
        permute = matched[PERMUTE]
        quantized = self.builder_.emit(quantize_elementwise(self.builder_, self.visit_expr(permute.args[0]), y))
        return relax.op.permute_dims(quantized, permute.attrs.axes)

    def _dequantize(self, call: relax.Call) -> relax.Expr | None:
        """(astype(x) - zp) * scale as elementwise ops; a constant's value folded."""
        folded = self.view.evaluate(call)
        if folded is not None:
            return array_constant(folded.astype(str(call.attrs.out_dtype)))
        params = self.view.qparams(call)
        if params is None:
            return None
        return dequantize_elementwise(self.builder_, self.visit_expr(call.args[0]), params, str(call.attrs.out_dtype))


def has_qdq(mod: tvm.IRModule) -> bool:
    """Whether any Relax function of `mod` calls quantize or dequantize."""
    return any(
        calls_of(mod, (QUANTIZE, DEQUANTIZE), gvar.name_hint)
        for gvar, func in mod.functions_items()
        if isinstance(func, relax.Function)
    )


@tvm.transform.module_pass(opt_level=0, name="QuantizeQDQ")
def quantize_qdq(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    """QDQ patterns to integer conv2d / matmul with their requantize, the other quantize and
    dequantize calls to elementwise ops (module docstring); a module without them as it is."""
    if not has_qdq(mod):
        return mod
    return relax.transform.DeadCodeElimination()(rewrite_functions(_QDQRewriter, mod))


__all__ = ["QParams", "has_qdq", "quantize_qdq"]
