"""Converters of aten ops that read or write at indices and that TVM's importer lacks, written
with Relax ops as PyTorch defines them: scatter_add / scatter_reduce, index_put on fewer axes
than the tensor has or by a boolean mask, searchsorted (rows of a sequence too) and bucketize,
EmbeddingBag, as_strided, and the ops whose result's size depends on the data (nonzero,
masked_select, repeat_interleave by a tensor, bincount, unique, unique_consecutive; x[mask] in
torch_ops.index_tensor). Their indices are checked like every indexing op's
(accel_target/passes/indexing.py).

A size that depends on the data is torch.export's unbacked symbol (``u0``): here one shape
variable per symbol, bound by a match_cast of the first tensor of that size, which the VM makes
on the host as a packed function (Relax's ``nonzero`` for the positions of a mask; our
``accel.run.arange`` for a size computed from the values), so that every later shape reading it
is symbolic in it.
"""

from __future__ import annotations

import math
import operator

import numpy as np
import tvm
from tvm import relax, tirx

from strategy.layout import array_constant, tensor_shape

from ..passes import indexing
from ..passes.relax_util import is_floating
from .torch_complex import cast
from .torch_complex import node_arg as _arg
from .torch_fold import Converter
from .torch_math import order_key
from .torch_pool import refuse_unread
from .torch_promote import theirs

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


def searchsorted(node, importer) -> relax.Expr:
    """aten.searchsorted.Tensor(sorted_sequence, x, *, out_int32=False, right=False, side=None,
    sorter=None): where each x would be inserted to keep its row of the sequence sorted (after
    equal values where right or side="right"); a NaN in x goes after every element, as in
    PyTorch (TVM's bucketize put it first). A 1-D sequence: bucketize's binary search. Rows
    (the sequence [..., M], x [..., K] with the same leading sizes: a NeRF's samples along its
    rays): the count of the row's elements before x. `sorter` orders an unsorted sequence."""
    sequence, x = (importer.env[a] for a in node.args[:2])
    sorter = node.kwargs.get("sorter")
    right = bool(node.kwargs.get("right", False)) or node.kwargs.get("side") == "right"
    sorted_sequence = sequence if sorter is None else relax.op.gather_elements(sequence, importer.env[sorter], axis=-1)
    dtype = "int32" if node.kwargs.get("out_int32", False) else "int64"
    return _insertion_points(importer.block_builder, importer.block_builder.emit(sorted_sequence), x, right, dtype)


def bucketize(node, importer) -> relax.Expr:
    """aten.bucketize.Tensor(x, boundaries, *, out_int32=False, right=False): searchsorted of x
    in the 1-D boundaries (`_insertion_points`)."""
    x, boundaries = (importer.env[a] for a in node.args[:2])
    dtype = "int32" if node.kwargs.get("out_int32", False) else "int64"
    return _insertion_points(importer.block_builder, boundaries, x, bool(node.kwargs.get("right", False)), dtype)


def _insertion_points(bb, sequence: relax.Expr, x: relax.Expr, right: bool, dtype: str) -> relax.Expr:
    rank = len(sequence.ty.shape)
    if rank == 1:
        found = relax.op.bucketize(x, sequence, out_int32=dtype == "int32", right=right)
        if not is_floating(x):
            return bb.emit(found)
        return bb.emit(relax.op.where(relax.op.isnan(x), relax.const(tensor_shape(sequence)[0], dtype), found))
    if tensor_shape(sequence)[:-1] != tensor_shape(x)[:-1]:
        raise NotImplementedError(
            f"accel: searchsorted of a sequence of shape {tensor_shape(sequence)} for values of shape "
            f"{tensor_shape(x)}; supported: a 1-D sequence, or the same sizes but for the last"
        )
    # x [..., K, 1] against the row [..., 1, M]: how many of the row come before x (a NaN in x
    # after all; not written as a negated comparison, which TVM turns into one NaN is not past)
    row, value = relax.op.expand_dims(sequence, rank - 1), relax.op.expand_dims(x, rank)
    before = relax.op.less_equal(row, value) if right else relax.op.less(row, value)
    if is_floating(x):
        before = relax.op.logical_or(before, relax.op.isnan(value))
    return bb.emit(relax.op.sum(relax.op.astype(before, dtype), axis=rank))


def _masked_put(node, importer, x, given: dict, values) -> relax.Expr:
    """x[mask] = v of one value (``x[x < 0] = 0``, ``scores[mask] = -inf``): where(mask, v, x),
    or x + where(mask, v, 0) accumulating, where the mask is on x's leading axes; else None."""
    shape = tensor_shape(x)
    mask = given.get(0)
    mask_shape = None if mask is None or len(given) != 1 else tensor_shape(mask)
    if mask_shape is None or mask_shape != shape[: len(mask_shape)]:
        return None
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
    converter takes an index for every axis and serves that case. A boolean mask: `_masked_put`
    of one value, else the positions of its true elements (`index_tensors`)."""
    x, values = importer.env[node.args[0]], importer.env[node.args[2]]
    given = {axis: importer.env[i] for axis, i in enumerate(node.args[1]) if i is not None}
    shape, rank = tensor_shape(x), len(x.ty.shape)
    if any(str(i.ty.dtype) == "bool" for i in given.values()):
        sizes = tensor_shape(values)
        one_value = all(isinstance(d, int) for d in sizes) and math.prod(sizes) == 1
        put = _masked_put(node, importer, x, given, values) if one_value else None
        if put is not None:  # else at the mask's positions, as index tensors
            return put
        axes, indices, _ = index_tensors(node, importer, "index_put (x[mask] = values)", values_node=node.args[2])
        given = dict(zip(axes, indices, strict=True))
    elif len(given) == rank:
        return theirs(node, importer)
    axes = sorted(given)
    if axes != list(range(axes[0], axes[0] + len(axes))):
        raise NotImplementedError(f"accel: {node.target.__name__} with index tensors on axes {axes}, not adjacent")
    bb = importer.block_builder
    index_shape = _broadcast([tensor_shape(i) for i in given.values()])
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


def as_strided(node, importer) -> relax.Expr:
    """aten.as_strided(x, size, stride, storage_offset=0) with static sizes and strides
    (Longformer's overlapping chunks): the elements of x's storage at offset + sum(i_k *
    stride_k), one take. x's storage is x with its axes in the order of their strides, where
    those strides lay it out densely (a contiguous tensor, a transposed one). Strides of a
    contiguous view are TVM's converter's (a reshape)."""
    size, stride = list(node.args[1]), list(node.args[2])
    offset = _arg(node, 3, "storage_offset", 0) or 0
    source = node.args[0].meta.get("val")
    static = all(isinstance(v, int) for v in [*size, *stride, offset])
    if static and offset == 0 and stride == _contiguous_strides(size) and source is not None and source.is_contiguous():
        return theirs(node, importer)
    order = _storage_order(source) if static and source is not None else None
    name = node.target.__name__
    if order is None:
        raise NotImplementedError(
            f"accel: {name} with size {size}, stride {stride}, offset {offset} of "
            f"{'a tensor that does not fill its storage' if static else 'symbolic extents'}; supported: "
            "static sizes and strides over a tensor whose strides lay it out densely"
        )
    index = offset - source.storage_offset()
    for axis, (n, step) in enumerate(zip(size, stride, strict=True)):
        index = index + np.arange(n, dtype="int64").reshape([-1 if a == axis else 1 for a in range(len(size))]) * step
    total = math.prod(source.shape)
    index = np.broadcast_to(np.asarray(index, dtype="int64"), size)
    if index.size and (index.min() < 0 or index.max() >= total):
        raise ValueError(f"accel: {name} reads storage element {index.max()} of a tensor of {total} elements")
    bb, x = importer.block_builder, importer.env[node.args[0]]
    if order != list(range(len(order))):
        x = bb.emit(relax.op.permute_dims(x, order))
    flat = bb.emit(relax.op.reshape(x, [total]))
    # "clip": every index is inside by the check above (checked_indexing leaves the take)
    return bb.emit(relax.op.take(flat, array_constant(np.ascontiguousarray(index)), axis=0, mode="clip"))


def _storage_order(tensor) -> list[int] | None:
    """The axes of `tensor` (a fake tensor of static shape) from the largest stride to the
    smallest, where its strides in that order are a contiguous tensor's (it fills its storage
    from its offset on); else None."""
    shape, strides = list(tensor.shape), list(tensor.stride())
    if not all(isinstance(v, int) for v in [*shape, *strides]):
        return None
    order = sorted(range(len(shape)), key=lambda a: -strides[a])
    dense = _contiguous_strides([shape[a] for a in order])
    ok = all(shape[a] == 1 or strides[a] == expected for a, expected in zip(order, dense, strict=True))
    return order if ok else None


def _contiguous_strides(size: list[int]) -> list[int]:
    return [math.prod(size[k + 1 :]) for k in range(len(size))]


def _broadcast(shapes: list[list]) -> list:
    """The shape `shapes` broadcast to; symbolic sizes where they are all the same shape."""
    if all(shape == shapes[0] for shape in shapes):
        return list(shapes[0])
    return list(np.broadcast_shapes(*(tuple(shape) for shape in shapes)))


def index_tensors(node, importer, op: str, values_node=None) -> tuple[list[int], list[relax.Expr], list[bool]]:
    """The index tensors of an indexing `node` (``node.args[1]``: a tensor or None per axis) with
    the axes they index, and whether each needs a check: a boolean mask over k axes becomes the
    k position vectors of its true elements (inside their axes). Their number depends on the
    data: the size of the indexed result's last broadcast axis (`node`'s result, or for a write
    the `values_node` written where it does not broadcast along that axis)."""
    env, rank = importer.env, len(importer.env[node.args[0]].ty.shape)
    given, axis = [], 0
    for index in node.args[1]:
        value = None if index is None else env[index]
        mask = value is not None and str(value.ty.dtype) == "bool"
        given.append((axis, value, mask))
        axis += len(value.ty.shape) if mask else 1
    covered = [a for a, v, mask in given if v is not None for a in range(a, a + (len(v.ty.shape) if mask else 1))]
    broadcast_rank = max(1 if mask else len(v.ty.shape) for _, v, mask in given if v is not None)
    start = covered[0] if covered == list(range(covered[0], covered[0] + len(covered))) else 0
    count_axis = start + broadcast_rank - 1  # in x[indices]'s shape
    axes, indices, checked = [], [], []
    for axis, value, mask in given:
        if not mask:
            if value is not None:
                axes.append(axis)
                indices.append(value)
                checked.append(True)
            continue
        if values_node is None:
            size = data_dependent_size(importer, node, count_axis)
        else:  # the values align with x[indices]'s last axes
            shape = values_node.meta["val"].shape
            values_axis = count_axis - (rank - len(covered) + broadcast_rank - len(shape))
            broadcast = values_axis < 0 or (isinstance(shape[values_axis], int) and shape[values_axis] == 1)
            size = _new_size(importer, node) if broadcast else data_dependent_size(importer, values_node, values_axis)
        positions = mask_positions(importer, op, value, size)
        axes += range(axis, axis + len(positions))
        indices += positions
        checked += [False] * len(positions)
    return axes, indices, checked


def _size_variable(importer, name: str) -> tirx.Var:
    """The shape variable `name` of this import (made on first use)."""
    sizes = importer.__dict__.setdefault("_accel_data_sizes", {})
    if name not in sizes:
        sizes[name] = tirx.Var(name, "int64")
    return sizes[name]


def _new_size(importer, node) -> tirx.Var:
    """A shape variable of its own for a size that depends on the data and that no value of the
    program has (a mask's count where the values written broadcast)."""
    return _size_variable(importer, f"{node.name}_count")


def data_dependent_size(importer, node, axis: int, item: int | None = None):
    """The size of `node`'s value (its `item`-th, of a tuple) along `axis`: an int where
    torch.export knows it, else the shape variable of its unbacked symbol (one per symbol in
    the program)."""
    value = node.meta["val"] if item is None else node.meta["val"][item]
    size = value.shape[axis]
    if isinstance(size, int):
        return size
    name = str(size) if size.node.expr.is_Symbol else f"{node.name}_size{axis}"
    return _size_variable(importer, _asserted_equal(importer, node.graph).get(name, name))


def _asserted_equal(importer, graph) -> dict[str, str]:
    """Sizes that the program asserts equal (``b[m] += a[m]``: Eq(u0, u1)), each mapped to one
    of them, so that they are one shape variable."""
    if "_accel_equal_sizes" not in importer.__dict__:
        parents: dict[str, str] = {}
        for node in graph.nodes:
            condition = node.args[0] if str(node.target) == "aten._assert_scalar.default" else None
            if getattr(condition, "target", None) is not operator.eq:
                continue
            names = [_root(parents, str(arg.meta.get("val"))) for arg in condition.args if hasattr(arg, "meta")]
            if len(names) == 2 and names[0] != names[1]:
                parents[names[1]] = names[0]
        importer._accel_equal_sizes = {name: _root(parents, name) for name in parents}
    return importer._accel_equal_sizes


def _root(parents: dict[str, str], name: str) -> str:
    while name in parents:
        name = parents[name]
    return name


def _nonzero(importer, op: str, mask: relax.Expr, size) -> relax.Expr:
    """[mask.ndim, size]: the positions of `mask`'s nonzero elements in row-major order, as
    torch.nonzero finds them (transposed)."""
    rank = len(mask.ty.shape)
    if rank == 0:
        raise NotImplementedError(f"accel: {op} of a 0-d mask is not supported; supported: masks of 1 or more axes")
    bb = importer.block_builder
    return bb.match_cast(bb.emit(relax.op.nonzero(mask)), relax.TensorType([rank, size], "int64"))


def mask_positions(importer, op: str, mask: relax.Expr, size) -> list[relax.Expr]:
    """The positions of `mask`'s nonzero elements: one int64 vector of `size` elements per axis."""
    found, bb = _nonzero(importer, op, mask, size), importer.block_builder
    return [bb.emit(relax.op.take(found, relax.const(axis, "int64"), axis=0)) for axis in range(len(mask.ty.shape))]


def nonzero(node, importer) -> relax.Expr:
    """aten.nonzero(x) -> [n, x.ndim]: the positions of x's nonzero elements, row by row."""
    x = importer.env[node.args[0]]
    found = _nonzero(importer, "nonzero", x, data_dependent_size(importer, node, 0))
    # (not a stack of mask_positions: TVM's ConvertLayout fails on that stack)
    return importer.block_builder.emit(relax.op.permute_dims(found, [1, 0]))


def masked_select(node, importer) -> relax.Expr:
    """aten.masked_select(x, mask) -> [n]: x's elements where the mask (broadcast together with
    x) is true, in row-major order."""
    bb = importer.block_builder
    x, mask = (importer.env[a] for a in node.args[:2])
    shape = tensor_shape(x)
    if tensor_shape(mask) != shape:
        shape = list(np.broadcast_shapes(tuple(shape), tuple(tensor_shape(mask))))
    x, mask = (v if tensor_shape(v) == shape else bb.emit(relax.op.broadcast_to(v, shape)) for v in (x, mask))
    flat = bb.emit(relax.op.reshape(mask, [math.prod(shape)]))
    (position,) = mask_positions(importer, "masked_select", flat, data_dependent_size(importer, node, 0))
    return bb.emit(relax.op.take(bb.emit(relax.op.reshape(x, [math.prod(shape)])), position, axis=0, mode="clip"))


_ARANGE = "accel.run.arange"


@tvm.register_global_func(_ARANGE)
def _arange(count: tvm.runtime.Tensor) -> tvm.runtime.Tensor:
    """[0, 1, ..., count - 1] (int64) for a one-element integer tensor, on the host (as TVM
    runs Relax's nonzero)."""
    return tvm.runtime.tensor(np.arange(int(count.numpy().reshape(-1)[0]), dtype="int64"))


def _positions(importer, count: relax.Expr, size) -> relax.Expr:
    """[0, 1, ..., size - 1] (int64), the shape variable `size` bound to the int64 scalar
    `count` at run time (checked, where `size` is a number). Bound by the match_cast of this
    tensor, which every kernel of that size reads or follows: FuseOps orders bindings by the
    values they read, and moved a match_cast of a shape (tensor_to_shape), which nothing reads,
    after the kernels of the size it bound."""
    bb = importer.block_builder
    found = bb.emit(relax.op.call_pure_packed(_ARANGE, count, ty_args=relax.TensorType(ndim=1, dtype="int64")))
    return bb.match_cast(found, relax.TensorType([size], "int64"))


def _non_negative(bb, op: str, values: relax.Expr, what: str) -> relax.Expr:
    """int64 `values`, each checked to be >= 0 at run time (the call fails naming `op`)."""
    message = f"accel: {op}: {what} is negative; PyTorch refuses it too"
    return indexing.check(bb, op, cast(bb, values, "int64"), [2**62], [0], indexing.NONE, message)


def repeat_interleave(node, importer) -> relax.Expr:
    """aten.repeat_interleave.Tensor(repeats, *, output_size=None) -> [sum(repeats)]: each i
    repeats[i] times, in order (``x.repeat_interleave(repeats, dim)`` takes x's slices at these):
    for position j of the result, the number of running totals of repeats at or before j."""
    bb = importer.block_builder
    repeats = importer.env[node.args[0]]
    counts = _non_negative(bb, "repeat_interleave", bb.emit(relax.op.reshape(repeats, [-1])), "a repeat count")
    position = _positions(importer, bb.emit(relax.op.sum(counts)), data_dependent_size(importer, node, 0))
    ends = bb.emit(relax.op.cumsum(counts, axis=0))
    found = relax.op.bucketize(position, ends, right=True)
    return bb.emit(relax.op.astype(found, str(repeats.ty.dtype)))


def bincount(node, importer) -> relax.Expr:
    """aten.bincount(x, weights=None, minlength=0) -> [max(max(x) + 1, minlength)]: how often each
    value occurs in x (the sum of its weights). A negative value fails the call, as in PyTorch."""
    bb = importer.block_builder
    x = importer.env[node.args[0]]
    weights, minlength = _arg(node, 1, "weights", None), int(_arg(node, 2, "minlength", 0))
    values = _non_negative(bb, "bincount", x, "a value counted")
    size = data_dependent_size(importer, node, 0)
    largest = relax.op.add(relax.op.max(values), relax.const(1, "int64"))
    dtype = str(node.meta["val"].dtype).replace("torch.", "")
    position = _positions(importer, bb.emit(relax.op.maximum(largest, relax.const(minlength, "int64"))), size)
    added = relax.op.ones_like(values, dtype) if weights is None else cast(bb, importer.env[weights], dtype)
    zeros = relax.op.zeros_like(position, dtype)
    return bb.emit(relax.op.scatter_elements(zeros, values, added, axis=0, reduction="add"))


def unique(node, importer) -> relax.Expr:
    """aten._unique2(x, sorted=True, return_inverse=False, return_counts=False) and
    unique_consecutive(x, return_inverse=False, return_counts=False) -> (values, inverse,
    counts): x's distinct values (of each run of equal ones, consecutive), sorted in PyTorch's
    order (torch.unique sorts whatever `sorted` says, as PyTorch's CPU kernel does); where each
    element of x went; how many each has. A NaN is distinct from every value, itself too, as in
    PyTorch. An output not asked for is empty, as in PyTorch."""
    bb = importer.block_builder
    x = importer.env[node.args[0]]
    op = node.target.__name__.split(".")[0]
    consecutive = op == "unique_consecutive"
    if consecutive and _arg(node, 3, "dim", None) is not None:
        raise NotImplementedError("accel: unique_consecutive along a dim is not supported; supported: dim=None")
    flat = bb.emit(relax.op.reshape(x, [-1]))
    count = tensor_shape(flat)[0]
    order = None if consecutive else bb.emit(relax.op.argsort(order_key(bb, flat), axis=0, dtype="int64"))
    ordered = flat if consecutive else bb.emit(relax.op.take(flat, order, axis=0))
    # a run starts where a value differs from the one before (float !=: a NaN from any)
    differs = relax.op.not_equal(
        relax.op.strided_slice(ordered, [0], [1], [count]), relax.op.strided_slice(ordered, [0], [0], [count - 1])
    )
    first = bb.emit(relax.op.concat([relax.const(np.array([True])), differs], axis=0))
    size = data_dependent_size(importer, node, 0, item=0)
    (starts,) = mask_positions(importer, op, first, size)
    group = bb.emit(relax.op.subtract(relax.op.cumsum(first, axis=0, dtype="int64"), relax.const(1, "int64")))
    flags = 1 if consecutive else 2  # where return_inverse is (return_counts after it)
    outputs = [bb.emit(relax.op.take(ordered, starts, axis=0))]
    if not _arg(node, flags, "return_inverse", False):
        outputs.append(relax.op.zeros([0], "int64"))
    else:
        inverse = group if consecutive else relax.op.scatter_elements(relax.op.zeros([count], "int64"), order, group, 0)
        outputs.append(relax.op.reshape(inverse, tensor_shape(x)))
    if not _arg(node, flags + 1, "return_counts", False):
        outputs.append(relax.op.zeros([0], "int64"))
    else:
        ones = relax.op.ones([count], "int64")
        outputs.append(relax.op.scatter_elements(relax.op.zeros([size], "int64"), group, ones, 0, "add"))
    return bb.emit(relax.Tuple([bb.emit(o) for o in outputs]))


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
    "scatter_add.default": scatter_reduce,
    "scatter_reduce.two": scatter_reduce,
    "searchsorted.Tensor": searchsorted,
    "bucketize.Tensor": bucketize,
    "index_put.default": index_put,
    "_embedding_bag.default": embedding_bag,
    "_embedding_bag_forward_only.default": embedding_bag,
    "nonzero.default": nonzero,
    "as_strided.default": as_strided,
    "masked_select.default": masked_select,
    "repeat_interleave.Tensor": repeat_interleave,
    "bincount.default": bincount,
    "_unique2.default": unique,
    "unique_consecutive.default": unique,
}
