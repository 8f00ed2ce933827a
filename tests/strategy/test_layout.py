"""Weight packing helpers of the strategies."""

import numpy as np
import pytest
import tvm

import topi_accel
from strategy.layout import map_array, permutation
from tests.helpers import rand


@pytest.mark.parametrize("shape,block", [((64, 3, 3, 32), 32), ((48, 1, 1, 7), 16)])
def test_map_array_matches_map_tensor(shape, block):
    w = rand(*shape)
    index_map = topi_accel.kernel_pack_map(topi_accel.Conv2DConfig(oc_block=block, ow_block=1, lanes=16))
    expected = index_map.map_tensor(tvm.runtime.tensor(w)).numpy()
    np.testing.assert_array_equal(map_array(index_map, w), expected)


def test_map_array_pads_with_zeros():
    w = rand(33, 70)
    index_map = topi_accel.weight_pack_map(topi_accel.DenseConfig(m_block=1, n_block=32, lanes=16))
    packed = map_array(index_map, w)
    assert packed.shape == (3, 33, 32)
    padded = np.concatenate([w, np.zeros((33, 26), "float32")], axis=1)
    np.testing.assert_array_equal(packed, padded.reshape(33, 3, 32).transpose(1, 0, 2))


def test_permutation():
    x = rand(2, 3, 4, 5)  # NCHW
    np.testing.assert_array_equal(x.transpose(permutation("NCHW", "NHWC")), np.moveaxis(x, 1, -1))
