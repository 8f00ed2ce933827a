"""What an op is, read from TVM itself rather than from lists of names: whether a call is
elementwise, judged from the kernel TVM's legalization makes for it.

A call is *elementwise* when each element of its result is computed from the elements of its
tensor arguments at that same index alone, numpy-broadcast: ``out[i] = f(a[i'], b[i''], ...)``
where ``i'`` is ``i``'s trailing ``rank(a)`` axes with 0 for the size-1 ones, and nothing else
depends on ``i``. Such a call commutes with every permutation of the axes: for full-rank
operands ``f(permute(a, p), permute(b, p)) == permute(f(a, b), p)``, so a layout change can move
through it. That is what SimplifyLayouts needs to know, for relu as for leakyrelu, softplus,
where or clip, most of which TVM 0.27 gives no layout inference.

How it is decided (`is_elementwise`): a representative call of the op (the same attributes,
dtypes and non-tensor arguments; tensors of distinct extents per axis, size 1 where the real
call broadcasts) must infer a result of the broadcast shape of its tensors, and TVM's
LegalizeOps must make it one kernel call of exactly those tensors, every block of which stores
at its own iteration variables and uses them only to index loads the numpy-broadcast way. TIR's
op pattern (kElemWise) is not enough: tril and prelu are kElemWise there, yet tril compares its
indices and prelu reads its slope along one axis. The answer is cached per op, attributes,
non-tensor arguments and broadcast pattern.
"""

from __future__ import annotations

import functools

import numpy as np
import tvm
import tvm_ffi
from tvm import relax, s_tir, tirx

from .relax_util import op_name

_DATA_PAR = 0  # IterVar.iter_type of a spatial (not reduced) axis


def is_elementwise(call: relax.Expr) -> bool:
    """Whether `call` (any expression) is a call of an op that is elementwise, in the sense of
    this module's docstring, for its dtypes, attributes and broadcasting, at its rank and with
    one more leading axis: the rewrites that move an elementwise op reshape its operands, so
    attributes that count axes (a pad's widths, all zero, say) make it not elementwise."""
    key = _representative_key(call)
    return key is not None and _elementwise(key) and _elementwise(_one_more_axis(key))


def _one_more_axis(key):
    """`key` with a leading axis on the result and on each full-rank tensor argument."""
    name, attrs, args, rank = key
    grown = tuple((a[0], (2 + rank, *a[1]), a[2]) if a[0] == "tensor" and len(a[1]) == rank else a for a in args)
    return name, attrs, grown, rank + 1


def _representative_key(call: relax.Expr):
    """A hashable description of `call` for the cache: (op, attrs, args), each tensor argument
    as (representative shape, dtype); None when `call` cannot be elementwise on its face."""
    if op_name(call) is None or call.op.get_attr("FLegalize") is None:
        return None
    out = call.ty
    if not isinstance(out, relax.TensorType) or out.ndim < 0 or out.shape is None:
        return None
    rank, out_shape = out.ndim, list(out.shape)
    args, tensors = [], 0
    for arg in call.args:
        ty = arg.ty
        if isinstance(ty, relax.TensorType):
            if ty.ndim < 0 or ty.ndim > rank or ty.shape is None:
                return None
            args.append(("tensor", _representative_shape(list(ty.shape), out_shape), str(ty.dtype)))
            tensors += 1
        elif isinstance(ty, tvm.ir.PrimType) or isinstance(arg, tvm.ir.StringImm):  # clip's bounds, say
            args.append(("value", _Hashed(arg)))
        else:  # a shape, tuple or function argument: the result is not a broadcast of tensors
            return None
    if not tensors:
        return None
    return call.op.name, _Hashed(call.attrs), tuple(args), rank


def _representative_shape(shape: list, out_shape: list) -> tuple[int, ...]:
    """An argument's shape with the extent 2 + axis of the result on each axis, aligned from the
    end, and 1 where the real argument broadcasts (extent 1 against a result that is not)."""
    offset = len(out_shape) - len(shape)
    dims = []
    for j, dim in enumerate(shape):
        axis = offset + j
        broadcasts = _is_one(dim) and not _is_one(out_shape[axis])
        dims.append(1 if broadcasts else 2 + axis)
    return tuple(dims)


def _is_one(dim) -> bool:
    return isinstance(dim, tirx.IntImm) and int(dim) == 1


class _Hashed:
    """A TVM object (or None) compared and hashed structurally, for cache keys."""

    def __init__(self, obj):
        self.obj = obj
        self._hash = 0 if obj is None else tvm_ffi.structural_hash(obj)

    def __hash__(self):
        return self._hash

    def __eq__(self, other):
        if self.obj is None or other.obj is None:
            return self.obj is other.obj
        return bool(tvm_ffi.structural_equal(self.obj, other.obj))


@functools.lru_cache(maxsize=4096)
def _elementwise(key) -> bool:
    """`is_elementwise` of the representative call that `key` describes."""
    name, attrs, args, rank = key
    params = [relax.Var(f"a{i}", relax.TensorType(a[1], a[2])) for i, a in enumerate(args) if a[0] == "tensor"]
    tensor_args = iter(params)
    call_args = [next(tensor_args) if a[0] == "tensor" else a[1].obj for a in args]
    call = relax.Call(tvm.ir.Op.get(name), call_args, attrs.obj)
    try:
        mod = _legalized(call, params)
    except Exception:  # noqa: BLE001  (the op rejects the representative call: not elementwise)
        return False
    if mod is None:
        return False
    kernel = _only_kernel_call(mod, params)
    return kernel is not None and kernel_is_elementwise(kernel)


def _legalized(call: relax.Call, params: list) -> tvm.IRModule | None:
    """The module `main(params) = call` after LegalizeOps, or None when the call does not infer
    a tensor of the broadcast shape of its tensor arguments."""
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(call)
        bb.emit_func_output(out)
    shape = getattr(out.ty, "shape", None)
    broadcast = np.broadcast_shapes(*[tuple(int(d) for d in p.ty.shape) for p in params])
    if shape is None or [int(d) for d in shape] != list(broadcast):
        return None
    return relax.transform.LegalizeOps()(bb.get())


def _only_kernel_call(mod: tvm.IRModule, params: list) -> tirx.PrimFunc | None:
    """The PrimFunc that `mod`'s main calls, when main is that one call_tir of its parameters."""
    main = mod["main"]
    bindings = [b for block in main.body.blocks for b in block.bindings]
    if len(bindings) != 1 or op_name(bindings[0].value) != "relax.call_tir":
        return None
    callee, inputs = bindings[0].value.args[0], bindings[0].value.args[1]
    if not isinstance(inputs, relax.Tuple) or not all(any(a.same_as(p) for p in params) for a in inputs.fields):
        return None
    func = mod[callee]
    return func if isinstance(func, tirx.PrimFunc) else None


def kernel_is_elementwise(func: tirx.PrimFunc) -> bool:
    """Whether every block of `func` stores at its own (spatial) iteration variables, in order,
    and uses them only as the numpy-broadcast indices of its loads (see the module docstring)."""
    blocks: list = []
    return _collect_blocks(func.body, blocks) and bool(blocks) and all(_block_is_elementwise(b) for b in blocks)


def _collect_blocks(stmt, found: list) -> bool:
    """The blocks with iteration variables under `stmt`, appended to `found`; False for a
    statement other than loops, sequences and blocks."""
    if isinstance(stmt, tirx.SeqStmt):
        return all(_collect_blocks(s, found) for s in stmt.seq)
    if isinstance(stmt, tirx.For):
        return _collect_blocks(stmt.body, found)
    if isinstance(stmt, s_tir.SBlockRealize):
        if len(stmt.block.iter_vars) == 0:  # the root block
            return stmt.block.init is None and _collect_blocks(stmt.block.body, found)
        found.append(stmt.block)
        return True
    return False


def _block_is_elementwise(block: s_tir.SBlock) -> bool:
    """One block of `kernel_is_elementwise`."""
    store, ivars = block.body, [iv.var for iv in block.iter_vars]
    if block.init is not None or any(int(iv.iter_type) != _DATA_PAR for iv in block.iter_vars):
        return False
    if not isinstance(store, tirx.BufferStore) or len(store.indices) != len(ivars):
        return False
    if not all(index.same_as(var) for index, var in zip(store.indices, ivars)):
        return False
    ok = [True]

    def on_load(load, _visitor):
        ok[0] = ok[0] and _broadcast_indices(load, ivars)

    def on_var(var, _visitor):
        ok[0] = ok[0] and not any(var.same_as(v) for v in ivars)

    tvm_ffi.structural_visit(store.value, [(tvm.ir.expr.TensorLoad, on_load), (tvm.ir.Var, on_var)])
    return ok[0]


def _broadcast_indices(load, ivars: list) -> bool:
    """Whether `load` reads at the trailing iteration variables, 0 on its size-1 axes."""
    indices, shape = list(load.indices), list(load.source.shape)
    offset = len(ivars) - len(indices)
    if offset < 0:
        return False
    for j, index in enumerate(indices):
        if index.same_as(ivars[offset + j]):
            continue
        if not (isinstance(index, tirx.IntImm) and int(index) == 0 and _is_one(shape[j])):
            return False
    return True
