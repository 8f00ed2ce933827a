"""Schedule pieces shared by the accel kernels (conv2d and the matmuls)."""

from __future__ import annotations

from tvm import s_tir


def register_tile(sch: s_tir.Schedule, rows, cols, lanes: int) -> None:
    """Unroll the tile rows and split the columns into unrolled vectors."""
    sch.unroll(rows)
    extent = int(sch.get(cols).extent)
    if extent % lanes == 0 and extent > lanes:
        outer, inner = sch.split(cols, [None, lanes])
        sch.unroll(outer)
        sch.vectorize(inner)
    else:
        sch.vectorize(cols)


# Narrowest vector a copy loop is still split into (4 floats: one SSE register).
MIN_COPY_LANES = 4


def vectorize_inner(sch: s_tir.Schedule, block, lanes: int) -> None:
    """Vectorize a copy block's innermost loop in chunks of `lanes`, or of the widest
    power-of-two fraction of it that divides the loop (24 channels: 3 x 8 on AVX-512);
    a loop of any other extent stays scalar. A partial block's loop (predicated) is split
    the same way. A block without a loop of its own (every one of extent 1, which
    `reverse_compute_at` leaves out) stays scalar: its innermost loop is a tile's."""
    inner = sch.get_loops(block)[-1]
    if len(sch.get_child_blocks(inner)) > 1:
        return
    extent = int(sch.get(inner).extent)
    width = lanes
    while extent % width and width > MIN_COPY_LANES:
        width //= 2
    if extent % width == 0:
        _, vec = sch.split(inner, [None, width])
        sch.vectorize(vec)
