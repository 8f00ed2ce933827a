"""PyTorch's nearest and bilinear interpolation, computed as PyTorch defines them.

TVM's importer maps ``upsample_nearest2d`` to a resize with half-pixel coordinates rounded to
the nearest index, where PyTorch takes ``floor(dst * scale)``: a 3x3 -> 7x7 upsample differed in
104 of 392 elements. And for a ``scale_factor`` whose product with the input size is not whole,
PyTorch maps coordinates with ``1 / scale_factor``, TVM's resize with ``in / out``.

Each axis's source coordinates are computed here in float32 as PyTorch computes them
(ATen's UpSample.h: ``nearest_idx``, ``area_pixel_compute_source_index``). Where TVM's
``resize2d`` (which has layout inference: it runs in NHWC) computes the same coordinates, it is
used: nearest with asymmetric coordinates and floor rounding, linear with half-pixel or
align-corners coordinates (not to a size of 1, where TVM's scale divides by zero and PyTorch's
is 0: timm's CSATv2 pools a map to 1x1 so). Otherwise the result is gathered with those tables
(``take`` per axis, and for linear the two neighbours' weights), exactly.

Antialiased bilinear and bicubic resizes (``antialias=True``): TVM's importer maps the bilinear
one to the plain bilinear resize, which differs wherever an axis shrinks (the antialiased filter
widens with the scale), and has no bicubic one. Both are linear and separable: the result is
``rows @ x @ columns`` with one constant matrix per axis, which PyTorch computes here by
resizing the identity along that axis (the other axis keeps its size, an identity, so each
matrix holds PyTorch's own weights). An axis that keeps its size is left out.
"""

from __future__ import annotations

import numpy as np
from tvm import relax

from strategy.layout import tensor_shape

from .torch_complex import node_arg

F32 = np.float32


def _scale(size_in: int, size_out: int, scale_factor, align_corners: bool) -> np.float32:
    """PyTorch's `area_pixel_compute_scale`."""
    if align_corners:
        return F32(size_in - 1) / F32(size_out - 1) if size_out > 1 else F32(0)
    return F32(1.0 / scale_factor) if scale_factor else F32(size_in) / F32(size_out)


def nearest_indices(size_in: int, size_out: int, scale_factor=None) -> np.ndarray:
    """PyTorch's source index of each output index, nearest mode."""
    dst = np.arange(size_out, dtype=F32)
    src = np.floor(dst * _scale(size_in, size_out, scale_factor, False)).astype(np.int64)
    return np.minimum(src, size_in - 1)


def linear_sources(size_in: int, size_out: int, align_corners: bool, scale_factor=None):
    """(lower index, upper index, upper weight) of each output index, linear mode."""
    dst = np.arange(size_out, dtype=F32)
    scale = _scale(size_in, size_out, scale_factor, align_corners)
    src = dst * scale if align_corners else np.maximum(scale * (dst + F32(0.5)) - F32(0.5), F32(0))
    low = src.astype(np.int64)
    high = low + (low < size_in - 1)
    return low, high, (src - low.astype(F32)).astype(F32)


def _output_sizes(node, shape: list, size_arg: int, scale_arg: int) -> tuple[list, list]:
    """(output H and W, the scale factors or Nones) of an upsample node."""
    size = node_arg(node, size_arg, "output_size", None)
    scales = node_arg(node, scale_arg, "scale_factors", None)
    if size is not None:
        return [int(s) for s in size], [None, None]
    return [int(shape[2 + i] * float(s)) for i, s in enumerate(scales)], [float(s) for s in scales]


def _resize(bb, x, size, method: str, mode: str) -> relax.Expr:
    rounding = "floor" if method == "nearest_neighbor" else ""
    return bb.emit(
        relax.op.image.resize2d(
            x, size, layout="NCHW", method=method, coordinate_transformation_mode=mode, rounding_method=rounding
        )
    )


def take_at(bb, x, indices: np.ndarray, axis: int) -> relax.Expr:
    """x gathered along `axis` at constant `indices` (a resize's source index table)."""
    return bb.emit(relax.op.take(x, relax.const(indices.astype("int64")), axis=axis))


def _weights(values: np.ndarray, axis: int, dtype: str) -> relax.Expr:
    shape = [1, 1, 1, 1]
    shape[axis] = len(values)
    return relax.const(values.reshape(shape).astype(dtype))


def upsample_nearest2d(node, importer) -> relax.Expr:
    """aten.upsample_nearest2d.vec(x, output_size, scale_factors) on NCHW x."""
    bb, x = importer.block_builder, importer.env[node.args[0]]
    shape = [int(d) for d in x.ty.shape]
    size, scales = _output_sizes(node, shape, 1, 2)
    tables = [nearest_indices(shape[2 + i], size[i], scales[i]) for i in range(2)]
    if all(np.array_equal(t, nearest_indices(shape[2 + i], size[i])) for i, t in enumerate(tables)):
        return _resize(bb, x, size, "nearest_neighbor", "asymmetric")  # (TVM's coordinates: in / out)
    for i, table in enumerate(tables):
        x = take_at(bb, x, table, 2 + i)
    return x


def upsample_bilinear2d(node, importer) -> relax.Expr:
    """aten.upsample_bilinear2d.vec(x, output_size, align_corners, scale_factors) on NCHW x."""
    bb, x = importer.block_builder, importer.env[node.args[0]]
    shape, dtype = [int(d) for d in x.ty.shape], str(x.ty.dtype)
    align = bool(node_arg(node, 2, "align_corners", False))
    size, scales = _output_sizes(node, shape, 1, 3)
    whole = all(s is None or shape[2 + i] * s == size[i] for i, s in enumerate(scales))
    if min(size) > 1 if align else whole:
        return _resize(bb, x, size, "linear", "align_corners" if align else "half_pixel")
    for i in range(2):
        low, high, weight = linear_sources(shape[2 + i], size[i], align, scales[i])
        lows, highs = take_at(bb, x, low, 2 + i), take_at(bb, x, high, 2 + i)
        upper = _weights(weight, 2 + i, dtype)
        x = bb.emit(relax.op.add(lows, relax.op.multiply(relax.op.subtract(highs, lows), upper)))
    return x


def _antialiased_weights(op, size_in: int, size_out: int, align_corners: bool, scale, axis: int) -> np.ndarray:
    """One axis's matrix of the antialiased resize `op`: [size_out, size_in] for the rows (axis
    2), [size_in, size_out] for the columns (axis 3), computed by PyTorch on the identity."""
    import torch

    rows = axis == 2
    sizes = [size_out, size_in] if rows else [size_in, size_out]
    scales = [scale, None] if rows else [None, scale]
    return op(torch.eye(size_in)[None, None], sizes, align_corners, *scales)[0, 0].numpy()


def upsample_antialiased(node, importer) -> relax.Expr:
    """aten._upsample_{bilinear,bicubic}2d_aa(x, output_size, align_corners, scales_h=None,
    scales_w=None) on NCHW x: see the module docstring."""
    bb, x = importer.block_builder, importer.env[node.args[0]]
    shape, dtype = tensor_shape(x), str(x.ty.dtype)
    size = [int(s) for s in node.args[1]]
    if not all(isinstance(n, int) for n in shape):
        raise NotImplementedError(f"accel: {node.target.__name__} of a symbolic size {shape} is not supported")
    align = bool(node_arg(node, 2, "align_corners", False))
    scales = [node_arg(node, 3, "scales_h", None), node_arg(node, 4, "scales_w", None)]
    for axis in (2, 3):
        weights = _antialiased_weights(node.target, shape[axis], size[axis - 2], align, scales[axis - 2], axis)
        if np.array_equal(weights, np.eye(shape[axis])):
            continue
        matrix = relax.const(weights.astype(dtype))
        x = bb.emit(relax.op.matmul(matrix, x) if axis == 2 else relax.op.matmul(x, matrix))
    return x


CONVERTERS = {
    "upsample_nearest2d.vec": upsample_nearest2d,
    "upsample_bilinear2d.vec": upsample_bilinear2d,
    "_upsample_bilinear2d_aa.default": upsample_antialiased,
    "_upsample_bicubic2d_aa.default": upsample_antialiased,
}
