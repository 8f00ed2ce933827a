"""Converters of aten ops that TVM's importer lacks, written with Relax ops as PyTorch defines
them: elementwise (fmax, fmin, hypot, copysign, signbit, bit shifts, erfinv), reductions
(var_mean and std_mean with a correction, prod along a dim, any and all, histc), cumulative ops
(logcumsumexp, cummax, cummin), cdist, and sort / argsort / topk / kthvalue of floats in
PyTorch's order (NaN the largest). Those that read or write at indices are in
torch_indexing.py.
"""

from __future__ import annotations

import numpy as np
from tvm import relax, te, tirx

from strategy.layout import tensor_shape

from ..passes import indexing
from ..passes.relax_util import is_floating
from .torch_complex import cast
from .torch_complex import node_arg as _arg
from .torch_fold import Converter
from .torch_promote import promoting

# the integer type of each float type's bits (a float's sign bit and sort order read from them)
_BITS = {"float16": "int16", "bfloat16": "int16", "float32": "int32", "float64": "int64"}


def _nan_ignoring(op) -> callable:
    """fmax / fmin: `op` of the two, or the other where one is NaN (NaN where both are)."""

    def compute(a: relax.Expr, b: relax.Expr) -> relax.Expr:
        if not is_floating(a):
            return op(a, b)
        return relax.op.where(relax.op.isnan(a), b, relax.op.where(relax.op.isnan(b), a, op(a, b)))

    return compute


def _signbit_te(x: te.Tensor) -> te.Tensor:
    return te.compute(x.shape, lambda *i: tirx.reinterpret(_BITS[str(x.dtype)], x(*i)) < 0, name="signbit")


def _signbit(bb: relax.BlockBuilder, x: relax.Expr) -> relax.Expr:
    """Whether each element's sign bit is set (-0.0 and negative NaNs too), as a bool tensor."""
    if not is_floating(x):
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


# ATen's calc_erfinv, after MATLAB's erfinv: rational first guesses inside and outside |y| <= 0.7
_ERFINV_CENTRAL = (
    (-0.140543331, 0.914624893, -1.645349621, 0.886226899),
    (0.012229801, -0.329097515, 1.442710462, -2.118377725, 1.0),
)
_ERFINV_TAIL = ((1.641345311, 3.429567803, -1.624906493, -1.970840454), (1.637067800, 3.543889200, 1.0))


def _horner(z: relax.Expr, coefficients: tuple) -> relax.Expr:
    """The float64 polynomial of `coefficients` (highest power first) at z."""
    value = relax.const(coefficients[0], "float64")
    for c in coefficients[1:]:
        value = relax.op.add(relax.op.multiply(value, z), relax.const(c, "float64"))
    return value


def erfinv(node, importer) -> relax.Expr:
    """aten.erfinv(y) as PyTorch computes it: a rational guess, then two Newton steps on erf;
    NaN outside [-1, 1], ±inf at ±1. In float64 whatever y's dtype: near ±1 a Newton step needs
    erf within an ulp of 1, which TVM's float32 erf is not (in float32, erfinv(0.9999999) came out
    0.8% low)."""
    bb = importer.block_builder
    y = cast(bb, importer.env[node.args[0]], "float64")
    c = lambda v: relax.const(v, "float64")  # noqa: E731
    magnitude, square = relax.op.abs(y), relax.op.multiply(y, y)
    numerator, denominator = (_horner(square, p) for p in _ERFINV_CENTRAL)
    central = relax.op.divide(relax.op.multiply(y, numerator), denominator)
    t = relax.op.sqrt(relax.op.negative(relax.op.log(relax.op.divide(relax.op.subtract(c(1.0), magnitude), c(2.0)))))
    numerator, denominator = (_horner(t, p) for p in _ERFINV_TAIL)
    tail = relax.op.divide(
        relax.op.where(relax.op.less(y, c(0.0)), relax.op.negative(numerator), numerator), denominator
    )
    x = bb.emit(relax.op.where(relax.op.less_equal(magnitude, c(0.7)), central, tail))
    for _ in range(2):
        slope = relax.op.multiply(c(2.0 / np.sqrt(np.pi)), relax.op.exp(relax.op.negative(relax.op.multiply(x, x))))
        x = bb.emit(relax.op.subtract(x, relax.op.divide(relax.op.subtract(relax.op.erf(x), y), slope)))
    infinite = relax.op.where(relax.op.less(y, c(0.0)), c(-np.inf), c(np.inf))
    x = relax.op.where(relax.op.equal(magnitude, c(1.0)), infinite, x)
    x = relax.op.where(relax.op.greater(magnitude, c(1.0)), c(np.nan), x)
    return bb.emit(relax.op.astype(x, str(node.meta["val"].dtype).replace("torch.", "")))


def histc(node, importer) -> relax.Expr:
    """aten.histc(x, bins=100, min=0, max=0): counts of x's elements in `bins` equal bins over
    [min, max] (the data's least and largest where min = max, widened by 1 each way where those
    are equal too), as PyTorch bins them: bin int((x - min) * bins / (max - min)), the last bin closed;
    elements outside and NaN are not counted. Data whose range is not finite fails the call, as
    in PyTorch."""
    bb = importer.block_builder
    x = importer.env[node.args[0]]
    dtype = str(x.ty.dtype)
    bins, low, high = int(_arg(node, 1, "bins", 100)), float(_arg(node, 2, "min", 0)), float(_arg(node, 3, "max", 0))
    flat = bb.emit(relax.op.reshape(x, [-1]))
    if tensor_shape(flat) == [0]:
        return bb.emit(relax.op.zeros([bins], dtype))
    finite = None
    if low == high:  # the data's range
        low, high = bb.emit(relax.op.min(flat)), bb.emit(relax.op.max(flat))
        same = relax.op.equal(low, high)
        low = bb.emit(relax.op.where(same, relax.op.subtract(low, relax.const(1.0, dtype)), low))
        high = bb.emit(relax.op.where(same, relax.op.add(high, relax.const(1.0, dtype)), high))
        unbounded = relax.op.logical_or(relax.op.isinf(low), relax.op.isinf(high))
        nan = relax.op.astype(relax.op.max(relax.op.astype(relax.op.isnan(flat), "int8")), "bool")
        finite = relax.op.logical_not(relax.op.logical_or(unbounded, nan))
    elif low > high:
        raise ValueError(f"accel: histc with min={low} > max={high}; supported: min <= max")
    else:
        low, high = relax.const(low, dtype), relax.const(high, dtype)
    scaled = relax.op.divide(
        relax.op.multiply(relax.op.subtract(flat, low), relax.const(bins, dtype)), relax.op.subtract(high, low)
    )
    inside = relax.op.logical_and(relax.op.greater_equal(flat, low), relax.op.less_equal(flat, high))
    position = relax.op.minimum(relax.op.astype(scaled, "int64"), relax.const(bins - 1, "int64"))
    position = relax.op.where(inside, position, relax.const(bins, "int64"))  # bin `bins`: not counted
    if finite is not None:
        position = bb.emit(relax.op.where(finite, position, relax.const(-1, "int64")))
        message = "accel: histc: the data's range is not finite (a NaN or an infinity), as PyTorch refuses it"
        position = indexing.check(bb, "histc", position, [bins + 1], [0], indexing.NONE, message)
    counted = relax.op.scatter_elements(
        relax.op.zeros([bins + 1], dtype), position, relax.op.ones_like(flat), axis=0, reduction="add"
    )
    return bb.emit(relax.op.strided_slice(counted, [0], [0], [bins]))


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
    if not is_floating(x):
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
    elif not is_floating(x):
        x = cast(bb, x, "int64")
    dim = node.args[1] % len(x.ty.shape)
    return bb.emit(relax.op.prod(x, [dim], keepdims=bool(_arg(node, 2, "keepdim", False))))


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
            if is_floating(x):
                beyond = relax.op.logical_or(
                    relax.op.isnan(b), relax.op.logical_and(relax.op.logical_not(relax.op.isnan(a)), beyond)
                )
            return [relax.op.where(beyond, b, a), relax.op.where(beyond, b_index, a_index)]

        return bb.emit(relax.Tuple(_scan(bb, [x, indices], axis, combine)))

    return convert


def _order_key_te(x: te.Tensor) -> te.Tensor:
    """Integers in the order PyTorch sorts floats: -0.0 equal to 0.0, every NaN equal and above
    +inf (the bits of a float read as an integer, negatives' magnitude bits flipped)."""
    bits = _BITS[str(x.dtype)]
    largest = tirx.max_value(bits)

    def key(*i):
        value = x(*i)
        word = tirx.reinterpret(bits, tirx.Select(value == tirx.const(0, x.dtype), tirx.const(0, x.dtype), value))
        flipped = tirx.Select(word < 0, tirx.bitwise_xor(word, largest), word)
        return tirx.Select(tirx.isnan(value), largest, flipped)

    return te.compute(x.shape, key, name="order_key")


def order_key(bb: relax.BlockBuilder, x: relax.Expr) -> relax.Expr:
    """x's elements as keys that sort in PyTorch's order (`_order_key_te`; integers are their own)."""
    if str(x.ty.dtype) not in _BITS:
        return x
    return bb.emit_te(_order_key_te, x, primfunc_name_hint="order_key")


def _keyed(node, importer) -> tuple[relax.Expr, relax.Expr, relax.BlockBuilder]:
    """x, the keys it is ordered by (`_order_key_te` of floats; integers are their own)."""
    x, bb = importer.env[node.args[0]], importer.block_builder
    return x, order_key(bb, x), bb


def _sort(indices_only: bool) -> Converter:
    """aten.sort / argsort (.default, .stable) in PyTorch's order: TVM's kernels compare the
    floats themselves, so a NaN fell anywhere. The order of the keys, the values read back at it."""

    def convert(node, importer) -> relax.Expr:
        x, key, bb = _keyed(node, importer)
        stable = node.target.__name__.endswith("stable")  # (its dim and descending are keywords)
        dim = int(node.kwargs.get("dim", -1) if stable else _arg(node, 1, "dim", -1))
        descending = bool(node.kwargs.get("descending", False) if stable else _arg(node, 2, "descending", False))
        indices = bb.emit(relax.op.argsort(key, axis=dim, descending=descending, dtype="int64"))
        if indices_only:
            return indices
        return bb.emit(relax.Tuple([bb.emit(relax.op.gather_elements(x, indices, axis=dim)), indices]))

    return convert


def topk(node, importer) -> relax.Expr:
    """aten.topk(x, k, dim=-1, largest=True, sorted=True) in PyTorch's order (topk of [0, nan, 1,
    -1, 2, 3] gave [nan, 0.0] for [nan, 3.0]). sorted=False (DeepSeek's router) is computed
    sorted: PyTorch leaves the order unspecified then, and sorted is one such order (TVM's
    converter refuses it)."""
    x, key, bb = _keyed(node, importer)
    k, dim, largest = int(_arg(node, 1, "k", 1)), int(_arg(node, 2, "dim", -1)), bool(_arg(node, 3, "largest", True))
    indices = bb.emit(relax.op.topk(key, k=k, axis=dim, largest=largest, ret_type="indices", dtype="int64"))
    return bb.emit(relax.Tuple([bb.emit(relax.op.gather_elements(x, indices, axis=dim)), indices]))


def kthvalue(node, importer) -> relax.Expr:
    """aten.kthvalue(x, k, dim=-1, keepdim=False): the k-th smallest in PyTorch's order and its
    index; TVM's importer has none."""
    x, key, bb = _keyed(node, importer)
    k, dim, keepdim = int(node.args[1]), int(_arg(node, 2, "dim", -1)), bool(_arg(node, 3, "keepdim", False))
    order = bb.emit(relax.op.argsort(key, axis=dim, dtype="int64"))
    kth = bb.emit(relax.op.take(order, relax.const([k - 1], "int64"), axis=dim))
    values = bb.emit(relax.op.gather_elements(x, kth, axis=dim))
    if not keepdim:
        values, kth = (bb.emit(relax.op.squeeze(v, [dim])) for v in (values, kth))
    return bb.emit(relax.Tuple([values, kth]))


def _truth(reduce) -> Converter:
    """aten.any / aten.all (.default, .dim, .dims): whether any / every element along the dims
    is nonzero (NaN is), a bool tensor. TVM's converter has no .default and gives any.dim the
    maximum of the values themselves, in their dtype (any of [-1.0, 0.0]: 0.0, false)."""

    def convert(node, importer) -> relax.Expr:
        x = importer.env[node.args[0]]
        dims = _arg(node, 1, "dim", None)
        dims = None if dims is None else [int(d) for d in dims] if isinstance(dims, (list, tuple)) else [int(dims)]
        keepdim = bool(_arg(node, 2, "keepdim", False))
        nonzero = relax.op.not_equal(x, relax.const(0, str(x.ty.dtype))) if str(x.ty.dtype) != "bool" else x
        found = reduce(relax.op.astype(nonzero, "int8"), dims or None, keepdim)
        return importer.block_builder.emit(relax.op.astype(found, "bool"))

    return convert


CONVERTERS: dict[str, Converter] = {
    "fmax.default": promoting(_nan_ignoring(relax.op.maximum)),
    "fmin.default": promoting(_nan_ignoring(relax.op.minimum)),
    "hypot.default": promoting(_hypot, "INT_TO_FLOAT"),
    "copysign.Tensor": copysign,
    "copysign.Scalar": copysign,
    "signbit.default": signbit,
    "erfinv.default": erfinv,
    "histc.default": histc,
    **{f"__lshift__.{o}": promoting(_shift(left=True)) for o in ("Tensor", "Scalar")},
    **{f"__rshift__.{o}": promoting(_shift(left=False)) for o in ("Tensor", "Scalar")},
    **{f"bitwise_left_shift.{o}": promoting(_shift(left=True)) for o in ("Tensor", "Tensor_Scalar")},
    **{f"bitwise_right_shift.{o}": promoting(_shift(left=False)) for o in ("Tensor", "Tensor_Scalar")},
    "var_mean.correction": var_mean,
    "prod.dim_int": prod_dim,
    "_cdist_forward.default": cdist,
    "logcumsumexp.default": logcumsumexp,
    "cummax.default": _cumulative_extremum(largest=True),
    "cummin.default": _cumulative_extremum(largest=False),
    **{f"sort.{v}": _sort(indices_only=False) for v in ("default", "stable")},
    **{f"argsort.{v}": _sort(indices_only=True) for v in ("default", "stable")},
    "topk.default": topk,
    "kthvalue.default": kthvalue,
    **{f"any.{v}": _truth(relax.op.max) for v in ("default", "dim", "dims")},
    **{f"all.{v}": _truth(relax.op.min) for v in ("default", "dim", "dims")},
}
