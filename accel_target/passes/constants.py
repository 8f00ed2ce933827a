"""Passes about constants: ShareConstants (equal tensor constants become one),
EmptyConstantsAtRunTime (a constant of no element made by a kernel), BindConstantSizes (shape
variables known at compile time become numbers), ZeroConstants (arithmetic with a constant zero),
NaNSafe (comparisons and fills that TVM gets wrong for NaN and infinities)."""

from __future__ import annotations

import hashlib
import math

import numpy as np
import tvm
from tvm import relax, tirx, topi
from tvm.relax.expr_functor import PyExprMutator, mutator

from .relax_util import is_floating, op_name, rewrite_functions


@mutator
class _ConstantSharer(PyExprMutator):
    def __init__(self, mod=None):
        super().__init__(mod)
        self.first: dict = {}  # (dtype, shape, digest of the bytes) -> the first such constant
        self.shared: dict = {}  # a constant seen before -> the one it became (hashed once)

    def visit_generic_const_(self, const):
        if not isinstance(const.value, tvm.runtime.Tensor):
            return const
        if const not in self.shared:
            array = const.value.numpy()
            key = (str(array.dtype), array.shape, _digest(array))
            self.shared[const] = self.first.setdefault(key, const)
        return self.shared[const]


def _digest(array: np.ndarray) -> bytes:
    """A digest of `array`'s bytes, read in place (as bytes: Python's buffers have no bfloat16)."""
    return hashlib.blake2b(np.ascontiguousarray(array).reshape(-1).view(np.uint8).data).digest()


@tvm.transform.module_pass(opt_level=0, name="ShareConstants")
class ShareConstants:
    """Tensor constants of equal dtype, shape and bytes become one constant. The strategies
    pack a constant weight once per call that reads it, and MicroBatch's per-sample copies of
    the leading layers read each weight once per sample: without sharing, every copy would be
    a weight of its own in the library, its weights file and memory (a batch of 8 carrying
    each early weight 8 times)."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return rewrite_functions(_ConstantSharer, mod)


@mutator
class _EmptyMaker(PyExprMutator):
    def visit_generic_const_(self, const):
        value = const.value
        if not isinstance(value, tvm.runtime.Tensor) or math.prod(value.shape) != 0:
            return const
        empty = self.builder_.call_te(topi.full, list(value.shape), str(value.dtype), 0, primfunc_name_hint="empty")
        return self.builder_.emit(empty)


@tvm.transform.module_pass(opt_level=0, name="EmptyConstantsAtRunTime")
class EmptyConstantsAtRunTime:
    """A constant with no element (a shape with a 0: ``x[:, :0]`` of a weight, a repeat of 0,
    ViTMAE's mask tokens without a mask) becomes a kernel that makes it: TVM saves such a
    constant in a library but cannot load it back ("Invalid DLTensor file format"), so the
    executable could not run (`AccelExecutable.jit` goes through a library) nor be saved.
    After the kernel phase's FoldConstant, which would fold it back."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return rewrite_functions(_EmptyMaker, mod)


def _tensor_to_shape_source(value, bound: dict):
    """The tensor a ``vm.builtin.tensor_to_shape`` call `value` reads (what a variable is
    bound to, by `bound`), else None."""
    # (the importer's R.tensor_to_shape is a packed call by the time the folding is done)
    packed = value.args[0] if op_name(value) == "relax.call_pure_packed" else None
    if isinstance(packed, relax.ExternFunc) and str(packed.global_symbol) == "vm.builtin.tensor_to_shape":
        return bound.get(value.args[1], value.args[1])
    return None


def known_dims(value, bound: dict) -> list[int] | None:
    """The dimensions a match_cast reads from the shape `value`, where they are known at
    compile time: a shape of constants, or one read from a constant tensor (``.item()`` of a
    tensor the folding computed; `bound`: variable -> value)."""
    if isinstance(value, relax.ShapeExpr) and all(isinstance(v, tirx.IntImm) for v in value.values):
        return [int(v) for v in value.values]
    tensor = _tensor_to_shape_source(value, bound)
    if isinstance(tensor, tvm.ir.expr.Constant):
        return [int(v) for v in tensor.value.numpy().reshape(-1)]
    return None


def constant_sizes(func: relax.Function) -> dict:
    """shape variable -> int, for the variables that a match_cast in `func` defines from a
    value known at compile time."""
    bound: dict = {}
    sizes: dict = {}
    for block in func.body.blocks:
        for binding in block.bindings:
            value = bound.get(binding.value, binding.value) if isinstance(binding.value, relax.Var) else binding.value
            bound[binding.var] = value
            if not isinstance(binding, relax.MatchCast) or not isinstance(binding.ty, relax.ShapeType):
                continue
            pattern, dims = binding.ty.values, known_dims(value, bound)
            if pattern is not None and dims is not None and len(dims) == len(pattern):
                sizes.update((var, dim) for var, dim in zip(pattern, dims) if isinstance(var, tirx.Var))
    return sizes


@tvm.transform.module_pass(opt_level=0, name="BindConstantSizes")
class BindConstantSizes:
    """A shape variable that a match_cast reads from a value known at compile time becomes
    that number in the whole function: ``.item()`` of a tensor computed from constants
    (Reformer's axial position embeddings read their length from positions the folding
    computed), and a match_cast of a shape of constants. What it sizes is then static: folded,
    fused and scheduled as any other tensor. Sized at run time, an op that broadcasts it
    against a static shape has no known shape, which LegalizeOps skips and CodeGenVM then
    fails on; and LegalizeOps gives a slice's shape a branch (``T.if_then_else(n < -4, n // 4
    + 5, n // 4 + 1)``) that FuseOps fails on ("Cannot find the FInferType attribute
    registered to op: prim.if_then_else"), leaving the model unfused. After the first numpy
    folding; repeated while it finds more (a size read from a shape of sizes)."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        for gvar, func in mod.functions_items():
            if not isinstance(func, relax.Function):
                continue
            done: set = set()
            while sizes := {var: dim for var, dim in constant_sizes(mod[gvar]).items() if var not in done}:
                mod = relax.transform.BindSymbolicVars(sizes, gvar.name_hint)(mod)
                done.update(sizes)
        return mod


# x / 0 of floats as IEEE 754 computes it: x times this, with the zero's sign (a remainder: NaN)
_BY_ZERO = {"relax.divide": np.inf, "relax.floor_divide": np.inf, "relax.mod": np.nan, "relax.floor_mod": np.nan}


def _zero_scalar(expr) -> float | None:
    """The value of `expr` where it is a 0-d constant equal to zero (-0.0 included), else None."""
    if not isinstance(expr, tvm.ir.expr.Constant) or expr.ty.ndim != 0:
        return None
    value = expr.value.numpy()[()]
    return value if value == 0 else None


@mutator
class _ZeroRewriter(PyExprMutator):
    def visit_call_(self, call):
        call = super().visit_call_(call)
        name = op_name(call)
        if name == "relax.multiply":
            return self._times_zero(call)
        zero = _zero_scalar(call.args[1]) if name in _BY_ZERO else None
        if zero is None:
            return call
        if not is_floating(call.args[1]):
            raise ValueError(
                f"{name}: divides {call.args[0].ty.dtype} values by the constant {zero}; integer division "
                "by zero has no result (PyTorch raises ZeroDivisionError), only floats divide by zero"
            )
        factor = np.copysign(_BY_ZERO[name], zero)
        return relax.op.multiply(call.args[0], relax.const(factor, str(call.args[1].ty.dtype)))

    def _times_zero(self, call):
        """x * 0.0 with the zero as a one-element tensor of x's rank (x's shape unchanged)."""
        args = list(call.args)
        for position, (zero, other) in enumerate((args, args[::-1])):
            rank = getattr(other.ty, "ndim", -1)
            if _zero_scalar(zero) is not None and is_floating(zero) and rank > 0:
                args[position] = relax.const(zero.value.numpy().reshape([1] * rank))
                return relax.op.multiply(*args)
        return call


@tvm.transform.module_pass(opt_level=0, name="ZeroConstants")
class ZeroConstants:
    """Arithmetic with a constant zero as IEEE 754 defines it. TVM's legalization gives a
    kernel a scalar constant as an immediate, and its constant folder then takes x * 0.0 as 0
    (NaN and inf times zero are NaN) and stops a build of x / 0.0 on its check ("Divide by
    zero"). A float multiplied by a constant zero reads the zero as a one-element tensor; one
    divided by a constant zero is x times an infinity of the zero's sign (``nan_to_num(x / 0)``),
    a remainder by zero NaN; an integer divided by a constant zero is an error naming the op
    (PyTorch raises ZeroDivisionError). Before LegalizeOps, after every folding that could make
    the zero."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return rewrite_functions(_ZeroRewriter, mod)


def _unequal(x: relax.Expr, y: relax.Expr) -> relax.Expr:
    """x != y of floats as IEEE 754 defines it, ordered one way or the other or unordered (a
    NaN): written so, TVM's simplifier cannot take x != x for false."""
    ordered = relax.op.logical_or(relax.op.less(x, y), relax.op.greater(x, y))
    return relax.op.logical_or(ordered, relax.op.logical_or(relax.op.isnan(x), relax.op.isnan(y)))


@mutator
class _NaNRewriter(PyExprMutator):
    def visit_call_(self, call):
        call = super().visit_call_(call)
        name = op_name(call)
        if name in ("relax.equal", "relax.not_equal") and all(is_floating(a) for a in call.args[:2]):
            unequal = _unequal(*call.args[:2])
            return unequal if name == "relax.not_equal" else relax.op.logical_not(unequal)
        if name not in ("relax.full", "relax.full_like") or not isinstance(call.args[1], tvm.ir.expr.Constant):
            return call
        if np.all(np.isfinite(call.args[1].value.numpy())):
            return call
        shape = call.args[0] if name == "relax.full" else call.args[0].ty.shape
        if shape is None:
            return call
        return relax.op.broadcast_to(relax.op.astype(call.args[1], str(call.ty.dtype)), shape)


@tvm.transform.module_pass(opt_level=0, name="NaNSafe")
class NaNSafe:
    """Ops that TVM gets wrong for NaN and infinities, written so that it cannot.

    - x == y and x != y of floats: TVM's simplifier takes x != x for false, also where the two
      operands are two equal expressions of a fused kernel, which NaN is not (``x != x`` is how
      PyTorch's own nanmean finds NaN: it divided by every element, NaN included). Written as
      (x < y or x > y or either is NaN).
    - full / full_like of an infinity or NaN that is not folded (``torch.full((n, n), -inf)``,
      an attention mask of a symbolic size) as that scalar broadcast: TVM 0.27's legalization
      of full stops on it (topi.full checks the fill against the dtype as a string, and it is a
      PrimType).
    Before LegalizeOps."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return rewrite_functions(_NaNRewriter, mod)
