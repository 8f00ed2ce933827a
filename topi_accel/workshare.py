"""Parallel loops whose iterations the threads claim as they go.

TVM's thread pool splits a parallel loop statically: of T threads, thread t
runs the t-th of T equal slices, and the kernel ends when the slowest slice
does. On a machine whose cores are slowed independently for a while (a shared
host, another process on one core) that is whenever either core is slow.
`claim_iterations` rewrites each top-level parallel loop into slices with a
counter each: a thread claims the chunks of iterations of its own slice, in
order, then whatever is left of the others' — a slowed thread does less, the
others more, and without slowdowns each thread runs its own contiguous slice
as before.

TIR has no atomics on CPUs, so the counters' add and load are one-instruction
LLVM IR functions that the module links in (TVM's ``pragma_import_llvm``);
they need nothing at run time.

A claimed index is a value, not a loop variable, and no buffer region may be
relaxed over it, so `claim_iterations` first runs TVM's lowering passes (`lower_blocks`) up to
flat, block-free buffers with their regions compacted (the build runs them
again: a no-op by then) and rewrites that function. It is the last step of a
kernel's schedule: no schedule primitive applies after it.
"""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx

from .knobs import ceil_div

CLAIM = "accel_claim_iteration"
PEEK = "accel_claimed_so_far"
# marks the loop that zeroes a claimed loop's counters (shared launches run it before their launch)
CLAIM_RESET = "accel_claim_reset"
# marks a kernel that `claim_iterations` or `serial_when_small` lowered and that TVM's
# lowering `accepted` (lowering it once more is what the build does; twice more, on claimed
# loops of a symbolic extent, the buffer compaction takes tens of seconds)
LOWERED = "accel.lowered"
# marks a top-level loop that `serial_when_small` made serial (`parallel_again` reads it)
SERIALIZED = "accel_serialized"
# CLAIM: the counter's old value, incremented atomically; PEEK: its value, loaded atomically
# (monotonic: the parallel launch and its join order the counters' reset and the results)
CLAIM_LLVM_IR = f"""
define linkonce_odr i32 @{CLAIM}(ptr %counter) alwaysinline {{
  %claimed = atomicrmw add ptr %counter, i32 1 monotonic, align 4
  ret i32 %claimed
}}
define linkonce_odr i32 @{PEEK}(ptr %counter) alwaysinline {{
  %claimed = load atomic i32, ptr %counter monotonic, align 4
  ret i32 %claimed
}}
"""


def lower_blocks(compact_again: bool = True) -> tvm.transform.Pass:
    """TVM's s_tir lowering (its default pipeline's first passes) up to a block-free function
    with flat buffers and int32 indices where they fit; with `compact_again`, compaction once
    more at the end, as the build would do after the rewrite (on BERT's head transposes it
    shrinks a per-row buffer of 98304 floats to 768 that the first compaction left alone)."""
    return tvm.transform.Sequential(
        [
            s_tir.transform.LowerInitBlock(),
            s_tir.transform.PlanAndUpdateBufferAllocationLocation(),
            s_tir.transform.ConvertBlocksToOpaque(),
            s_tir.transform.CompactBufferAllocation(),
            s_tir.transform.LowerMatchBuffer(),  # the AMX kernels' operands (topi_accel.amx)
            # as TVM's pipeline does before flattening: compacting a buffer that a row-by-row
            # kernel computes per row leaves indices such as `row - row`, on which FlattenBuffer
            # divides by zero (SegFormer's and CvT's reshape-transpose chains)
            s_tir.transform.StmtSimplify(),
            s_tir.transform.LowerOpaqueBlock(),
            tirx.transform.FlattenBuffer(),
            tirx.transform.NarrowDataType(32),
            *([s_tir.transform.CompactBufferAllocation()] if compact_again else []),
        ]
    )


# a loop's iterations are claimed in chunks, at most this many per loop: a claim is an atomic
# add, which costs more than one row of a short loop (a transpose's)
MAX_CLAIMS = 32
# each slice's counter on a cache line of its own
COUNTER_STRIDE = 16


def _claimed(loop: tirx.For, slices: int) -> tirx.Stmt:
    """`loop` (parallel, from 0) as `slices` parallel slices of its chunks of iterations,
    each with a counter: a thread claims the chunks of its slice, then those left in the
    others'."""
    n, index = loop.extent, loop.extent.ty.dtype
    binds = []  # a symbolic extent's numbers, computed once (not repeated in every expression)
    if isinstance(n, tirx.IntImm):
        n = int(n)
        chunk = ceil_div(n, MAX_CLAIMS)
        chunks = ceil_div(n, chunk)
        slices = min(slices, chunks)
    else:  # a symbolic extent: the same chunks, computed at run time (a slice may be empty)
        total = n
        n, chunk, chunks = (tirx.Var(name, loop.extent.ty) for name in ("claim_extent", "claim_chunk", "claim_chunks"))
        binds = [
            tirx.Bind(n, total),
            # (at least 1: a size-0 axis has no chunks, not a division by zero)
            tirx.Bind(chunk, tirx.max(tirx.ceildiv(n, tirx.const(MAX_CLAIMS, index)), tirx.const(1, index))),
            tirx.Bind(chunks, tirx.ceildiv(n, chunk)),
        ]
    counters = tirx.decl_buffer((slices * COUNTER_STRIDE,), "int32", "accel_claim_counters")
    claimed = tirx.decl_buffer((1,), "int32", "accel_claimed", scope="local")

    def const(v):
        return tirx.const(v, index) if isinstance(v, int) else v

    def first_chunk(s):  # slice s holds chunks [first_chunk(s), first_chunk(s + 1))
        return tirx.floordiv(s * chunks, slices)

    slice_, other = tirx.Var("slice", loop.extent.ty), tirx.Var("other", loop.extent.ty)
    victim = tirx.floormod(slice_ + other, slices)
    counter = tirx.address_of(tirx.BufferLoad(counters, [victim * COUNTER_STRIDE]))
    size = first_chunk(victim + 1) - first_chunk(victim)
    claim = tirx.BufferStore(claimed, tirx.call_extern("int32", CLAIM, counter), [0])
    begin = tirx.Var("begin", loop.extent.ty)
    extent = const(chunk) if isinstance(n, int) and n % chunk == 0 else tirx.min(const(chunk), n - begin)
    run_chunk = tirx.SeqStmt(
        [
            # (the clamp, a no-op, tells the index arithmetic that `begin` is in [0, n): a
            # transpose's divisions by constants were 1.6x slower without it)
            tirx.Bind(
                begin,
                (
                    first_chunk(victim)
                    + tirx.max(tirx.min(tirx.Cast(index, tirx.BufferLoad(claimed, [0])), size), const(0))
                )
                * chunk,
            ),
            tirx.For(loop.loop_var, begin, extent, tirx.ForKind.SERIAL, loop.body),
        ]
    )
    drain = tirx.SeqStmt(
        [
            tirx.AllocBuffer(claimed),
            claim,
            tirx.While(tirx.Cast(index, tirx.BufferLoad(claimed, [0])) < size, tirx.SeqStmt([run_chunk, claim])),
        ]
    )
    # own slice first, then the others' in turn; a drained slice costs a load
    visit = tirx.For(
        other,
        const(0),
        const(slices),
        tirx.ForKind.SERIAL,
        tirx.IfThenElse(tirx.Cast(index, tirx.call_extern("int32", PEEK, counter)) < size, drain, None),
    )
    i = tirx.Var("i", loop.extent.ty)
    zero = tirx.For(
        i,
        const(0),
        const(slices),
        tirx.ForKind.SERIAL,
        tirx.BufferStore(counters, tirx.const(0, "int32"), [i * COUNTER_STRIDE]),
        annotations={CLAIM_RESET: True},
    )
    par = tirx.For(slice_, const(0), const(slices), tirx.ForKind.PARALLEL, visit)
    return tirx.AttrStmt(
        tirx.const(0, "int32"),
        "pragma_import_llvm",
        CLAIM_LLVM_IR,
        tirx.SeqStmt([*binds, tirx.AllocBuffer(counters), zero, par]),
    )


def _top_loops(stmt: tirx.Stmt, change) -> tirx.Stmt:
    """`stmt` with each of its top-level loops (through sequences) replaced by `change(loop)`
    where that is not None; the same object where nothing changed."""
    if isinstance(stmt, tirx.SeqStmt):
        seq = [_top_loops(s, change) for s in stmt.seq]
        return stmt if all(new.same_as(old) for new, old in zip(seq, stmt.seq)) else tirx.SeqStmt(seq)
    changed = change(stmt) if isinstance(stmt, tirx.For) else None
    return stmt if changed is None else changed


def _claim(loop: tirx.For, slices: int) -> tirx.Stmt | None:
    if loop.kind != tirx.ForKind.PARALLEL:
        return None
    fits = not isinstance(loop.extent, tirx.IntImm) or int(loop.extent) < 2**31  # (a symbolic one: MAX_CLAIMS chunks)
    if not (fits and isinstance(loop.min, tirx.IntImm) and int(loop.min) == 0):
        return None  # (our schedules make parallel loops from 0: an int32 counter)
    return _claimed(loop, slices)


def _iterations(stmt: tirx.Stmt) -> int | None:
    """How many times the stores and calls of `stmt` run (loop extents multiplied down each
    nest, added up across it; the larger branch of a condition; blocks' bodies, not their
    inits); None if a loop's extent is symbolic."""
    if isinstance(stmt, tirx.SeqStmt):
        counts = [_iterations(s) for s in stmt.seq]
        return None if None in counts else sum(counts)
    if isinstance(stmt, tirx.For):
        inner = _iterations(stmt.body)
        if inner is None or not isinstance(stmt.extent, tirx.IntImm):
            return None
        return int(stmt.extent) * inner
    if isinstance(stmt, tirx.IfThenElse):
        counts = [_iterations(s) for s in (stmt.then_case, stmt.else_case) if s is not None]
        return None if None in counts else max(counts)
    body = getattr(stmt, "block", None) or getattr(stmt, "body", None)  # (a block's realize: its block)
    if isinstance(body, tirx.Stmt):
        return _iterations(body)
    return 1 if isinstance(stmt, (tirx.BufferStore, tirx.Evaluate)) else 0  # (not a declaration)


def _with_kind(loop: tirx.For, kind, annotations: dict) -> tirx.For:
    return tirx.For(loop.loop_var, loop.min, loop.extent, kind, loop.body, None, annotations)


def _serial(loop: tirx.For) -> tirx.For | None:
    if loop.kind != tirx.ForKind.PARALLEL:
        return None
    return _with_kind(loop, tirx.ForKind.SERIAL, {**loop.annotations, SERIALIZED: 1})


def _parallel(loop: tirx.For) -> tirx.For | None:
    if SERIALIZED not in loop.annotations:
        return None
    return _with_kind(loop, tirx.ForKind.PARALLEL, {k: v for k, v in loop.annotations.items() if k != SERIALIZED})


def serial_when_small(func: tirx.PrimFunc, min_iterations: int) -> tirx.PrimFunc | None:
    """`func` (scheduled) lowered as `claim_iterations` lowers it, with its top-level parallel
    loops serial, when its innermost statements run fewer than `min_iterations` times in
    all: waking the pool's threads for a parallel loop costs more than such a kernel saves
    (10-15 us a loop on a 2-core Emerald Rapids whose idle workers sleep, `accel_target.threads`).
    None if it is larger, of a symbolic size, has no parallel loop, or if TVM's lowering
    rejects it lowered (as for `claim_iterations`: the int8 kernels' dot products). The loops
    it makes serial are marked SERIALIZED, for `parallel_again`."""
    work = _iterations(func.body)  # (counted before lowering: a large kernel is not lowered here)
    if work is None or work >= min_iterations:
        return None
    lowered = lower_blocks()(tvm.IRModule({"main": func}))["main"]
    body = _top_loops(lowered.body, _serial)
    checked = None if body.same_as(lowered.body) else accepted(lowered.with_body(body))
    return None if checked is None else checked.with_attr(LOWERED, True)


def parallel_again(func: tirx.PrimFunc, slices: int) -> tirx.PrimFunc | None:
    """A kernel that `serial_when_small` made serial with its loops parallel again, claimed as
    `claim_iterations` claims them, or None if it has no such loop: in a shared launch
    (`shared_launch`) the pool is awake anyway, and a small kernel runs on every thread."""
    body = _top_loops(func.body, _parallel)
    return None if body.same_as(func.body) else _claimed_kernel(func.with_body(body), slices)


def accepted(func: tirx.PrimFunc) -> tirx.PrimFunc | None:
    """`func` (rewritten after `lower_blocks`), or None if the passes that the build runs on
    it reject it (not the trailing compaction, which is ours, for the first lowering: on
    claimed loops of a symbolic extent it costs tens of seconds)."""
    try:
        lower_blocks(compact_again=False)(tvm.IRModule({"main": func}))
    except tvm.error.InternalError:  # (what TVM's failed checks raise)
        return None
    return func


def claim_iterations(func: tirx.PrimFunc, slices: int) -> tirx.PrimFunc | None:
    """`func` (scheduled) lowered to a block-free function in which the threads claim the
    iterations of each top-level parallel loop: at most MAX_CLAIMS chunks of it, in `slices`
    slices (one per thread it is built for); None if it has no such loop, or if TVM's
    lowering, which the build runs again on the result, rejects it (its buffer compaction
    fails on explicit vector accesses of flat buffers: the int8 kernels' dot products)."""
    return _claimed_kernel(lower_blocks()(tvm.IRModule({"main": func}))["main"], slices)


def _claimed_kernel(lowered: tirx.PrimFunc, slices: int) -> tirx.PrimFunc | None:
    body = _top_loops(lowered.body, lambda loop: _claim(loop, slices))
    if body.same_as(lowered.body):
        return None
    checked = accepted(lowered.with_body(body))
    return None if checked is None else checked.with_attr(LOWERED, True)
