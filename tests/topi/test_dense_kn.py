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
