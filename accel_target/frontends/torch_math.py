"""Converters of aten ops that TVM's importer lacks, written with Relax ops as PyTorch defines
them: elementwise (fmax, fmin, hypot, copysign, signbit, bit shifts), reductions (var_mean and
std_mean with a correction, prod along a dim), scatter_add / scatter_reduce, index_put on
fewer axes than the tensor has, cumulative ops (logcumsumexp, cummax, cummin), cdist,
searchsorted and EmbeddingBag.
"""

from __future__ import annotations

import math

import numpy as np
from tvm import relax, te, tirx

from strategy.layout import tensor_shape

from .torch_complex import cast
from .torch_complex import node_arg as _arg
from .torch_fold import Converter
from .torch_pool import refuse_unread
from .torch_promote import promoting, theirs


def _floating(value: relax.Expr) -> bool:
    return str(value.ty.dtype).startswith(("float", "bfloat"))


def _nan_ignoring(op) -> callable:
    """fmax / fmin: `op` of the two, or the other where one is NaN (NaN where both are)."""

    def compute(a: relax.Expr, b: relax.Expr) -> relax.Expr:
        if not _floating(a):
            return op(a, b)
        return relax.op.where(relax.op.isnan(a), b, relax.op.where(relax.op.isnan(b), a, op(a, b)))

    return compute


def _signbit_te(x: te.Tensor) -> te.Tensor:
    bits = {"float16": "int16", "bfloat16": "int16", "float32": "int32", "float64": "int64"}[str(x.dtype)]
    return te.compute(x.shape, lambda *i: tirx.reinterpret(bits, x(*i)) < 0, name="signbit")


def _signbit(bb: relax.BlockBuilder, x: relax.Expr) -> relax.Expr:
    """Whether each element's sign bit is set (-0.0 and negative NaNs too), as a bool tensor."""
    if not _floating(x):
        return bb.emit(relax.op.less(x, relax.const(0, str(x.ty.dtype))))
    return bb.emit_te(_signbit_te, x, primfunc_name_hint="signbit")


def signbit(node, importer) -> relax.Expr:
    """aten.signbit(x)."""
    return _signbit(importer.block_builder, importer.env[node.args[0]])


def copysign(node, importer) -> relax.Expr:
    """aten.copysign(a, b): |a| with b's sign bit, in floating point (PyTorch's promotion)."""

    def compute(a, b):
        magnitude = relax.op.abs(a)
        return relax.op.where(_signbit(importer.block_builder, b), relax.op.negative(magnitude), magnitude)

    return promoting(compute, "INT_TO_FLOAT")(node, importer)


def _hypot(a: relax.Expr, b: relax.Expr) -> relax.Expr:
    """sqrt(a² + b²) scaled by the larger magnitude, so that it overflows only where the result
    does; inf where either is infinite (NaN or not), as C's hypot."""
    dtype = str(a.ty.dtype)
    zero, one, inf = (relax.const(v, dtype) for v in (0.0, 1.0, np.inf))
    big = relax.op.maximum(relax.op.abs(a), relax.op.abs(b))
    small = relax.op.minimum(relax.op.abs(a), relax.op.abs(b))
    ratio = relax.op.divide(small, relax.op.where(relax.op.equal(big, zero), one, big))
    scaled = relax.op.multiply(big, relax.op.sqrt(relax.op.add(one, relax.op.multiply(ratio, ratio))))
    infinite = relax.op.logical_or(relax.op.isinf(a), relax.op.isinf(b))
    return relax.op.where(infinite, inf, scaled)


def _shift(left: bool) -> callable:
    """a << b and a >> b of integers as PyTorch computes them: a shift by a negative amount or
    by the width or more gives 0 (a right shift of a negative value -1), where LLVM's shift has
    no defined result."""

    def compute(a: relax.Expr, b: relax.Expr) -> relax.Expr:
        dtype = str(a.ty.dtype)
        if not dtype.startswith(("int", "uint")):
            raise NotImplementedError(f"accel: a bit shift of {dtype} values; PyTorch shifts integers only")
        width = np.iinfo(dtype).bits
        outside = relax.op.logical_or(
            relax.op.less(b, relax.const(0, dtype)), relax.op.greater_equal(b, relax.const(width, dtype))
        )
        safe = relax.op.where(outside, relax.const(0, dtype), b)
        if left:
            return relax.op.where(outside, relax.const(0, dtype), relax.op.left_shift(a, safe))
        signed = dtype.startswith("int")
        sign = relax.op.right_shift(a, relax.const(width - 1, dtype)) if signed else relax.const(0, dtype)
        return relax.op.where(outside, sign, relax.op.right_shift(a, safe))

    return compute


def _dims(node, index: int, rank: int) -> list[int]:
    dims = _arg(node, index, "dim", None)
    if dims is None or dims == []:  # every axis, as PyTorch reads an empty list
        return list(range(rank))
    return sorted({d % rank for d in ([dims] if isinstance(dims, int) else dims)})


def var_mean(node, importer) -> relax.Expr:
    """aten.var_mean.correction(x, dim=None, *, correction=1, keepdim=False) -> (var, mean):
    the sum of squared deviations over (count - correction), as PyTorch divides it (a count
    not above the correction gives inf or NaN, as there); std_mean decomposes to it."""
    bb = importer.block_builder
    x = importer.env[node.args[0]]
    if not _floating(x):
        raise NotImplementedError(f"accel: var_mean of {x.ty.dtype} values; PyTorch takes floating inputs")
    dtype, shape = str(x.ty.dtype), [int(d) for d in x.ty.shape]
    dims = _dims(node, 1, len(shape))
    correction = _arg(node, 2, "correction", None)
    correction = 1.0 if correction is None else float(correction)
    keepdim = bool(node.kwargs.get("keepdim", False))
    count = float(np.prod([shape[d] for d in dims]))
    mean = bb.emit(relax.op.mean(x, dims, keepdims=True))
    deviation = bb.emit(relax.op.subtract(x, mean))
    squares = bb.emit(relax.op.sum(relax.op.multiply(deviation, deviation), dims, keepdims=keepdim))
    variance = bb.emit(relax.op.divide(squares, relax.const(max(count - correction, 0.0), dtype)))
    if not keepdim:
        mean = bb.emit(relax.op.squeeze(mean, dims))
    return bb.emit(relax.Tuple([variance, mean]))


def prod_dim(node, importer) -> relax.Expr:
    """aten.prod.dim_int(x, dim, keepdim=False, *, dtype=None): integers and bools multiply in
    int64, as in PyTorch."""
    bb = importer.block_builder
    x = importer.env[node.args[0]]
    dtype = node.kwargs.get("dtype")
    if dtype is not None:
        x = cast(bb, x, importer._convert_data_type(dtype))
    elif not _floating(x):
        x = cast(bb, x, "int64")
    dim = node.args[1] % len(x.ty.shape)
    return bb.emit(relax.op.prod(x, [dim], keepdims=bool(_arg(node, 2, "keepdim", False))))


_REDUCTIONS = {"sum": "add", "prod": "mul", "amax": "max", "amin": "min"}


def scatter_reduce(node, importer) -> relax.Expr:
    """aten.scatter_add(x, dim, index, src) and scatter_reduce.two(x, dim, index, src, reduce,
    include_self=True): each src element at index[i] along dim combined into a copy of x. Only
    src's leading part of index's shape is read, as in PyTorch (TVM's scatter takes src of
    index's shape). "mean" and include_self=False are refused by name."""
    bb = importer.block_builder
    x, dim, index, src = (importer.env[a] if i != 1 else a for i, a in enumerate(node.args[:4]))
    reduce = "sum" if node.target.__name__.startswith("scatter_add") else _arg(node, 4, "reduce", None)
    name = node.target.__name__
    if reduce not in _REDUCTIONS:
        raise NotImplementedError(f"accel: {name} with reduce={reduce!r}; supported: {', '.join(_REDUCTIONS)}")
    if not _arg(node, 5, "include_self", True):
        raise NotImplementedError(f"accel: {name} with include_self=False is not supported")
    index_shape = [int(d) for d in index.ty.shape]
    if [int(d) for d in src.ty.shape] != index_shape:
        src = bb.emit(relax.op.strided_slice(src, list(range(len(index_shape))), [0] * len(index_shape), index_shape))
    dim %= len(index_shape)
    return bb.emit(relax.op.scatter_elements(x, index, src, dim, _REDUCTIONS[reduce]))


def cdist(node, importer) -> relax.Expr:
    """aten._cdist_forward(x1 [..., P, M], x2 [..., R, M], p, compute_mode) -> [..., P, R]: the
    p-norm distance of every pair of rows (p = 0 counts the coordinates that differ; p = inf
    the largest difference)."""
    bb = importer.block_builder
    x1, x2 = importer.env[node.args[0]], importer.env[node.args[1]]
    p = float(node.args[2])
    rank = len(x1.ty.shape)
    dtype = str(x1.ty.dtype)
    diff = relax.op.abs(relax.op.subtract(relax.op.expand_dims(x1, rank - 1), relax.op.expand_dims(x2, rank - 2)))
    last = [rank]
    if p == 0:
        return bb.emit(relax.op.sum(relax.op.astype(relax.op.not_equal(diff, relax.const(0.0, dtype)), dtype), last))
    if p == np.inf:
        return bb.emit(relax.op.max(diff, last))
    if p == 1:
        return bb.emit(relax.op.sum(diff, last))
    if p == 2:
        return bb.emit(relax.op.sqrt(relax.op.sum(relax.op.multiply(diff, diff), last)))
    powered = relax.op.sum(relax.op.power(diff, relax.const(p, dtype)), last)
    return bb.emit(relax.op.power(powered, relax.const(1.0 / p, dtype)))


def searchsorted(node, importer) -> relax.Expr:
    """aten.searchsorted.Tensor(sorted_sequence, x, *, out_int32=False, right=False, side=None,
    sorter=None) with a 1-D sequence: where each x would be inserted to keep it sorted (after
    equal values where right or side="right"), as bucketize computes it."""
    sequence, x = (importer.env[a] for a in node.args[:2])
    if len(sequence.ty.shape) != 1 or node.kwargs.get("sorter") is not None:
        raise NotImplementedError(
            f"accel: searchsorted of a {len(sequence.ty.shape)}-D sequence"
            f"{' with a sorter' if node.kwargs.get('sorter') is not None else ''}; supported: a sorted 1-D sequence"
        )
    right = bool(node.kwargs.get("right", False)) or node.kwargs.get("side") == "right"
    out_int32 = bool(node.kwargs.get("out_int32", False))
    return importer.block_builder.emit(relax.op.bucketize(x, sequence, out_int32=out_int32, right=right))


def _masked_put(node, importer, x, given: dict, values) -> relax.Expr:
    """x[mask] = v of one value (``x[x < 0] = 0``, ``scores[mask] = -inf``): where(mask, v, x),
    or x + where(mask, v, 0) accumulating; the mask on x's leading axes. Several values go to
    positions that depend on the data: refused."""
    name, shape = node.target.__name__, tensor_shape(x)
    mask = given.get(0)
    mask_shape = None if mask is None or len(given) != 1 else tensor_shape(mask)
    if mask_shape is None or mask_shape != shape[: len(mask_shape)] or math.prod(tensor_shape(values)) != 1:
        raise NotImplementedError(
            f"accel: {name} with a boolean mask of more than one value, or beside other indices: the positions "
            "written depend on the data (x[mask] = v of one value v, the mask on x's leading axes, is supported)"
        )
    bb = importer.block_builder
    dtype = str(x.ty.dtype)
    for _ in range(len(shape) - len(mask_shape)):
        mask = relax.op.expand_dims(mask, -1)
    value = relax.op.reshape(cast(bb, values, dtype), [])
    if _arg(node, 3, "accumulate", False):
        return bb.emit(relax.op.add(x, relax.op.where(mask, value, relax.const(0, dtype))))
    return bb.emit(relax.op.where(mask, value, x))


def index_put(node, importer) -> relax.Expr:
    """aten.index_put(x, indices, values, accumulate=False) where the index tensors cover
    fewer axes than x has (``x[idx] = v`` of a matrix, ``x[:, idx] = v``: None for the axes
    taken whole), adjacent ones: a scatter_nd of x with those axes first, at the broadcast
    indices (negative ones counted back), of the values broadcast as PyTorch does. TVM's
    converter takes an index for every axis and serves that case. A boolean mask: `_masked_put`."""
    x, values = importer.env[node.args[0]], importer.env[node.args[2]]
    given = {axis: importer.env[i] for axis, i in enumerate(node.args[1]) if i is not None}
    shape, rank = tensor_shape(x), len(x.ty.shape)
    if any(str(i.ty.dtype) == "bool" for i in given.values()):
        return _masked_put(node, importer, x, given, values)
    if len(given) == rank:
        return theirs(node, importer)
    axes = sorted(given)
    if axes != list(range(axes[0], axes[0] + len(axes))):
        raise NotImplementedError(f"accel: {node.target.__name__} with index tensors on axes {axes}, not adjacent")
    bb = importer.block_builder
    index_shape = list(np.broadcast_shapes(*(tuple(tensor_shape(i)) for i in given.values())))
    counted = []
    for axis in axes:
        i = cast(bb, given[axis], "int64")
        i = relax.op.where(
            relax.op.less(i, relax.const(0, "int64")), relax.op.add(i, relax.const(shape[axis], "int64")), i
        )
        counted.append(relax.op.expand_dims(relax.op.broadcast_to(i, index_shape), -1))
    indices = bb.emit(relax.op.concat(counted, axis=-1))
    start, rest = axes[0], [a for a in range(rank) if a not in given]
    order = axes + rest  # x's axes, the indexed first
    placed = [*shape[:start], *index_shape, *shape[start + len(axes) :]]  # x[indices]'s shape
    values = relax.op.broadcast_to(cast(bb, values, str(x.ty.dtype)), placed)
    value_order = [
        *range(start, start + len(index_shape)),
        *range(start),
        *range(start + len(index_shape), len(placed)),
    ]
    scattered = relax.op.scatter_nd(
        relax.op.permute_dims(x, order),
        indices,
        relax.op.permute_dims(values, value_order),
        "add" if _arg(node, 3, "accumulate", False) else "update",
    )
    return bb.emit(relax.op.permute_dims(scattered, [order.index(a) for a in range(rank)]))


def _scan(bb, parts: list, axis: int, combine) -> list:
    """Inclusive prefix scan of the tensors `parts` (together: values, indices) along `axis`,
    in log2(n) steps (Hillis and Steele): at step s, element i combines element i - s's
    partial result (earlier) with its own (later); positions before s take their own.
    combine(earlier, later) -> combined, each a list like `parts`; associative."""
    n = tensor_shape(parts[0])[axis]
    if not isinstance(n, int):
        raise NotImplementedError("accel: a cumulative op along an axis of symbolic length is not supported")
    step = 1
    while step < n:
        earlier = [relax.op.strided_slice(p, [axis], [0], [n - step]) for p in parts]
        later = [relax.op.strided_slice(p, [axis], [step], [n]) for p in parts]
        combined = combine(earlier, later)
        head = [relax.op.strided_slice(p, [axis], [0], [step]) for p in parts]
        parts = [bb.emit(relax.op.concat([h, c], axis=axis)) for h, c in zip(head, combined)]
        step *= 2
    return parts


def logcumsumexp(node, importer) -> relax.Expr:
    """aten.logcumsumexp(x, dim): log(cumsum(exp(x))) without overflow: each step adds two
    partial sums as max + log(1 + exp(min - max)) (-inf where both are -inf)."""
    bb = importer.block_builder
    x = importer.env[node.args[0]]
    axis, dtype = node.args[1] % len(x.ty.shape), str(x.ty.dtype)

    def combine(earlier, later):
        (a,), (b,) = earlier, later
        big, small = relax.op.maximum(a, b), relax.op.minimum(a, b)
        one = relax.const(1.0, dtype)
        summed = relax.op.add(big, relax.op.log(relax.op.add(one, relax.op.exp(relax.op.subtract(small, big)))))
        return [relax.op.where(relax.op.equal(big, relax.const(-np.inf, dtype)), big, summed)]

    return _scan(bb, [x], axis, combine)[0]


def _cumulative_extremum(largest: bool) -> Converter:
    """aten.cummax / cummin(x, dim) -> (values, indices): the running extremum and the index
    it was last found at (ties: the later index; NaN, once seen, is the extremum), as PyTorch."""

    def convert(node, importer) -> relax.Expr:
        bb = importer.block_builder
        x = importer.env[node.args[0]]
        axis, shape = node.args[1] % len(x.ty.shape), tensor_shape(x)
        positions = relax.op.arange(0, shape[axis], dtype="int64")
        positions = relax.op.reshape(positions, [shape[axis] if a == axis else 1 for a in range(len(shape))])
        indices = bb.emit(relax.op.broadcast_to(positions, shape))

        def combine(earlier, later):
            (a, a_index), (b, b_index) = earlier, later
            beyond = relax.op.greater_equal(b, a) if largest else relax.op.less_equal(b, a)
            if _floating(x):
                beyond = relax.op.logical_or(
                    relax.op.isnan(b), relax.op.logical_and(relax.op.logical_not(relax.op.isnan(a)), beyond)
                )
            return [relax.op.where(beyond, b, a), relax.op.where(beyond, b_index, a_index)]

        return bb.emit(relax.Tuple(_scan(bb, [x, indices], axis, combine)))

    return convert


_BAG_MODES = ("sum", "mean", "max")


def embedding_bag(node, importer) -> relax.Expr:
    """aten._embedding_bag(weight [V, D], indices [N], offsets [B], scale_grad_by_freq, mode,
    sparse, per_sample_weights, include_last_offset, padding_idx) -> (output [B, D], ...), of
    which models read the output: bag b holds the rows weight[indices[n]] for n from offsets[b]
    up to the next offset, reduced by their sum (each times its per-sample weight), mean or
    maximum; an empty bag is zeros, a row at padding_idx counts in none. Each index's bag is
    found at run time (offsets may be an input)."""
    refuse_unread(node, "its offset2bag, bag_size or max_indices")
    bb = importer.block_builder
    weight, indices, offsets = (importer.env[a] for a in node.args[:3])
    mode = _BAG_MODES[int(_arg(node, 4, "mode", 0))]
    samples = _arg(node, 6, "per_sample_weights", None)
    include_last = bool(_arg(node, 7, "include_last_offset", False))
    padding = _arg(node, 8, "padding_idx", None)
    dtype = str(weight.ty.dtype)
    count, bags, dim = indices.ty.shape[0], offsets.ty.shape[0], weight.ty.shape[1]
    bags = bags - 1 if include_last else bags
    rows = relax.op.take(weight, indices, axis=0)
    if samples is not None:
        rows = relax.op.multiply(rows, relax.op.expand_dims(importer.env[samples], 1))
    # the bag of each index: the number of offsets at or before its position, less one
    position = relax.op.arange(0, count, dtype=str(offsets.ty.dtype))
    bag = bb.emit(
        relax.op.expand_dims(
            relax.op.subtract(relax.op.bucketize(position, offsets, right=True), relax.const(1, "int64")), 1
        )
    )
    counted = relax.op.ones([count], dtype)
    if padding is not None and padding >= 0:
        kept = relax.op.not_equal(indices, relax.const(padding, str(indices.ty.dtype)))
        counted = relax.op.astype(kept, dtype)
        if mode == "max":
            rows = relax.op.where(relax.op.expand_dims(kept, 1), rows, relax.const(-np.inf, dtype))
        else:
            rows = relax.op.multiply(rows, relax.op.expand_dims(counted, 1))
    in_bag = bb.emit(relax.op.scatter_nd(relax.op.zeros([bags], dtype), bag, counted, "add"))
    if mode == "max":
        start = relax.op.broadcast_to(relax.const(-np.inf, dtype), [bags, dim])
        largest = relax.op.scatter_nd(start, bag, rows, "max")
        empty = relax.op.expand_dims(relax.op.equal(in_bag, relax.const(0.0, dtype)), 1)
        return bb.emit(relax.op.where(empty, relax.const(0.0, dtype), largest))
    total = relax.op.scatter_nd(relax.op.zeros([bags, dim], dtype), bag, rows, "add")
    if mode == "sum":
        return bb.emit(total)
    divisor = relax.op.maximum(in_bag, relax.const(1.0, dtype))
    return bb.emit(relax.op.divide(total, relax.op.expand_dims(divisor, 1)))


CONVERTERS: dict[str, Converter] = {
    "fmax.default": promoting(_nan_ignoring(relax.op.maximum)),
    "fmin.default": promoting(_nan_ignoring(relax.op.minimum)),
    "hypot.default": promoting(_hypot, "INT_TO_FLOAT"),
    "copysign.Tensor": copysign,
    "copysign.Scalar": copysign,
    "signbit.default": signbit,
    **{f"__lshift__.{o}": promoting(_shift(left=True)) for o in ("Tensor", "Scalar")},
    **{f"__rshift__.{o}": promoting(_shift(left=False)) for o in ("Tensor", "Scalar")},
    **{f"bitwise_left_shift.{o}": promoting(_shift(left=True)) for o in ("Tensor", "Tensor_Scalar")},
    **{f"bitwise_right_shift.{o}": promoting(_shift(left=False)) for o in ("Tensor", "Tensor_Scalar")},
    "var_mean.correction": var_mean,
    "prod.dim_int": prod_dim,
    "scatter_add.default": scatter_reduce,
    "scatter_reduce.two": scatter_reduce,
    "_cdist_forward.default": cdist,
    "searchsorted.Tensor": searchsorted,
    "logcumsumexp.default": logcumsumexp,
    "cummax.default": _cumulative_extremum(largest=True),
    "cummin.default": _cumulative_extremum(largest=False),
    "index_put.default": index_put,
    "_embedding_bag.default": embedding_bag,
    "_embedding_bag_forward_only.default": embedding_bag,
}
