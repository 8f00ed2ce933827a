"""FoldConstantSubgraphs: every value that depends on constants alone, computed by one build.

TVM's FoldConstant evaluates the ops it folds one at a time, each legalized, compiled by LLVM
and run. A model exported to ONNX computes index tables from constants: BEIT's relative
position index is 300 ops of concat, where, scatter_nd and reshape (`FoldConstantNumpy` folds
only elementwise and shape ops), which FoldConstant would build one by one. This pass takes
the bindings of a function that compute from constants only (pure calls, tuples), puts them in
a function of their own, compiles it once for the host (TVM's default pipeline, its
legalization and kernels: the values are TVM's) and runs it; each tensor value that the rest
of the function reads becomes a constant, and what computed it is left for
DeadCodeElimination. Values of more than MAX_BYTES stay as they are (TVM's FoldConstant
after it decides about them as before).

`fold_what_is_left` runs TVM's FoldConstant only where a value still depends on constants
alone: it legalizes every call of the module to find out (1.5 ms a call, a second on a
DenseNet-121). Elsewhere it does the other thing FoldConstant does, each use of a variable
bound to a constant made the constant (the numpy folding binds its results so).
"""

from __future__ import annotations

import math

import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from strategy.layout import array_constant, static_shape

from .relax_util import bound, rewrite_functions, with_function

# a folded tensor becomes part of the library: larger values are left to TVM's FoldConstant
MAX_BYTES = 4 << 20
# fewer foldable bindings than this: TVM's FoldConstant's per-op builds cost no more
MIN_BINDINGS = 4


def _free_vars(expr) -> set:
    found = set()
    relax.analysis.post_order_visit(expr, lambda e: found.add(e) if isinstance(e, relax.Var) else None)
    return found


def _pure_call(expr) -> bool:
    """A call of a pure op (call_tir of a PrimFunc included), a tuple, a tuple's field or a
    constant (one that FoldConstantNumpy bound) or a variable."""
    if isinstance(expr, (relax.Tuple, relax.TupleGetItem, tvm.ir.expr.Constant, relax.Var)):
        return True
    if not isinstance(expr, relax.Call) or not isinstance(expr.op, tvm.ir.Op):
        return False
    return bool(expr.op.get_attr("FPurity"))


def _small_tensor(var: relax.Var) -> bool:
    shape = static_shape(var) if isinstance(var.ty, relax.TensorType) else None
    return shape is not None and math.prod(shape) * tvm.DataType(str(var.ty.dtype)).bits // 8 <= MAX_BYTES


def _constant_bindings(func: relax.Function) -> list:
    """The bindings of `func` whose values depend on constants alone (no input, no shape
    variable), in order."""
    known, found = set(), []
    for block in func.body.blocks:
        for binding in block.bindings:
            value = binding.value
            if (
                isinstance(binding, relax.VarBinding)
                and _pure_call(value)
                and _free_vars(value) <= known
                and not relax.analysis.free_symbolic_vars(value)
            ):
                known.add(binding.var)
                found.append(binding)
    return found


def _read_elsewhere(func: relax.Function, computed: list) -> list:
    """The variables of `computed` that a binding outside it or the function's result reads."""
    read, inside = _free_vars(func.body.body), set(computed)
    for block in func.body.blocks:
        for binding in block.bindings:
            if binding.var not in inside:
                read |= _free_vars(binding.value)
    return [v for v in computed if v in read]


def _callees(bindings: list) -> set:
    found = set()
    for binding in bindings:
        relax.analysis.post_order_visit(
            binding.value, lambda e: found.add(e) if isinstance(e, tvm.ir.GlobalVar) else None
        )
    return found


def _evaluate(mod: tvm.IRModule, bindings: list, wanted: list) -> list:
    """The values of the variables `wanted`, computed by `bindings` (a module of their own,
    with the functions they call, built for the host)."""
    result = relax.Var("folded", relax.TupleType([v.ty for v in wanted]))
    body = relax.SeqExpr([relax.DataflowBlock([*bindings, relax.VarBinding(result, relax.Tuple(wanted))])], result)
    functions = {gvar: mod[gvar] for gvar in _callees(bindings)}
    functions[tvm.ir.GlobalVar("main")] = relax.Function([], body, result.ty, is_pure=True)
    executable = tvm.compile(tvm.IRModule(functions), target=tvm.target.Target("llvm"))
    values = relax.VirtualMachine(executable, tvm.cpu())["main"]()
    return [value.numpy() for value in values]


def _fold(mod: tvm.IRModule, gvar: tvm.ir.GlobalVar) -> tvm.IRModule:
    func = mod[gvar]
    if not isinstance(func.body, relax.SeqExpr):
        return mod
    bindings = _constant_bindings(func)
    computed = [b.var for b in bindings if not isinstance(b.value, (tvm.ir.expr.Constant, relax.Var))]
    wanted = [v for v in _read_elsewhere(func, computed) if _small_tensor(v)]
    if len(computed) < MIN_BINDINGS or not wanted:
        return mod
    folded = dict(zip(wanted, (array_constant(a) for a in _evaluate(mod, bindings, wanted))))
    blocks = []
    for block in func.body.blocks:
        new = [relax.VarBinding(b.var, folded[b.var]) if b.var in folded else b for b in block.bindings]
        blocks.append(relax.DataflowBlock(new) if isinstance(block, relax.DataflowBlock) else relax.BindingBlock(new))
    body = relax.SeqExpr(blocks, func.body.body)
    return with_function(mod, gvar, relax.Function(func.params, body, func.ret_ty, func.is_pure, func.attrs, func.span))


@tvm.transform.module_pass(opt_level=0, name="FoldConstantSubgraphs")
def fold_constant_subgraphs(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    """Every Relax function's values that depend on constants alone, folded by one build (see
    the module's docstring); contained by the pipeline (a failure leaves the module as it was)."""
    folded = mod
    for gvar, func in list(mod.functions_items()):
        if isinstance(func, relax.Function):
            folded = _fold(folded, gvar)
    return mod if folded is mod else relax.transform.DeadCodeElimination()(folded)


def _computes_from_constants(mod: tvm.IRModule) -> bool:
    """Whether a Relax function of `mod` computes a value from constants alone."""
    for func in mod.functions.values():
        if isinstance(func, relax.Function) and isinstance(func.body, relax.SeqExpr):
            if any(not isinstance(b.value, (tvm.ir.expr.Constant, relax.Var)) for b in _constant_bindings(func)):
                return True
    return False


@mutator
class _ConstantsInlined(PyExprMutator):
    def visit_var_(self, var: relax.Var) -> relax.Expr:
        value = bound(self, var)
        return value if isinstance(value, tvm.ir.expr.Constant) else var

    def visit_dataflow_var_(self, var: relax.Var) -> relax.Expr:
        return self.visit_var_(var)


@tvm.transform.module_pass(opt_level=0, name="FoldConstant")
def fold_what_is_left(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    """TVM's FoldConstant where a value of `mod` depends on constants alone; else the
    constants bound to variables put where the variables are read (see the module's docstring)."""
    if _computes_from_constants(mod):
        return relax.transform.FoldConstant()(mod)
    return relax.transform.DeadCodeElimination()(rewrite_functions(_ConstantsInlined, mod))
