"""The two kernels of sums around Strassen's seven products (strategy.strassen).

strassen_lefts: for x [2h, 2k] split into the blocks A11, A12, A21, A22 of [h, k], the seven
left operands stacked, [7, h, k]:

    A11 + A22, A21 + A22, A11, A22, A11 + A12, A21 - A11, A12 - A22

in one pass over x, parallel over the blocks' rows (LLVM vectorizes the inner loop).
Serial for a target of one core; and like every accel kernel, one of little work may run
without threads (topi_accel.tir_passes.serial).

strassen_combine: from the seven products [7, h, n/2], the result [*rows, n] (rows' product
2h) of the four blocks C11 = P1 + P4 - P5 + P7, C12 = P3 + P5, C21 = P2 + P4, C22 = P1 - P2 +
P3 + P6, one element per store, so that an epilogue inlines into it as into accel's other
kernels; parallel over the blocks' rows, the quadrant loops unrolled so that their selections
fold away.

TVM's own kernel of the same slices, adds and concat runs each step as a loop nest of its own,
most through a buffer of their own; here x is read once and each left operand written once.
"""

from __future__ import annotations

import functools
import math

from tvm import s_tir, te, tirx
from tvm.script import tirx as T
from tvm.topi.utils import ravel_index

from .symbolic import prim_func


@functools.lru_cache(maxsize=64)
def strassen_lefts_func(h: int, k: int, dtype: str = "float32", parallel: bool = True) -> tirx.PrimFunc:
    """The PrimFunc (x [2h, 2k]) -> lefts [7, h, k], its rows parallel if `parallel`."""

    h, k = T.int64(h), T.int64(k)  # the index type of the kernels TE makes

    @T.prim_func(s_tir=True)
    def strassen_lefts(x: T.Buffer((2 * h, 2 * k), dtype), lefts: T.Buffer((T.int64(7), h, k), dtype)):
        T.func_attr({"tirx.noalias": True})
        for i, j in T.grid(h, k):
            with T.sblock("strassen_lefts"):
                r, c = T.axis.remap("SS", [i, j])
                lefts[0, r, c] = x[r, c] + x[h + r, k + c]
                lefts[1, r, c] = x[h + r, c] + x[h + r, k + c]
                lefts[2, r, c] = x[r, c]
                lefts[3, r, c] = x[h + r, k + c]
                lefts[4, r, c] = x[r, c] + x[r, k + c]
                lefts[5, r, c] = x[h + r, c] - x[r, c]
                lefts[6, r, c] = x[r, k + c] - x[h + r, k + c]

    if not parallel:
        return strassen_lefts
    sch = s_tir.Schedule(strassen_lefts)
    sch.parallel(sch.get_loops(sch.get_sblock("strassen_lefts"))[0])
    return sch.mod["main"]


def strassen_combine(products: te.Tensor, rows: tuple[int, ...], n: int) -> te.Tensor:
    """The product [*rows, n] from Strassen's seven [7, h, n/2] (rows' product 2h):

        C11 = P1 + P4 - P5 + P7    C12 = P3 + P5    C21 = P2 + P4    C22 = P1 - P2 + P3 + P6

    named "strassen_combine", one element per store, so that an epilogue (a bias, GELU, a
    residual add over the same rows) inlines into it as into accel's other kernels."""
    _, h, nh = (int(d) for d in products.shape)
    p1, p2, p3, p4, p5, p6, p7 = (lambda i, j, p=p: products[p, i, j] for p in range(7))

    def element(*index):
        r, c = ravel_index(index[:-1], rows), index[-1]
        top, left = r < h, c < nh
        i, j = tirx.if_then_else(top, r, r - h), tirx.if_then_else(left, c, c - nh)
        upper = tirx.if_then_else(left, p1(i, j) + p4(i, j) - p5(i, j) + p7(i, j), p3(i, j) + p5(i, j))
        lower = tirx.if_then_else(left, p2(i, j) + p4(i, j), p1(i, j) - p2(i, j) + p3(i, j) + p6(i, j))
        return tirx.if_then_else(top, upper, lower)

    return te.compute((*rows, n), element, name="strassen_combine")


def schedule_strassen_combine(func: tirx.PrimFunc, h: int, nh: int, parallel: bool = True) -> tirx.PrimFunc:
    """Rows parallel (if `parallel`); in each, the two quadrants' columns one after the other,
    each a loop of its own (unrolled quadrant loops: the selections above fold away, LLVM
    vectorizes)."""
    sch = s_tir.Schedule(func)
    block = sch.get_sblock("strassen_combine")
    *row_loops, c = sch.get_loops(block)
    r = sch.fuse(*row_loops) if len(row_loops) > 1 else row_loops[0]
    qr, i = sch.split(r, [2, h])
    qc, j = sch.split(c, [2, nh])
    sch.reorder(i, qr, qc, j)
    if parallel:
        sch.parallel(i)
    sch.unroll(qr)
    sch.unroll(qc)
    return sch.mod["main"]


@functools.lru_cache(maxsize=64)
def strassen_combine_func(
    rows: tuple[int, ...], n: int, dtype: str = "float32", parallel: bool = True
) -> tirx.PrimFunc:
    """The scheduled PrimFunc (products [7, h, n/2]) -> out [*rows, n], h half the rows'
    product (rows and n even)."""
    m = math.prod(rows)
    if m % 2 or n % 2:
        raise ValueError(f"strassen_combine: rows {list(rows)} ({m}) and outputs {n} must be even")
    products = te.placeholder((7, m // 2, n // 2), dtype, name="products")
    func = prim_func([products], strassen_combine(products, rows, n))
    return schedule_strassen_combine(func, m // 2, n // 2, parallel)
