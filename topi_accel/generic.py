"""A schedule for the kernels TVM's own legalization makes (elementwise, pooling,
softmax, norms, transposes): they arrive as plain serial loop nests.

`parallelize` splits every top-level block's outer spatial loops across the
thread pool, leaving vectorization of the inner loop to LLVM.
"""

from __future__ import annotations

import math

from tvm import s_tir, tirx
from tvm.s_tir.schedule.schedule import ScheduleError

# below this many iterations of work a parallel region costs more than it saves
MIN_PARALLEL_WORK = 4096
# an innermost loop at least this long stays serial, for LLVM to vectorize
VECTOR_RUN = 16


def _spatial_prefix(sch: s_tir.Schedule, block) -> list:
    """The outer loops of `block` that bind its data-parallel block vars (one loop per var)."""
    loops, iters = sch.get_loops(block), sch.get(block).iter_vars
    if len(loops) != len(iters):
        return []
    prefix = []
    for loop, var in zip(loops, iters):
        if var.iter_type != tirx.IterVar.DataPar:
            break
        prefix.append(loop)
    return prefix


def _is_scheduled(sch: s_tir.Schedule, blocks) -> bool:
    return any(sch.get(loop).kind == tirx.ForKind.PARALLEL for block in blocks for loop in sch.get_loops(block))


def parallelize(func: tirx.PrimFunc) -> tirx.PrimFunc | None:
    """`func` with the outer spatial loops of its top-level blocks parallel; None if unchanged."""
    sch = s_tir.Schedule(func)
    try:
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
    except ScheduleError:  # not a TE-made function
        return None
    if _is_scheduled(sch, blocks):  # an accel kernel, with or without epilogue
        return None
    changed = False
    for block in blocks:
        loops = _spatial_prefix(sch, block)
        if not loops:
            continue
        extents = [sch.get(loop).extent for loop in loops]
        if not all(isinstance(e, tirx.IntImm) for e in extents):
            continue
        extents = [int(e) for e in extents]
        reduces = len(loops) < len(sch.get_loops(block))
        # an elementwise block keeps a long innermost run out of the parallel loop (LLVM
        # vectorizes it); a reduction parallelizes all its spatial loops
        keep = 1 if not reduces and len(loops) > 1 and extents[-1] >= VECTOR_RUN else 0
        outer = loops[: len(loops) - keep]
        work = math.prod(int(sch.get(loop).extent) for loop in sch.get_loops(block))
        if math.prod(extents[: len(outer)]) < 2 or work < MIN_PARALLEL_WORK:
            continue
        try:
            sch.parallel(sch.fuse(*outer) if len(outer) > 1 else outer[0])
            changed = True
        except ScheduleError:
            continue
    return sch.mod["main"] if changed else None
