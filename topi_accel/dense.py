"""dense_kn: matrix product with weights stored [in, out] (K x N), optional bias.

The kernel reads its weights packed as ``[N/nb, K, nb]`` (``nb`` =
``DenseConfig.n_block``, N zero-padded to a multiple of ``nb``), so that the
panel one register tile needs is contiguous. `weight_pack_map` is that layout
as an IndexMap, applied at compile time to constant weights.

Schedule: parallel over (column block, row block) with the column block
outermost, so a weight panel stays in cache while all rows stream past it; a
register tile of ``m_block`` rows x ``n_block`` columns accumulates over K; each
row block prefetches its share of the next panel (`topi_accel.prefetch`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import tvm
from tvm import s_tir, te, tirx
from tvm.tirx import IndexMap
from tvm.topi.utils import ravel_index, unravel_index

from .knobs import cpu_knobs, largest_divisor, pick_block, round_up
from .prefetch import prefetch_next_panel
from .tiles import register_tile, vectorize_inner

SUPPORTED_DTYPES = ("float32",)


@dataclass(frozen=True)
class DenseConfig:
    """Schedule knobs: rows and columns of the register tile, float32 vector lanes,
    whether to use threads."""

    m_block: int
    n_block: int
    lanes: int
    parallel: bool = True


def check_dense(data_shape, weight_shape, dtype: str = "float32", bias_shape=None) -> tuple[int, int, int]:
    """Check a dense_kn call and return (M, K, N).

    data_shape: 2-D: [rows, in_features]. weight_shape: 2-D, [in_features, out_features].
    bias_shape: None or 1-D [out_features].
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
    m, k = (int(v) for v in data_shape)
    k2, n = (int(v) for v in weight_shape)
    if k != k2:
        raise ValueError(f"dense_kn: data in_features {k} != weight rows {k2} (data {[m, k]}, weight {[k2, n]})")
    if bias_shape is not None and [int(v) for v in bias_shape] != [n]:
        raise ValueError(f"dense_kn: bias shape {list(bias_shape)} != expected [{n}]")
    return m, k, n


def dense_config(m: int, n: int, target: tvm.target.Target | None = None) -> DenseConfig:
    """Tile sizes for an [m, *] x [*, n] product on `target`."""
    knobs = cpu_knobs(target)
    n_block = 2 * knobs.lanes if n > knobs.lanes else knobs.lanes
    rows = max(knobs.accumulators // (n_block // knobs.lanes), 1)
    # a third of the register budget in rows keeps the B panel loads amortized
    m_block = pick_block(m, min(rows, 8))
    return DenseConfig(m_block=m_block, n_block=n_block, lanes=knobs.lanes, parallel=knobs.parallel)


def weight_pack_map(cfg: DenseConfig) -> IndexMap:
    """[K, N] -> packed [N/nb, K, nb] as an IndexMap (pad N with zeros)."""
    nb = cfg.n_block
    return IndexMap.from_func(lambda k, n: [n // nb, k, n % nb])


def dense_kn(data: te.Tensor, packed_weight: te.Tensor, n: int, cfg: DenseConfig, bias: te.Tensor | None = None):
    """data @ weight (+ bias) with the weight packed by `weight_pack_map`.

    data: [M, K], or [*rows, K] with ``cfg.m_block`` dividing the last of the row axes
    (a register tile never spans two of them). packed_weight: 3-D: [ceil(N / nb), K, nb].
    bias: 1-D [N] or None. Returns [*rows, N] named "dense_kn"; the register tile
    "dense_kn_acc" covers the padded tile grid of the rows flattened.
    """
    *rows, k = (int(v) for v in data.shape)
    m, mb, nb = math.prod(rows), cfg.m_block, cfg.n_block
    expected = (round_up(n, nb) // nb, k, nb)
    if tuple(int(v) for v in packed_weight.shape) != expected:
        raise ValueError(f"dense_kn: packed weight shape {list(packed_weight.shape)} != expected {list(expected)}")
    if not keeps_rows(rows, cfg):
        raise ValueError(f"dense_kn: row axes {rows} need m_block {mb} to divide the last; flatten them to 2-D")
    rk = te.reduce_axis((0, k), name="rk")
    acc = te.compute(
        (round_up(m, mb), round_up(n, nb)),
        # rows past M (tail tile) re-read the last row; the write-back drops them
        lambda i, j: te.sum(
            data[(*unravel_index(tirx.min(i, m - 1), rows), rk)] * packed_weight[j // nb, rk, j % nb], axis=rk
        ),
        name="dense_kn_acc",
    )
    if bias is None:
        return te.compute((*rows, n), lambda *i: acc[ravel_index(i[:-1], rows), i[-1]], name="dense_kn")
    return te.compute((*rows, n), lambda *i: acc[ravel_index(i[:-1], rows), i[-1]] + bias[i[-1]], name="dense_kn")


def keeps_rows(rows, cfg: DenseConfig) -> bool:
    """Whether `dense_kn` takes data with these leading (row) axes as they are: one axis, or
    several with ``cfg.m_block`` dividing the last (a register tile never spans two)."""
    return len(rows) == 1 or (len(rows) > 1 and rows[-1] % cfg.m_block == 0)


def schedule_dense_kn(func: tirx.PrimFunc, n: int, cfg: DenseConfig) -> tirx.PrimFunc:
    """Schedule a PrimFunc made from `dense_kn` (blocks found by name)."""
    return schedule_matmul(func, "dense_kn", n, cfg, prefetch_weights=True)


def schedule_matmul(
    func: tirx.PrimFunc, name: str, n: int, cfg: DenseConfig, prefetch_weights: bool = False
) -> tirx.PrimFunc:
    """Register-tile `name`_acc (loops [batch,] i, j, k) and write back `name` from registers.

    prefetch_weights: the second operand is packed ([batch,] N/nb, K, nb), so its column
    blocks' panels follow each other in the order the outer loop visits them: the tiles of
    one prefetch the next (topi_accel.prefetch).
    """
    sch = s_tir.Schedule(func)
    acc = sch.get_sblock(f"{name}_acc")
    out = sch.get_sblock(name)
    *batch, i, j, rk = sch.get_loops(acc)
    rows, k = (int(sch.get(loop).extent) for loop in (i, rk))
    io, ii = sch.split(i, [None, cfg.m_block])
    jo, ji = sch.split(j, [None, cfg.n_block])
    # column block outermost: its weight panel stays in cache while the rows stream past
    sch.reorder(*batch, jo, io, rk, ii, ji)
    outer = sch.fuse(*batch, jo, io)
    if cfg.parallel:
        sch.parallel(outer)
    if prefetch_weights:
        prefetch_next_panel(sch, rk, 1, k * cfg.n_block, rows // cfg.m_block, rows)
    register_tile(sch, ii, ji, cfg.lanes)
    sch.reverse_compute_at(out, outer)
    sch.set_scope(acc, 0, "local")
    sch.decompose_reduction(acc, sch.get_loops(acc)[1])  # the first reduction loop
    vectorize_inner(sch, out, cfg.lanes)
    return sch.mod["main"]


@functools.lru_cache(maxsize=256)  # a model repeats shapes; PrimFuncs are immutable
def dense_kn_func(
    rows: int | tuple[int, ...], k: int, n: int, cfg: DenseConfig, with_bias: bool = False, dtype: str = "float32"
):
    """The scheduled PrimFunc (data [*rows, K], packed_weight[, bias]) -> out [*rows, N] for one shape."""
    rows = (rows,) if isinstance(rows, int) else tuple(rows)
    data = te.placeholder((*rows, k), dtype, name="data")
    weight = te.placeholder((round_up(n, cfg.n_block) // cfg.n_block, k, cfg.n_block), dtype, name="packed_weight")
    bias = te.placeholder((n,), dtype, name="bias") if with_bias else None
    out = dense_kn(data, weight, n, cfg, bias)
    args = [data, weight] + ([bias] if with_bias else []) + [out]
    return schedule_dense_kn(te.create_prim_func(args, index_dtype_override="int64"), n, cfg)


def batch_matmul_config(m: int, n: int, target: tvm.target.Target | None = None) -> DenseConfig:
    """Tiles for [B, m, K] x [B, K, n] with an unpacked right operand: n_block divides n."""
    knobs = cpu_knobs(target)
    n_block = next((b for b in (2 * knobs.lanes, knobs.lanes) if n % b == 0), None) or largest_divisor(
        n, 2 * knobs.lanes
    )
    rows = max(knobs.accumulators // max(n_block // knobs.lanes, 1), 1)
    return DenseConfig(m_block=pick_block(m, min(rows, 8)), n_block=n_block, lanes=knobs.lanes, parallel=knobs.parallel)


def batch_matmul_kn(a: te.Tensor, b: te.Tensor, cfg: DenseConfig, batch: tuple[int, ...] | None = None) -> te.Tensor:
    """Batched a @ b, both activations (attention's Q @ K^T and P @ V).

    a: 3-D [B, M, K]. b: 3-D [B, K, N], read as it is (N contiguous), so
    ``cfg.n_block`` must divide N. batch: the axes B unflattens to in the result
    (default (B,)). Returns [*batch, M, N] named "batch_matmul_kn".
    """
    (bs, m, k), (bs2, k2, n) = ([int(v) for v in t.shape] for t in (a, b))
    batch = (bs,) if batch is None else tuple(batch)
    if (bs, k) != (bs2, k2) or n % cfg.n_block or math.prod(batch) != bs:
        raise ValueError(
            f"batch_matmul_kn: shapes {[bs, m, k]} x {[bs2, k2, n]} with n_block {cfg.n_block} and batch axes"
            f" {list(batch)} are not supported (equal batch and K, n_block dividing N, batch axes of B elements)"
        )
    rk = te.reduce_axis((0, k), name="rk")
    last = m - 1
    acc = te.compute(
        (bs, round_up(m, cfg.m_block), n),
        lambda p, i, j: te.sum(a[p, tirx.min(i, last), rk] * b[p, rk, j], axis=rk),
        name="batch_matmul_kn_acc",
    )
    return te.compute((*batch, m, n), lambda *i: acc[ravel_index(i[:-2], batch), i[-2], i[-1]], name="batch_matmul_kn")


@functools.lru_cache(maxsize=256)  # a model repeats shapes; PrimFuncs are immutable
def batch_matmul_kn_func(
    batch: int | tuple[int, ...], m: int, k: int, n: int, cfg: DenseConfig, dtype: str = "float32"
):
    """The scheduled PrimFunc (a [B, M, K], b [B, K, N]) -> out [*batch, M, N] for one shape."""
    batch = (batch,) if isinstance(batch, int) else tuple(batch)
    bs = math.prod(batch)
    a = te.placeholder((bs, m, k), dtype, name="a")
    b = te.placeholder((bs, k, n), dtype, name="b")
    out = batch_matmul_kn(a, b, cfg, batch)
    return schedule_matmul(te.create_prim_func([a, b, out], index_dtype_override="int64"), "batch_matmul_kn", n, cfg)
