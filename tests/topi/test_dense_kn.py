"""dense_kn against numpy."""

import math
from dataclasses import replace

import pytest
import tvm

import topi_accel
from tests.helpers import ISAS, assert_close, isa_params, pack, rand, run_primfunc
from topi_accel.knobs import largest_divisor

# (M, K, N)
SHAPES = [
    # BERT-base layers, classifier head
    (128, 768, 768),
    (128, 768, 3072),
    (128, 3072, 768),
    (1, 2048, 1000),
    # tails: K = 33, N = 1000, prime M, tiny everything
    (256, 33, 1000),
    (100, 16, 1000),
    (97, 64, 48),
    (7, 33, 17),
    (1, 1, 1),
    (5, 3, 130),
]


# every ISA's tiles (those this host can run) and single-threaded kernels
@pytest.mark.parametrize("target", [*isa_params(), pytest.param({"tag": "accel", "num-cores": 1}, id="1core")])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_dense_kn(shape, target):
    m, k, n = shape
    x, w = rand(m, k), rand(k, n)
    target = tvm.target.Target(target)
    with target:
        cfg = topi_accel.dense_config(m, n)
    inputs = [x, pack(w, topi_accel.weight_pack_map(cfg))]
    assert_close(run_primfunc(topi_accel.dense_kn_func(m, k, n, cfg), inputs, (m, n), target), x @ w)


@pytest.mark.parametrize("isa, lanes", [("avx512", 16), ("avx2", 8), ("sse", 4)])
def test_dense_config_takes_three_vectors_where_they_divide_n(isa, lanes):
    """Columns per register tile: three vectors where they divide N (BERT's 768, 2304, 3072 on
    every ISA), else two (1000); one for N of one vector or less."""
    with tvm.target.Target(ISAS[isa]):
        for n in (768, 2304, 3072):
            assert topi_accel.dense_config(128, n).n_block == 3 * lanes, n
        assert topi_accel.dense_config(128, 1000).n_block == 2 * lanes
        assert topi_accel.dense_config(128, lanes).n_block == lanes


@pytest.mark.parametrize("isa, lanes, columns_of_1000", [("avx512", 16, 64), ("avx2", 8, 40), ("sse", 4, 20)])
def test_a_single_row_takes_four_to_eight_vectors(isa, lanes, columns_of_1000):
    """A GEMV's tile: the most of 8 to 4 vectors that divide N (its accumulators are its only
    chains of FMAs), else 4 (N = 1000 with AVX-512: 64 columns, padded); fewer columns than 4
    vectors as for more rows."""
    with tvm.target.Target(ISAS[isa]):
        assert topi_accel.dense_config(1, 3072).n_block == 8 * lanes
        assert topi_accel.dense_config(1, 1000).n_block == columns_of_1000
        assert topi_accel.dense_config(1, 10).n_block == topi_accel.dense_config(128, 10).n_block


# per ISA, (M, last row axis or None): the row tile dense_config picks for N = 1000 (two vectors)
ROW_TILES = {
    # 6 rows fill AVX2's and SSE's 12 accumulators: 256 and 100 rows padded to 258 and 102
    # rather than a divisor (4, 5); 20 would pad to 24 (a fifth); [2, 128] and [8, 35] keep
    # their rows (6 does not divide 128 or 35, 4 and 5 do); [10, 28] has none to keep (5 does
    # not divide 28 either)
    "avx2": {(256, None): 6, (100, None): 6, (20, None): 5, (256, 128): 4, (280, 35): 5, (280, 28): 6},
    # AVX-512: 8 rows at most (a third of the registers), 100 padded to 104 rather than 5
    "avx512": {(256, None): 8, (100, None): 8, (20, None): 5, (256, 128): 8, (280, 35): 8, (280, 28): 8},
}
ROW_TILES["sse"] = ROW_TILES["avx2"]  # 12 accumulators too


@pytest.mark.parametrize("isa", ISAS)
def test_a_row_tile_pads_a_few_rows_for_more_accumulators(isa):
    """A product's row tile: the full tile of the register budget where it pads at most a tenth
    of the rows and divides the last of several row axes, else `pick_block`'s divisor."""
    with tvm.target.Target(ISAS[isa]):
        for (m, last), m_block in ROW_TILES[isa].items():
            cfg = topi_accel.dense_config(m, 1000, rows=(m // last, last) if last else None)
            assert cfg.n_block == 2 * cfg.lanes and cfg.m_block == m_block, (m, last, cfg)


# batched products (attention's 128 rows): the same rule, no row axes
BATCHED_ROW_TILES = {
    "avx2": {128: 6, 196: 6, 100: 6, 20: 5},
    "avx512": {128: 8, 196: 8, 100: 8, 20: 5},
}
BATCHED_ROW_TILES["sse"] = BATCHED_ROW_TILES["avx2"]


@pytest.mark.parametrize("isa", ISAS)
def test_a_batched_row_tile_pads_a_few_rows_for_more_accumulators(isa):
    """As dense_config's; but Winograd's products keep the divisor (pad_rows=False): a 15x13
    grid of F(2x2) tiles (56 an image) in rows of 4 with 12 accumulators, not 6."""
    with tvm.target.Target(ISAS[isa]):
        for m, m_block in BATCHED_ROW_TILES[isa].items():
            cfg = topi_accel.batch_matmul_config(m, 64)
            assert cfg.n_block == 2 * cfg.lanes and cfg.m_block == m_block, (m, cfg)
        geo = topi_accel.conv2d_geometry((1, 15, 13, 16), (64, 3, 3, 16), 1, 1)
        assert topi_accel.winograd_config(geo).m_block == (4 if BATCHED_ROW_TILES[isa][196] == 6 else 8)


@pytest.mark.parametrize("rows", [(1, 128), (2, 64), (3, 5, 7)], ids=str)
def test_dense_kn_keeps_leading_axes(rows):
    """data [*rows, K] -> [*rows, N] when the row tile divides the last row axis."""
    k, n = 40, 50
    x, w = rand(*rows, k), rand(k, n)
    target = tvm.target.Target("accel")
    with target:
        cfg = topi_accel.dense_config(math.prod(rows), n)
    # the largest row tile within the target's register budget that divides the last row axis
    cfg = replace(cfg, m_block=largest_divisor(rows[-1], cfg.m_block))
    out = run_primfunc(
        topi_accel.dense_kn_func(rows, k, n, cfg), [x, pack(w, topi_accel.weight_pack_map(cfg))], (*rows, n), target
    )
    assert_close(out, x @ w)


def test_dense_kn_rejects_row_tiles_across_leading_axes():
    cfg = topi_accel.DenseConfig(m_block=8, n_block=32, lanes=16)
    with pytest.raises(ValueError, match=r"dense_kn: row axes \[2, 3, 4\] need m_block 8 to divide the last"):
        topi_accel.dense_kn_func((2, 3, 4), 16, 32, cfg)


# (batch, M, K, N): attention's Q @ K^T and P @ V (BERT-base, 12 heads, seq 128), tails, and a
# batch of dot products (a 1x1 tile: MobileViT's export, declined before)
BATCH_SHAPES = [
    (12, 128, 64, 128),
    (12, 128, 128, 64),
    (3, 7, 5, 24),
    (2, 97, 33, 48),
    (4, 1, 16, 7),
    (8, 1, 32, 1),
]


@pytest.mark.parametrize("target", ["accel", {"tag": "accel", "num-cores": 1}], ids=["accel", "1core"])
@pytest.mark.parametrize("shape", BATCH_SHAPES, ids=str)
def test_batch_matmul_kn(shape, target):
    bs, m, k, n = shape
    a, b = rand(bs, m, k), rand(bs, k, n)
    target = tvm.target.Target(target)
    with target:
        cfg = topi_accel.batch_matmul_config(m, n)
    assert n % cfg.n_block == 0
    out = run_primfunc(topi_accel.batch_matmul_kn_func(bs, m, k, n, cfg), [a, b], (bs, m, n), target)
    assert_close(out, a @ b)


@pytest.mark.parametrize("batch", [(1, 12), (2, 3)], ids=str)
def test_batch_matmul_kn_keeps_batch_axes(batch):
    """a [B, M, K] @ b [B, K, N] -> [*batch, M, N] (B = prod(batch)); M = 7 leaves a row tail."""
    bs, m, k, n = math.prod(batch), 7, 5, 32
    a, b = rand(bs, m, k), rand(bs, k, n)
    target = tvm.target.Target("accel")
    with target:
        cfg = topi_accel.batch_matmul_config(m, n)
    out = run_primfunc(topi_accel.batch_matmul_kn_func(batch, m, k, n, cfg), [a, b], (*batch, m, n), target)
    assert_close(out, (a @ b).reshape(*batch, m, n))


# (batch, M, K, N): Strassen's seven products of BERT-base's FFN on 128 rows, and tails (N past
# a column block, M past a row tile, one row)
BATCH_DENSE_SHAPES = [(7, 64, 384, 1536), (3, 7, 33, 17), (2, 97, 64, 1000), (4, 1, 16, 40)]


@pytest.mark.parametrize("target", [*isa_params(), pytest.param({"tag": "accel", "num-cores": 1}, id="1core")])
@pytest.mark.parametrize("shape", BATCH_DENSE_SHAPES, ids=str)
def test_batch_dense_kn(shape, target):
    """B products, each with its own weight packed as dense_kn packs one."""
    bs, m, k, n = shape
    x, w = rand(bs, m, k), rand(bs, k, n)
    target = tvm.target.Target(target)
    with target:
        cfg = topi_accel.dense_config(m, n)
    packed = pack(w, topi_accel.weight_pack_map(cfg, batch_axes=1))
    assert packed.shape == (bs, -(-n // cfg.n_block), k, cfg.n_block)
    out = run_primfunc(topi_accel.batch_dense_kn_func(bs, m, k, n, cfg), [x, packed], (bs, m, n), target)
    assert_close(out, x @ w)


def test_batch_dense_kn_rejects_weights_packed_otherwise():
    with tvm.target.Target("accel"):
        cfg = topi_accel.dense_config(8, 64)
    data = tvm.te.placeholder((2, 8, 16), name="data")
    weight = tvm.te.placeholder((2, 64 // cfg.n_block, 16, cfg.n_block + 1), name="w")
    with pytest.raises(ValueError, match="batch_dense_kn: packed weight shape"):
        topi_accel.batch_dense_kn(data, weight, 64, cfg)
