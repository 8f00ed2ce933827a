"""What TVM's torch.export importer needs, for decoders (GPT-2, Llama) first and for the
ops it mistranslates or lacks in the zoo's other architectures: our decomposition table,
PyTorch-computed constants for what depends on no input, and converters.

- Decompositions: PyTorch's default table but for ``scaled_dot_product_attention``,
  which stays one node (its decomposition fails to re-trace GPT-2 at batch 2, and
  hides the two products of attention behind broadcasts and reshapes).
- Input-independent subgraphs (a decoder's causal mask, built from ``arange``,
  ``diff``, ``cumsum`` and broadcast indexing; Llama's rotary cos/sin tables) are
  computed by PyTorch itself at import and enter the module as constants. TVM's
  importer mistranslates some of those ops (``cumsum`` of a bool keeps the bool
  type, so the mask is wrong and does not compile) and lacks others.
- ``scaled_dot_product_attention`` becomes ``softmax(Q @ Kᵀ * scale + mask) @ V``
  with plain ``relax.matmul`` (the accel ``batch_matmul_kn`` kernel) for bool or
  float masks, ``is_causal`` and grouped-query attention; TVM's own converter
  takes float masks only and emits ``nn.attention``, a kernel of its own.
- ``cumsum`` of integers or bools sums in int64, as PyTorch does.
- Complex tensors, which TVM's importer has no dtype for, as (real, imaginary) pairs, and the
  FFTs as products with DFT matrices (accel_target/torch_complex.py): FNet, Autoformer,
  DeepSeek-V2's rotary embedding, torch.stft spectrograms.
- Elementwise ops (add, sub, mul, div in every rounding mode, comparisons, clamp, and the
  unary ops PyTorch computes in floating point) get their operands cast to the dtype PyTorch
  computes in, Python scalars too (`_promoting`): TVM's converters gave a scalar the
  tensor's dtype and divided integers as integers, silently.
- PT2E's ``quantized_decomposed`` quantize / dequantize ops (accel_target/torch_quant.py),
  never folded: they stay for accel_target.quantize.
- Every indexing op the importer emits checked (accel_target/indexing.py): PyTorch's negative
  indices count from the end, and an index outside its tensor is an error, never a read.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import tvm
from tvm import relax

from strategy.layout import array_constant, constant_array, same_dims, tensor_shape

from . import indexing, torch_complex
from .torch_complex import aten_name as _name
from .torch_complex import cast
from .torch_quant import CONVERTERS as QUANTIZED_OPS

# Input kinds of an ExportedProgram whose values are fixed at export and bound as
# constants by the importer (parameters stay out: they may be kept as inputs).
_FIXED_INPUT_KINDS = ("BUFFER", "CONSTANT_TENSOR")


def decompositions() -> dict:
    """PyTorch's default decomposition table without scaled_dot_product_attention."""
    import torch

    table = torch.export.default_decompositions()
    table.pop(torch.ops.aten.scaled_dot_product_attention.default, None)
    return table


def _fixed_inputs(program) -> dict:
    """{placeholder name: tensor} of the buffers and lifted constants of `program`."""
    values = {}
    for spec in program.graph_signature.input_specs:
        if spec.kind.name not in _FIXED_INPUT_KINDS:
            continue
        value = program.constants.get(spec.target)
        values[spec.arg.name] = value if value is not None else program.state_dict[spec.target]
    return values


def _is_static_tensors(value) -> bool:
    """A tensor, or a tuple/list of tensors, with concrete shapes."""
    import torch

    if isinstance(value, (tuple, list)):
        return len(value) > 0 and all(_is_static_tensors(v) for v in value)
    return isinstance(value, torch.Tensor) and all(isinstance(d, int) for d in value.shape)


def _may_fold(node, known: dict) -> bool:
    """A pure op whose every input is known and whose result someone uses."""
    import torch

    if node.op != "call_function" or not node.users:
        return False
    if torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ()):
        return False
    if getattr(node.target, "namespace", None) == "quantized_decomposed":
        return False  # q/dq stay in the graph: accel_target.quantize makes integer kernels of them
    return all(arg in known for arg in node.all_input_nodes) and _is_static_tensors(node.meta.get("val"))


def input_independent_values(program) -> dict:
    """{fx node: PyTorch value} for every op of `program` that depends on no user input
    and no parameter, computed by PyTorch (shapes are static at export)."""
    import torch

    fixed = _fixed_inputs(program)
    known = {node: fixed[node.name] for node in program.graph.nodes if node.op == "placeholder" and node.name in fixed}
    folded = {}
    with torch.no_grad():
        for node in program.graph.nodes:
            if not _may_fold(node, known):
                continue
            args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), known.__getitem__)
            known[node] = folded[node] = node.target(*args, **kwargs)
    return folded


def _as_relax(value) -> relax.Expr:
    """A relax constant (or tuple of constants) holding a PyTorch value."""
    import torch

    if isinstance(value, (tuple, list)):
        return relax.Tuple([_as_relax(v) for v in value])
    if value.is_complex():  # carried as (real, imaginary) pairs (accel_target/torch_complex.py)
        value = torch.view_as_real(value)
    return array_constant(value.detach().contiguous().numpy())


Converter = Callable[[Any, Any], relax.Expr]


def _folding(stock: Converter | None, name: str, folded: dict) -> Converter:
    """`name`'s converter: a constant for a folded node, the given converter otherwise."""

    def convert(node, importer):
        if node in folded:
            return _as_relax(folded[node])
        if stock is None:
            raise NotImplementedError(f"accel: the torch importer has no converter for {name}")
        return stock(node, importer)

    return convert


def _stock(importer, name: str) -> Converter | None:
    """The importer's own converter for `name`, in the custom-converter signature (as it was
    before `convert_map`'s converters replaced it in the importer's table)."""
    method = getattr(importer, _STOCK, importer.convert_map).get(name)
    return None if method is None else (lambda node, _importer: method(node))


_STOCK = "accel_stock_converters"


def _scalar(node, index: int, key: str, default):
    """Argument `index` (positional) or `key` (keyword) of an fx node."""
    return node.args[index] if len(node.args) > index else node.kwargs.get(key, default)


def _shape(expr: relax.Expr) -> list:
    """Shape of a tensor expression: ints, and the PrimExpr of a symbolic dimension (a batch, a
    sequence length)."""
    shape = tensor_shape(expr)
    if shape is None:
        raise ValueError(f"accel: scaled_dot_product_attention needs operands of known shape, got {expr.ty}")
    return shape


def _static(dims: list, what: str) -> list[int]:
    """`dims` as ints, else a ValueError naming `what` needs them static."""
    if any(not isinstance(d, int) for d in dims):
        raise ValueError(f"accel: scaled_dot_product_attention with {what} needs static sizes, got {dims}")
    return dims


def _causal_bias(length: int, kv_length: int, dtype: str) -> relax.Expr:
    """is_causal's additive mask (top left aligned, as PyTorch's): -inf above the diagonal."""
    allowed = np.tril(np.ones((length, kv_length), bool))
    return array_constant(np.where(allowed, 0.0, -np.inf).astype(dtype))


def _mask_bias(bb: relax.BlockBuilder, mask: relax.Expr, dtype: str) -> relax.Expr:
    """An attention mask as an additive bias: a bool mask keeps True, drops False
    (computed here when the mask is a constant)."""
    if isinstance(mask, tvm.ir.expr.Constant):
        array = constant_array(mask)
        return array_constant(np.where(array, 0.0, -np.inf).astype(dtype) if array.dtype == bool else array)
    if str(mask.ty.dtype) != "bool":
        return mask
    zero, minus_inf = relax.const(0.0, dtype), relax.const(-np.inf, dtype)
    return bb.emit(relax.op.where(mask, zero, minus_inf))


def _may_mask_whole_rows(bias: relax.Expr) -> bool:
    """Whether an additive bias can be -inf along a whole row (not when it is a constant
    without such a row)."""
    if not isinstance(bias, tvm.ir.expr.Constant):
        return True
    return bool(np.isneginf(constant_array(bias)).all(axis=-1).any())


def _safe_softmax(bb: relax.BlockBuilder, scores: relax.Expr, masked: bool) -> relax.Expr:
    """Softmax over the last axis; a row that is -inf throughout gives zeros, not NaN,
    as in PyTorch's scaled_dot_product_attention (aten._safe_softmax). (TVM's max starts
    from the lowest finite value: that is the maximum of a row of -inf.)"""
    probabilities = bb.emit(relax.op.nn.softmax(scores, axis=-1))
    if not masked:
        return probabilities
    dtype = str(scores.ty.dtype)
    row_max = bb.emit(relax.op.max(scores, axis=-1, keepdims=True))
    dead = bb.emit(relax.op.less_equal(row_max, relax.const(np.finfo(dtype).min, dtype)))
    return bb.emit(relax.op.where(dead, relax.const(0.0, dtype), probabilities))


def _match_heads(bb, query, key_or_value, enable_gqa: bool) -> relax.Expr:
    """Key/value with the query's batch axes: heads repeated (grouped-query attention:
    each kv head serves consecutive query heads) and other batch axes broadcast."""
    q_shape, shape = _shape(query), _shape(key_or_value)
    if enable_gqa and len(shape) >= 3 and not same_dims(shape[-3:-2], q_shape[-3:-2]):
        heads, kv_heads = _static([q_shape[-3], shape[-3]], "grouped-query attention (heads)")
        key_or_value = bb.emit(relax.op.repeat(key_or_value, heads // kv_heads, axis=-3))
        shape = _shape(key_or_value)
    batch = q_shape[:-2]
    if not same_dims(shape[:-2], batch):
        key_or_value = bb.emit(relax.op.broadcast_to(key_or_value, batch + shape[-2:]))
    return key_or_value


def scaled_dot_product_attention(node, importer) -> relax.Expr:
    """aten.scaled_dot_product_attention(q [..., L, E], k [..., S, E], v [..., S, Ev],
    attn_mask=None, dropout_p=0, is_causal=False, *, scale=None, enable_gqa=False)
    -> [..., L, Ev] as softmax(q @ kᵀ * scale + mask) @ v with relax.matmul."""
    bb, env = importer.block_builder, importer.env
    query, key, value = (env[a] for a in node.args[:3])
    mask = _scalar(node, 3, "attn_mask", None)
    dropout = _scalar(node, 4, "dropout_p", 0.0)
    if dropout != 0.0:
        raise ValueError(f"accel: scaled_dot_product_attention with dropout_p={dropout}; supported: 0.0 (inference)")
    dtype = str(query.ty.dtype)
    enable_gqa = node.kwargs.get("enable_gqa", False)
    key, value = (_match_heads(bb, query, t, enable_gqa) for t in (key, value))
    rank = len(_shape(key))
    key_t = bb.emit(relax.op.permute_dims(key, list(range(rank - 2)) + [rank - 1, rank - 2]))
    scores = bb.emit(relax.op.matmul(query, key_t))
    scale = node.kwargs.get("scale") or 1.0 / math.sqrt(_static(_shape(query)[-1:], "no scale (head size)")[0])
    scores = bb.emit(relax.op.multiply(scores, relax.const(scale, dtype)))
    masked = False
    if mask is not None:
        bias = _mask_bias(bb, env[mask], dtype)
        masked = _may_mask_whole_rows(bias)
        scores = bb.emit(relax.op.add(scores, bias))
    if _scalar(node, 5, "is_causal", False):  # masks no whole row: column 0 stays
        scores = bb.emit(relax.op.add(scores, _causal_bias(*_static(_shape(scores)[-2:], "is_causal"), dtype)))
    probabilities = _safe_softmax(bb, scores, masked)
    return bb.emit(relax.op.matmul(probabilities, value))


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


def _operand_dtype(operands: list, kind: str) -> str | None:
    """The dtype PyTorch computes an elementwise op of `operands` (fx nodes, Python numbers,
    None for an absent bound) in: its type promotion of `kind` (``DEFAULT``, or ``INT_TO_FLOAT``
    for true division), from the operands' dtypes and ranks. None where an operand is neither a
    tensor nor a number (a symbolic size)."""
    import torch
    from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

    values = [a.meta.get("val") if isinstance(a, torch.fx.Node) else a for a in operands if a is not None]
    if not all(isinstance(v, (torch.Tensor, bool, int, float)) for v in values):
        return None
    _, result = elementwise_dtypes(*values, type_promotion_kind=getattr(ELEMENTWISE_TYPE_PROMOTION_KIND, kind))
    return str(result).removeprefix("torch.")


def _operand(importer, arg, dtype: str) -> relax.Expr:
    """An operand (fx node or Python number) as a relax value of `dtype`."""
    if not isinstance(arg, (bool, int, float)):
        return cast(importer.block_builder, importer.env[arg], dtype)
    return relax.const(arg, dtype)


def _promoting(op, kind: str = "DEFAULT", swap: bool = False) -> Converter:
    """An aten binary op (add, sub, rsub, mul, div, comparisons, ...) with PyTorch's type
    promotion made explicit: both operands, a Python scalar too, cast to the dtype PyTorch
    computes in, then `op` (``alpha`` scaling the second operand; `swap`: rsub's order).
    TVM's converters give a scalar the tensor's dtype (int64 ``x + 1.5`` added 1), keep an
    integer true division integral (``x / 2``), and give an integer scalar int32 beside an
    int64 tensor (JetMoE's ``div(x, 2, rounding_mode="trunc")``: no import). A comparison of
    bools compares int32s (TVM compiles one of bools to a float comparison LLVM rejects:
    XLM's ``mask == 0``); a sum or product of bools is their ``or`` / ``and``, as in
    PyTorch. An operand that is neither tensor nor number: TVM's converter."""

    def convert(node, importer) -> relax.Expr:
        args = list(node.args[:2])
        dtype = _operand_dtype(args, kind)
        if dtype is None:
            return _theirs(node, importer)
        compute = op
        if dtype == "bool" and op in _COMPARISONS:
            dtype = "int32"
        elif dtype == "bool":  # (LLVM cannot multiply bools; PyTorch's sum and product of bools)
            compute = _LOGICAL.get(op, op)
        lhs, rhs = (_operand(importer, a, dtype) for a in (args[::-1] if swap else args))
        bb = importer.block_builder
        alpha = _scalar(node, 2, "alpha", 1)
        if alpha != 1:
            rhs = bb.emit(relax.op.multiply(rhs, relax.const(alpha, dtype)))
        return bb.emit(compute(lhs, rhs))

    return convert


def _theirs(node, importer) -> relax.Expr:
    """TVM's converter of `node`, where ours leaves it (an operand that is a symbolic size)."""
    stock = _stock(importer, _name(node))
    if stock is None:
        raise NotImplementedError(f"accel: {_name(node)} of {node.args} (a symbolic size) is not supported")
    return stock(node, importer)


_TRUE_DIVIDE = _promoting(relax.op.divide, "INT_TO_FLOAT")
_ROUNDED = {"trunc": _promoting(relax.op.divide), "floor": _promoting(relax.op.floor_divide)}


def _divide(node, importer) -> relax.Expr:
    """aten.div.Tensor_mode / Scalar_mode: true division (in floating point, as PyTorch
    divides integers), or rounded by "trunc" (integers divide so) or "floor", operands
    promoted as `_promoting` does."""
    mode = _scalar(node, 2, "rounding_mode", None)
    if mode is None:
        return _TRUE_DIVIDE(node, importer)
    quotient = _ROUNDED[mode](node, importer)
    if mode == "floor" or "int" in str(quotient.ty.dtype):
        return quotient
    return importer.block_builder.emit(relax.op.trunc(quotient))


def power(node, importer) -> relax.Expr:
    """aten.pow (Tensor_Scalar, Tensor_Tensor, Scalar), operands promoted as `_promoting`
    does: an integer tensor to a float power is float (TVM's converter applied power, which
    takes floats only, to the integers: no import); an integer power of integers is computed
    in float64 and rounded (exact below 2**53). Float tensors: TVM's converter (``x ** 2``
    as a product, not a call of pow)."""
    args = list(node.args[:2])
    dtype = _operand_dtype(args, "DEFAULT")
    tensors = [str(importer.env[a].ty.dtype) for a in args if not isinstance(a, (bool, int, float))]
    if dtype is None or ("float" in dtype and all(t == dtype for t in tensors)):
        return _theirs(node, importer)
    compute = dtype if "float" in dtype else "float64"
    bb = importer.block_builder
    base, exponent = (_operand(importer, a, compute) for a in node.args[:2])
    result = bb.emit(relax.op.power(base, exponent))
    if compute == dtype:
        return result
    return bb.emit(relax.op.astype(bb.emit(relax.op.round(result)), dtype))


def clamp(node, importer) -> relax.Expr:
    """aten.clamp(x, min=None, max=None), bounds numbers or tensors, promoted with x as
    PyTorch does (an integer tensor clamped to 2.5 becomes float; TVM's converter clamped it
    as an integer to 2)."""
    x, low, high = node.args[0], _scalar(node, 1, "min", None), _scalar(node, 2, "max", None)
    dtype = _operand_dtype([x, low, high], "DEFAULT")
    if dtype is None:
        return _theirs(node, importer)
    bb = importer.block_builder
    value = _operand(importer, x, dtype)
    for bound, op in ((low, relax.op.maximum), (high, relax.op.minimum)):
        if bound is not None:
            value = bb.emit(op(value, _operand(importer, bound, dtype)))
    return value


def _theirs_with(node, importer, arg, value: relax.Expr) -> relax.Expr:
    """TVM's converter of `node`, reading `value` for its input `arg` (an fx node)."""
    before = importer.env[arg]
    importer.env[arg] = value
    try:
        return _theirs(node, importer)
    finally:
        importer.env[arg] = before


def _floating_input(node, importer) -> relax.Expr:
    """A unary aten op that PyTorch computes in floating point (exp, sigmoid, sqrt,
    reciprocal, ...), given an integer or bool tensor: its input cast to the result's dtype,
    then TVM's converter (which kept it integral: the reciprocal of 2 was 0; exp failed)."""
    arg, dtype = node.args[0], str(node.meta["val"].dtype).removeprefix("torch.")
    return _theirs_with(node, importer, arg, cast(importer.block_builder, importer.env[arg], dtype))


# (the unary ops of PyTorch's INT_TO_FLOAT type promotion that TVM's importer converts)
_FLOATING_UNARY = (
    "exp exp2 expm1 log log2 log10 log1p sigmoid tanh sqrt rsqrt reciprocal sin cos tan asin acos atan "
    "sinh cosh asinh acosh atanh erf"
).split()


_LOGICAL = {
    relax.op.add: relax.op.logical_or,
    relax.op.maximum: relax.op.logical_or,
    relax.op.multiply: relax.op.logical_and,
    relax.op.minimum: relax.op.logical_and,
}
_COMPARISONS = (
    relax.op.equal,
    relax.op.not_equal,
    relax.op.less,
    relax.op.less_equal,
    relax.op.greater,
    relax.op.greater_equal,
)


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


def _merged_runtime(bb, indices: list, axes: list[int], shape: list) -> relax.Expr:
    """The index into the merged `axes` of data of `shape` at `indices` (relax tensors), each
    checked on its own axis (accel_target/indexing.py: negatives counted back, one outside an
    error at run time)."""
    sizes, merged = [shape[a] for a in axes], None
    for j, (index, axis) in enumerate(zip(indices, axes, strict=True)):
        index = bb.emit(relax.op.astype(indexing.check(bb, "index.Tensor", index, shape, [axis]), "int64"))
        term = bb.emit(relax.op.multiply(index, relax.const(math.prod(sizes[j + 1 :]), "int64")))
        merged = term if merged is None else bb.emit(relax.op.add(merged, term))
    return merged


def index_tensor(node, importer) -> relax.Expr:
    """aten.index.Tensor(x, indices) as PyTorch computes it: the index tensors broadcast
    together and pick elements jointly; their broadcast axes stand where the indexed axes were
    when those are adjacent, else lead. One take of x with the indexed axes merged into one, at
    sum(index_j * stride_j). TVM's converter takes ``x[:, i, j]`` with 1-D i and j as an outer
    product (a [N, 3, 3] result for [N, 3]) and fails on broadcasting indices (nn.Unfold's);
    one index, bool masks and symbolic sizes of the indexed axes go to it still."""
    bb, env = importer.block_builder, importer.env
    data = env[node.args[0]]
    picked = [(axis, env[index]) for axis, index in enumerate(node.args[1]) if index is not None]
    axes, indices = [axis for axis, _ in picked], [index for _, index in picked]
    shape = tensor_shape(data)
    if (
        len(picked) < 2
        or shape is None
        or any(str(i.ty.dtype) == "bool" for i in indices)
        or not all(isinstance(shape[axis], int) for axis in axes)
    ):
        return importer._index_tensor(node)
    sizes, first = [shape[axis] for axis in axes], axes[0]
    if all(isinstance(i, tvm.ir.expr.Constant) for i in indices):
        merged = array_constant(_merged_constant([constant_array(i) for i in indices], axes, shape))
    else:
        merged = _merged_runtime(bb, indices, axes, shape)
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


def topk(node, importer) -> relax.Expr:
    """aten.topk(x, k, dim=-1, largest=True, sorted=True), `sorted` False too (DeepSeek's
    router), computed sorted: PyTorch leaves the order unspecified then, and sorted is one
    such order. TVM's converter refuses unsorted top-k."""
    x, k = importer.env[node.args[0]], int(_scalar(node, 1, "k", 1))
    dim, largest = int(_scalar(node, 2, "dim", -1)), bool(_scalar(node, 3, "largest", True))
    return importer.block_builder.emit(relax.op.topk(x, k=k, axis=dim, largest=largest, ret_type="both", dtype="int64"))


def grid_sample(node, importer) -> relax.Expr:
    """aten.grid_sampler_2d(x, grid, ...) (F.grid_sample): PyTorch's grid is
    [N, H_out, W_out, 2], relax.image.grid_sample (topi's) reads [N, 2, H_out, W_out], so TVM's
    converter gets the grid permuted. Given it as it is, it made a wrong shape (RT-DETR's and
    Mask2Former's deformable attention: no import), or, for a square grid, wrong values."""
    grid = importer.env[node.args[1]]
    permuted = importer.block_builder.emit(relax.op.permute_dims(grid, [0, 3, 1, 2]))
    return _theirs_with(node, importer, node.args[1], permuted)


CONVERTERS: dict[str, Converter] = {
    "scaled_dot_product_attention.default": scaled_dot_product_attention,
    "cumsum.default": cumsum,
    "index.Tensor": index_tensor,
    "cat.default": cat,
    # elementwise ops with PyTorch's type promotion (_promoting)
    **{
        f"{name}.{overload}": _promoting(op)
        for name, op in [
            ("add", relax.op.add),
            ("sub", relax.op.subtract),
            ("mul", relax.op.multiply),
            ("maximum", relax.op.maximum),
            ("minimum", relax.op.minimum),
            ("eq", relax.op.equal),
            ("ne", relax.op.not_equal),
            ("lt", relax.op.less),
            ("le", relax.op.less_equal),
            ("gt", relax.op.greater),
            ("ge", relax.op.greater_equal),
        ]
        for overload in (("default",) if name in ("maximum", "minimum") else ("Tensor", "Scalar"))
    },
    "rsub.Tensor": _promoting(relax.op.subtract, swap=True),
    "rsub.Scalar": _promoting(relax.op.subtract, swap=True),
    "div.Tensor": _TRUE_DIVIDE,
    "div.Scalar": _TRUE_DIVIDE,
    "div.Tensor_mode": _divide,
    "div.Scalar_mode": _divide,
    "floor_divide.default": _promoting(relax.op.floor_divide),
    "remainder.Tensor": _promoting(relax.op.floor_mod),
    "remainder.Scalar": _promoting(relax.op.floor_mod),
    "fmod.Tensor": _promoting(relax.op.mod),
    "fmod.Scalar": _promoting(relax.op.mod),
    "pow.Tensor_Scalar": power,
    "pow.Tensor_Tensor": power,
    "pow.Scalar": power,
    "clamp.default": clamp,
    "clamp.Tensor": clamp,
    "concat.default": cat,
    "unfold.default": unfold,
    "amax.default": _extremum(relax.op.max),
    "amin.default": _extremum(relax.op.min),
    "topk.default": topk,
    "max.dim": _extremum_dim(relax.op.max, relax.op.argmax),
    "min.dim": _extremum_dim(relax.op.min, relax.op.argmin),
    "grid_sampler_2d.default": grid_sample,
    **QUANTIZED_OPS,
}


def convert_map(importer, folded: dict) -> dict[str, Converter]:
    """Custom converters for `importer`: ours (CONVERTERS; the unary ops PyTorch computes in
    floating point, where the importer has them), and for every op with a folded node, the
    folded constant there and the op's converter elsewhere."""
    names = {node.target.__name__ for node in folded}
    setattr(importer, _STOCK, dict(importer.convert_map))  # before the custom ones replace them
    custom = dict(CONVERTERS)
    for name in _FLOATING_UNARY:
        if f"{name}.default" in importer.convert_map:
            custom[f"{name}.default"] = _floating_input
    for name, complex_converter in torch_complex.CONVERTERS.items():
        custom[name] = _complex_or(complex_converter, custom.get(name) or _stock(importer, name))
    for name in names:
        custom[name] = _folding(custom.get(name) or _stock(importer, name), name, folded)
    return custom


def _complex_or(complex_converter: Converter, real_converter: Converter | None) -> Converter:
    """`complex_converter` where a node has a complex input or result, else `real_converter`."""

    def convert(node, importer):
        if torch_complex.touches_complex(node) or real_converter is None:
            return complex_converter(node, importer)
        return real_converter(node, importer)

    return convert


def import_program(program, *, keep_params_as_input: bool = False):
    """ExportedProgram -> IRModule through TVM's importer, with our decompositions,
    PyTorch-computed input-independent values and converters."""
    from tvm.relax.frontend.torch.exported_program_translator import (
        ExportedProgramImporter,
    )

    program = program.run_decompositions(decompositions())
    folded = input_independent_values(program)
    torch_complex.check(program, folded)
    importer = ExportedProgramImporter()
    custom = convert_map(importer, folded)
    return indexing.checked_indexing(importer.from_exported_program(program, keep_params_as_input, True, False, custom))
