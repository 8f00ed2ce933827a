"""A reduction over a symbolic innermost extent (softmax over a dynamic sequence length) as
vector partial results with a runtime tail.

A float sum or max does not vectorize as written (its order is fixed), and TVM's rfactor
cannot split a symbolic extent without a condition on every element: its init then misses
the lanes that no element reaches (rows shorter than a vector), and compute_at cannot move
the result. `vector_lanes` rewrites the scheduled function instead: a serial loop of
symbolic extent ``n`` around one reduction block becomes

    lanes[0:L] = identity                           (vectorized)
    for k0 in range(n // L): lanes[0:L] = op(lanes[0:L], value(k0 * L + 0:L))   (vectorized)
    out = init; for l in range(L): out = op(out, lanes[l])
    for k in range(n // L * L, n): out = op(out, value(k))                     (the tail)

with ``L`` chosen by the caller (topi_accel.generic: the target's float32 vector lanes, at
most one per VECTOR_RUN elements of the representative extent). The partial results are
combined in another order than the serial loop's, as the static kernels' rfactor does. They
are kept in a global-scope buffer of constant size, which TVM's LowerTVMBuiltin puts on the
stack (a local-scope one becomes a workspace allocation, per row).
"""

from __future__ import annotations

from collections.abc import Callable

from tvm import ir, s_tir, sym, tirx

from .blocks import block_buffers, block_realize, fresh_iter_vars, rewrite_loops

# sum, max and min: the combiners whose partial results may be combined in any order
_COMBINERS = (tirx.Add, tirx.Max, tirx.Min)


def _identity(op: type, dtype: str) -> tirx.PrimExpr:
    if op is tirx.Add:
        return tirx.const(0, dtype)
    return tirx.min_value(dtype) if op is tirx.Max else tirx.max_value(dtype)


def _same_load(expr, store: tirx.BufferStore) -> bool:
    return (
        isinstance(expr, ir.expr.TensorLoad)
        and expr.source.same_as(store.buffer)
        and len(expr.indices) == len(store.indices)
        and all(a.same_as(b) or sym.Analyzer().can_prove_equal(a, b) for a, b in zip(expr.indices, store.indices))
    )


def _reduction(loop: tirx.For):
    """(realize, reduce iter var index, combiner) if `loop` is a serial loop of symbolic
    extent from 0 around one block ``out = op(out, value)`` that reduces over it alone."""
    realize = loop.body
    if (
        loop.kind != tirx.ForKind.SERIAL
        or isinstance(loop.extent, tirx.IntImm)
        or not isinstance(realize, s_tir.SBlockRealize)
    ):
        return None
    if not (isinstance(loop.min, tirx.IntImm) and int(loop.min) == 0):
        return None
    block, store = realize.block, realize.block.body
    if block.init is None or block.alloc_buffers or block.match_buffers or not isinstance(store, tirx.BufferStore):
        return None
    if not (isinstance(realize.predicate, tirx.IntImm) and int(realize.predicate) == 1):
        return None
    reduce = [i for i, iv in enumerate(block.iter_vars) if iv.iter_type == tirx.IterVar.CommReduce]
    if len(reduce) != 1 or not realize.iter_values[reduce[0]].same_as(loop.loop_var):
        return None
    value = store.value
    if type(value) not in _COMBINERS or not _same_load(value.a, store):
        return None
    if any(isinstance(v, tirx.Var) and v.same_as(loop.loop_var) for v in tirx.analysis.undefined_vars(value.b)):
        return None  # (the loop variable only through the block variable)
    if not isinstance(block.init, tirx.BufferStore) or not block.init.buffer.same_as(store.buffer):
        return None
    return realize, reduce[0], type(value)


def _with_reduce(values: list, reduce: int, expr) -> list:
    """`values` (a block's iteration values) with the reduction's, index `reduce`, as `expr`."""
    return values[:reduce] + [expr] + values[reduce + 1 :]


def _lane_partials(realize, reduce: int, op: type, rf, loop_vars, known) -> tuple:
    """The blocks of the partial results in `rf`: its init (the identity in every lane) and its
    update (lane ``l`` of step ``k0`` takes element ``k0 * lanes + l``)."""
    block, store = realize.block, realize.block.body
    lanes0, lane, _, k0, _ = loop_vars
    index, lanes = k0.ty, int(rf.shape[0])
    dom = ir.Range(tirx.const(0, index), tirx.const(lanes, index))
    vl, vl_init = (tirx.IterVar(dom, tirx.Var("v_lane", index), tirx.IterVar.DataPar) for _ in range(2))
    init = block_realize(
        "_".join((block.name_hint, "lanes_init")),
        [vl_init],
        [lanes0],
        tirx.BufferStore(rf, _identity(op, rf.dtype), [vl_init.var]),
        known,
    )
    update_vars, (term,) = fresh_iter_vars(block.iter_vars, store.value.b)
    update = block_realize(
        f"{block.name_hint}_lanes",
        [*update_vars, vl],
        [*_with_reduce(list(realize.iter_values), reduce, k0 * lanes + lane), lane],
        tirx.BufferStore(rf, op(tirx.BufferLoad(rf, [vl.var]), term), [vl.var]),
        known,
    )
    return init, update


def _lane_results(realize, reduce: int, op: type, rf, loop_vars, known) -> tuple:
    """The blocks after the partial results: their combination into the block's output (with
    the block's own init), and the block itself over the tail."""
    block, store = realize.block, realize.block.body
    _, _, lane1, k0, tail = loop_vars
    index, lanes = k0.ty, int(rf.shape[0])
    dom = ir.Range(tirx.const(0, index), tirx.const(lanes, index))
    vl1 = tirx.IterVar(dom, tirx.Var("v_lane", index), tirx.IterVar.CommReduce)
    values = list(realize.iter_values)
    kept = [i for i in range(len(block.iter_vars)) if i != reduce]
    combine_vars, (combined, init_store) = fresh_iter_vars(
        [block.iter_vars[i] for i in kept],
        tirx.BufferStore(
            store.buffer,
            op(tirx.BufferLoad(store.buffer, store.indices), tirx.BufferLoad(rf, [vl1.var])),
            store.indices,
        ),
        block.init,
    )
    combine = block_realize(
        block.name_hint, [*combine_vars, vl1], [*(values[i] for i in kept), lane1], combined, known, init_store
    )
    tail_vars, (tail_store,) = fresh_iter_vars(block.iter_vars, store)
    rest = block_realize(f"{block.name_hint}_tail", tail_vars, _with_reduce(values, reduce, tail), tail_store, known)
    return combine, rest


def _lane_loops(n, lanes: int, loop_vars, blocks) -> tirx.SeqStmt:
    """The four loops of the module docstring around `blocks` (init, update, combine, tail)."""
    lanes0, lane, lane1, k0, tail = loop_vars
    init, update, combine, rest = blocks
    index, vector = n.ty, tirx.ForKind.VECTORIZED
    whole = tirx.floordiv(n, lanes) * lanes
    return tirx.SeqStmt(
        [
            tirx.For(lanes0, tirx.const(0, index), tirx.const(lanes, index), vector, init),
            tirx.For(
                k0,
                tirx.const(0, index),
                tirx.floordiv(n, lanes),
                tirx.ForKind.SERIAL,
                tirx.For(lane, tirx.const(0, index), tirx.const(lanes, index), vector, update),
            ),
            tirx.For(lane1, tirx.const(0, index), tirx.const(lanes, index), tirx.ForKind.SERIAL, combine),
            tirx.For(tail, whole, n - whole, tirx.ForKind.SERIAL, rest),
        ]
    )


def _split(loop: tirx.For, realize, reduce: int, op: type, lanes: int, buffers) -> tirx.Stmt:
    """The loop nest of the module docstring for one reduction, in a block of its own that
    allocates the partial results."""
    block, store = realize.block, realize.block.body
    index = loop.extent.ty
    rf = tirx.decl_buffer((lanes,), store.buffer.dtype, f"{block.name_hint}_lanes")
    known = [*buffers, rf]
    loop_vars = [tirx.Var(name, index) for name in ("lane", "lane", "lane", "k0", "k_tail")]
    blocks = (
        *_lane_partials(realize, reduce, op, rf, loop_vars, known),
        *_lane_results(realize, reduce, op, rf, loop_vars, known),
    )
    body = _lane_loops(loop.extent, lanes, loop_vars, blocks)
    wrapper = s_tir.SBlock([], [], [], f"{block.name_hint}_vector", body, None, [rf])
    reads, writes = s_tir.analysis.get_sblock_read_write_region(wrapper, {b: b for b in buffers})
    return s_tir.SBlockRealize([], True, s_tir.SBlock([], reads, writes, wrapper.name_hint, body, None, [rf]))


def vector_lanes(func: tirx.PrimFunc, lanes: Callable[[tirx.PrimExpr], int]) -> tirx.PrimFunc | None:
    """`func` (scheduled: no schedule primitive runs on it afterwards) with each reduction over
    a serial loop of symbolic extent split into ``lanes(extent)`` vector partial results and a
    tail (the module docstring; fewer than 2 lanes: left as it is); None if none is split."""
    buffers, done = block_buffers(func), []

    def at_loop(loop: tirx.For) -> tirx.Stmt | None:
        found = _reduction(loop)
        if found is None or lanes(loop.extent) < 2:
            return None
        done.append(found[0].block.name_hint)
        return _split(loop, *found, lanes(loop.extent), buffers)

    body = rewrite_loops(func.body, at_loop)
    return func.with_body(body) if done else None
