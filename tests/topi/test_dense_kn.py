"""dense_kn against numpy."""

import pytest
import tvm

import topi_accel
from tests.helpers import assert_close, pack, rand, run_primfunc

# (M, K, N)
SHAPES = [
    # BERT-base layers, classifier head
    (128, 768, 768),
    (128, 768, 3072),
    (128, 3072, 768),
    (1, 2048, 1000),
    # tails: K = 33, N = 1000, prime M, tiny everything
    (256, 33, 1000),
    (97, 64, 48),
    (7, 33, 17),
    (1, 1, 1),
    (5, 3, 130),
]


@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("target", ["accel", {"tag": "accel", "mattr": ["-avx512f"]}, {"tag": "accel", "num-cores": 1}], ids=["accel", "avx2", "1core"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_dense_kn(shape, target, bias):
    m, k, n = shape
    x, w, b = rand(m, k), rand(k, n), rand(n)
    target = tvm.target.Target(target)
    with target:
        cfg = topi_accel.dense_config(m, n)
    inputs = [x, pack(w, topi_accel.weight_pack_map(cfg))] + ([b] if bias else [])
    out = run_primfunc(topi_accel.dense_kn_func(m, k, n, cfg, with_bias=bias), inputs, (m, n), target)
    assert_close(out, x @ w + (b if bias else 0))


# (batch, M, K, N): attention's Q @ K^T and P @ V (BERT-base, 12 heads, seq 128), tails
BATCH_SHAPES = [(12, 128, 64, 128), (12, 128, 128, 64), (3, 7, 5, 24), (2, 97, 33, 48), (4, 1, 16, 7)]


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
