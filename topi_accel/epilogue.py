"""Epilogues: elementwise work after an accel kernel, done in the kernel's write-back.

FuseOps may append the elementwise consumers of an accel kernel (bias, folded
BN affine, ReLU/ReLU6/GELU, residual add) to it, and FuseTIR then merges them
into one PrimFunc as separate loop nests over the whole output.
`inline_epilogue` moves each of them into the kernel's write-back block, so
the output is written once, from registers, with the epilogue applied.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir.schedule.schedule import ScheduleError

# write-back blocks of the accel computes (each compute's output tensor is named after it)
OUTPUT_BLOCKS = ("conv2d_nhwc_ohwi", "dense_kn", "batch_matmul_kn")


def inline_epilogue(func: tirx.PrimFunc) -> tirx.PrimFunc | None:
    """`func` with its accel kernel's consumers inlined into the write-back; None if there are none."""
    sch = s_tir.Schedule(func)
    inlined = 0
    for name in OUTPUT_BLOCKS:
        try:
            block = sch.get_sblock(name)
        except ScheduleError:
            continue
        while len(consumers := sch.get_consumers(block)) == 1:
            try:
                sch.reverse_compute_inline(consumers[0])
            except ScheduleError:  # not elementwise: it stays a loop nest of its own
                break
            inlined += 1
    return sch.mod["main"] if inlined else None
