"""Accel kernels and their epilogues: elementwise work after an accel kernel, done in the
kernel's write-back.

What makes a PrimFunc an accel kernel is one mark, set where a registered implementation
adds its kernel to the module (strategy.dispatch.kernel_call, through `mark_kernel`): the
block that writes the kernel's output carries the annotation IMPL (the implementation's
name), and the function the attribute IMPL. A block annotation survives FuseTIR, which
drops the attributes of the functions it merges; the build sets the attribute again on
the fused function (`accel_impl` reads either). Epilogue inlining, WriteInPlace and the
report all read this mark, and nothing else.

FuseOps may append the elementwise consumers of an accel kernel (bias, folded
BN affine, ReLU/ReLU6/GELU, residual add) to it, and FuseTIR then merges them
into one PrimFunc as separate loop nests over the whole output.
`inline_epilogue` moves each of them into the kernel's write-back block, so
the output is written once, from registers, with the epilogue applied.

Where TVM's own preconditions of these primitives cannot be proved, the schedule runs
without those checks (``enable_check=False``): with symbolic shapes, the write-back of a
kernel whose row tiles are split by a symbolic count carries a predicate that its
affine-binding analysis does not parse, so the output's region cover, and the stage
pipeline, are unknown; and with static ones, TVM finds no stage pipeline where the
write-back of a blockized register tile (the int8 kernels') is predicated to a channel tail
over several channel blocks (144 channels in tiles of 32). What makes the inlining right is
checked here instead: every consumer inlined reads the kernel's output only at the element
it writes, over the same shape (`reads_elementwise`), and the kernel's write-back writes
every element of it.
"""

from __future__ import annotations

import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir.schedule.schedule import ScheduleError

from .generic import parallel_block
from .tir_passes.blocks import inlining_stays_small

# PrimFunc attribute and block annotation: the implementation ("<compute>.<key>") that made the kernel
IMPL = "accel.impl"


def all_blocks(sch: s_tir.Schedule) -> list:
    """Every block of `sch`'s function but the root (which reads and writes nothing), parents
    first. Raises ScheduleError for a function without blocks (lowered already)."""
    found, pending = [], list(sch.get_child_blocks(sch.get_sblock("root")))
    while pending:
        block = pending.pop(0)
        found.append(block)
        pending.extend(sch.get_child_blocks(block))
    return found


def mark_kernel(func: tirx.PrimFunc, impl: str, num_outputs: int = 1) -> tirx.PrimFunc:
    """`func` marked as the kernel of implementation `impl`: the blocks that write its last
    `num_outputs` parameters (its outputs) annotated IMPL = impl, and the attribute IMPL.

    func: a scheduled TE/TIR function (with blocks). Raises ValueError when no block writes
    an output (a function lowered already cannot be marked).
    """
    sch = s_tir.Schedule(func)
    outputs = list(func.params[len(func.params) - num_outputs :])
    writers = [b for b in all_blocks(sch) if any(w.source.same_as(p) for w in sch.get(b).writes for p in outputs)]
    if not writers:
        raise ValueError(
            f"{impl}: no block of the kernel writes its output; kernel_call takes a scheduled TE/TIR function"
        )
    for block in writers:
        sch.annotate(block, IMPL, impl)
    return sch.mod["main"].with_attr(IMPL, impl)


def output_blocks(sch: s_tir.Schedule) -> list:
    """The blocks of `sch`'s function that write an accel kernel's output (marked by `mark_kernel`)."""
    try:
        blocks = all_blocks(sch)
    except ScheduleError:  # no root block: lowered already
        return []
    return [b for b in blocks if IMPL in sch.get(b).annotations]


def accel_impl(func: tirx.PrimFunc) -> str | None:
    """The implementation that made the accel kernel in `func` (its attribute, else the
    annotation of its output block, e.g. after fusion); None for any other function."""
    if func.attrs is not None and IMPL in func.attrs:
        return str(func.attrs[IMPL])
    try:
        sch = s_tir.Schedule(func)
    except Exception:  # noqa: BLE001 (TVM raises various errors for a function it cannot schedule)
        return None
    marked = output_blocks(sch)
    return str(sch.get(marked[0]).annotations[IMPL]) if marked else None


def contains_accel_kernel(func: tirx.PrimFunc) -> bool:
    """Whether `func` is an accel kernel, with or without an epilogue fused after it."""
    return accel_impl(func) is not None


def reads_elementwise(sch: s_tir.Schedule, consumer, producer) -> bool:
    """Whether block `consumer` reads what block `producer` writes only at the element it
    writes itself, over the same shape: not a broadcast of it (a squeeze-excitation gate,
    [1, 1, 1, C], scaling [1, H, W, C]), not a reduction of it.

    TVM 0.27's reverse_compute_inline does not refuse a broadcasting consumer with a
    ScheduleError: it fails with "Cannot dispatch a null expression" (an InternalError).
    """
    block = sch.get(consumer)
    buffers = {w.source.name: w.source for w in sch.get(producer).writes}
    if len(block.writes) != 1 or block.init is not None or any(int(v.iter_type) != 0 for v in block.iter_vars):
        return False
    write = block.writes[0]
    reads = [r for r in block.reads if r.source.name in buffers]
    same = tvm_ffi.structural_equal
    return bool(reads) and all(same(r.source.shape, write.source.shape) and same(r.region, write.region) for r in reads)


def _kernel_stages(sch: s_tir.Schedule, outputs: list) -> set[str]:
    """Names of the output blocks and of every block they depend on: the kernel's own stages."""
    names, pending = set(), list(outputs)
    while pending:
        block = pending.pop()
        name = sch.get(block).name_hint
        if name not in names:
            names.add(name)
            pending.extend(sch.get_producers(block))
    return names


def _inline_intermediates(sch: s_tir.Schedule, outputs: list) -> None:
    """Fold every elementwise block after the kernel that feeds others (GELU's erf, scale and
    shift) into them, so that the kernel's output has a single chain of consumers; not into a
    consumer that broadcasts it (that would recompute it per element of the larger output)."""
    stages = _kernel_stages(sch, outputs)
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        if sch.get(block).name_hint in stages:
            continue
        consumers = sch.get_consumers(block)
        if not all(reads_elementwise(sch, c, block) and inlining_stays_small(sch, block, c) for c in consumers):
            continue
        try:
            sch.compute_inline(block)
        except ScheduleError:  # writes the function's output, or is not elementwise
            continue


def _has_symbolic_shapes(func: tirx.PrimFunc) -> bool:
    """Whether a buffer parameter of `func` has a dimension that is not a number."""
    return any(not isinstance(dim, tirx.IntImm) for param in func.params for dim in getattr(param.ty, "shape", ()))


def _inline_chain(func: tirx.PrimFunc, check: bool) -> tuple[tirx.PrimFunc | None, bool]:
    """(`func` with its accel kernel's elementwise consumers inlined into the write-back, or
    None if there were none; whether TVM refused to inline one of them)."""
    sch = s_tir.Schedule(func, enable_check=check)
    outputs = output_blocks(sch)
    if not outputs:
        return None, False
    _inline_intermediates(sch, outputs)  # leaves the kernel's stages, the outputs among them, as they were
    inlined, refused = 0, False
    for block in outputs:
        while len(consumers := sch.get_consumers(block)) == 1 and reads_elementwise(sch, consumers[0], block):
            if not inlining_stays_small(sch, block, consumers[0]):
                break  # it stays a loop nest of its own
            try:
                sch.reverse_compute_inline(consumers[0])
            except ScheduleError:  # it stays a loop nest of its own
                refused = True
                break
            inlined += 1
    return (sch.mod["main"] if inlined else None), refused


def inline_epilogue(func: tirx.PrimFunc) -> tirx.PrimFunc | None:
    """`func` with its accel kernel's consumers inlined into the write-back; None if there are none.

    Where TVM's checks refuse a consumer that reads the output elementwise, the inlining is
    done again without them (see the module docstring); else the requantize of an int8 kernel
    with a channel tail (a 24->144 pointwise conv in tiles of 32 channels) would run as
    separate serial loops over the whole output after the kernel.
    """
    checked = not _has_symbolic_shapes(func)
    result, refused = _inline_chain(func, checked)
    if refused and checked:
        unchecked, _ = _inline_chain(func, False)
        return unchecked or result
    return result


def parallelize_rest(func: tirx.PrimFunc) -> tirx.PrimFunc | None:
    """`func` (an accel kernel after `inline_epilogue`) with each block that is left at the
    root after the kernel, serial, split across the thread pool as TVM's own kernels are
    (`generic.parallel_block`); None if there is none. Such a block is a consumer that the
    write-back cannot take: it broadcasts the kernel's output (a squeeze-excitation gate,
    [1, 1, 1, C], scaling a whole [1, H, W, C] image)."""
    sch = s_tir.Schedule(func)
    outputs = output_blocks(sch)
    stages = _kernel_stages(sch, outputs) if outputs else set()
    changed = False
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        if sch.get(block).name_hint not in stages:
            changed = parallel_block(sch, block) or changed
    return sch.mod["main"] if changed else None
