"""PadAsConv: zero pads of an NCHW tensor's spatial axes carried through ConvertLayout as convs."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from strategy.layout import static_shape

from .relax_util import PAD, conv_padding_of_pad, op_name, rewrite_functions

FLOAT_DTYPES = ("float16", "float32", "float64")


@mutator
class _PadAsConv(PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        padding = conv_padding_of_pad(call, "NCHW") if op_name(call) == PAD else None
        if padding is None:
            return call
        shape, dtype = static_shape(call.args[0]), str(call.ty.dtype)
        if shape is None or dtype not in FLOAT_DTYPES:
            return call
        ones = relax.const(np.ones((shape[1], 1, 1, 1), dtype))
        return relax.op.nn.conv2d(call.args[0], ones, padding=padding, groups=shape[1])


@tvm.transform.module_pass(opt_level=0, name="PadAsConv")
class PadAsConv:
    """A zero pad of the spatial axes of an NCHW tensor [N, C, H, W] as the identity depthwise
    1x1 conv2d with that padding (weight [C, 1, 1, 1] of ones, groups C), so that
    ConvertLayout converts it with the convolutions around it: TVM 0.27 has no
    FRelaxInferLayout for nn.pad (and its InferLayoutOutput cannot be built from Python to
    register one), so a pad would otherwise stay NCHW between two transposes.
    SimplifyLayouts turns the conv back into a pad in whatever layout it ended in. Reflect,
    replicate and non-zero pads, and pads of integer tensors, are left as they are."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return rewrite_functions(_PadAsConv, mod)
