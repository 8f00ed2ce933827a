"""FoldConstantNumpy: elementwise and shape ops on constants folded in numpy; `numpy_call`,
the value of one such op, for other passes that fold (quantize)."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from strategy.layout import array_constant, constant_array, static_shape

from .relax_util import op_name, resolve, rewrite_functions

BINARY = {
    "relax.add": np.add,
    "relax.subtract": np.subtract,
    "relax.multiply": np.multiply,
    "relax.divide": np.divide,
    "relax.power": np.power,
    "relax.maximum": np.maximum,
    "relax.minimum": np.minimum,
}
UNARY = {
    "relax.sqrt": np.sqrt,
    "relax.rsqrt": lambda a: 1 / np.sqrt(a),
    "relax.exp": np.exp,
    "relax.negative": np.negative,
}


def _shape_arg(expr) -> list[int]:
    return [int(v) for v in expr.values]


# ops that move values: (array, call) -> array
SHAPE_OPS = {
    "relax.reshape": lambda a, call: a.reshape(_shape_arg(call.args[1])),
    "relax.broadcast_to": lambda a, call: np.broadcast_to(a, _shape_arg(call.args[1])),
    "relax.permute_dims": lambda a, call: a.transpose(
        None if call.attrs.axes is None else [int(x) for x in call.attrs.axes]
    ),
    "relax.expand_dims": lambda a, call: np.expand_dims(a, tuple(int(x) for x in call.attrs.axis)),
    "relax.squeeze": lambda a, call: np.squeeze(
        a, None if call.attrs.axis is None else tuple(int(x) for x in call.attrs.axis)
    ),
    "relax.astype": lambda a, call: a,  # the cast to the call's dtype in numpy_call does it
}
# the ops numpy_call computes
NUMPY_OPS = BINARY.keys() | UNARY.keys() | SHAPE_OPS.keys()


def numpy_call(name: str, call: relax.Call, arrays: list[np.ndarray]) -> np.ndarray:
    """The value of `call` (op `name`, one of NUMPY_OPS) on `arrays`, the values of its tensor
    operands, computed in numpy and cast to the call's dtype."""
    if name in BINARY:
        result = BINARY[name](*arrays)
    elif name in UNARY:
        result = UNARY[name](arrays[0])
    else:
        result = SHAPE_OPS[name](arrays[0], call)
    return np.asarray(result, dtype=str(call.ty.dtype))


@mutator
class _NumpyFolder(PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        name = op_name(call)
        if name not in NUMPY_OPS:
            return call
        if not isinstance(call.ty, relax.TensorType) or static_shape(call) is None:
            return call
        operands = [resolve(self, a) for a in call.args if not isinstance(a, relax.ShapeExpr)]
        if not all(isinstance(a, tvm.ir.expr.Constant) for a in operands):
            return call
        arrays = [constant_array(a) for a in operands]
        return array_constant(numpy_call(name, call, arrays))


@tvm.transform.module_pass(opt_level=0, name="FoldConstantNumpy")
class FoldConstantNumpy:
    """Fold the ops of NUMPY_OPS (elementwise arithmetic, reshape, permute, broadcast, casts)
    whose operands are all constants, in numpy, to a constant of the call's static shape.

    TVM's FoldConstant legalizes, compiles with LLVM and runs one kernel for every op it
    folds; these are the ops weight preparation consists of (BN folded into conv weights,
    OIHW -> OHWI, [out, in] -> [in, out]), many per model. FoldConstant still runs after it
    for anything else.
    """

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return rewrite_functions(_NumpyFolder, mod)
