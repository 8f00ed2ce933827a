"""Pooling as PyTorch defines it, where TVM's importer lacks it or gets it wrong.

- ``adaptive_max_pool1d`` / ``adaptive_max_pool2d`` (timm's bilinear attention transform pools
  [N, C, H, W] to [N, C, t, 1] and [N, C, 1, t]), which TVM's importer lacks. Output cell ``i``
  of an axis of ``n`` in ``m`` covers ``[floor(i * n / m), ceil((i + 1) * n / m))``: where ``m``
  divides ``n`` on every axis that is ``max_pool`` with kernel = stride = ``n / m`` (which the
  layout passes carry in NHWC), else the maximum of each cell's slice, axis by axis.
- The ``*_with_indices`` pools: TVM's converters return zeros for the indices, silently. Where
  the program uses the indices (``return_indices=True``), the import is refused, naming the op;
  where it does not, the values are what they were.
- ``avg_pool2d`` / ``avg_pool3d`` with ``divisor_override``: TVM's converter ignores it and
  divides by the window. Each window's sum divided by the override is computed as an average
  pool over windows that are all whole (the input padded with zeros on every side the windows
  reach, ``ceil_mode``'s last window included) times the window's size over the override.
"""

from __future__ import annotations

from tvm import relax

from strategy.layout import tensor_shape

from .torch_fold import Converter
from .torch_promote import theirs


def refuse_unread(node, what: str) -> None:
    """Raise NotImplementedError naming `node`'s op where the program reads more of its tuple of
    results than the first (`what`: the others, which the converter does not compute)."""
    import operator

    if any(user.target is not operator.getitem or user.args[1] != 0 for user in node.users):
        raise NotImplementedError(f"accel: {node.target.__name__} with {what} read is not supported")


def _refuse_indices(node) -> None:
    refuse_unread(node, "its indices (return_indices=True)")


def max_pool_with_indices(node, importer) -> relax.Expr:
    """aten.max_pool{2,3}d_with_indices: TVM's converter, for a program that reads only the values."""
    _refuse_indices(node)
    return theirs(node, importer)


def _cells(size: int, cells: int) -> list[tuple[int, int]]:
    """[start, end) of each of `cells` adaptive pooling cells over an axis of `size`."""
    return [(i * size // cells, -(-(i + 1) * size // cells)) for i in range(cells)]


def adaptive_max_pool(node, importer):
    """aten.adaptive_max_pool{1,2}d(x, output_size) -> (values, indices): see the module docstring."""
    _refuse_indices(node)
    bb, x = importer.block_builder, importer.env[node.args[0]]
    output_size = list(node.args[1])
    spatial = len(output_size)
    rank = len(x.ty.shape)
    shape = tensor_shape(x)[rank - spatial :]
    if not all(isinstance(n, int) for n in shape):
        raise NotImplementedError(f"accel: {node.target.__name__} of a symbolic size {shape} is not supported")
    if all(n % m == 0 for n, m in zip(shape, output_size)):
        kernel = [n // m for n, m in zip(shape, output_size)]
        lead = rank - spatial  # [C, ...] pools as [1, C, ...]
        data = relax.op.expand_dims(x, 0) if lead == 1 else x
        pool = relax.op.nn.max_pool2d if spatial == 2 else relax.op.nn.max_pool1d
        values = pool(data, kernel, kernel, layout="NCHW" if spatial == 2 else "NCW")
        values = bb.emit(relax.op.squeeze(values, [0]) if lead == 1 else values)
        return bb.emit(relax.Tuple([values]))
    values = x
    for axis, (n, m) in enumerate(zip(shape, output_size), rank - spatial):
        cells = [relax.op.strided_slice(values, [axis], [a], [b]) for a, b in _cells(n, m)]
        pieces = [relax.op.max(cell, [axis], keepdims=True) for cell in cells]
        values = bb.emit(relax.op.concat(pieces, axis) if len(pieces) > 1 else pieces[0])
    return bb.emit(relax.Tuple([values]))


def _pooled_size(size: int, kernel: int, stride: int, pad: int, ceil_mode: bool) -> int:
    """PyTorch's pooling output size (ATen's pooling_output_shape, dilation 1)."""
    span = size + 2 * pad - kernel
    out = (span + (stride - 1 if ceil_mode else 0)) // stride + 1
    return out - 1 if ceil_mode and (out - 1) * stride >= size + pad else out


def _per_axis(value, spatial: int) -> list[int]:
    """A pooling argument (an int, or a list of one or of `spatial`) as `spatial` ints."""
    values = [value] if isinstance(value, int) else list(value)
    return values * spatial if len(values) == 1 else values


def avg_pool(node, importer) -> relax.Expr:
    """aten.avg_pool{2,3}d(x, kernel_size, stride=[], padding=0, ceil_mode=False,
    count_include_pad=True, divisor_override=None): see the module docstring."""
    spatial = 2 if node.target.__name__.startswith("avg_pool2d") else 3
    args = [*node.args, *[None] * 7][:7]
    divisor = args[6] if args[6] is not None else node.kwargs.get("divisor_override")
    if divisor is None:
        return theirs(node, importer)
    bb, x = importer.block_builder, importer.env[node.args[0]]
    kernel, stride, pad = (_per_axis(v, spatial) for v in (args[1], args[2] or args[1], args[3] or 0))
    ceil_mode = bool(args[4])
    shape = tensor_shape(x)[-spatial:]
    if not all(isinstance(n, int) for n in shape):
        raise NotImplementedError(f"accel: {node.target.__name__} with divisor_override of a symbolic size {shape}")
    pad_width = [0, 0] * (len(x.ty.shape) - spatial)
    for n, k, st, p in zip(shape, kernel, stride, pad):
        # zeros up to the last window's end (past the padding where ceil_mode adds a window)
        reach = (_pooled_size(n, k, st, p, ceil_mode) - 1) * st + k
        pad_width += [p, max(reach - n - p, p)]
    padded = bb.emit(relax.op.nn.pad(x, pad_width))
    lead = len(x.ty.shape) - spatial  # [C, ...] pools as [1, C, ...]
    data = bb.emit(relax.op.expand_dims(padded, 0)) if lead == 1 else padded
    pool = relax.op.nn.avg_pool2d if spatial == 2 else relax.op.nn.avg_pool3d
    average = bb.emit(pool(data, kernel, stride, layout="NCHW" if spatial == 2 else "NCDHW"))
    average = bb.emit(relax.op.squeeze(average, [0])) if lead == 1 else average
    volume = 1
    for k in kernel:
        volume *= k
    return bb.emit(relax.op.multiply(average, relax.const(volume / float(divisor), str(x.ty.dtype))))


CONVERTERS: dict[str, Converter] = {
    "avg_pool2d.default": avg_pool,
    "avg_pool3d.default": avg_pool,
    "adaptive_max_pool1d.default": adaptive_max_pool,
    "adaptive_max_pool2d.default": adaptive_max_pool,
    "max_pool2d_with_indices.default": max_pool_with_indices,
    "max_pool3d_with_indices.default": max_pool_with_indices,
}
