"""conv2d_winograd against tvm.topi.testing.conv2d_nhwc_python: both tiles, tails, padding, targets."""

from dataclasses import replace

import numpy as np
import pytest
import tvm

import topi_accel
from tests.helpers import ISAS, assert_close, conv2d_reference, isa_params, rand, run_primfunc

# (batch, height, width, in_c, out_c, padding): 3x3, stride 1
SHAPES = [
    (1, 56, 56, 64, 64, 1),  # ResNet-50 stage 1
    (1, 14, 14, 256, 256, 1),  # stage 3
    # tails: outputs that are not whole tiles, batch > 1, O not a multiple of two vectors
    (2, 15, 13, 16, 48, 1),
    (1, 9, 30, 32, 16, 1),
    # no padding, and asymmetric padding (top, left, bottom, right)
    (1, 18, 18, 16, 32, 0),
    (1, 16, 17, 32, 32, (0, 1, 2, 1)),
]
# every ISA's tiles (those this host can run) and single-threaded kernels: the other schedule paths
TARGETS = [*isa_params(), {"tag": "accel", "num-cores": 1}]


def _run(shape, tile, target="accel"):
    n, h, w, c, o, padding = shape
    x, wt = rand(n, h, w, c), rand(o, 3, 3, c)
    with tvm.target.Target(target):
        geo = topi_accel.conv2d_geometry(x.shape, wt.shape, 1, padding)
        cfg = replace(topi_accel.winograd_config(geo), tile=tile)
        func = topi_accel.conv2d_winograd_func(geo, cfg)
    out = run_primfunc(func, [x, topi_accel.transform_kernel(wt, cfg)], (n, geo.out_h, geo.out_w, o), target)
    return out, conv2d_reference(x, wt, geo.stride, geo.pad, geo.dilation, 1)


@pytest.mark.parametrize("tile", [2, 4])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_conv2d_winograd(shape, tile):
    out, ref = _run(shape, tile)
    assert_close(out, ref)


@pytest.mark.parametrize("target", TARGETS, ids=str)
@pytest.mark.parametrize("tile", [2, 4])
def test_conv2d_winograd_target_variants(target, tile):
    out, ref = _run(SHAPES[2], tile, target)
    assert_close(out, ref)


def test_transformed_kernel_matches_definition():
    """U = G g G^T for every (out, in) channel pair, packed [alpha^2, O/nb, I, nb]."""
    wt = rand(32, 3, 3, 16)
    with tvm.target.Target("accel"):
        cfg = replace(topi_accel.winograd_config(topi_accel.conv2d_geometry((1, 8, 8, 16), wt.shape, 1, 1)), tile=2)
    packed = topi_accel.transform_kernel(wt, cfg)
    g = np.array([[1, 0, 0], [0.5, -0.5, 0.5], [0.5, 0.5, 0.5], [0, 0, 1]])  # F(2x2, 3x3), TVM's point order
    o, i = 5, 7
    expected = g @ wt[o, :, :, i].astype(np.float64) @ g.T
    got = packed[:, o // cfg.n_block, i, o % cfg.n_block].reshape(4, 4)
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "data, kernel, kwargs, reason",
    [
        ((1, 56, 56, 64), (64, 1, 1, 64), {}, "kernel 1x1 is not 3x3"),
        ((1, 56, 56, 64), (64, 3, 3, 64), {"strides": 2, "padding": 1}, "strides (2, 2)"),
        ((1, 56, 56, 64), (64, 3, 3, 16), {"padding": 1, "groups": 4}, "groups=4"),
        ((1, 56, 56, 10), (64, 3, 3, 10), {"padding": 1}, "channels 10->64 are not multiples of {lanes}"),
        ((1, 7, 7, 512), (512, 3, 3, 512), {"padding": 1}, "output 1x7x7 has fewer than 98 pixels"),
    ],
)
@pytest.mark.parametrize("isa", ISAS)
def test_winograd_condition_names_what_it_does_not_take(isa, data, kernel, kwargs, reason):
    lanes = {"avx512": 16, "avx2": 8, "sse": 4}[isa]
    with tvm.target.Target(ISAS[isa]):
        geo = topi_accel.conv2d_geometry(data, kernel, **kwargs)
        assert reason.format(lanes=lanes) in topi_accel.winograd_condition(geo)


@pytest.mark.parametrize("isa", ISAS)
def test_winograd_condition_takes_a_resnet_3x3(isa):
    with tvm.target.Target(ISAS[isa]):
        assert topi_accel.winograd_condition(topi_accel.conv2d_geometry((1, 28, 28, 64), (64, 3, 3, 64), 1, 1)) is None
        # 24 channels are whole 256-bit vectors, not whole 512-bit ones
        geo = topi_accel.conv2d_geometry((1, 28, 28, 24), (24, 3, 3, 24), 1, 1)
        assert (topi_accel.winograd_condition(geo) is None) == (isa != "avx512")


@pytest.mark.parametrize(
    "batch, size, tile",
    [(1, 7, None), (2, 7, 2), (4, 7, 2), (8, 7, 4), (1, 14, 2), (2, 14, 4), (8, 14, 4), (1, 28, 4)],
)
@pytest.mark.parametrize("isa", ISAS)
def test_winograd_tile_counts_the_whole_batch(isa, batch, size, tile):
    # the transformed weights are read once per call: a batch of 7x7 outputs serves them as
    # many tiles as one larger image (measured in TILE_BY_OUTPUT_PIXELS's comment)
    with tvm.target.Target(ISAS[isa]):
        geo = topi_accel.conv2d_geometry((batch, size, size, 64), (64, 3, 3, 64), 1, 1)
        assert (topi_accel.winograd_condition(geo) is None) == (tile is not None)
        assert topi_accel.winograd.winograd_tile(geo) == tile
        if tile is not None:
            assert topi_accel.winograd_config(geo).tile == tile


def test_transform_kernel_rejects_other_kernels():
    with tvm.target.Target("accel"):
        cfg = topi_accel.winograd_config(topi_accel.conv2d_geometry((1, 28, 28, 32), (32, 3, 3, 32), 1, 1))
    with pytest.raises(ValueError, match=r"conv2d_winograd: kernel \[32, 5, 5, 32\] is not OHWI 3x3"):
        topi_accel.transform_kernel(rand(32, 5, 5, 32), cfg)


def test_compute_rejects_convs_it_cannot_do():
    with tvm.target.Target("accel"):
        geo = topi_accel.conv2d_geometry((1, 16, 16, 16), (16, 3, 3, 16), 2, 1)
        cfg = topi_accel.winograd_config(geo)
    data = tvm.te.placeholder((1, 16, 16, 16), name="data")
    kernel = tvm.te.placeholder((cfg.alpha**2, 1, 16, 16), name="kernel")
    with pytest.raises(ValueError, match=r"conv2d_winograd: .*strides \(2, 2\).*supported: 3x3, strides \(1, 1\)"):
        topi_accel.conv2d_winograd(data, kernel, geo, cfg)
