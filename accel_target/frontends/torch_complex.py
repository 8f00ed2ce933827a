"""Complex tensors and FFTs through TVM's torch.export importer, which has neither.

A complex tensor is carried as its ``torch.view_as_real``: a real tensor of the matching
precision with a trailing axis of 2 (real, imaginary), so that ``view_as_real`` and
``view_as_complex`` are the tensor itself.

FFTs (``aten._fft_r2c``, ``_fft_c2c``, ``_fft_c2r``: what torch.export makes of torch.fft's
fft, fftn, rfft, irfft, ...) are discrete Fourier transforms as products with constant
matrices, one transformed axis at a time: the axis moved next to the (real, imaginary) pair,
both flattened into one, and multiplied by a matrix of cosines and sines of twice the size
(scaled by the normalization) — a matmul the accel dense kernel computes. That is n² work
per transformed axis where an FFT does n log n, which at the sequence and feature lengths of
the models that use it (FNet, Autoformer: 8-512) is a small matrix product.

Elementwise ops on complex values: ``mul`` and ``add`` / ``sub`` (complex with complex, real
or a number), ``_conj``, copies (``clone``, ``_to_copy``: a real tensor made complex, a complex
one's real parts), ``abs`` (magnitudes: a spectrogram); shape ops: ``permute``, ``view`` /
``reshape``, ``unsqueeze``, ``select``, ``slice`` and a zero ``constant_pad_nd`` (what irfft
does to an input of another length). Any other op with a complex input or output is an error
at import that names it (`check`), never a computation on the pairs as if they were real
values.
"""

from __future__ import annotations

import math

import numpy as np
from tvm import relax

from strategy.layout import tensor_shape

_PART_DTYPES = {"torch.complex64": "float32", "torch.complex128": "float64"}
# ATen's fft_norm_mode: none, by_root_n, by_n
_NORMALIZATION = {0: lambda n: 1.0, 1: lambda n: 1 / math.sqrt(n), 2: lambda n: 1 / n}


def is_complex(node) -> bool:
    """Whether an fx node's value is a complex tensor."""
    import torch

    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return isinstance(value, torch.Tensor) and value.is_complex()


def aten_name(node) -> str:
    """An aten op's name as the importer's table has it ("div.Tensor_mode")."""
    return f"{node.target._opname}.{node.target._overloadname}"


def node_arg(node, index: int, key: str, default):
    """Argument `index` (positional) or `key` (keyword) of an fx node, `default` when absent."""
    return node.args[index] if len(node.args) > index else node.kwargs.get(key, default)


def cast(bb, value: relax.Expr, dtype: str) -> relax.Expr:
    """`value` as `dtype` (itself if it is of that dtype)."""
    return value if str(value.ty.dtype) == dtype else bb.emit(relax.op.astype(value, dtype))


def _part_dtype(node) -> str:
    dtype = str(node.meta["val"].dtype)
    if dtype not in _PART_DTYPES:
        raise NotImplementedError(f"accel: {aten_name(node)} gives {dtype}; supported: complex64, complex128")
    return _PART_DTYPES[dtype]


def _moved(bb, x: relax.Expr, axis: int, to: int) -> tuple[relax.Expr, list[int] | None]:
    """`x` with `axis` moved to position `to`, and the permutation that moves it back."""
    rank = len(tensor_shape(x))
    axis, to = axis % rank, to % rank
    if axis == to:
        return x, None
    order = [a for a in range(rank) if a != axis]
    order.insert(to, axis)
    return bb.emit(relax.op.permute_dims(x, order)), list(np.argsort(order))


def _times(bb, x: relax.Expr, matrix: np.ndarray, axes: int, out_shape: list) -> relax.Expr:
    """The last `axes` axes of `x` flattened and multiplied by `matrix`, then shaped `out_shape`."""
    shape = tensor_shape(x)
    flat = bb.emit(relax.op.reshape(x, [*shape[: len(shape) - axes], int(matrix.shape[0])]))
    product = bb.emit(relax.op.matmul(flat, relax.const(matrix.astype(str(x.ty.dtype)))))
    return bb.emit(relax.op.reshape(product, out_shape))


def _angles(rows: int, n: int, columns: int) -> np.ndarray:
    """[rows, columns]: 2π j k / n (j k taken modulo n first, for precision)."""
    return 2 * np.pi * (np.outer(np.arange(rows), np.arange(columns)) % n) / n


def _complex_matrix(n: int, inverse: bool, scale: float) -> np.ndarray:
    """[2n, 2n]: (re, im) pairs of n values to the pairs of their DFT (inverse DFT), scaled."""
    angles = _angles(n, n, n)
    cos, sin = np.cos(angles) * scale, np.sin(angles) * scale * (-1 if inverse else 1)
    matrix = np.empty((n, 2, n, 2))
    matrix[:, 0, :, 0], matrix[:, 1, :, 0] = cos, sin  # re' = re cos + im sin
    matrix[:, 0, :, 1], matrix[:, 1, :, 1] = -sin, cos  # im' = im cos - re sin
    return matrix.reshape(2 * n, 2 * n)


def _dft(bb, pairs: relax.Expr, axis: int, inverse: bool, scale: float) -> relax.Expr:
    """The DFT of complex `pairs` along `axis` (an axis of the complex tensor, >= 0)."""
    moved, back = _moved(bb, pairs, axis, -2)
    shape = tensor_shape(moved)
    out = _times(bb, moved, _complex_matrix(int(shape[-2]), inverse, scale), 2, shape)
    return out if back is None else bb.emit(relax.op.permute_dims(out, back))


def _transform(node, shape: list, rank: int, last: int | None = None) -> tuple[list[int], float]:
    """The transformed axes of an aten._fft_* node (of a tensor of `rank` axes, complex ones
    counted as one, and of `shape`), and its normalization's scale for their lengths (`last`:
    the last one's, where it is not the input's: an inverse real transform's)."""
    dims = [int(d) % rank for d in node.args[1]]
    lengths = [int(shape[d]) for d in dims[:-1]] + [last or int(shape[dims[-1]])]
    return dims, _NORMALIZATION[int(node.args[2])](math.prod(lengths))


def fft_c2c(node, importer) -> relax.Expr:
    """aten._fft_c2c(x, dim, normalization, forward): fft / fftn / ifft of a complex tensor."""
    bb, pairs = importer.block_builder, importer.env[node.args[0]]
    dims, scale = _transform(node, tensor_shape(pairs), len(tensor_shape(pairs)) - 1)
    for i, d in enumerate(dims):
        pairs = _dft(bb, pairs, d, not bool(node.args[3]), scale if i == 0 else 1.0)
    return pairs


def fft_r2c(node, importer) -> relax.Expr:
    """aten._fft_r2c(x, dim, normalization, onesided): rfft / rfftn (onesided: the last
    transformed axis keeps its first n // 2 + 1 values) or fft of a real tensor."""
    bb, x = importer.block_builder, importer.env[node.args[0]]
    shape = tensor_shape(x)
    dims, scale = _transform(node, shape, len(shape))
    n = int(shape[dims[-1]])
    columns = n // 2 + 1 if bool(node.args[3]) else n
    angles = _angles(n, n, columns)
    matrix = np.stack([np.cos(angles), -np.sin(angles)], axis=-1).reshape(n, 2 * columns) * scale
    moved, back = _moved(bb, x, dims[-1], -1)
    pairs = _times(bb, moved, matrix, 1, [*tensor_shape(moved)[:-1], columns, 2])
    if back is not None:
        pairs = bb.emit(relax.op.permute_dims(pairs, [*back, len(back)]))
    for d in dims[:-1]:
        pairs = _dft(bb, pairs, d, False, 1.0)
    return pairs


def fft_c2r(node, importer) -> relax.Expr:
    """aten._fft_c2r(x, dim, normalization, last_dim_size): irfft / irfftn. The last
    transformed axis holds the first values of a Hermitian-symmetric signal of
    `last_dim_size`; the imaginary parts of its first value (and of its middle one for an even
    size) are ignored, as in PyTorch."""
    bb, pairs = importer.block_builder, importer.env[node.args[0]]
    shape, n = tensor_shape(pairs), int(node.args[3])
    dims, scale = _transform(node, shape, len(shape) - 1, last=n)
    for d in dims[:-1]:
        pairs = _dft(bb, pairs, d, True, 1.0)
    given = int(shape[dims[-1]])
    k = np.arange(given)
    weight = np.where((k == 0) | (2 * k == n), 1.0, 2.0) * (k < n // 2 + 1) * scale  # the conjugate half
    angles = _angles(given, n, n)
    matrix = np.stack([np.cos(angles), -np.sin(angles)], axis=1) * weight[:, None, None]
    moved, back = _moved(bb, pairs, dims[-1], -2)
    out = _times(bb, moved, matrix.reshape(2 * given, n), 2, [*tensor_shape(moved)[:-2], n])
    return out if back is None else bb.emit(relax.op.permute_dims(out, back[:-1]))


def _parts(bb, pairs: relax.Expr) -> list[relax.Expr]:
    """[real parts, imaginary parts] of complex `pairs`."""
    halves = bb.emit(relax.op.split(pairs, 2, axis=-1))
    return [bb.emit(relax.op.squeeze(bb.emit(relax.TupleGetItem(halves, i)), [-1])) for i in (0, 1)]


def _pairs_of(importer, arg, dtype: str) -> relax.Expr:
    """An operand of a complex op as complex pairs: a complex tensor or number as it is, a
    real tensor or number with imaginary parts of zero."""
    bb = importer.block_builder
    if isinstance(arg, (bool, int, float, complex)):
        return relax.const(np.array([complex(arg).real, complex(arg).imag], dtype))
    value = cast(bb, importer.env[arg], dtype)
    if is_complex(arg):
        return value
    return bb.emit(relax.op.stack([value, bb.emit(relax.op.zeros_like(value))], axis=-1))


def multiply(node, importer) -> relax.Expr:
    """aten.mul of complex tensors or numbers, or of a complex tensor and a real tensor or number."""
    bb, (a, b), dtype = importer.block_builder, node.args[:2], _part_dtype(node)
    if all(is_complex(arg) or isinstance(arg, complex) for arg in (a, b)):
        (ar, ai), (br, bi) = _parts(bb, _pairs_of(importer, a, dtype)), _parts(bb, _pairs_of(importer, b, dtype))
        real = bb.emit(relax.op.subtract(bb.emit(relax.op.multiply(ar, br)), bb.emit(relax.op.multiply(ai, bi))))
        imaginary = bb.emit(relax.op.add(bb.emit(relax.op.multiply(ar, bi)), bb.emit(relax.op.multiply(ai, br))))
        return bb.emit(relax.op.stack([real, imaginary], axis=-1))
    pairs, factor = (a, b) if is_complex(a) else (b, a)
    if isinstance(factor, (bool, int, float)):
        scale = relax.const(factor, dtype)
    else:  # a real tensor scales both parts
        scale = bb.emit(relax.op.expand_dims(cast(bb, importer.env[factor], dtype), -1))
    return bb.emit(relax.op.multiply(_pairs_of(importer, pairs, dtype), scale))


def _adding(op):
    """aten.add / sub with a complex operand (the other complex, real or a number)."""

    def convert(node, importer) -> relax.Expr:
        bb, dtype = importer.block_builder, _part_dtype(node)
        lhs, rhs = (_pairs_of(importer, arg, dtype) for arg in node.args[:2])
        alpha = node.kwargs.get("alpha", node.args[2] if len(node.args) > 2 else 1)
        if alpha != 1:
            rhs = bb.emit(relax.op.multiply(rhs, relax.const(alpha, dtype)))
        return bb.emit(op(lhs, rhs))

    return convert


def conjugate(node, importer) -> relax.Expr:
    """aten._conj / conj_physical: the imaginary parts negated."""
    pairs = _pairs_of(importer, node.args[0], _part_dtype(node))
    return importer.block_builder.emit(relax.op.multiply(pairs, relax.const(np.array([1, -1], str(pairs.ty.dtype)))))


def copy(node, importer) -> relax.Expr:
    """aten.clone / alias / _to_copy with a complex input or result: a real tensor made
    complex, a complex tensor kept (its precision as asked), or its real parts (PyTorch's
    cast of a complex tensor to a real dtype)."""
    arg = node.args[0]
    if is_complex(node):
        return _pairs_of(importer, arg, _part_dtype(node))
    real = _parts(importer.block_builder, importer.env[arg])[0]
    return cast(importer.block_builder, real, str(node.meta["val"].dtype).removeprefix("torch."))


def slice_complex(node, importer) -> relax.Expr:
    """aten.slice.Tensor(x, dim=0, start=None, end=None, step=1) of a complex tensor: the
    same slice of its pairs (irfft's input cut to n // 2 + 1 values)."""
    pairs = importer.env[node.args[0]]
    shape = tensor_shape(pairs)
    dim, start, end, step = (list(node.args[1:]) + [None] * 4)[:4]
    dim = int(dim or 0) % (len(shape) - 1)
    begin, end = 0 if start is None else start, shape[dim] if end is None else min(end, int(shape[dim]))
    return importer.block_builder.emit(relax.op.strided_slice(pairs, [dim], [begin], [end], [step or 1]))


def pad_complex(node, importer) -> relax.Expr:
    """aten.constant_pad_nd(x, pad, value=0) of a complex tensor with zeros: the pairs padded
    alike (irfft's input padded up to n // 2 + 1 values)."""
    pairs, pad = importer.env[node.args[0]], [int(p) for p in node.args[1]]
    value = node.args[2] if len(node.args) > 2 else 0
    if value != 0:
        raise NotImplementedError(f"accel: constant_pad_nd of a complex tensor with {value}; supported: zeros")
    rank = len(tensor_shape(pairs))
    widths = [0, 0] * (rank - 1 - len(pad) // 2)
    for axis in range(len(pad) // 2 - 1, -1, -1):  # pad lists the last axis first
        widths += pad[2 * axis : 2 * axis + 2]
    return importer.block_builder.emit(relax.op.nn.pad(pairs, [*widths, 0, 0]))


def magnitude(node, importer) -> relax.Expr:
    """aten.abs of a complex tensor: sqrt(re² + im²), real (a spectrogram's magnitudes)."""
    bb = importer.block_builder
    pairs = importer.env[node.args[0]]
    squares = bb.emit(relax.op.sum(bb.emit(relax.op.multiply(pairs, pairs)), axis=[-1]))
    return bb.emit(relax.op.sqrt(squares))


def permute(node, importer) -> relax.Expr:
    """aten.permute of a complex tensor: its pairs' axes alike, the pair axis kept last."""
    pairs = importer.env[node.args[0]]
    rank = len(tensor_shape(pairs)) - 1
    order = [int(axis) % rank for axis in node.args[1]]
    return importer.block_builder.emit(relax.op.permute_dims(pairs, [*order, rank]))


def view(node, importer) -> relax.Expr:
    """aten.view / reshape of a complex tensor: its pairs shaped alike, the pair axis kept."""
    pairs = importer.env[node.args[0]]
    return importer.block_builder.emit(relax.op.reshape(pairs, [*(int(d) for d in node.args[1]), 2]))


def unsqueeze(node, importer) -> relax.Expr:
    """aten.unsqueeze of a complex tensor (the new axis among the complex ones)."""
    pairs = importer.env[node.args[0]]
    axis = int(node.args[1]) % len(tensor_shape(pairs))  # the result has one complex axis more
    return importer.block_builder.emit(relax.op.expand_dims(pairs, axis))


def select(node, importer) -> relax.Expr:
    """aten.select.int of a complex tensor: one index of a complex axis."""
    pairs = importer.env[node.args[0]]
    shape = tensor_shape(pairs)
    axis = int(node.args[1]) % (len(shape) - 1)
    index = int(node.args[2]) % int(shape[axis])
    bb = importer.block_builder
    picked = bb.emit(relax.op.strided_slice(pairs, [axis], [index], [index + 1]))
    return bb.emit(relax.op.squeeze(picked, [axis]))


def same(node, importer) -> relax.Expr:
    """view_as_real / view_as_complex: the pairs are the tensor itself (and an assertion of
    its metadata is nothing)."""
    return importer.env[node.args[0]]


# converters that take complex values; for the ops that also take real ones, only where an
# input or the result is complex (`convert_map`)
CONVERTERS = {
    "_fft_c2c.default": fft_c2c,
    "_fft_r2c.default": fft_r2c,
    "_fft_c2r.default": fft_c2r,
    "view_as_real.default": same,
    "view_as_complex.default": same,
    "_assert_tensor_metadata.default": same,  # a check of dtype and device at export
    "_conj.default": conjugate,
    "conj_physical.default": conjugate,
    "mul.Tensor": multiply,
    "mul.Scalar": multiply,
    "add.Tensor": _adding(relax.op.add),
    "add.Scalar": _adding(relax.op.add),
    "sub.Tensor": _adding(relax.op.subtract),
    "sub.Scalar": _adding(relax.op.subtract),
    "abs.default": magnitude,
    "permute.default": permute,
    "view.default": view,
    "reshape.default": view,
    "unsqueeze.default": unsqueeze,
    "select.int": select,
    "slice.Tensor": slice_complex,
    "constant_pad_nd.default": pad_complex,
    "clone.default": copy,
    "alias.default": copy,
    "_to_copy.default": copy,
}


def touches_complex(node) -> bool:
    """Whether an fx node has a complex input or result."""
    return is_complex(node) or any(is_complex(arg) for arg in node.all_input_nodes)


def check(program, folded: dict) -> None:
    """Raise where `program` has a complex value that CONVERTERS do not carry: an op on
    complex tensors that is not theirs, a complex input, a complex result (PyTorch computes
    the nodes in `folded`, complex ones too)."""
    supported = ", ".join(sorted(CONVERTERS))
    for node in program.graph.nodes:
        if node in folded or not touches_complex(node):
            continue
        if node.op == "placeholder":
            raise NotImplementedError(
                f"accel: the input {node.name} is complex ({node.meta['val'].dtype}); accel takes real "
                "inputs: pass torch.view_as_real of it and view_as_complex it in the model"
            )
        if node.op == "output":
            raise NotImplementedError(
                "accel: the model returns a complex tensor; return torch.view_as_real of it (accel's results are real)"
            )
        if node.op == "call_function" and aten_name(node) not in CONVERTERS:
            raise NotImplementedError(
                f"accel: {aten_name(node)} of complex tensors is not supported; complex values go through {supported}"
            )
