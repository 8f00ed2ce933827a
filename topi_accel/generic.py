"""A schedule for the kernels TVM's own legalization makes (elementwise, pooling,
softmax, norms, transposes): they arrive as plain serial loop nests.

`parallelize` splits every top-level block's outer spatial loops across the
thread pool, leaving vectorization of the inner loop to LLVM. A pad feeding
another block is inlined into it, and a reduction over a small window
(pooling) runs the window outside its innermost spatial loop, so that loop
(the channels, in NHWC) is the vectorized one; each chunk of channels that the
accumulator registers hold is reduced there and stored once (not a masked store
of the output per tap). A reduction over whole images (a global pool in NHWC) runs as
partial rows of channels over chunks of image rows in parallel, then combined.
A chain of elementwise blocks (a quantize: divide, round, add, clip, cast, then the
transpose to NHWC) is one block: each one read by a single consumer over no more elements
than it has is inlined into it, where FuseTIR left every step a loop nest and a buffer of
its own.
A function of several blocks over the same rows (softmax, norms) is computed
row by row under one parallel loop, each row's intermediates in cache, its
long reductions as vectorizable partial results.
Symbolic outer loops (a dynamic BERT's [batch, 12, seq, seq]) are fused into the parallel
loop as static ones are: with the outer ones serial around a parallel one, the thread pool
would be woken 12 x batch times per softmax. Work is estimated at the representative size
of each shape variable. A reduction over a symbolic innermost extent is vectorized last,
with a runtime tail (topi_accel.tir_passes.reductions).
"""

from __future__ import annotations

import math

from tvm import ir, s_tir, sym, tirx
from tvm.s_tir.schedule.schedule import ScheduleError
from tvm.target import Target

from .knobs import cpu_knobs, largest_divisor
from .symbolic import REPRESENTATIVE_ROWS
from .tir_passes.blocks import inlining_stays_small
from .tir_passes.reductions import vector_lanes

# below this many iterations of work a parallel region costs more than it saves
MIN_PARALLEL_WORK = 4096
# an innermost loop at least this long stays serial, for LLVM to vectorize
VECTOR_RUN = 16
# an innermost loop this short under a serial run is unrolled: the run's loop then stores
# each of its (3) elements in a statement of its own, which LLVM vectorizes as one
# interleaved group (an image's NCHW -> NHWC with its quantize and pad)
MAX_UNROLLED = 4
# a reduction over at most this many elements per output is a window (pooling)
MAX_WINDOW = 64
# a reduction over whole images (a global pool) splits its rows into at most this many
# partial results (`_partial_rows`)
MAX_PARTIALS = 32
# a transpose that moves the innermost axis copies tiles of up to this many elements a side,
# and only tiles of at least MIN_TRANSPOSE_TILE (`_tiled_transpose`)
TRANSPOSE_TILE = 16
MIN_TRANSPOSE_TILE = 4
_IF_THEN_ELSE = ir.Op.get("prim.if_then_else")


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


def _size(extent) -> int:
    """A loop extent as an int; a symbolic one at the representative size of each of its
    shape variables (for the work estimates)."""
    if isinstance(extent, tirx.IntImm):
        return int(extent)
    analyzer = sym.Analyzer()
    for var in tirx.analysis.undefined_vars(extent):
        analyzer.bind(var, tirx.const(REPRESENTATIVE_ROWS, var.ty.dtype))
    return int(analyzer.simplify(extent))


def _extent(sch: s_tir.Schedule, loops) -> int:
    return math.prod(_size(sch.get(loop).extent) for loop in loops)


def _inner_run(extents: list[int]) -> int:
    """How many innermost loops of these extents make a run of VECTOR_RUN iterations, leaving
    one loop at least outside; 0 if none do."""
    for inner in range(1, len(extents)):
        if math.prod(extents[-inner:]) >= VECTOR_RUN:
            return inner
    return 0


def _is_pad(block: s_tir.SBlock) -> bool:
    """Whether `block` stores if_then_else(condition, a load, a constant): a pad."""
    body = block.body
    value = body.value if isinstance(body, tirx.BufferStore) else None
    return (
        isinstance(value, ir.Call)
        and value.op.same_as(_IF_THEN_ELSE)
        and isinstance(value.args[1], ir.expr.TensorLoad)
        and isinstance(value.args[2], (tirx.FloatImm, tirx.IntImm))
    )


def _channel_chunk(channels: int) -> int:
    """Channels of a window reduction's chunk: the largest divisor of `channels` in whole
    vectors that the target's accumulator registers hold, or all of them (no such divisor, or
    no target in scope)."""
    target = Target.current(allow_none=True)
    if target is None or target.kind.name != "llvm":
        return channels
    knobs = cpu_knobs(target)
    chunk = largest_divisor(channels, knobs.accumulators * knobs.lanes)
    return chunk if chunk % knobs.lanes == 0 else channels


def _window_first(sch: s_tir.Schedule, block, spatial: list, extents: list[int]) -> int:
    """Run a small reduction window (`block` reduces) outside the innermost spatial loop (the
    channels), in chunks of channels (`_channel_chunk`); the window's loops, 0 if it did not."""
    reduction = sch.get_loops(block)[len(spatial) :]
    window = _extent(sch, reduction)
    if window > MAX_WINDOW or extents[-1] < VECTOR_RUN or math.prod(extents[:-1]) < 2:
        return 0  # (a global pool keeps its channels parallel instead)
    static = isinstance(sch.get(spatial[-1]).extent, tirx.IntImm)
    chunk = _channel_chunk(extents[-1]) if static else extents[-1]
    try:
        if chunk < extents[-1]:
            chunks, channels = sch.split(spatial[-1], [None, chunk])
            sch.reorder(chunks, *reduction, channels)
        else:
            sch.reorder(*reduction, spatial[-1])
    except ScheduleError:
        return 0
    return len(reduction)


def _partial_rows(sch: s_tir.Schedule, block) -> bool:
    """Reduce a long reduction over outer axes (a global pool in NHWC: [n, h, w, c] ->
    [n, 1, 1, c]) in partial results over chunks of its first reduced axis (rfactor), the chunks
    in parallel, each one's channels innermost (contiguous: LLVM vectorizes them); the partial
    results are then summed. Reduced with its channels parallel instead, each thread walks the
    whole image once per channel, a scalar at a time at the image's row stride. Whether it did."""
    spatial = _spatial_prefix(sch, block)
    if not spatial or _size(sch.get(spatial[-1]).extent) < VECTOR_RUN or not _reads_innermost(sch, block):
        return False
    if _extent(sch, sch.get_loops(block)) < MIN_PARALLEL_WORK:
        return False
    reduction = sch.get_loops(block)[len(spatial) :]
    first = sch.get(reduction[0]).extent
    parts = largest_divisor(int(first), MAX_PARTIALS) if isinstance(first, tirx.IntImm) else 1
    if parts < 2:
        return False
    part, _ = sch.split(reduction[0], [parts, None])  # (changes no result)
    try:
        partial = sch.rfactor(part, 0)
    except ScheduleError:
        return False
    loops = sch.get_loops(partial)  # the spatial loops (the channels last), the part, the rest reduced
    outer, channels, part, reduced = (
        loops[: len(spatial) - 1],
        loops[len(spatial) - 1],
        loops[len(spatial)],
        loops[len(spatial) + 1 :],
    )
    try:
        sch.reorder(part, *outer, *reduced, channels)
        sch.parallel(sch.fuse(part, *outer))
        init = sch.decompose_reduction(partial, reduced[0])
        sch.vectorize(sch.get_loops(init)[-1])
    except ScheduleError:
        pass  # what is done is right; the rest stays serial
    return True


def _reads_innermost(sch: s_tir.Schedule, block) -> bool:
    """Whether every input `block` reads is read along its innermost axis by the block's
    innermost spatial variable (an NHWC image's channels)."""
    b = sch.get(block)
    spatial = [iv.var for iv in b.iter_vars if iv.iter_type == tirx.IterVar.DataPar]
    return bool(spatial) and all(read.region[-1].min.same_as(spatial[-1]) for read in b.reads)


def _window_in_registers(sch: s_tir.Schedule, block, taps: int) -> None:
    """Reduce a window (`block`'s loops: the spatial ones, the `taps` loops of the window, the
    channels) into a local row of channels, which its one consumer (an average pool's
    division) or else a write-back then reads once, vectorized; the init split from the update
    and vectorized (the update's innermost loop is left to LLVM: a reduction block cannot be
    vectorized in TIR). Reduced in the output itself, each tap of a max pool would be a load,
    a compare and a masked store of the output (AVX2's vmaskmovps stores slowly)."""
    at = sch.get_loops(block)[-taps - 2]
    consumers = sch.get_consumers(block)
    try:
        if len(consumers) == 1 and _moved_under(sch, consumers[0], at):
            sch.set_scope(block, 0, "local")
            reader = consumers[0]
        else:  # the function's output: a local copy, written back
            reader = sch.cache_write(block, 0, "local")
            sch.reverse_compute_at(reader, at)
        sch.vectorize(sch.get_loops(reader)[-1])
        init = sch.decompose_reduction(block, sch.get_loops(block)[-taps - 1])
        sch.vectorize(sch.get_loops(init)[-1])
    except ScheduleError:
        pass  # what is done is right; the rest stays as TVM wrote it


def _moved_under(sch: s_tir.Schedule, consumer, at) -> bool:
    """Move `consumer` under loop `at`, after what its producer computes there; whether it
    could be (not if it reads more of the producer than that)."""
    try:
        sch.reverse_compute_at(consumer, at)
    except ScheduleError:
        return False
    return True


def _inline_elementwise(sch: s_tir.Schedule) -> bool:
    """Inline every top-level block without a reduction whose one consumer runs over at most
    twice its elements (an elementwise step, a transpose; not a broadcast, which would
    recompute it per element of the larger output) into that consumer, unless that copies a
    large expression (`inlining_stays_small`); whether any was. A pad
    is left to `_parallel_loops`, which inlines it into its consumer after choosing how that
    runs (a pooling window: over the channels, not row by row)."""
    changed = False
    for block in sch.get_child_blocks(sch.get_sblock("root"))[:-1]:
        consumers = sch.get_consumers(block)
        if len(consumers) != 1 or any(v.iter_type != tirx.IterVar.DataPar for v in sch.get(block).iter_vars):
            continue
        if _is_pad(sch.get(block)):
            continue
        if _extent(sch, sch.get_loops(consumers[0])) > 2 * _extent(sch, sch.get_loops(block)):
            continue
        if not inlining_stays_small(sch, block, consumers[0]):
            continue
        try:
            sch.compute_inline(block)
        except ScheduleError:  # writes an output, or TVM cannot inline it
            continue
        changed = True
    return changed


def _transposed_axes(sch: s_tir.Schedule, block) -> tuple[int, int] | None:
    """(the block var its input is read along innermost, the output's innermost var) of an
    elementwise block that reads its inputs in one permutation of its output's axes, other than
    the identity at the innermost axis (a transpose, perhaps with a quantize inlined), or reads
    scalars; None for any other block."""
    b = sch.get(block)
    names = [iv.var for iv in b.iter_vars]
    if any(iv.iter_type != tirx.IterVar.DataPar for iv in b.iter_vars) or len(b.writes) != 1:
        return None

    def axes(region) -> list[int] | None:
        found = []
        for r in region.region:
            if not (isinstance(r.extent, tirx.IntImm) and int(r.extent) == 1):
                return None
            index = next((i for i, var in enumerate(names) if r.min.same_as(var)), None)
            if index is None:
                return None
            found.append(index)
        return found

    every = list(range(len(names)))
    if axes(b.writes[0]) != every:
        return None
    inner = None
    for read in b.reads:
        if all(isinstance(r.min, tirx.IntImm) for r in read.region):
            continue  # a scalar (a quantize's scale)
        order = axes(read)
        if order is None or sorted(order) != every or inner not in (None, order[-1]):
            return None
        inner = order[-1]
    return None if inner is None or inner == every[-1] else (inner, every[-1])


def _tiled_transpose(sch: s_tir.Schedule, block) -> bool:
    """Copy a transpose that moves the innermost axis (`_transposed_axes`) in tiles of the two
    innermost axes, the input's and the output's (divisors of each, up to TRANSPOSE_TILE), the
    loops over the tiles parallel and, within a tile, the input's innermost axis innermost:
    each tile reads and writes a few whole cache lines, where a row of the output would read a
    cache line of the input per element. Whether it did."""
    found = _transposed_axes(sch, block)
    if found is None:
        return False
    loops = _spatial_prefix(sch, block)
    if len(loops) != len(sch.get(block).iter_vars):
        return False
    extents = [sch.get(loops[i]).extent for i in found]
    if not all(isinstance(e, tirx.IntImm) for e in extents):
        return False
    tiles = [largest_divisor(int(e), TRANSPOSE_TILE) for e in extents]
    if min(tiles) < MIN_TRANSPOSE_TILE:
        return False  # (an image's NCHW -> NHWC of 3 channels: the generic schedule unrolls them)
    (read_axis, last), (read_tile, last_tile) = found, tiles
    try:
        read_outer, read_inner = sch.split(loops[read_axis], [None, read_tile])
        last_outer, last_inner = sch.split(loops[last], [None, last_tile])
        outer = [read_outer if i == read_axis else loop for i, loop in enumerate(loops[:-1])] + [last_outer]
        sch.reorder(*outer, last_inner, read_inner)
        if _extent(sch, outer) >= 2 and _extent(sch, sch.get_loops(block)) >= MIN_PARALLEL_WORK:
            sch.parallel(sch.fuse(*outer))
    except ScheduleError:
        pass  # what is done is right (a split or reorder changes no result)
    return True


def _has_parallel_loop(sch: s_tir.Schedule, blocks) -> bool:
    return any(sch.get(loop).kind == tirx.ForKind.PARALLEL for block in blocks for loop in sch.get_loops(block))


def _vector_partial_sums(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """`func` with each reduction over a long innermost axis split into (up to VECTOR_RUN)
    partial results (rfactor), contiguous per row, that `_lanes_innermost` vectorizes: a
    float sum or max does not vectorize as written, its order being fixed."""
    sch = s_tir.Schedule(func)
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        loops = sch.get_loops(block)
        spatial = _spatial_prefix(sch, block)
        if len(loops) != len(spatial) + 1:  # one reduction loop, innermost
            continue
        extent = sch.get(loops[-1]).extent
        if not isinstance(extent, tirx.IntImm) or int(extent) < 4 * VECTOR_RUN or int(extent) % VECTOR_RUN:
            continue
        try:
            # a partial result per VECTOR_RUN elements, at most VECTOR_RUN of them: 16 over 768
            # (a layer norm), 8 over 128 (a softmax)
            _, lanes = sch.split(loops[-1], [None, min(VECTOR_RUN, int(extent) // VECTOR_RUN)])
            sch.rfactor(lanes, len(spatial))  # the lanes last in the partial buffer: one vector per row
        except ScheduleError:
            return func
    return sch.mod["main"]


def _lanes_innermost(sch: s_tir.Schedule, block, depth: int) -> None:
    """Run a partial-result block's reduction outside its lane loop and vectorize the lanes
    (compute_at makes the loops under the `depth` row loops in block-variable order: the
    lanes first), so that each step of the reduction is one vector operation."""
    lane, *reduction = sch.get_loops(block)[depth:]
    sch.reorder(*reduction, lane)
    sch.vectorize(lane)


def _row_by_row(func: tirx.PrimFunc) -> tirx.PrimFunc | None:
    """Every block computed under the output's parallel row loop (all its spatial loops but
    the innermost fused; symbolic ones fused last, `_fuse_symbolic_rows`: a row's index
    divisions cost less than a parallel region per outer iteration); None where that does
    not fit, or would recompute a producer per row."""
    sch = s_tir.Schedule(_vector_partial_sums(func))
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    out = blocks[-1]
    spatial = _spatial_prefix(sch, out)
    if len(blocks) < 2 or len(spatial) < 2:
        return None
    rows = _extent(sch, spatial[:-1])
    work = {sch.get(b).name_hint: _extent(sch, sch.get_loops(b)) for b in blocks}
    if rows < 2 or work[sch.get(out).name_hint] < MIN_PARALLEL_WORK:
        return None
    static = all(isinstance(sch.get(loop).extent, tirx.IntImm) for loop in spatial[:-1])
    row = sch.fuse(*spatial[:-1]) if static else spatial[-2]
    depth = 1 if static else len(spatial) - 1  # loops down to the row loop
    try:
        for block in reversed(blocks[:-1]):
            sch.compute_at(block, row)
            if sch.get(block).name_hint.endswith("_rf"):  # rfactor's partial results
                _lanes_innermost(sch, block, depth)
            per_row = _extent(sch, sch.get_loops(block)[depth:])
            if per_row * rows > 2 * work[sch.get(block).name_hint]:
                return None  # each row needs much more than its share: recomputation
        sch.parallel(row)  # (checked: every row's blocks are independent of the others')
    except ScheduleError:
        return None
    return sch.mod["main"] if static else _fuse_symbolic_rows(sch.mod["main"], depth)


def _fuse_symbolic_rows(func: tirx.PrimFunc, depth: int) -> tirx.PrimFunc:
    """`func` with its `depth` outer row loops (the innermost parallel, its rows independent)
    fused into one parallel loop. TVM's checks refuse to parallelize a loop whose iterations
    are found by symbolic divisions (not affine to them); the unfused loop passed them."""
    sch = s_tir.Schedule(func, enable_check=False)
    out = sch.get_child_blocks(sch.get_sblock("root"))[-1]
    loops = sch.get_loops(out)[:depth]
    try:
        fused = sch.fuse(*loops)
        sch.parallel(fused)
    except ScheduleError:
        return func
    return sch.mod["main"]


def parallelize(func: tirx.PrimFunc) -> tirx.PrimFunc | None:
    """`func`, one of TVM's own kernels, with the outer spatial loops of its top-level blocks
    parallel, and its reductions over a symbolic innermost extent in vector partial results
    (topi_accel.tir_passes.reductions); None if unchanged."""
    scheduled = _parallel_loops(func)
    vectorized = vector_lanes(scheduled or func, _symbolic_lanes)
    return vectorized or scheduled


def _parallel_loops(func: tirx.PrimFunc) -> tirx.PrimFunc | None:
    """`func` with the outer spatial loops of its top-level blocks parallel; None if unchanged."""
    sch = s_tir.Schedule(func)
    try:
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
    except ScheduleError:  # not a TE-made function
        return None
    if _has_parallel_loop(sch, blocks):  # scheduled already (an accel kernel, or by its strategy)
        return None
    changed = len(blocks) > 1 and _inline_elementwise(sch)
    if changed:
        func, blocks = sch.mod["main"], sch.get_child_blocks(sch.get_sblock("root"))
    if len(blocks) > 1 and not any(_is_pad(sch.get(b)) for b in blocks):
        rowwise = _row_by_row(func)
        if rowwise is not None:
            return rowwise
    for block in blocks:
        if _is_pad(sch.get(block)) and sch.get_consumers(block):
            try:
                sch.compute_inline(block)
                changed = True
            except ScheduleError:
                pass
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        changed = parallel_block(sch, block) or changed
    return sch.mod["main"] if changed else None


def parallel_block(sch: s_tir.Schedule, block) -> bool:
    """Split top-level `block`'s outer spatial loops across the thread pool (a transpose of
    the innermost axis in tiles, a pooling window outside the channels, a global pool in
    partial results, an elementwise block with a vectorizable run kept innermost), unless a
    loop of it is parallel already; whether it changed anything."""
    if _has_parallel_loop(sch, [block]):
        return False
    if _tiled_transpose(sch, block):
        return True
    loops = _spatial_prefix(sch, block)
    if not loops:
        return False
    extents = [_size(sch.get(loop).extent) for loop in loops]  # symbolic: representative
    reduces = len(loops) < len(sch.get_loops(block))
    # a window reduction keeps its innermost loop out of the parallel loop (LLVM vectorizes
    # it), an elementwise block its innermost loops up to a run of VECTOR_RUN iterations
    # (vectorized, or at least without divisions per element, which dominate a small
    # transpose such as NCHW -> NHWC of 224 x 224 x 3); another reduction parallelizes all
    # its spatial loops
    taps = _window_first(sch, block, loops, extents) if reduces else 0
    if reduces and not taps and _partial_rows(sch, block):
        return True
    keep = 1 if taps else 0 if reduces else _inner_run(extents)
    changed = False
    if keep > 1 and extents[-1] <= MAX_UNROLLED:
        sch.unroll(loops[-1])
        changed = True
    outer = loops[: len(loops) - keep]
    work = _extent(sch, sch.get_loops(block))
    if math.prod(extents[: len(outer)]) < 2 or work < MIN_PARALLEL_WORK:
        return changed  # (a small softmax's row maxima reduced in registers took masked stores on AVX2)
    try:
        sch.parallel(sch.fuse(*outer) if len(outer) > 1 else outer[0])
    except ScheduleError:
        return changed
    if taps:
        _window_in_registers(sch, block, taps)
    return True


def _symbolic_lanes(extent) -> int:
    """Vector partial results of a reduction over a symbolic extent: the target's float32 lanes,
    at most one per VECTOR_RUN elements of the representative extent (as `_vector_partial_sums`
    takes for a static one); 0 without an LLVM target in scope."""
    target = Target.current(allow_none=True)
    if target is None or target.kind.name != "llvm" or _size(extent) < 4 * VECTOR_RUN:
        return 0
    return min(cpu_knobs(target).lanes, _size(extent) // VECTOR_RUN)
