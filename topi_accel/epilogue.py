"""Epilogues: elementwise work after an accel kernel, done in the kernel's write-back.

FuseOps may append the elementwise consumers of an accel kernel (bias, folded
BN affine, ReLU/ReLU6/GELU, residual add) to it, and FuseTIR then merges them
into one PrimFunc as separate loop nests over the whole output.
`inline_epilogue` moves each of them into the kernel's write-back block, so
the output is written once, from registers, with the epilogue applied.
"""

from __future__ import annotations

import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir.schedule.schedule import ScheduleError

# write-back blocks of the accel computes (each compute's output tensor is named after it)
OUTPUT_BLOCKS = ("conv2d_nhwc_ohwi", "conv2d_winograd", "dense_kn", "batch_matmul_kn")


def has_accel_block(sch: s_tir.Schedule) -> bool:
    """Whether the scheduled function is an accel kernel (with or without an epilogue)."""
    return any(sch.get(b).name_hint in OUTPUT_BLOCKS for b in sch.get_child_blocks(sch.get_sblock("root")))


def contains_accel_kernel(func: tirx.PrimFunc) -> bool:
    """Whether `func` is an accel kernel, with or without an epilogue fused after it."""
    return has_accel_block(s_tir.Schedule(func))


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


def _inline_intermediates(sch: s_tir.Schedule) -> None:
    """Fold every elementwise block that feeds others (GELU's erf, scale and shift) into
    them, so that the kernel's output has a single chain of consumers; not into a consumer
    that broadcasts it (that would recompute it per element of the larger output)."""
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        if sch.get(block).name_hint.startswith(OUTPUT_BLOCKS):  # the kernel's own stages
            continue
        if not all(reads_elementwise(sch, c, block) for c in sch.get_consumers(block)):
            continue
        try:
            sch.compute_inline(block)
        except ScheduleError:  # writes the function's output, or is not elementwise
            continue


def inline_epilogue(func: tirx.PrimFunc) -> tirx.PrimFunc | None:
    """`func` with its accel kernel's consumers inlined into the write-back; None if there are none."""
    sch = s_tir.Schedule(func)
    if not has_accel_block(sch):
        return None
    _inline_intermediates(sch)
    inlined = 0
    for name in OUTPUT_BLOCKS:
        try:
            block = sch.get_sblock(name)
        except ScheduleError:
            continue
        while len(consumers := sch.get_consumers(block)) == 1 and reads_elementwise(sch, consumers[0], block):
            try:
                sch.reverse_compute_inline(consumers[0])
            except ScheduleError:  # not elementwise: it stays a loop nest of its own
                break
            inlined += 1
    return sch.mod["main"] if inlined else None
