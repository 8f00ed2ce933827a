"""dense_kn: matrix product with weights stored [in, out] (K x N). A bias, an activation or a
residual add after it is fused into its write-back by the build (topi_accel.epilogue).

The kernel reads its weights packed as ``[N/nb, K, nb]`` (``nb`` =
``DenseConfig.n_block``, N zero-padded to a multiple of ``nb``), so that the
panel one register tile needs is contiguous. `weight_pack_map` is that layout
as an IndexMap, applied at compile time to constant weights.

Schedule: parallel over (column block, row block) with the column block
outermost, so a weight panel stays in cache while all rows stream past it; a
register tile of ``m_block`` rows x ``n_block`` columns accumulates over K; each
row block prefetches its share of the next panel (`topi_accel.tir_passes.prefetch`).
`batch_dense_kn` is B such products, each with its own weight, in one kernel: the
weights packed ``[B, N/nb, K, nb]``, the matrix outermost in the parallel loop.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

import tvm
from tvm import s_tir, te, tirx
from tvm.tirx import IndexMap
from tvm.topi.utils import ravel_index, unravel_index

from . import views
from .knobs import ceil_div, cpu_knobs, largest_divisor, pads_little, pick_block, round_up
from .symbolic import REPRESENTATIVE_ROWS, SYMBOLIC, ceil_to, extent, is_static, prim_func, static_or
from .tiles import register_tile, vectorize_inner
from .tir_passes.prefetch import prefetch_next_panel

SUPPORTED_DTYPES = ("float32",)


@dataclass(frozen=True)
class DenseConfig:
    """Schedule knobs: rows and columns of the register tile, float32 vector lanes,
    whether to use threads."""

    m_block: int
    n_block: int
    lanes: int
    parallel: bool = True


def check_dense(data_shape, weight_shape, dtype: str = "float32") -> tuple[int, int, int]:
    """Check a dense_kn call and return (M, K, N).

    data_shape: 2-D: [rows, in_features], rows may be symbolic. weight_shape: 2-D, [in_features, out_features].
    """
    if str(dtype) not in SUPPORTED_DTYPES:
        raise ValueError(f"dense_kn: dtype {dtype} is not supported; supported: {', '.join(SUPPORTED_DTYPES)}")
    if len(data_shape) != 2:
        raise ValueError(f"dense_kn: data has rank {len(data_shape)} (shape {list(data_shape)}); expected 2-D [M, K]")
    if len(weight_shape) != 2:
        raise ValueError(
            f"dense_kn: weight has rank {len(weight_shape)} (shape {list(weight_shape)}); "
            "expected 2-D [K, N] ([in, out])"
        )
    m, k = (int(v) if is_static(v) else v for v in data_shape)  # m may be symbolic
    k2, n = (int(v) for v in weight_shape)
    if k != k2:
        raise ValueError(f"dense_kn: data in_features {k} != weight rows {k2} (data {[m, k]}, weight {[k2, n]})")
    return m, k, n


# Vectors of columns of a one-row register tile (GEMV), most and least: its accumulators are its
# only chains of FMAs, and two or three leave the FMA latency uncovered.
ROW_VECTORS = (8, 4)


def _row_columns(n: int, knobs) -> int:
    """Columns of a one-row tile: the most vectors of ROW_VECTORS that divide `n`, else the
    least (N padded); `column_block`'s for fewer columns than that."""
    most, least = ROW_VECTORS
    if ceil_div(n, knobs.lanes) < least:
        return knobs.column_block(n)
    return knobs.lanes * next((v for v in range(most, least - 1, -1) if n % (v * knobs.lanes) == 0), least)


def dense_config(
    m: int | tirx.PrimExpr | None, n: int, target: tvm.target.Target | None = None, rows: tuple | None = None
) -> DenseConfig:
    """Tile sizes for an [m, *] x [*, n] product on `target` (m symbolic, None or an
    expression: the tiles of REPRESENTATIVE_ROWS rows). rows: the data's row axes, their
    product m, which `dense_kn` keeps as they are where `keeps_rows` says so (the strategy
    flattens them where not).

    The rows of a tile: `pick_block`'s divisor of m, or the full tile where that pads at most
    `knobs.MAX_PADDED_FRACTION` of the rows and does not lose row axes that the divisor keeps
    (256 rows in tiles of 6 rows of two vectors, 258 computed, rather than 4)."""
    symbolic = not is_static(m) if m is not None else True
    factor = _static_factor(m) if symbolic else 1
    m = static_or(m, REPRESENTATIVE_ROWS)
    knobs = cpu_knobs(target)
    n_block = _row_columns(n, knobs) if m == 1 else knobs.column_block(n)
    divisor, padded = _row_tiles(m, n_block, knobs)
    if padded and (rows is None or keeps_rows(rows, padded) or not keeps_rows(rows, divisor)):
        chosen = padded
    else:
        chosen = divisor
    return replace(chosen, m_block=_provable_block(chosen.m_block, factor)) if symbolic else chosen


def _static_factor(m) -> int:
    """The product of the constant factors of a symbolic row count (16 for ``b * 16``)."""
    if isinstance(m, tirx.Mul):
        return _static_factor(m.a) * _static_factor(m.b)
    return int(m) if is_static(m) else 1


def _provable_block(block: int, factor: int) -> int:
    """Rows of a tile for M = b * `factor` rows (b symbolic): `block`, or the largest smaller
    one, that divides `factor` or is smaller than it and shares no factor with it. TVM's prover
    cannot show that the tiles cover M otherwise (ceil(14 b / 6) tiles of 6 rows for 14 b, or
    of 5 for 4 b: reverse_compute_at fails, and the matmul goes to TVM's kernel)."""
    if factor == 1:  # (b * s: any block)
        return block
    return next(b for b in range(block, 0, -1) if factor % b == 0 or (b < factor and math.gcd(factor, b) == 1))


def _row_tiles(m: int, n_block: int, knobs) -> tuple[DenseConfig, DenseConfig | None]:
    """The tiles of `m` rows by `n_block` columns: rows `pick_block`'s divisor of m, and rows
    the full tile of the register budget where that pads at most `knobs.MAX_PADDED_FRACTION`
    of them (else None)."""
    # a third of the register budget in rows keeps the B panel loads amortized
    full = min(knobs.tile_rows(n_block), 8)
    divisor = DenseConfig(m_block=pick_block(m, full), n_block=n_block, lanes=knobs.lanes, parallel=knobs.parallel)
    return divisor, replace(divisor, m_block=full) if pads_little(m, full) else None


def weight_pack_map(cfg: DenseConfig, batch_axes: int = 0) -> IndexMap:
    """[*batch, K, N] -> packed [*batch, N/nb, K, nb] as an IndexMap (pad N with zeros): with
    `batch_axes` leading axes, each matrix packed so, one after the other (`batch_dense_kn`)."""
    nb = cfg.n_block
    return IndexMap.from_func(lambda *b, k, n: [*b, n // nb, k, n % nb], ndim=batch_axes + 2)


def dense_kn(data: te.Tensor, packed_weight: te.Tensor, n: int, cfg: DenseConfig):
    """data @ weight with the weight packed by `weight_pack_map`.

    data: [M, K], or [*rows, K] with ``cfg.m_block`` dividing the last of the row axes
    (a register tile never spans two of them); the first row axis may be symbolic, and
    with one row axis M may be. packed_weight: 3-D: [ceil(N / nb), K, nb].
    Returns [*rows, N] named "dense_kn"; the register tile
    "dense_kn_acc" covers the padded tile grid of the rows flattened.
    """
    *rows, k = data.shape
    k, mb, nb = int(k), cfg.m_block, cfg.n_block
    rows = [int(r) if is_static(r) else r for r in rows]
    m = math.prod(rows)
    expected = (round_up(n, nb) // nb, k, nb)
    if tuple(int(v) for v in packed_weight.shape) != expected:
        raise ValueError(f"dense_kn: packed weight shape {list(packed_weight.shape)} != expected {list(expected)}")
    if not keeps_rows(rows, cfg):
        raise ValueError(f"dense_kn: row axes {rows} need m_block {mb} to divide the last; flatten them to 2-D")
    rk = te.reduce_axis((0, k), name="rk")
    acc = te.compute(
        (ceil_to(m, mb), round_up(n, nb)),
        # rows past M (tail tile) re-read the last row; the write-back drops them
        lambda i, j: te.sum(
            data[(*unravel_index(tirx.min(i, m - 1), rows), rk)] * packed_weight[j // nb, rk, j % nb], axis=rk
        ),
        name="dense_kn_acc",
    )
    return te.compute((*rows, n), lambda *i: acc[ravel_index(i[:-1], rows), i[-1]], name="dense_kn")


def batch_dense_kn(data: te.Tensor, packed_weight: te.Tensor, n: int, cfg: DenseConfig) -> te.Tensor:
    """B products at once, each with its own weight: data [B, M, K] @ weights [B, K, N]
    packed by `weight_pack_map(cfg, 1)` ([B, ceil(N / nb), K, nb]), all extents static.
    Returns [B, M, N] named "dense_kn" (its register tile "dense_kn_acc"), so that it is
    scheduled, prefetched and takes epilogues as `dense_kn` does."""
    bs, m, k = (int(v) for v in data.shape)
    mb, nb = cfg.m_block, cfg.n_block
    expected = (bs, ceil_div(n, nb), k, nb)
    if tuple(int(v) for v in packed_weight.shape) != expected:
        raise ValueError(
            f"batch_dense_kn: packed weight shape {list(packed_weight.shape)} != expected {list(expected)}"
        )
    rk = te.reduce_axis((0, k), name="rk")
    acc = te.compute(
        (bs, round_up(m, mb), round_up(n, nb)),
        # rows past M (tail tile) re-read the last row; the write-back drops them
        lambda p, i, j: te.sum(data[p, tirx.min(i, m - 1), rk] * packed_weight[p, j // nb, rk, j % nb], axis=rk),
        name="dense_kn_acc",
    )
    return te.compute((bs, m, n), lambda p, i, j: acc[p, i, j], name="dense_kn")


def keeps_rows(rows, cfg: DenseConfig) -> bool:
    """Whether `dense_kn` takes data with these leading (row) axes as they are: one axis, or
    several with ``cfg.m_block`` dividing the last (a register tile never spans two) and
    only the first symbolic."""
    if len(rows) == 1:
        return True
    return len(rows) > 1 and all(is_static(r) for r in rows[1:]) and int(rows[-1]) % cfg.m_block == 0


def schedule_dense_kn(func: tirx.PrimFunc, n: int, cfg: DenseConfig) -> tirx.PrimFunc:
    """Schedule a PrimFunc made from `dense_kn` (blocks found by name)."""
    return schedule_matmul(func, "dense_kn", n, cfg, prefetch_weights=True)


def schedule_matmul(
    func: tirx.PrimFunc, name: str, n: int, cfg: DenseConfig, prefetch_weights: bool = False
) -> tirx.PrimFunc:
    """Register-tile `name`_acc (loops [batch,] i, j, k) and write back `name` from registers.

    prefetch_weights: the second operand is packed ([batch,] N/nb, K, nb), so its column
    blocks' panels follow each other in the order the outer loop visits them: the tiles of
    one prefetch the next (topi_accel.tir_passes.prefetch). The row extent may be symbolic.
    """
    sch = s_tir.Schedule(func)
    acc = sch.get_sblock(f"{name}_acc")
    out = sch.get_sblock(name)
    *batch, i, j, rk = sch.get_loops(acc)
    rows, k = (sch.get(loop).extent for loop in (i, rk))
    io, ii = sch.split(i, [None, cfg.m_block])
    jo, ji = sch.split(j, [None, cfg.n_block])
    # column block outermost: its weight panel stays in cache while the rows stream past
    sch.reorder(*batch, jo, io, rk, ii, ji)
    outer = sch.fuse(*batch, jo, io)
    if cfg.parallel:
        sch.parallel(outer)
    if prefetch_weights:
        prefetch_next_panel(sch, rk, 1, int(k) * cfg.n_block, rows // cfg.m_block, rows)
    register_tile(sch, ii, ji, cfg.lanes)
    sch.reverse_compute_at(out, outer)
    sch.set_scope(acc, 0, "local")
    sch.decompose_reduction(acc, sch.get_loops(acc)[1])  # the first reduction loop
    if len(sch.get_loops(out)) > 1:  # a 1x1 tile's write-back has no loop under `outer`
        vectorize_inner(sch, out, cfg.lanes)
    return sch.mod["main"]


@functools.lru_cache(maxsize=256)  # a model repeats shapes; PrimFuncs are immutable
def dense_kn_func(
    rows: int | tuple[int | None, ...],
    k: int,
    n: int,
    cfg: DenseConfig,
    dtype: str = "float32",
):
    """The scheduled PrimFunc (data [*rows, K], packed_weight) -> out [*rows, N] for one
    shape; a row axis given as None (`symbolic.SYMBOLIC`) is a variable of the PrimFunc, one
    given as an expression of shape variables is that expression (see topi_accel.symbolic)."""
    rows = (rows,) if rows is SYMBOLIC or isinstance(rows, int) else tuple(rows)
    rows = tuple(extent(r, f"rows{a}" if len(rows) > 1 else "rows") for a, r in enumerate(rows))
    data = te.placeholder((*rows, k), dtype, name="data")
    weight = te.placeholder((round_up(n, cfg.n_block) // cfg.n_block, k, cfg.n_block), dtype, name="packed_weight")
    return schedule_dense_kn(prim_func([data, weight], dense_kn(data, weight, n, cfg)), n, cfg)


@functools.lru_cache(maxsize=256)
def batch_dense_kn_func(batch: int, m: int, k: int, n: int, cfg: DenseConfig, dtype: str = "float32"):
    """The scheduled PrimFunc (data [B, M, K], packed_weight) -> out [B, M, N] of
    `batch_dense_kn`: parallel over (matrix, column block, row block), each row block
    prefetching its share of the next panel, as `dense_kn`."""
    data = te.placeholder((batch, m, k), dtype, name="data")
    weight = te.placeholder((batch, ceil_div(n, cfg.n_block), k, cfg.n_block), dtype, name="packed_weight")
    return schedule_dense_kn(prim_func([data, weight], batch_dense_kn(data, weight, n, cfg)), n, cfg)


def batch_matmul_config(
    m: int | tirx.PrimExpr | None,
    n: int | tirx.PrimExpr | None,
    target: tvm.target.Target | None = None,
    pad_rows: bool = True,
) -> DenseConfig:
    """Tiles for [B, m, K] x [B, K, n]: n_block divides a static n (the right operand is read
    unpacked); a symbolic n (None or an expression) gets dense_kn's two vectors, the operand
    packed in the kernel. A symbolic m gets the tiles of REPRESENTATIVE_ROWS rows. The rows of
    a tile: as `dense_config`'s (there are no row axes to keep), or with `pad_rows` False
    `pick_block`'s divisor."""
    knobs = cpu_knobs(target)
    m = static_or(m, REPRESENTATIVE_ROWS)
    if not is_static(n):
        n_block = 2 * knobs.lanes
    else:
        n_block = next((b for b in (2 * knobs.lanes, knobs.lanes) if n % b == 0), None) or largest_divisor(
            n, 2 * knobs.lanes
        )
    divisor, padded = _row_tiles(m, n_block, knobs)
    return padded if pad_rows and padded else divisor


def _packed_columns(b: te.Tensor, nb: int) -> te.Tensor:
    """b [B, K, N] with a symbolic N as [B, ceil(N / nb), K, nb], zero past N
    ("batch_matmul_kn_pack"): the product's vector loads stay whole. A whole column block is
    a plain copy (LLVM vectorizes it), only the last one is read column by column under its
    bounds (not every element under a condition)."""
    bs, k, n = b.shape
    return te.compute(
        (bs, tirx.ceildiv(n, nb), k, nb),
        lambda p, jo, r, ji: tirx.if_then_else(
            jo < n // nb,
            b[p, r, jo * nb + ji],
            tirx.if_then_else(jo * nb + ji < n, b[p, r, tirx.min(jo * nb + ji, n - 1)], tirx.const(0, b.dtype)),
        ),
        name="batch_matmul_kn_pack",
    )


def batch_matmul_kn(
    a: te.Tensor,
    b: te.Tensor,
    cfg: DenseConfig,
    batch: tuple | None = None,
    pack_right: bool = False,
    out_axes: tuple[int, ...] | None = None,
) -> te.Tensor:
    """Batched a @ b, both activations (attention's Q @ K^T and P @ V).

    a: 3-D [B, M, K]. b: 3-D [B, K, N], read as it is (N contiguous), so ``cfg.n_block``
    must divide a static N; a symbolic N, or any N with `pack_right` (b a view of a tensor
    laid out otherwise), is packed in the kernel ("batch_matmul_kn_pack"). B, M and K may be
    symbolic too. batch: the axes B unflattens to in the result (default (B,)). out_axes: the
    result's axes permuted so (attention's head merge keeps N last, its write-back a vector
    store; one moving N writes each tile's elements apart). Returns [*batch, M, N], permuted by
    out_axes, named "batch_matmul_kn".
    """
    (bs, m, k), (bs2, k2, n) = ([int(v) if is_static(v) else v for v in t.shape] for t in (a, b))
    batch = (bs,) if batch is None else tuple(batch)
    axes = tuple(range(len(batch) + 2)) if out_axes is None else tuple(out_axes)
    static = all(is_static(v) for v in (bs, bs2, k, k2, n, *batch))
    if static and ((bs, k) != (bs2, k2) or n % cfg.n_block or math.prod(batch) != bs):
        raise ValueError(
            f"batch_matmul_kn: shapes {[bs, m, k]} x {[bs2, k2, n]} with n_block {cfg.n_block} and batch axes"
            f" {list(batch)} are not supported (equal batch and K, n_block dividing N, batch axes of B elements)"
        )
    if sorted(axes) != list(range(len(batch) + 2)):
        raise ValueError(f"batch_matmul_kn: out_axes {list(axes)} is no permutation of {len(batch) + 2} axes")
    rk = te.reduce_axis((0, k), name="rk")
    last, nb = m - 1, cfg.n_block
    if is_static(n) and not pack_right:
        right = lambda p, j: b[p, rk, j]  # noqa: E731
    else:
        packed = _packed_columns(b, nb)
        right = lambda p, j: packed[p, j // nb, rk, j % nb]  # noqa: E731
    acc = te.compute(
        (bs, ceil_to(m, cfg.m_block), ceil_to(n, nb)),
        lambda p, i, j: te.sum(a[p, tirx.min(i, last), rk] * right(p, j), axis=rk),
        name="batch_matmul_kn_acc",
    )
    shape = (*batch, m, n)

    def element(*index):
        unpermuted = [None] * len(axes)
        for position, axis in enumerate(axes):
            unpermuted[axis] = index[position]
        return acc[ravel_index(unpermuted[:-2], batch), unpermuted[-2], unpermuted[-1]]

    return te.compute(tuple(shape[axis] for axis in axes), element, name="batch_matmul_kn")


def _schedule_pack(func: tirx.PrimFunc, parallel: bool, rows_contiguous: bool = True) -> tirx.PrimFunc:
    """The packing of the right operand, if any: parallel over (batch, column block); with
    `rows_contiguous` False (a view whose consecutive elements run along K: attention's Kᵀ)
    each column's K elements are read together."""
    sch = s_tir.Schedule(func)
    if not any(sch.get(b).name_hint == "batch_matmul_kn_pack" for b in sch.get_child_blocks(sch.get_sblock("root"))):
        return func
    p, jo, r, ji = sch.get_loops(sch.get_sblock("batch_matmul_kn_pack"))
    if not rows_contiguous:
        sch.reorder(ji, r)
    if parallel:
        sch.parallel(sch.fuse(p, jo))
    return sch.mod["main"]


@functools.lru_cache(maxsize=256)  # a model repeats shapes; PrimFuncs are immutable
def batch_matmul_kn_func(
    batch: int | tuple[int | None, ...],
    m: int | None,
    k: int | None,
    n: int | None,
    cfg: DenseConfig,
    dtype: str = "float32",
    a_view: views.View | None = None,
    b_view: views.View | None = None,
    out_axes: tuple[int, ...] | None = None,
):
    """The scheduled PrimFunc (a [B, M, K], b [B, K, N]) -> out [*batch, M, N] for one shape;
    an extent given as None (`symbolic.SYMBOLIC`) is a variable of the PrimFunc, one given as
    an expression of shape variables is that expression (see topi_accel.symbolic).

    a_view, b_view: the operand is that view of the PrimFunc's parameter (topi_accel.views),
    read in place; out_axes: see `batch_matmul_kn`."""
    batch = (batch,) if batch is SYMBOLIC or isinstance(batch, int) else tuple(batch)
    batch = tuple(extent(d, f"batch{a}" if len(batch) > 1 else "batch") for a, d in enumerate(batch))
    m, k, n = extent(m, "m"), extent(k, "k"), extent(n, "n")
    bs = math.prod(batch)
    operands = []
    for name, view, shape in (("a", a_view, (bs, m, k)), ("b", b_view, (bs, k, n))):
        source = te.placeholder(shape if view is None else view.shape, dtype, name=name)
        operands.append((source, source if view is None else views.apply(view, source)))
    (a_source, a), (b_source, b) = operands
    rows_contiguous = b_view is None or views.reads(b_view).unit_stride_last
    out = batch_matmul_kn(a, b, cfg, batch, not rows_contiguous, out_axes)
    func = prim_func([a_source, b_source], out)
    if a_view is not None or b_view is not None:
        sch = s_tir.Schedule(func)
        views.inline_views(sch, ("batch_matmul_kn_acc", "batch_matmul_kn", "batch_matmul_kn_pack"))
        func = sch.mod["main"]
    return _schedule_pack(schedule_matmul(func, "batch_matmul_kn", n, cfg), cfg.parallel, rows_contiguous)
