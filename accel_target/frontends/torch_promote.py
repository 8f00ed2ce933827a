"""Elementwise aten ops with PyTorch's type promotion made explicit, and the way back to TVM's
own converters (`stock`, `theirs`) where ours leave a node to them.

TVM's converters give a Python scalar the tensor's dtype (int64 ``x + 1.5`` added 1), keep an
integer true division integral (``x / 2``), and compute the unary ops PyTorch computes in floating
point on integers (the reciprocal of 2 was 0): silently wrong answers, which these converters
replace by casts to the dtype PyTorch computes in (`promoting`, `power`, `clamp`, `floating_input`).
"""

from __future__ import annotations

import functools

from tvm import relax

from .torch_complex import aten_name as _name
from .torch_complex import cast
from .torch_complex import node_arg as _scalar
from .torch_fold import Converter


def _stock_table(importer) -> dict:
    """The importer's own converters (its class's table, bound to it: the custom ones replace
    entries of the table it converts with), made once per importer."""
    if not hasattr(importer, _STOCK):
        setattr(importer, _STOCK, type(importer).create_convert_map(importer))
    return getattr(importer, _STOCK)


def stock(name: str) -> Converter | None:
    """The importer's own converter for `name`, in the custom-converter signature, or None
    where TVM's importer has none."""
    if name not in stock_names():
        return None
    return lambda node, importer: _stock_table(importer)[name](node)


_STOCK = "accel_stock_converters"


@functools.cache
def stock_names() -> frozenset[str]:
    """The ops TVM's torch.export importer converts."""
    from tvm.relax.frontend.torch.exported_program_translator import ExportedProgramImporter

    return frozenset(ExportedProgramImporter().convert_map)


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


def promoting(op, kind: str = "DEFAULT", swap: bool = False) -> Converter:
    """An aten binary op (add, sub, rsub, mul, div, comparisons, ...) with PyTorch's type
    promotion made explicit: both operands, a Python scalar too, cast to the dtype PyTorch
    computes in, then `op` (``alpha`` scaling the second operand; `swap`: rsub's order).
    TVM's converters give a scalar the tensor's dtype (int64 ``x + 1.5`` added 1), keep an
    integer true division integral (``x / 2``), and give an integer scalar int32 beside an
    int64 tensor (JetMoE's ``div(x, 2, rounding_mode="trunc")``: no import). A comparison of
    bools compares int32s (TVM compiles one of bools to a float comparison LLVM rejects:
    XLM's ``mask == 0``); a sum or product of bools is their ``or`` / ``and``, as in
    PyTorch. Half types compute in float32, PyTorch's op math, and round once: a scalar given
    the tensor's dtype left ``x / 1e6`` of float16 values all 0 (1e6 is inf in float16). An
    operand that is neither tensor nor number: TVM's converter."""

    def convert(node, importer) -> relax.Expr:
        args = list(node.args[:2])
        dtype = _operand_dtype(args, kind)
        if dtype is None:
            return theirs(node, importer)
        compute = op
        if dtype == "bool" and op in _COMPARISONS:
            dtype = "int32"
        elif dtype == "bool":  # (LLVM cannot multiply bools; PyTorch's sum and product of bools)
            compute = _LOGICAL.get(op, op)
        math = "float32" if dtype in ("float16", "bfloat16") else dtype
        lhs, rhs = (_operand(importer, a, math) for a in (args[::-1] if swap else args))
        bb = importer.block_builder
        alpha = _scalar(node, 2, "alpha", 1)
        if alpha != 1:
            rhs = bb.emit(relax.op.multiply(rhs, relax.const(alpha, math)))
        found = bb.emit(compute(lhs, rhs))
        return found if str(found.ty.dtype) != math or math == dtype else bb.emit(relax.op.astype(found, dtype))

    return convert


def theirs(node, importer) -> relax.Expr:
    """TVM's converter of `node`, where ours leaves it (an operand that is a symbolic size)."""
    converter = stock(_name(node))
    if converter is None:
        raise NotImplementedError(f"accel: {_name(node)} of {node.args} (a symbolic size) is not supported")
    return converter(node, importer)


_TRUE_DIVIDE = promoting(relax.op.divide, "INT_TO_FLOAT")
_ROUNDED = {"trunc": promoting(relax.op.divide), "floor": promoting(relax.op.floor_divide)}


def _divide(node, importer) -> relax.Expr:
    """aten.div.Tensor_mode / Scalar_mode: true division (in floating point, as PyTorch
    divides integers), or rounded by "trunc" (integers divide so) or "floor", operands
    promoted as `promoting` does."""
    mode = _scalar(node, 2, "rounding_mode", None)
    if mode is None:
        return _TRUE_DIVIDE(node, importer)
    quotient = _ROUNDED[mode](node, importer)
    if mode == "floor" or "int" in str(quotient.ty.dtype):
        return quotient
    return importer.block_builder.emit(relax.op.trunc(quotient))


def power(node, importer) -> relax.Expr:
    """aten.pow (Tensor_Scalar, Tensor_Tensor, Scalar), operands promoted as `promoting`
    does: an integer tensor to a float power is float (TVM's converter applied power, which
    takes floats only, to the integers: no import); an integer power of integers is computed
    in float64 and rounded (exact below 2**53). Float tensors: TVM's converter (``x ** 2``
    as a product, not a call of pow)."""
    args = list(node.args[:2])
    dtype = _operand_dtype(args, "DEFAULT")
    tensors = [str(importer.env[a].ty.dtype) for a in args if not isinstance(a, (bool, int, float))]
    if dtype is None or ("float" in dtype and all(t == dtype for t in tensors)):
        return theirs(node, importer)
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
        return theirs(node, importer)
    bb = importer.block_builder
    value = _operand(importer, x, dtype)
    for bound, op in ((low, relax.op.maximum), (high, relax.op.minimum)):
        if bound is not None:
            value = bb.emit(op(value, _operand(importer, bound, dtype)))
    return value


def theirs_with(node, importer, arg, value: relax.Expr) -> relax.Expr:
    """TVM's converter of `node`, reading `value` for its input `arg` (an fx node)."""
    before = importer.env[arg]
    importer.env[arg] = value
    try:
        return theirs(node, importer)
    finally:
        importer.env[arg] = before


def floating_input(node, importer) -> relax.Expr:
    """A unary aten op that PyTorch computes in floating point (exp, sigmoid, sqrt,
    reciprocal, ...), given an integer or bool tensor: its input cast to the result's dtype,
    then TVM's converter (which kept it integral: the reciprocal of 2 was 0; exp failed)."""
    arg, dtype = node.args[0], str(node.meta["val"].dtype).removeprefix("torch.")
    return theirs_with(node, importer, arg, cast(importer.block_builder, importer.env[arg], dtype))


def where(node, importer) -> relax.Expr:
    """aten.where.self(condition, x, y): x and y cast to the dtype PyTorch computes in (TVM's
    converter required one dtype: a float32 and an int64 branch did not import)."""
    branches = list(node.args[1:3])
    dtype = _operand_dtype(branches, "DEFAULT")
    if dtype is None:
        return theirs(node, importer)
    x, y = (_operand(importer, branch, dtype) for branch in branches)
    return importer.block_builder.emit(relax.op.where(importer.env[node.args[0]], x, y))


# (the unary ops of PyTorch's INT_TO_FLOAT type promotion that TVM's importer converts)
FLOATING_UNARY = (
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


CONVERTERS: dict[str, Converter] = {
    # elementwise ops with PyTorch's type promotion (promoting)
    **{
        f"{name}.{overload}": promoting(op)
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
    "rsub.Tensor": promoting(relax.op.subtract, swap=True),
    "rsub.Scalar": promoting(relax.op.subtract, swap=True),
    "div.Tensor": _TRUE_DIVIDE,
    "div.Scalar": _TRUE_DIVIDE,
    "div.Tensor_mode": _divide,
    "div.Scalar_mode": _divide,
    "floor_divide.default": promoting(relax.op.floor_divide),
    "remainder.Tensor": promoting(relax.op.floor_mod),
    "remainder.Scalar": promoting(relax.op.floor_mod),
    "fmod.Tensor": promoting(relax.op.mod),
    "fmod.Scalar": promoting(relax.op.mod),
    "pow.Tensor_Scalar": power,
    "pow.Tensor_Tensor": power,
    "pow.Scalar": power,
    "clamp.default": clamp,
    "clamp.Tensor": clamp,
    "where.self": where,
}

__all__ = ["CONVERTERS", "FLOATING_UNARY", "floating_input", "stock", "stock_names", "theirs", "theirs_with"]
