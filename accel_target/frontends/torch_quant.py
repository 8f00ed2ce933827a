"""Converters for PyTorch's quantized_decomposed ops (torch.export of a PT2E-quantized model),
which TVM 0.27's exported-program importer lacks.

``convert_pt2e`` leaves the quantized model as float ops between
``quantized_decomposed.quantize_per_tensor`` / ``dequantize_per_tensor`` (activations) and
``dequantize_per_channel`` (int8 weights, a scale per output channel). They become
``relax.quantize`` / ``relax.dequantize``: the same QDQ graph as an ONNX QDQ model, which
`accel_target.passes.quantize` rewrites to the integer kernels. A ``[quant_min, quant_max]`` narrower
than the dtype's (7-bit ranges) is a clip of the quantized tensor.
"""

from __future__ import annotations

import numpy as np
from tvm import relax

# quantized_decomposed's arguments after the tensor: scale, zero_point, [axis,] quant_min, quant_max, dtype
_TORCH_DTYPES = {"torch.uint8": "uint8", "torch.int8": "int8", "torch.int32": "int32"}


def _dtype(value) -> str:
    name = _TORCH_DTYPES.get(str(value))
    if name is None:
        raise ValueError(f"accel: quantized_decomposed dtype {value} is not supported; supported: uint8, int8, int32")
    return name


def _param(importer, value, dtype: str) -> relax.Expr:
    """A scale / zero point: a number of the graph, or a tensor (a buffer, a constant)."""
    if isinstance(value, (int, float)):
        return relax.const(np.asarray(value, dtype=dtype))
    expr = importer.env[value]
    return expr if str(expr.ty.dtype) == dtype else importer.block_builder.emit(relax.op.astype(expr, dtype))


def _clipped(bb, quantized: relax.Expr, low: int, high: int, dtype: str) -> relax.Expr:
    info = np.iinfo(dtype)
    if (low, high) == (info.min, info.max):
        return quantized
    return bb.emit(relax.op.clip(quantized, low, high))


def quantize_per_tensor(node, importer) -> relax.Expr:
    """quantize_per_tensor(x, scale, zero_point, quant_min, quant_max, dtype)."""
    bb = importer.block_builder
    x, scale, zero_point, low, high, dtype = node.args[:6]
    dtype = _dtype(dtype)
    data = importer.env[x]
    q = bb.emit(
        relax.op.quantize(
            data, _param(importer, scale, "float32"), _param(importer, zero_point, dtype), axis=0, out_dtype=dtype
        )
    )
    return _clipped(bb, q, int(low), int(high), dtype)


def _dequantize(node, importer, axis: int) -> relax.Expr:
    """dequantize of node.args[:3] (tensor, scale, zero point) along `axis`."""
    x, scale, zero_point = node.args[:3]
    data = importer.env[x]
    dtype = str(data.ty.dtype)
    scale, zero_point = _param(importer, scale, "float32"), _param(importer, zero_point, dtype)
    return importer.block_builder.emit(relax.op.dequantize(data, scale, zero_point, axis=axis))


def dequantize_per_tensor(node, importer) -> relax.Expr:
    """dequantize_per_tensor(x, scale, zero_point, quant_min, quant_max, dtype, *, out_dtype=None)."""
    return _dequantize(node, importer, 0)


def dequantize_per_channel(node, importer) -> relax.Expr:
    """dequantize_per_channel(w, scales, zero_points, axis, quant_min, quant_max, dtype, *, out_dtype=None)."""
    return _dequantize(node, importer, int(node.args[3]))


CONVERTERS = {
    "quantize_per_tensor.default": quantize_per_tensor,
    "quantize_per_tensor.tensor": quantize_per_tensor,
    "dequantize_per_tensor.default": dequantize_per_tensor,
    "dequantize_per_tensor.tensor": dequantize_per_tensor,
    "dequantize_per_channel.default": dequantize_per_channel,
}

__all__ = ["CONVERTERS"]
