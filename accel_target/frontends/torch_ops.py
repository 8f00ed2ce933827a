"""Converters that TVM's torch.export importer lacks or gets wrong, and `import_program`, which
runs it with them; decoders (GPT-2, Llama) first, then the ops of the zoo's other architectures.

- Before the importer: our decompositions, PyTorch-computed constants for what depends on no
  input, and the refusal of programs that mutate (accel_target/frontends/torch_fold.py).
- ``scaled_dot_product_attention`` as two plain products (accel_target/frontends/torch_attention.py).
- ``slice`` to a symbolic end that the export proved inside its axis keeps that length
  (BERT's ``position_ids[:, :seq]``), so that shapes stay related to the inputs' symbols;
  every result gets the sizes torch.export knows to be numbers (`_known_sizes`).
- ``split_with_sizes`` by sizes the data gives (``counts.tolist()``: a mixture of experts).
- ``cumsum`` of integers or bools sums in int64, as PyTorch does.
- Complex tensors, which TVM's importer has no dtype for, as (real, imaginary) pairs, and the
  FFTs as products with DFT matrices (accel_target/frontends/torch_complex.py): FNet, Autoformer,
  DeepSeek-V2's rotary embedding, torch.stft spectrograms.
- Elementwise ops (add, sub, mul, div in every rounding mode, comparisons, clamp, and the
  unary ops PyTorch computes in floating point) get their operands cast to the dtype PyTorch
  computes in, Python scalars too (accel_target/frontends/torch_promote.py): TVM's converters gave a scalar the
  tensor's dtype and divided integers as integers, silently.
- Nearest and bilinear interpolation as PyTorch defines them (accel_target/frontends/torch_resize.py).
- Adaptive max pooling, and pools whose indices the program reads refused rather than zeros
  (accel_target/frontends/torch_pool.py); group norm without a weight or a bias.
- ``elu`` with its ``scale`` and ``input_scale``, which TVM's converter drops (SELU).
- Ops TVM's importer lacks or gets wrong: fmax, fmin, hypot, copysign, signbit, bit shifts,
  erfinv, var_mean / std_mean with a correction, prod along a dim, any / all, histc,
  logcumsumexp, cummax, cummin, cdist, sort / argsort / topk / kthvalue in PyTorch's order (NaN
  the largest) (accel_target/frontends/torch_math.py); scatter_add / scatter_reduce, index_put
  on fewer axes than the tensor has, searchsorted and bucketize (a NaN last), EmbeddingBag,
  as_strided, and the ops whose result's size depends on the data (x[mask], x[mask] = v,
  nonzero, masked_select, repeat_interleave by a tensor, bincount, unique)
  (accel_target/frontends/torch_indexing.py).
- PT2E's ``quantized_decomposed`` quantize / dequantize ops (accel_target/frontends/torch_quant.py),
  never folded: they stay for accel_target.passes.quantize.
- Every indexing op the importer emits checked (accel_target/passes/indexing.py): PyTorch's negative
  indices count from the end, and an index outside its tensor is an error, never a read.
"""

from __future__ import annotations

import itertools
import math
import sys

import numpy as np
import tvm
from tvm import relax

from strategy.layout import array_constant, constant_array, same_dims, tensor_shape

from .. import tvm_private
from ..passes import indexing
from . import torch_complex
from .torch_attention import scaled_dot_product_attention
from .torch_complex import node_arg as _scalar
from .torch_fold import Converter, decomposed, decompositions, folding, input_independent_values
from .torch_indexing import CONVERTERS as INDEXING_OPS
from .torch_indexing import index_tensors
from .torch_math import CONVERTERS as MATH_OPS
from .torch_pool import CONVERTERS as POOL_OPS
from .torch_pool import refuse_unread
from .torch_promote import CONVERTERS as PROMOTING_OPS
from .torch_promote import FLOATING_UNARY, floating_input, stock, stock_names, theirs, theirs_with
from .torch_quant import CONVERTERS as QUANTIZED_OPS
from .torch_resize import CONVERTERS as RESIZE_OPS


def cumsum(node, importer) -> relax.Expr:
    """aten.cumsum(x, dim, *, dtype=None): integers and bools sum in int64, as in PyTorch."""
    data = importer.env[node.args[0]]
    dim = _scalar(node, 1, "dim", None)
    dtype = node.kwargs.get("dtype")
    if dtype is not None:
        dtype = importer._convert_data_type(dtype)
    elif str(data.ty.dtype) == "bool" or str(data.ty.dtype).startswith(("int", "uint")):
        dtype = "int64"
    return importer.block_builder.emit(relax.op.cumsum(data, dim, dtype))


def cat(node, importer) -> relax.Expr:
    """aten.cat(tensors, dim=0): a 1-D empty tensor among them is left out, as PyTorch does (its
    legacy rule: XLM concatenates its empty key/value cache so; TVM's converter fails on it)."""
    tensors = importer.retrieve_args(node)[0]
    kept = [t for t in tensors if tensor_shape(t) != [0]]
    if len(kept) == len(tensors) or not kept:
        return importer._cat(node)
    if len(kept) == 1:
        return kept[0]
    return importer.block_builder.emit(relax.op.concat(kept, axis=_scalar(node, 1, "dim", 0)))


def _merged_constant(indices: list[np.ndarray], axes: list[int], shape: list) -> np.ndarray:
    """The index into the merged `axes` of data of `shape` at constant `indices` (broadcast
    together), negatives counted back; a ValueError names an index outside its axis."""
    counted_back = [
        indexing.constant_indices("index.Tensor", index, [shape[axis]], [axis], shape)
        for index, axis in zip(np.broadcast_arrays(*indices), axes, strict=True)
    ]
    return np.ravel_multi_index(counted_back, [shape[axis] for axis in axes]).astype("int64")


def _size_value(bb, size) -> relax.Expr:
    """A size (an int, or the PrimExpr of a symbolic one) as a 0-d int64 tensor."""
    if isinstance(size, int):
        return relax.const(size, "int64")
    return bb.emit(relax.op.reshape(bb.emit(relax.op.shape_to_tensor(relax.ShapeExpr([size]))), []))


def _merged_runtime(bb, indices: list, axes: list[int], shape: list, checked: list[bool]) -> relax.Expr:
    """The index into the merged `axes` of data of `shape` at `indices` (relax tensors), those
    `checked` checked on their own axis (accel_target/passes/indexing.py: negatives counted
    back, one outside an error at run time); the axes' sizes may be symbolic."""
    sizes, merged = [shape[a] for a in axes], None
    for j, (index, axis) in enumerate(zip(indices, axes, strict=True)):
        if checked[j]:
            index = indexing.check(bb, "index.Tensor", index, shape, [axis])
        index = bb.emit(relax.op.astype(index, "int64"))
        term = bb.emit(relax.op.multiply(index, _size_value(bb, math.prod(sizes[j + 1 :]))))
        merged = term if merged is None else bb.emit(relax.op.add(merged, term))
    return merged


def index_tensor(node, importer) -> relax.Expr:
    """aten.index.Tensor(x, indices) as PyTorch computes it: the index tensors broadcast
    together and pick elements jointly; their broadcast axes stand where the indexed axes were
    when those are adjacent, else lead. One take of x with the indexed axes merged into one, at
    sum(index_j * stride_j). TVM's converter takes ``x[:, i, j]`` with 1-D i and j as an outer
    product (a [N, 3, 3] result for [N, 3]) and fails on broadcasting indices (nn.Unfold's, and
    GPT-2's mask of packed sequences ``cumsum[batch_index, :, row][..., column]`` exported with a
    symbolic batch and sequence: a wrong mask) and on boolean masks (``x[mask]``: here the
    positions of the mask's true elements, a result whose size depends on the data). One index
    tensor goes to it still."""
    bb = importer.block_builder
    data = importer.env[node.args[0]]
    axes, indices, checked = index_tensors(node, importer, "index.Tensor (x[mask])")
    shape = tensor_shape(data)
    if all(checked) and (len(axes) < 2 or shape is None):
        return importer._index_tensor(node)
    sizes, first = [shape[axis] for axis in axes], axes[0]
    if all(isinstance(i, tvm.ir.expr.Constant) for i in indices) and all(isinstance(s, int) for s in sizes):
        merged = array_constant(_merged_constant([constant_array(i) for i in indices], axes, shape))
    else:
        merged = _merged_runtime(bb, indices, axes, shape, checked)
    if axes != list(range(first, first + len(axes))):  # apart: the broadcast axes lead
        order = axes + [a for a in range(len(shape)) if a not in axes]
        data, shape, first = bb.emit(relax.op.permute_dims(data, order)), [shape[a] for a in order], 0
    flat = bb.emit(relax.op.reshape(data, shape[:first] + [math.prod(sizes)] + shape[first + len(sizes) :]))
    # "clip": the merged index is inside by construction, and checked_indexing leaves the take
    return bb.emit(relax.op.take(flat, merged, axis=first, mode="clip"))


def _extremum(op) -> Converter:
    """aten.amax / aten.amin(x, dim=(), keepdim=False): over `dim`, every axis when it is
    empty (Reformer's amax); TVM's importer has neither."""

    def convert(node, importer) -> relax.Expr:
        dims = _scalar(node, 1, "dim", ())
        dims = [int(d) for d in dims] if isinstance(dims, (list, tuple)) else [int(dims)]
        data = importer.env[node.args[0]]
        return importer.block_builder.emit(op(data, dims or None, bool(_scalar(node, 2, "keepdim", False))))

    return convert


def _extremum_dim(reduce, pick) -> Converter:
    """aten.max.dim / aten.min.dim(x, dim, keepdim=False): (values, indices), the index of the
    first extremum where there are several, as PyTorch gives it (TVM's converter has no
    min.dim, TimesFM's, and takes max.dim's index from a top-k, whose ties go either way)."""

    def convert(node, importer) -> relax.Expr:
        data, dim = importer.env[node.args[0]], int(node.args[1])
        keepdim = bool(_scalar(node, 2, "keepdim", False))
        bb = importer.block_builder
        values = bb.emit(reduce(data, [dim], keepdim))
        indices = bb.emit(pick(data, dim, keepdim))
        if str(indices.ty.dtype) != "int64":
            indices = bb.emit(relax.op.astype(indices, "int64"))
        return bb.emit(relax.Tuple([values, indices]))

    return convert


def unfold(node, importer) -> relax.Expr:
    """aten.unfold(x, dim, size, step): the windows x[..., i * step : i * step + size, ...]
    along `dim` (of static size), their elements on a new last axis (PatchTST's patches): one
    take of every window's elements, then the window's axis moved last. TVM has no converter."""
    bb = importer.block_builder
    data = importer.env[node.args[0]]
    dim, size, step = (int(v) for v in node.args[1:4])
    shape = tensor_shape(data)
    dim %= len(shape)
    if not isinstance(shape[dim], int):
        raise ValueError(f"accel: unfold of dimension {dim}, of symbolic size {shape[dim]}, is not supported")
    windows = (shape[dim] - size) // step + 1
    index = (np.arange(windows)[:, None] * step + np.arange(size)).reshape(-1)
    # "clip": every index is inside by construction (checked_indexing leaves the take)
    taken = bb.emit(relax.op.take(data, array_constant(index), axis=dim, mode="clip"))
    split = bb.emit(relax.op.reshape(taken, [*shape[:dim], windows, size, *shape[dim + 1 :]]))
    order = [a for a in range(len(shape) + 1) if a != dim + 1] + [dim + 1]
    return bb.emit(relax.op.permute_dims(split, order))


def split_with_sizes(node, importer) -> relax.Expr:
    """aten.split_with_sizes(x, sizes, dim=0), the sizes numbers or sizes the data gives
    (``counts.tolist()``: a mixture of experts' tokens per expert); TVM's converter takes
    only numbers."""
    x, bb = importer.env[node.args[0]], importer.block_builder
    sizes = [s if isinstance(s, int) else importer.env[s] for s in node.args[1]]
    dim = _scalar(node, 2, "dim", 0)
    if all(isinstance(s, int) for s in sizes):
        return bb.emit(relax.op.split(x, list(itertools.accumulate(sizes[:-1])), dim))
    shape = tensor_shape(x)
    dim %= len(shape)
    # the axis must be the sizes' sum (checked at run time, as PyTorch checks it): then each
    # slice is inside it and of the size given. Of an axis of known size, the last piece is
    # the rest, so that the pieces concatenated have that size again (not u0 + u1 + u2 + u3)
    checked = bb.match_cast(x, relax.TensorType([*shape[:dim], sum(sizes), *shape[dim + 1 :]], str(x.ty.dtype)))
    if isinstance(shape[dim], int):
        sizes[-1] = shape[dim] - sum(sizes[:-1])
    else:
        x = checked
    ends = list(itertools.accumulate(sizes))
    pieces = [
        bb.emit(relax.op.strided_slice(x, [dim], [end - size], [end], assume_inbound=True))
        for size, end in zip(sizes, ends, strict=True)
    ]
    return bb.emit(relax.Tuple(pieces))


def _sym_expr(value):
    """A slice bound (an fx node of a symbolic size, an int, None) as a sympy expression."""
    import sympy
    import torch

    if isinstance(value, torch.fx.Node):
        value = value.meta.get("val")
    if isinstance(value, torch.SymInt):
        return value.node.expr
    return sympy.Integer(0 if value is None else int(value))


def _proved_inside(node, dim: int, start, end, step: int) -> bool:
    """torch.export sized the slice (end - start) / step, unclamped: its shape environment
    proved 0 <= start <= end <= the axis's size."""
    import sympy
    import torch

    value = node.meta.get("val")
    if not isinstance(value, torch.Tensor) or not isinstance(step, int) or step < 1:
        return False
    size = value.shape[dim]
    length = size.node.expr if isinstance(size, torch.SymInt) else sympy.Integer(int(size))
    unclamped = sympy.floor((_sym_expr(end) - _sym_expr(start) + step - 1) / step)
    return sympy.simplify(length - unclamped) == 0


def _checked_slice(bb, x: relax.Expr, shape: list, dim: int, begin, end, step: int) -> relax.Expr:
    """x[begin:end:step] along `dim` as a take at arange(begin, end, step), the indices checked
    at run time (accel_target/passes/indexing.py)."""
    index = bb.emit(relax.op.arange(begin, end, step, "int64"))
    index = indexing.check(bb, "slice", index, shape, [dim], negatives=indexing.NONE)
    # "clip": checked above, and checked_indexing leaves the take
    return bb.emit(relax.op.take(x, index, axis=dim, mode="clip"))


def slice_tensor(node, importer) -> relax.Expr:
    """aten.slice.Tensor(x, dim=0, start=None, end=None, step=1), `dim` counted from the front
    (TVM's converter passed a negative one on, which its lowering of a slice of symbolic shape
    rejects: Llama's mask of packed sequences, ``cat(...)[..., 1:]``, with a symbolic batch).

    A symbolic end that torch.export proved inside the axis (BERT's ``position_ids[:, :seq]``
    of a [1, 512] buffer, seq <= 512 by the export's range constraints) gives a slice of length
    (end - start) / step, as torch's shape says: a take at ``arange(start, end, step)``, checked
    at run time (a size beyond the export's range is an error, not a read past the axis). TVM's
    converter clamps the end to the axis (``min(seq, 512)``), a length no other shape of the
    model equals: the add of the position embeddings had no shape and stayed unlowered
    ("CodeGenVM cannot emit this Relax operator directly")."""
    from torch.fx import Node

    x, env, bb = importer.env[node.args[0]], importer.env, importer.block_builder
    shape = tensor_shape(x)
    if shape is None:
        return theirs(node, importer)
    dim = int(_scalar(node, 1, "dim", 0)) % len(shape)
    start, end, step = _scalar(node, 2, "start", None), _scalar(node, 3, "end", None), _scalar(node, 4, "step", 1)
    begin = env[start] if isinstance(start, Node) else int(start or 0)
    if isinstance(end, Node) and _proved_inside(node, dim, start, end, step):
        return _checked_slice(bb, x, shape, dim, begin, env[end], step)
    stop = env[end] if isinstance(end, Node) else (sys.maxsize if end is None else int(end))
    whole = isinstance(stop, int) and stop >= sys.maxsize or same_dims([stop], [shape[dim]])
    if isinstance(begin, int) and begin == 0 and step == 1 and whole:
        return x
    return bb.emit(relax.op.strided_slice(x, [dim], [begin], [stop], [step]))


def grid_sample(node, importer) -> relax.Expr:
    """aten.grid_sampler_2d(x, grid, ...) (F.grid_sample): PyTorch's grid is
    [N, H_out, W_out, 2], relax.image.grid_sample (topi's) reads [N, 2, H_out, W_out], so TVM's
    converter gets the grid permuted. Given it as it is, it made a wrong shape (RT-DETR's and
    Mask2Former's deformable attention: no import), or, for a square grid, wrong values."""
    grid = importer.env[node.args[1]]
    permuted = importer.block_builder.emit(relax.op.permute_dims(grid, [0, 3, 1, 2]))
    return theirs_with(node, importer, node.args[1], permuted)


def elu(node, importer) -> relax.Expr:
    """aten.elu(x, alpha=1, scale=1, input_scale=1): scale * x where x > 0, else
    scale * alpha * (exp(input_scale * x) - 1). TVM's converter drops scale and input_scale,
    so SELU, which PyTorch decomposes to an elu of scale 1.0507, came out 5% too small,
    silently."""
    x = importer.env[node.args[0]]
    alpha, scale, input_scale = (float(_scalar(node, i, key, 1.0)) for i, key in enumerate(ELU_ARGS, 1))
    dtype = str(x.ty.dtype)

    def times(value: relax.Expr, factor: float) -> relax.Expr:
        return value if factor == 1.0 else relax.op.multiply(value, relax.const(factor, dtype))

    negative = times(relax.op.subtract(relax.op.exp(times(x, input_scale)), relax.const(1.0, dtype)), scale * alpha)
    return importer.block_builder.emit(
        relax.op.where(relax.op.greater(x, relax.const(0.0, dtype)), times(x, scale), negative)
    )


ELU_ARGS = ("alpha", "scale", "input_scale")


def group_norm(node, importer) -> relax.Expr:
    """aten.native_group_norm(x, weight, bias, N, C, HxW, groups, eps) -> (y, mean, rstd), of
    which models read y (the others are refused): a missing weight or bias is ones or zeros
    (timm's PoolFormerV2 normalizes without a bias; TVM's converter passes None on and crashes)."""
    refuse_unread(node, "its mean or reciprocal deviation")
    x = importer.env[node.args[0]]
    weight, bias, _, channels, _, groups, eps = node.args[1:8]
    dtype = str(x.ty.dtype)
    gamma = importer.env[weight] if weight is not None else relax.const(np.ones(channels, dtype))
    beta = importer.env[bias] if bias is not None else relax.const(np.zeros(channels, dtype))
    axes = list(range(2, len(x.ty.shape)))
    return importer.block_builder.emit(relax.op.nn.group_norm(x, gamma, beta, groups, 1, axes, eps))


CONVERTERS: dict[str, Converter] = {
    "scaled_dot_product_attention.default": scaled_dot_product_attention,
    "elu.default": elu,
    "cumsum.default": cumsum,
    "index.Tensor": index_tensor,
    "cat.default": cat,
    "slice.Tensor": slice_tensor,
    **PROMOTING_OPS,
    "concat.default": cat,
    "unfold.default": unfold,
    "amax.default": _extremum(relax.op.max),
    "amin.default": _extremum(relax.op.min),
    "split_with_sizes.default": split_with_sizes,
    "max.dim": _extremum_dim(relax.op.max, relax.op.argmax),
    "min.dim": _extremum_dim(relax.op.min, relax.op.argmin),
    "grid_sampler_2d.default": grid_sample,
    **QUANTIZED_OPS,
    **RESIZE_OPS,
    **POOL_OPS,
    **MATH_OPS,
    **INDEXING_OPS,
    "native_group_norm.default": group_norm,
}


def convert_map(folded: dict) -> dict[str, Converter]:
    """Custom converters: ours (CONVERTERS; the unary ops PyTorch computes in floating point,
    where TVM's importer has them), and for every op with a folded node, the folded constant
    there and the op's converter elsewhere."""
    names = {node.target.__name__ for node in folded}
    custom = dict(CONVERTERS)
    for name in FLOATING_UNARY:
        if f"{name}.default" in stock_names():
            custom[f"{name}.default"] = floating_input
    for name, complex_converter in torch_complex.CONVERTERS.items():
        custom[name] = _complex_or(complex_converter, custom.get(name) or stock(name))
    for name in names:
        custom[name] = folding(custom.get(name) or stock(name), name, folded)
    for name in stock_names():
        custom.setdefault(name, stock(name))
    return {name: _naming(name, converter) for name, converter in custom.items()}


def _naming(name: str, converter: Converter) -> Converter:
    """`converter`, an error it raises marked with the op it was converting (`failed_op`), its
    result with the sizes torch.export knows (`_known_sizes`)."""

    def convert(node, importer):
        try:
            return _known_sizes(node, importer, converter(node, importer))
        except Exception as err:
            if not hasattr(err, FAILED_OP):
                setattr(err, FAILED_OP, name)
            raise

    return convert


def _known_sizes(node, importer, value):
    """`value` cast to the sizes that are numbers where Relax has expressions: those that
    torch.export knows (a size the program asserts, checked at run time by the cast), and those
    that simplify to one (a mixture of experts' outputs concatenated: u0 + u1 + (16 - u0 - u1)
    rows, 16, which Relax's concat leaves as it is). Else `value`."""
    theirs = getattr(node.meta.get("val"), "shape", None)
    if theirs is None or not isinstance(getattr(value, "ty", None), relax.TensorType) or value.ty.ndim != len(theirs):
        return value
    ours = tensor_shape(value) or [None] * len(theirs)  # (None: a shape Relax does not know)
    if all(isinstance(d, int) for d in ours):
        return value
    if "_accel_analyzer" not in importer.__dict__:  # one per import, not one per node
        importer._accel_analyzer = tvm.sym.Analyzer()
    analyzer = importer._accel_analyzer
    known = [_number(o, t, analyzer) for o, t in zip(ours, theirs, strict=True)]
    changed = [k is not o and not (isinstance(o, int) and k == o) for k, o in zip(known, ours, strict=True)]
    if not any(changed) or any(k is None for k in known):
        return value
    return importer.block_builder.match_cast(value, relax.TensorType(known, str(value.ty.dtype)))


def _number(ours, theirs, analyzer):
    """A size as an int where torch.export's is one or ours simplifies to one, else ours."""
    if type(theirs) is int:
        return theirs
    if ours is None or isinstance(ours, int):
        return ours
    simplified = analyzer.simplify(ours)
    return int(simplified) if isinstance(simplified, tvm.tirx.IntImm) else ours


FAILED_OP = "accel_failed_op"


def failed_op(err: BaseException) -> str | None:
    """The aten op (``split_with_sizes.default``) whose conversion raised `err` or its cause."""
    while err is not None:
        if (name := getattr(err, FAILED_OP, None)) is not None:
            return name
        err = err.__cause__ or err.__context__
    return None


def _unconvertible(name: str) -> bool:
    """No converter has the op `name` (neither ours nor TVM's)."""
    return name not in CONVERTERS and name not in torch_complex.CONVERTERS and name not in stock_names()


def _complex_or(complex_converter: Converter, real_converter: Converter | None) -> Converter:
    """`complex_converter` where a node has a complex input or result, else `real_converter`."""

    def convert(node, importer):
        if torch_complex.touches_complex(node) or real_converter is None:
            return complex_converter(node, importer)
        return real_converter(node, importer)

    return convert


def import_program(program, *, keep_params_as_input: bool = False):
    """ExportedProgram -> IRModule through TVM's importer, with our decompositions,
    PyTorch-computed input-independent values and converters.

    A symbolic dimension of the program (a torch.export Dim) is a shape variable of ``main``,
    its range in the function's ``tir_var_lower_bound`` / ``tir_var_upper_bound``. A program that
    mutates a buffer or an input raises UnsupportedModelError (accel_target/frontends/torch_fold.py).
    """
    from tvm.relax.frontend.torch import from_exported_program

    program = decomposed(program)
    folded = input_independent_values(program, None if keep_params_as_input else _unconvertible)
    torch_complex.check(program, folded)
    with tvm_private.torch_importer():
        mod = from_exported_program(
            program,
            keep_params_as_input=keep_params_as_input,
            unwrap_unit_return_tuple=True,
            custom_convert_map=convert_map(folded),
            run_ep_decomposition=False,
        )
    return indexing.checked_indexing(mod)


__all__ = ["CONVERTERS", "convert_map", "decompositions", "failed_op", "import_program", "slice_tensor"]
