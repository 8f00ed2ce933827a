"""Small kernels run on the calling thread alone.

A parallel loop is a launch of the thread pool: the caller publishes the job and waits for
the tasks a worker has started. A kernel of little work gains less from a second thread
than the launch costs, so `serial_when_small` makes its parallel loops
serial.
"""

from __future__ import annotations

import tvm_ffi
from tvm import tirx

from .blocks import contains


def iterations(stmt: tirx.Stmt, scalar_weight: int = 1, vector: bool = False) -> int | None:
    """How many times the stores and calls of `stmt` run (loop extents multiplied down each
    nest, added up across it; the larger branch of a condition; blocks' bodies, not their
    inits), each one outside a vectorized loop counted `scalar_weight` times (`vector`: `stmt`
    is inside one); None if a loop's extent is symbolic."""
    if isinstance(stmt, tirx.SeqStmt):
        counts = [iterations(s, scalar_weight, vector) for s in stmt.seq]
        return None if None in counts else sum(counts)
    if isinstance(stmt, tirx.For):
        inner = iterations(stmt.body, scalar_weight, vector or stmt.kind == tirx.ForKind.VECTORIZED)
        if inner is None or not isinstance(stmt.extent, tirx.IntImm):
            return None
        return int(stmt.extent) * inner
    if isinstance(stmt, tirx.IfThenElse):
        counts = [iterations(s, scalar_weight, vector) for s in (stmt.then_case, stmt.else_case) if s is not None]
        return None if None in counts else max(counts)
    body = getattr(stmt, "block", None) or getattr(stmt, "body", None)  # (a block's realize: its block)
    if isinstance(body, tirx.Stmt):
        return iterations(body, scalar_weight, vector)
    if isinstance(stmt, (tirx.BufferStore, tirx.Evaluate)):
        return 1 if vector else scalar_weight
    return 0  # (not a declaration)


def _serial(loop: tirx.For) -> tirx.For:
    if loop.kind != tirx.ForKind.PARALLEL:
        return loop
    return tirx.For(loop.loop_var, loop.min, loop.extent, tirx.ForKind.SERIAL, loop.body, None, loop.annotations)


def serial_when_small(func: tirx.PrimFunc, min_iterations: int, scalar_weight: int = 1) -> tirx.PrimFunc | None:
    """`func` with its parallel loops serial when its innermost statements run fewer than
    `min_iterations` times in all (`iterations`: those outside a vectorized loop counted
    `scalar_weight` times); None if it is larger, of a symbolic size, or has no parallel
    loop."""
    work = iterations(func.body, scalar_weight)
    if work is None or work >= min_iterations:
        return None
    body = tvm_ffi.structural_map(func.body, (tirx.For, _serial), order="post")
    return None if body.same_as(func.body) else func.with_body(body)


def computes_rows_in_buffers(func: tirx.PrimFunc) -> bool:
    """Whether `func`'s root block allocates buffers and a parallel loop runs over them: the
    producers of each row computed under the row loop into a slice of their buffer."""
    root = getattr(func.body, "block", None)
    if root is None or len(root.alloc_buffers) == 0:
        return False
    return contains(func.body, tirx.For, lambda loop: loop.kind == tirx.ForKind.PARALLEL)
