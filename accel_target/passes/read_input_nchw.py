"""ReadInputNCHW: the first conv reads the NCHW image as it is instead of its transpose."""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from strategy.conv2d import reads_nchw
from strategy.layout import is_permutation, permutation
from strategy.registry import select

from .relax_util import CONV2D, PERMUTE, bound, conv2d_like, op_name, permute_axes, rewrite_functions

READS_NCHW = "conv2d_nhwc_ohwi.accel"  # the implementation whose kernel may read NCHW data


@mutator
class _ReadInputNCHW(PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        source = bound(self, call.args[0]) if op_name(call) == CONV2D else None
        if op_name(source) != PERMUTE or source.args[0].ty.ndim != 4:
            return call
        layout = str(call.attrs.data_layout)
        if not is_permutation(layout, "NCHW") or permute_axes(source) != permutation("NCHW", layout):
            return call
        new = conv2d_like(call, source.args[0], data_layout="NCHW")
        target = tvm.target.Target.current(allow_none=True)
        impl, _ = (None, None) if target is None else select(new, target.keys)
        return new if impl is not None and impl.name == READS_NCHW and reads_nchw(new) else call


@tvm.transform.module_pass(opt_level=0, name="ReadInputNCHW")
class ReadInputNCHW:
    """conv2d(permute_dims(x), data_layout=NHWC) of NCHW `x` -> conv2d(x, data_layout=NCHW), its
    out_layout kept, where conv2d_nhwc_ohwi.accel takes the new call and its kernel reads x as
    it is (strategy.conv2d.reads_nchw: a model's first conv, on the image, transposed in the
    padded copy of its input the kernel makes anyway). ConvertLayout leaves that permute of
    the input before the first conv, a runtime transform of the whole image."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return rewrite_functions(_ReadInputNCHW, mod)
