"""ONNX Resize where TVM's converter would compute other coordinates than ONNX defines.

TVM's converter turns a Resize's ``scales`` into output sizes and then maps coordinates with
``in / out``; ONNX maps them with the scale itself (``x_original = x_resized / scale`` for
``asymmetric``, ``(x_resized + 0.5) / scale - 0.5`` for the half-pixel modes). The two agree
where ``scale * size`` is whole; elsewhere (PyTorch's ``F.interpolate(scale_factor=1.7)``
exported) TVM's result differed from ONNX Runtime's and PyTorch's, silently. There, each axis's
source coordinates are computed here as ONNX defines them, in float32, and the result is
gathered: nearest (every ``nearest_mode``) and linear, in the ``asymmetric``, ``half_pixel`` and
``pytorch_half_pixel`` modes (``align_corners`` and ``tf_crop_and_resize`` map from the sizes,
as TVM's converter and ONNX Runtime do). What this cannot compute and TVM's converter would
compute wrongly is refused with an error naming it: cubic with such scales, ``antialias`` where it
filters (a linear or cubic downscaling), ``axes`` and a ``keep_aspect_ratio_policy``, which TVM's
converter does not read.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend as stock

from .torch_resize import take_at

F32 = np.float32


def _source(coordinate_mode: str, size_in: int, size_out: int, scale: float) -> np.ndarray:
    """ONNX's original coordinate of each output index along an axis, in float32."""
    dst, scale = np.arange(size_out, dtype=F32), F32(scale)
    if coordinate_mode == "asymmetric":
        return dst / scale
    if coordinate_mode == "pytorch_half_pixel" and size_out == 1:
        return np.zeros(1, F32)
    if coordinate_mode in ("half_pixel", "pytorch_half_pixel"):
        return (dst + F32(0.5)) / scale - F32(0.5)
    raise tvm.error.OpNotImplemented(
        f"accel: ONNX Resize with coordinate_transformation_mode={coordinate_mode!r} and a scale {scale:g} whose "
        f"product with the input size {size_in} is not whole is not supported "
        "(supported there: asymmetric, half_pixel, pytorch_half_pixel)"
    )


_SIZES_ONLY = ("align_corners", "tf_crop_and_resize")  # coordinates from the sizes, as TVM maps them

_ROUNDING = {
    "round_prefer_floor": lambda x: np.ceil(x - F32(0.5)),
    "round_prefer_ceil": lambda x: np.floor(x + F32(0.5)),
    "floor": np.floor,
    "ceil": np.ceil,
}


def _unread(attr: dict, upscaling: bool) -> str | None:
    """The attribute TVM's converter would ignore where it matters (antialias filters only a
    linear or cubic downscaling)."""
    if attr.get("antialias", 0) and attr.get("mode", b"nearest") != b"nearest" and not upscaling:
        return "antialias=1 when downscaling"
    if attr.get("axes") is not None:
        return f"axes={list(attr['axes'])}"
    if attr.get("keep_aspect_ratio_policy", b"stretch") != b"stretch":
        return f"keep_aspect_ratio_policy={attr['keep_aspect_ratio_policy'].decode()}"
    return None


def _upscaling(inputs, params, scales, shape: list) -> bool:
    """Whether no axis gets smaller, by constant scales or constant sizes of a static shape."""
    if isinstance(scales, tvm.ir.GenericConst):
        return bool(np.all(scales.value.numpy() >= 1))
    sizes = stock.get_constant(inputs[3], params) if len(inputs) > 3 and inputs[3] is not None else None
    if not isinstance(sizes, tvm.ir.GenericConst) or None in shape:
        return False
    return bool(np.all(sizes.value.numpy() >= np.array(shape)))


class Resize(stock.Resize):
    """Resize as ONNX defines it: see the module docstring."""

    @classmethod
    def _impl_v18(cls, bb, inputs, attr, params):
        scales = stock.get_constant(inputs[2], params) if len(inputs) > 2 and inputs[2] is not None else None
        x = inputs[0]
        shape = [getattr(d, "value", None) for d in x.ty.shape]
        if (unread := _unread(attr, _upscaling(inputs, params, scales, shape))) is not None:
            raise tvm.error.OpNotImplemented(f"accel: ONNX Resize with {unread} is not supported")
        if not isinstance(scales, tvm.ir.GenericConst) or None in shape:
            return super()._impl_v18(bb, inputs, attr, params)
        scales = scales.value.numpy().astype("float64")
        axes = [(axis, n, int(np.floor(n * s)), s) for axis, (n, s) in enumerate(zip(shape, scales)) if axis >= 2]
        coordinate_mode = attr.get("coordinate_transformation_mode", b"half_pixel").decode()
        if all(n * s == out for _, n, out, s in axes) or coordinate_mode in _SIZES_ONLY:
            return super()._impl_v18(bb, inputs, attr, params)
        mode = attr.get("mode", b"nearest").decode()
        if mode not in ("nearest", "linear"):
            raise tvm.error.OpNotImplemented(
                f"accel: ONNX Resize mode={mode!r} with scales {[f'{s:g}' for s in scales]} whose product with the "
                f"input shape {shape} is not whole is not supported (there: nearest, linear)"
            )
        rounding = _ROUNDING[attr.get("nearest_mode", b"round_prefer_floor").decode()]
        for axis, n, out, scale in axes:
            if scale == 1:
                continue
            source = _source(coordinate_mode, n, out, scale)
            if mode == "nearest":
                x = take_at(bb, x, np.clip(rounding(source), 0, n - 1), axis)
                continue
            source = np.clip(source, F32(0), F32(n - 1))
            low = np.floor(source).astype(np.int64)
            high = np.minimum(low + 1, n - 1)
            weight = (source - low.astype(F32)).reshape([-1 if a == axis else 1 for a in range(len(shape))])
            lows, highs = take_at(bb, x, low, axis), take_at(bb, x, high, axis)
            upper = relax.const(weight.astype(str(x.ty.dtype)))
            x = bb.emit(relax.op.add(lows, relax.op.multiply(relax.op.subtract(highs, lows), upper)))
        return x
