"""FoldViews: attention's head split and merge read and written by the matmul kernels.

A transformer splits the output of its QKV dense layer into heads, ``qkv [S, 3 * H * D]``
reshaped to ``[S, 3, H, D]``, permuted to ``[3, H, S, D]`` and sliced into Q, K and V, and
merges the heads of ``P @ V [H, S, D]`` with a permute to ``[S, H, D]`` before the output
dense layer. Legalized op by op, each permute and slice is a copy of the activation at run
time. Here each batch matmul (both operands activations, rank 3 or more) is legalized with
what surrounds it: an operand that is such a chain of ``reshape``, ``permute_dims``,
``strided_slice``, ``squeeze``, ``expand_dims``, ``broadcast_to`` and ``take`` of one index
(one of them a permute, a slice, a broadcast or a take) is read from the chain's source, and
a result whose one use is a permute (after a reshape of its batch axes, if any) is written
permuted, in place of that permute: attention's head merge keeps the last axis; a product
over an NHWC image's rows or columns per channel (timm's BAT) moves its batch axis, the
channels, last. The request travels to the strategy as
strategy.dense.REQUESTED_VIEWS; the chains no kernel reads any more are dead and go. An
operand whose chain the kernel cannot read without dividing its row or column indices stays
materialized (strategy.dense), as does everything when the matmul gets another kernel.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass

import tvm
from tvm import relax
from tvm.ir.expr import Constant
from tvm.relax.expr_functor import PyExprMutator, mutator

from strategy import dense as dense_strategy  # its names read at call time: a reload replaces them
from strategy.dispatch import dispatch
from strategy.layout import constant_array, same_dims, tensor_shape

from .relax_util import PERMUTE, RESHAPE, bindings, op_name, permute_axes

MATMUL = "relax.matmul"
SLICE = "relax.strided_slice"
SQUEEZE = "relax.squeeze"
EXPAND_DIMS = "relax.expand_dims"
TAKE = "relax.take"
BROADCAST = "relax.broadcast_to"
MATERIALIZED = (PERMUTE, SLICE, TAKE, BROADCAST)  # a chain of reshapes alone is free: the VM makes views of them


def _ints(values) -> tuple[int, ...] | None:
    """A tuple argument of PrimValues (strided_slice's begin, end, ...) as ints; None if any is
    not a known number."""
    fields = getattr(values, "fields", None)
    if fields is None:
        return None
    if not all(isinstance(f, tvm.tirx.IntImm) for f in fields):
        return None
    return tuple(int(f) for f in fields)


def _steps(call: relax.Call) -> tuple | None:
    """The topi_accel.views steps of a layout op, None for another op (or a slice or take of
    indices not known)."""
    name = op_name(call)
    if name in (RESHAPE, EXPAND_DIMS):  # expand_dims: a reshape that adds unit axes
        shape = tensor_shape(call)
        return None if shape is None else (("reshape", tuple(shape)),)
    if name == PERMUTE:
        return (("transpose", tuple(permute_axes(call))),)
    if name == BROADCAST:  # grouped-query attention's K and V heads, each read by several
        shape = tensor_shape(call)
        return None if shape is None else (("broadcast_to", tuple(shape)),)
    if name == SQUEEZE:
        axis = call.attrs.axis
        return (("squeeze", None if axis is None else tuple(int(a) for a in axis)),)
    if name == SLICE and len(call.args) in (4, 5):  # strides left out: all 1
        axes, begin, end, *strides = (_ints(arg) for arg in call.args[1:])
        strides = strides[0] if strides else None if axes is None else (1,) * len(axes)
        if None in (axes, begin, end, strides):
            return None
        return (("strided_slice", begin, end, strides, axes, bool(call.attrs.assume_inbound)),)
    if name == TAKE:  # one index of an axis (torch's unbind): that slice, squeezed
        index, shape, axis = call.args[1], tensor_shape(call.args[0]), call.attrs.axis
        axis = None if shape is None or axis is None else int(axis) % len(shape)  # no axis: a flat take
        if not isinstance(index, Constant) or axis is None or not isinstance(shape[axis], int):
            return None
        value = constant_array(index)
        if value.ndim != 0 or not 0 <= int(value) < shape[axis]:
            return None
        i = int(value)
        return (("strided_slice", (i,), (i + 1,), (1,), (axis,), True), ("squeeze", (axis,)))
    return None


def view_chain(var2val: dict, expr: relax.Expr) -> tuple[relax.Expr, tuple, list] | None:
    """(source, steps from it to `expr`, the variables bound along the way) for an `expr`
    bound to a chain of layout ops that copies at run time (holds one of MATERIALIZED) from a
    tensor of known shape that is no constant; None for any other."""
    steps, names, bound = [], [], []
    while isinstance(expr, relax.Var) and expr in var2val:
        value = var2val[expr]
        if not isinstance(value, relax.Var) and (more := _steps(value)) is None:
            break
        bound.append(expr)
        if isinstance(value, relax.Var):  # an alias
            expr = value
            continue
        steps += reversed(more)
        names.append(op_name(value))
        expr = value.args[0]
    if not any(name in MATERIALIZED for name in names) or tensor_shape(expr) is None or isinstance(expr, Constant):
        return None
    return expr, tuple(reversed(steps)), bound


def _users(func: relax.Function) -> dict:
    """Each variable of `func`: the variables bound to expressions that read it (the
    function's result counts as a reader, None)."""
    users: dict = {}
    for binding in bindings(func):
        for var in relax.analysis.free_vars(binding.value):
            users.setdefault(var, []).append(binding.var)
    for var in relax.analysis.free_vars(func.body.body):
        users.setdefault(var, []).append(None)
    return users


def _permuted_result(var2val: dict, users: dict, matmul_var: relax.Var) -> tuple | None:
    """(the permute's variable, batch axes, permutation, the reshape's variable or None) where
    the matmul's one use is a permute, directly or after a reshape of the batch axes alone."""
    shape = tensor_shape(matmul_var)
    batch, user, reshaped_var = shape[:-2], users.get(matmul_var, []), None
    if len(user) != 1 or user[0] is None:
        return None
    value = var2val.get(user[0])  # (none for a match_cast)
    if op_name(value) == RESHAPE:
        reshaped = tensor_shape(value)
        if reshaped is None or len(users.get(user[0], [])) != 1 or not same_dims(reshaped[-2:], shape[-2:]):
            return None
        reshaped_var, batch, user = user[0], reshaped[:-2], users[user[0]]
        if user[0] is None:
            return None
        value = var2val.get(user[0])
    if op_name(value) != PERMUTE:
        return None
    axes = permute_axes(value)
    return user[0], tuple(batch), tuple(axes), reshaped_var


@dataclass
class _Request:
    """A batch matmul to legalize at the binding of `host`: its call, the views to ask for, and
    the variables whose ops the kernel may take in (the views' chains, the permute after it)."""

    matmul: relax.Var
    call: relax.Call
    views: dense_strategy.MatmulViews
    members: list


def _requests(func: relax.Function) -> dict:
    """The bindings to legalize here: host variable -> _Request."""
    var2val = relax.analysis.get_var2val(func)
    users = _users(func)
    requests = {}
    for var, value in var2val.items():
        if op_name(value) != MATMUL or any(len(tensor_shape(x) or ()) < 3 for x in value.args):
            continue
        chains = [view_chain(var2val, x) for x in value.args]
        views = dense_strategy.MatmulViews(*(None if c is None else c[:2] for c in chains))
        members = [v for c in chains if c is not None for v in c[2]]
        permuted = _permuted_result(var2val, users, var)
        if permuted is not None:
            host, views.out = permuted[0], permuted[1:3]
            members += [v for v in (permuted[3], host) if v is not None]
            requests[host] = _Request(var, value, views, members)
        elif views.a is not None or views.b is not None:
            requests[var] = _Request(var, value, views, members)
    return requests


@mutator
class _FoldViews(PyExprMutator):
    def __init__(self, mod: tvm.IRModule, requests: dict):
        super().__init__(mod)
        self.requests = requests
        self.folded: list = []  # (host variable, _Request) of each matmul legalized here

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        request = self.requests.get(binding.var)
        if request is None:
            return super().visit_var_binding_(binding)
        asked, matmul, remap = request.views, request.call, self.visit_expr
        views = dense_strategy.MatmulViews(
            *(None if v is None else (remap(v[0]), v[1]) for v in (asked.a, asked.b)), asked.out
        )
        call = self.builder_.normalize(relax.Call(matmul.op, [remap(x) for x in matmul.args], matmul.attrs))
        token = dense_strategy.REQUESTED_VIEWS.set(views)
        try:
            value = dispatch(self.builder_, call)
        finally:
            dense_strategy.REQUESTED_VIEWS.reset(token)
        if views.out is not None and not views.permuted:  # another kernel: the permute stays
            return super().visit_var_binding_(binding)
        self.builder_.emit_normalized(relax.VarBinding(binding.var, self.builder_.normalize(value)))
        self.folded.append((binding.var, request))
        return None


# host variable -> (the matmul's variable, the variables whose ops its kernel may take in),
# for the report (accel_target.reporting, which keeps those the legalized module no longer
# binds): filled by each run of the pass in an open `noting_folds`
_FOLDS: contextvars.ContextVar[dict | None] = contextvars.ContextVar("accel_folds", default=None)


@contextlib.contextmanager
def noting_folds():
    """A log of what FoldViews did in the block (its last run's), as `_FOLDS` describes."""
    log: dict = {}
    token = _FOLDS.set(log)
    try:
        yield log
    finally:
        _FOLDS.reset(token)


@tvm.transform.module_pass(opt_level=0, name="FoldViews")
def fold_views(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    """Batch matmuls legalized reading their operands' views and writing permuted results in
    place (see the module's docstring); the layout ops left unread are removed."""
    log = _FOLDS.get()
    if log is not None:
        log.clear()
    folded, asked = [], False
    for gvar, func in list(mod.functions_items()):
        if not isinstance(func, relax.Function):
            continue
        requests = _requests(func)
        if requests:
            asked = True
            mutator_ = _FoldViews(mod, requests)
            mutator_.builder_.update_func(gvar, mutator_.visit_expr(func))
            mod = mutator_.builder_.get()
            folded += mutator_.folded
    if log is not None:
        log.update((host, (request.matmul, request.members)) for host, request in folded)
    return relax.transform.DeadCodeElimination()(mod) if asked else mod  # the chains and kernels left unread
