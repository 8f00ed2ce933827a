"""Whole register tiles written back without their tail conditions.

A kernel whose columns are a symbolic extent (attention's Q @ K^T: N is the sequence) writes
its register tile back under a condition on each element's column: TVM's vectorizer cannot
store a vector under a condition per lane and writes the tile element by element, each
under the whole condition. Every tile
but the last of a row is whole, so `whole_tiles` runs the write-back twice over: unguarded,
vectorized, when the condition holds at the tile's last element in every loop (and so at all
of them: each of its comparisons is proven not to loosen as a loop advances), as it was
otherwise.
"""

from __future__ import annotations

from tvm import ir, s_tir, sym, tirx

from .blocks import block_buffers, block_realize, fresh_iter_vars, rewrite_loops, substitute


def _vars_in(expr, loops) -> bool:
    used = tirx.analysis.undefined_vars(expr)
    return any(u.same_as(loop.loop_var) for u in used for loop in loops)


def _at_last(expr, loops):
    """`expr` with each loop's variable at its last iteration."""
    return substitute(expr, {loop.loop_var: loop.min + loop.extent - 1 for loop in loops})


def _guard(cond, loops, analyzer: sym.Analyzer):
    """A condition on the loops' last iteration that implies `cond` at every iteration; None
    where none is found."""
    if not _vars_in(cond, loops):
        return cond
    if isinstance(cond, (tirx.And, tirx.Or)):
        a, b = _guard(cond.a, loops, analyzer), _guard(cond.b, loops, analyzer)
        if isinstance(cond, tirx.And):
            return None if a is None or b is None else tirx.And(a, b)
        return a if b is None else b if a is None else tirx.Or(a, b)
    if isinstance(cond, (tirx.LT, tirx.LE)):
        slack = cond.b - cond.a  # the comparison holds while this stays (non-)positive
        if analyzer.can_prove(slack - _at_last(slack, loops) >= 0):  # smallest at the last iteration
            return _at_last(cond, loops)
    return None


def _nest(stmt):
    """(loops, realize) if `stmt` is a perfect nest of serial, unrolled or vectorized loops
    around one block realize with a condition, the innermost loop vectorized."""
    loops = []
    while isinstance(stmt, tirx.For) and stmt.kind != tirx.ForKind.PARALLEL:
        loops.append(stmt)
        stmt = stmt.body
    if not loops or not isinstance(stmt, s_tir.SBlockRealize) or loops[-1].kind != tirx.ForKind.VECTORIZED:
        return None
    if isinstance(stmt.predicate, tirx.IntImm) or stmt.block.init is not None:
        return None
    return loops, stmt


def _unguarded(loops, realize, buffers) -> tirx.Stmt:
    """A copy of the nest (its own variables) without the block's condition."""
    block = realize.block
    fresh = {loop.loop_var: tirx.Var(loop.loop_var.name, loop.loop_var.ty.dtype) for loop in loops}
    values = [substitute(v, fresh) for v in realize.iter_values]
    iter_vars, (body,) = fresh_iter_vars(block.iter_vars, block.body)
    stmt = block_realize(block.name_hint, iter_vars, values, body, buffers, annotations=block.annotations)
    for loop in reversed(loops):
        stmt = tirx.For(
            fresh[loop.loop_var], loop.min, loop.extent, loop.kind, stmt, loop.thread_binding, loop.annotations
        )
    return stmt


def whole_tiles(func: tirx.PrimFunc) -> tirx.PrimFunc | None:
    """`func` (scheduled, blocks kept) with each vectorized write-back whose condition depends on
    the vector lane run without it where the condition holds for the whole nest (module
    docstring); None if there is none."""
    buffers, done = block_buffers(func), []

    def at_loop(loop: tirx.For) -> tirx.Stmt | None:
        nest = _nest(loop)
        if nest is None or not _vars_in(nest[1].predicate, nest[0][-1:]):
            return None
        loops, realize = nest
        analyzer = sym.Analyzer()
        for each in loops:
            analyzer.bind(each.loop_var, ir.Range.from_min_extent(each.min, each.extent))
        guard = _guard(realize.predicate, loops, analyzer)
        if guard is None:
            return None
        done.append(realize.block.name_hint)
        return tirx.IfThenElse(analyzer.simplify(guard), _unguarded(loops, realize, buffers), loop)

    body = rewrite_loops(func.body, at_loop)
    if not done:
        return None
    # the two copies of a nest define its variables twice (a let-bound activation's, from
    # accel_target.passes.fast_math): TIR defines each variable once
    return tirx.transform.ConvertSSA()(ir.IRModule({"main": func.with_body(body)}))["main"]
