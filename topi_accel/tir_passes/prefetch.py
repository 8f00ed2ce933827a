"""Software prefetch of the weight panel the next iterations of a kernel's outer loop read.

The matmul-like kernels (dense_kn, the Winograd products, channel-block-outer convs) run
their outer loop over (weight panel, rows) with the panel outer: while a panel serves row
after row from cache, the first rows of the next one find it in memory. The hardware
prefetcher follows a stream only a few lines ahead and within a 4 KiB page, so those rows
wait on most of its lines. Here each outer iteration prefetches its share of the next
panel, spread through its reduction: the next panel arrives in cache while this one is
used, which pays where many rows share a panel (128 x 3072 x 768). With few rows per panel
(a GEMV, 16 rows) the weights stream anyway and the prefetches only cost.

The schedule splits the reduction (`prefetch_next_panel`) and marks the outer part; the
prefetches are inserted once the kernel is lowered (`insert_prefetches`, a build step):
s_tir has no prefetch primitive, and in the loop that keeps the accumulators in registers
LLVM would not move their stores past a prefetch. A prefetch changes no result; an
address past the buffer wraps around to its start.
"""

from __future__ import annotations

import math

import tvm
from tvm import s_tir, sym, tirx
from tvm.s_tir.schedule.schedule import ScheduleError

from ..epilogue import all_blocks
from ..knobs import ceil_div
from .blocks import contains, lower_blocks

PREFETCH = "accel_prefetch"
# reduction steps of the register tile between two rounds of prefetches
STEPS = 64
# fewer rows of the product than this per weight panel: no prefetch (see above)
MIN_ROWS = 32
# bytes of one cache line (x86-64)
LINE_BYTES = 64
# last entry of the annotation of a panel whose share is computed at run time
SYMBOLIC_SHARE = -1


def prefetch_next_panel(sch: s_tir.Schedule, reduction, buffer_index: int, panel: int, per_panel, rows) -> None:
    """Make the iterations of the outer loop prefetch the next weight panel, if worth it.

    reduction: the first reduction loop of the register tile's block, under the outer
    (parallel) loop, which runs `per_panel` iterations per panel of `panel` floats of
    parameter `buffer_index`, panels one after the other in memory and in the loop; rows:
    the product's rows that read one panel. Splits `reduction` by STEPS and annotates the
    outer part; not when STEPS does not divide it into several parts, or rows < MIN_ROWS.
    `per_panel` and `rows` may be symbolic (expressions of the kernel's shape variables, rows
    a multiple of per_panel): the share is then computed at run time from the outer loop's
    extent, and the prefetches run only where rows >= MIN_ROWS.
    """
    extent = sch.get(reduction).extent
    if not isinstance(extent, tirx.IntImm) or int(extent) % STEPS or int(extent) == STEPS:
        return
    static = isinstance(per_panel, (int, tirx.IntImm)) and isinstance(rows, (int, tirx.IntImm))
    if static and int(rows) < MIN_ROWS:
        return
    outer, _ = sch.split(reduction, [None, STEPS])
    # outer iteration p prefetches the floats [(p + per_panel) * share, + share): its share of
    # the panel per_panel iterations further on, i.e. of the next one
    if static:
        sch.annotate(outer, PREFETCH, [buffer_index, ceil_div(panel, int(per_panel)), int(per_panel)])
    else:  # (annotations hold no shape variables: panel, and rows per outer iteration)
        per_iteration = sym.Analyzer().simplify(rows // per_panel)
        sch.annotate(outer, PREFETCH, [buffer_index, panel, int(per_iteration), SYMBOLIC_SHARE])


def prefetch(buffer, offset) -> tirx.Stmt:
    """A prefetch of the cache line of float `offset` of `buffer` (for reading, into L2
    and outward, data cache)."""
    return tirx.Evaluate(tirx.call_intrin("void", "tirx.prefetch", buffer.access_ptr("r", offset=offset), 0, 2, 1))


def _share(loops: list[tirx.For], outer: tirx.For, total: int):
    """(share, per_panel, guard) of the annotated ``loops[-1]``: static ints and no guard, or,
    for a symbolic outer loop, expressions of its extent (panels are its outermost part) and
    the condition rows >= MIN_ROWS."""
    _, share, per_panel, *symbolic = (int(v) for v in loops[-1].annotations[PREFETCH])
    if not symbolic:
        return share, per_panel, None
    panel, per_iteration = share, per_panel
    dtype = outer.extent.ty.dtype
    per_panel = tirx.floordiv(outer.extent, tirx.const(total // panel, dtype))
    guard = per_panel * tirx.const(per_iteration, dtype) >= tirx.const(MIN_ROWS, dtype)
    return tirx.ceildiv(tirx.const(panel, dtype), per_panel), per_panel, guard


def _prefetches(loops: list[tirx.For], outer: tirx.For, params, fetch) -> tirx.Stmt:
    """The prefetches of one iteration of ``loops[-1]`` (annotated), inside ``loops[:-1]``;
    for a symbolic share, in a loop of its own and only where there are MIN_ROWS rows."""
    buffer = params[int(loops[-1].annotations[PREFETCH][0])]
    per_line = LINE_BYTES // tvm.DataType(buffer.dtype).itemsize  # elements of one cache line
    total = math.prod(int(extent) for extent in buffer.ty.shape)
    share, ahead, guard = _share(loops, outer, total)
    dtype = loops[-1].loop_var.ty

    def const(v):
        return tirx.const(v, dtype) if isinstance(v, int) else tirx.Cast(dtype, v)

    iteration, iterations = const(0), 1  # of the nest, row-major
    for loop in loops:
        iteration = iteration * const(int(loop.extent)) + tirx.Cast(dtype, loop.loop_var - loop.min)
        iterations *= int(loop.extent)
    step = ceil_div(share, iterations) if guard is None else tirx.ceildiv(const(share), const(iterations))
    line = tirx.Var("prefetch_line", dtype)
    start = (tirx.Cast(dtype, outer.loop_var) + const(ahead)) * const(share) + iteration * const(step)
    offset = tirx.floormod(start + line * const(per_line), const(total))
    if guard is None:
        count = const(ceil_div(step, per_line))
        return tirx.For(line, const(0), count, tirx.ForKind.UNROLLED, fetch(buffer, offset))
    lines = tirx.For(line, const(0), tirx.ceildiv(step, const(per_line)), tirx.ForKind.SERIAL, fetch(buffer, offset))
    return tirx.IfThenElse(guard, lines, None)


def _insert(stmt: tirx.Stmt, outer: tirx.For | None, params, fetch, loops: list, inserted: list) -> tirx.Stmt:
    """`stmt` with prefetches in its annotated loops; `outer`: the top-level loop around it."""

    def recurse(s, outer=outer, loops=loops):
        return _insert(s, outer, params, fetch, loops, inserted)

    if isinstance(stmt, tirx.SeqStmt):
        return tirx.SeqStmt([recurse(s) for s in stmt.seq])
    if isinstance(stmt, tirx.AttrStmt):
        return tirx.AttrStmt(stmt.node, stmt.attr_key, stmt.value, recurse(stmt.body))
    if isinstance(stmt, tirx.IfThenElse):
        return tirx.IfThenElse(stmt.condition, recurse(stmt.then_case), stmt.else_case and recurse(stmt.else_case))
    if isinstance(stmt, tirx.For):
        if outer is None:  # a top-level loop
            body = recurse(stmt.body, stmt, [])
        else:
            body = recurse(stmt.body, outer, loops + [stmt])
            if PREFETCH in stmt.annotations:
                body = tirx.SeqStmt([_prefetches(loops + [stmt], outer, params, fetch), body])
                inserted.append(stmt)
        return tirx.For(stmt.loop_var, stmt.min, stmt.extent, stmt.kind, body, stmt.thread_binding, stmt.annotations)
    if hasattr(stmt, "body"):  # a While, or another statement with a body: not a kernel's loop nest
        raise TypeError(f"insert_prefetches: a {type(stmt).__name__} in a kernel's loop nest is not handled")
    return stmt


def asks_for_prefetches(func: tirx.PrimFunc) -> bool:
    """Whether a loop of `func` carries the annotation of `prefetch_next_panel` (a function
    without blocks, lowered already or written as loops, such as TVM's searchsorted: any of
    its loops)."""
    sch = s_tir.Schedule(func)
    try:
        blocks = all_blocks(sch)
    except ScheduleError:
        return contains(func.body, tirx.For, lambda loop: PREFETCH in loop.annotations)
    return any(PREFETCH in sch.get(loop).annotations for block in blocks for loop in sch.get_loops(block))


def insert_prefetches(func: tirx.PrimFunc, fetch=prefetch) -> tirx.PrimFunc | None:
    """`func` lowered to a block-free function with the prefetches its schedule asked for
    (`prefetch_next_panel`); None, and `func` not even lowered, if it asked for none.
    fetch(buffer, offset) makes the statement for one cache line (tests record the
    addresses instead)."""
    if not asks_for_prefetches(func):
        return None
    lowered = lower_blocks()(tvm.IRModule({"main": func}))["main"]
    inserted = []
    body = _insert(lowered.body, None, lowered.params, fetch, [], inserted)
    return lowered.with_body(body) if inserted else None
