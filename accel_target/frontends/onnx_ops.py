"""ONNX converters for ops that TVM 0.27's ONNX frontend computes differently from ONNX's
definition (its reference implementation, which ONNX Runtime follows), silently:

- ``TopK``: TVM's kernel compares the floats, so a NaN fell anywhere (the 3 largest of
  [nan, 1, nan, 2, 0, 2] came out [nan, 1, nan]); ONNX orders NaN above every number, and of
  equal values the one at the lower index first. Here: the stable order of integer keys
  (accel_target/frontends/torch_math.order_key), its first k, the values read back at them.
  ``sorted=0`` (any order) is computed sorted, one such order, where TVM's refused it.
- ``Sign`` of NaN is NaN (TVM's: 0).
- ``IsInf`` reads ``detect_positive`` / ``detect_negative`` (TVM's flags both infinities).
- ``ThresholdedRelu`` is ``x > alpha ? x : 0`` in x's dtype (TVM's multiplied x by the
  comparison in float32: NaN for -inf, and float32 for any input).
- ``OneHot`` gives the dtype of its values (TVM's: float64 for float32 values).
- ``ConvTranspose`` reads ``output_shape`` (TVM's ignored it: another output size).
- ``Unique`` of an N-D tensor (TVM's failed).
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend as stock
from tvm.relax.frontend.onnx.onnx_frontend import get_constant

from strategy.layout import constant_array, tensor_shape

from ..passes.relax_util import is_floating
from .torch_math import order_key


class TopK(stock.OnnxOpConverter):
    """TopK with NaN above every number and ties in index order (see the module docstring)."""

    @classmethod
    def _top(cls, bb, x, k: int, axis: int, largest: bool) -> relax.Expr:
        order = bb.emit(relax.op.argsort(order_key(bb, x), axis=axis, descending=largest, dtype="int64"))
        indices = bb.emit(relax.op.strided_slice(order, [axis], [0], [k]))
        return relax.Tuple([bb.emit(relax.op.gather_elements(x, indices, axis=axis)), indices])

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        return cls._top(bb, inputs[0], int(attr.get("k", 1)), int(attr.get("axis", -1)), True)

    @classmethod
    def _impl_v10(cls, bb, inputs, attr, params):
        return cls._impl_v11(bb, inputs, attr, params)

    @classmethod
    def _impl_v11(cls, bb, inputs, attr, params):
        k = get_constant(inputs[1], params)
        if not isinstance(k, tvm.ir.GenericConst):
            raise ValueError("accel: TopK with a k computed at run time; supported: a constant k")
        k = int(constant_array(k).reshape(-1)[0])
        return cls._top(bb, inputs[0], k, int(attr.get("axis", -1)), bool(attr.get("largest", 1)))


class Sign(stock.OnnxOpConverter):
    @classmethod
    def _impl_v9(cls, bb, inputs, attr, params):
        x = inputs[0]
        if not is_floating(x):
            return relax.op.sign(x)
        return relax.op.where(relax.op.isnan(x), x, relax.op.sign(x))


class IsInf(stock.OnnxOpConverter):
    @classmethod
    def _impl_v10(cls, bb, inputs, attr, params):
        x = inputs[0]
        dtype = str(x.ty.dtype)
        found = [
            relax.op.equal(x, relax.const(value, dtype))
            for value, attribute in ((np.inf, "detect_positive"), (-np.inf, "detect_negative"))
            if attr.get(attribute, 1)
        ]
        if not found:
            return relax.op.zeros_like(x, "bool")
        return found[0] if len(found) == 1 else relax.op.logical_or(*found)


class ThresholdedRelu(stock.OnnxOpConverter):
    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        x = inputs[0]
        dtype = str(x.ty.dtype)
        above = relax.op.greater(x, relax.const(float(attr.get("alpha", 1.0)), dtype))
        return relax.op.where(above, x, relax.const(0, dtype))


class OneHot(stock.OneHot):
    @classmethod
    def _impl_v11(cls, bb, inputs, attr, params):
        found = bb.normalize(super()._impl_v11(bb, inputs, attr, params))
        dtype = str(inputs[2].ty.dtype)
        return found if str(found.ty.dtype) == dtype else relax.op.astype(found, dtype)


class ConvTranspose(stock.ConvTranspose):
    """ConvTranspose with ``output_shape``: the pads it implies, as ONNX derives them (TVM's
    converter ignored it, and the output had the size of the pads given instead)."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        if "output_shape" not in attr:
            return super()._impl_v1(bb, inputs, attr, params)
        wanted, sizes = list(attr.pop("output_shape")), tensor_shape(inputs[0])[2:]
        weight = tensor_shape(inputs[1])[2:]
        if len(wanted) != len(sizes) or not all(isinstance(d, int) for d in sizes + weight):
            raise NotImplementedError(
                f"accel: ConvTranspose with output_shape {wanted} of an input of spatial sizes {sizes}; "
                "supported: known sizes, output_shape of the spatial axes"
            )
        axes = range(len(sizes))
        strides, dilations = attr.get("strides", [1] * len(sizes)), attr.get("dilations", [1] * len(sizes))
        extra, kernel = attr.get("output_padding", [0] * len(sizes)), attr.get("kernel_shape", weight)
        auto_pad = attr.pop("auto_pad", b"NOTSET")
        upper = (auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad) == "SAME_UPPER"
        total = [strides[i] * (sizes[i] - 1) + extra[i] + (kernel[i] - 1) * dilations[i] + 1 - wanted[i] for i in axes]
        if any(t < 0 for t in total):
            raise NotImplementedError(
                f"accel: ConvTranspose with output_shape {wanted} larger than its full output "
                f"{[w + t for w, t in zip(wanted, total, strict=True)]}; supported: at most that"
            )
        begin = [t // 2 if upper else t - t // 2 for t in total]
        attr["pads"] = begin + [t - b for t, b in zip(total, begin, strict=True)]
        return super()._impl_v1(bb, inputs, attr, params)


class Unique(stock.Unique):
    """Unique of the flattened tensor (no axis) flattened first: TVM's runs numpy's unique on
    the tensor as it is, whose inverse indices keep the tensor's shape (numpy 2), where TVM
    expects them flat: the call failed."""

    @classmethod
    def _impl_v11(cls, bb, inputs, attr, params):
        x = inputs[0]
        if attr.get("axis") is None and len(x.ty.shape) != 1:
            x = bb.emit(relax.op.reshape(x, [-1]))
        return super()._impl_v11(bb, [x, *inputs[1:]], attr, params)


CONVERTERS = {
    "ConvTranspose": ConvTranspose,
    "Unique": Unique,
    "TopK": TopK,
    "Sign": Sign,
    "IsInf": IsInf,
    "ThresholdedRelu": ThresholdedRelu,
    "OneHot": OneHot,
}
