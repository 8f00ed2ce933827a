"""WholeInputPooling: a pooling whose one window covers its whole input, as a reduction."""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from strategy.layout import static_shape

from .relax_util import op_name, rewrite_functions

# the layouts whose spatial axes it finds, and the reduction each pooling becomes
LAYOUTS = ("NCHW", "NHWC")
POOLS = {"relax.nn.avg_pool2d": relax.op.mean, "relax.nn.max_pool2d": relax.op.max}


def whole_input_window(call: relax.Call) -> list[int] | None:
    """The spatial axes (H and W of its layout) of a pooling whose one window, unpadded and
    undilated, covers its whole input (its output is 1x1), else None."""
    attrs = call.attrs
    layout = str(attrs.layout)
    shape, out_shape = static_shape(call.args[0]), static_shape(call)
    if layout not in LAYOUTS or str(attrs.out_layout) != layout or shape is None or out_shape is None:
        return None
    axes = [layout.index("H"), layout.index("W")]
    if any(int(p) for p in attrs.padding) or any(int(d) != 1 for d in attrs.dilation):
        return None
    if any(out_shape[a] != 1 or int(k) < shape[a] for a, k in zip(axes, attrs.pool_size)):
        return None
    return axes


@mutator
class _WholeInputPooling(PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        reduce = POOLS.get(op_name(call))
        axes = whole_input_window(call) if reduce is not None else None
        return call if axes is None else reduce(call.args[0], axes, keepdims=True)


@tvm.transform.module_pass(opt_level=0, name="WholeInputPooling")
class WholeInputPooling:
    """An average or max pooling whose one window covers its whole input (unpadded,
    undilated; NCHW or NHWC) as a mean or max over the spatial axes, keeping them as size 1.
    The pooling kernel loops over the whole window and bounds-checks every element, which a
    window far larger than its input makes costly: Hugging Face's EfficientNet pools its 2x2
    feature map with a 1280x1280 window (ceil_mode)."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return rewrite_functions(_WholeInputPooling, mod)
