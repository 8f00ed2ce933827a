"""conv1d_nwc_owi (the conv2d_nhwc_ohwi kernel at H = 1) against torch.nn.functional.conv1d."""

import math
from dataclasses import replace

import numpy as np
import pytest
import torch
import tvm

import topi_accel
from tests.helpers import assert_close, pack, rand, run_primfunc

# (batch, width, in_c, out_c, kernel, stride, padding, dilation, groups)
SHAPES = [
    # Whisper's stem: k3 pad 1, then stride 2
    (1, 100, 16, 64, 3, 1, 1, 1, 1),
    (1, 100, 64, 64, 3, 2, 1, 1, 1),
    # wav2vec2's feature extractor: one input channel, k10 stride 5; k3 and k2 stride 2
    (1, 4000, 1, 32, 10, 5, 0, 1, 1),
    (1, 799, 32, 32, 3, 2, 0, 1, 1),
    (1, 99, 512, 512, 2, 2, 0, 1, 1),
    # wav2vec2's positional conv: groups 16, kernel 128, padding 64 (and at base size: 768 channels)
    (2, 30, 64, 64, 128, 1, 64, 1, 16),
    (1, 49, 768, 768, 128, 1, 64, 1, 16),
    # asymmetric padding (left, right)
    (1, 50, 8, 24, 3, 2, (0, 2), 1, 1),
    (1, 31, 5, 7, 5, 1, (3, 1), 1, 1),
    # dilation
    (1, 40, 8, 16, 3, 1, 2, 2, 1),
    (2, 33, 6, 12, 3, 2, 0, 3, 3),
    # groups, including depthwise (groups == channels)
    (1, 20, 12, 24, 3, 1, 1, 1, 4),
    (1, 64, 32, 32, 3, 1, 1, 1, 32),
    (2, 37, 12, 12, 5, 1, 2, 2, 12),
    # tails: odd channels and widths, O not a multiple of the vector, kernel as wide as the input
    (3, 23, 33, 17, 3, 2, 1, 1, 1),
    (2, 13, 3, 1000, 1, 1, 0, 1, 1),
    (1, 7, 9, 5, 7, 1, 3, 1, 1),
    (1, 1, 4, 8, 1, 1, 0, 1, 1),
]

TARGETS = [
    {"tag": "accel", "mattr": ["-avx512f"]},  # 256-bit vectors (AVX2 tiles)
    {"tag": "accel", "num-cores": 1},  # single-threaded kernels: no column-parallel loop
]


def _reference(x_nwc, w_owi, stride, padding, dilation, groups):
    """torch's NCW conv1d of NWC data and OWI weights, returned as NWC."""
    left, right = (padding, padding) if isinstance(padding, int) else padding
    x = torch.nn.functional.pad(torch.from_numpy(x_nwc.transpose(0, 2, 1)), (left, right))
    w = torch.from_numpy(np.ascontiguousarray(w_owi.transpose(0, 2, 1)))
    out = torch.nn.functional.conv1d(x, w, stride=stride, dilation=dilation, groups=groups)
    return out.numpy().transpose(0, 2, 1)


def _run(shape, target="accel", **config):
    n, w, c, o, k, stride, padding, dilation, groups = shape
    x, wt = rand(n, w, c), rand(o, k, c // groups)
    target = tvm.target.Target(target)
    with target:
        geo = topi_accel.conv1d_geometry(x.shape, wt.shape, stride, padding, dilation, groups)
        cfg = replace(topi_accel.conv1d_config(geo), **config)
    packed = pack(wt, topi_accel.conv1d_kernel_pack_map(cfg))
    out = run_primfunc(topi_accel.conv1d_nwc_owi_func(geo, cfg), [x, packed], (n, geo.out_w, o), target)
    return out, _reference(x, wt, stride, padding, dilation, groups), cfg


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_conv1d_nwc_owi(shape):
    out, ref, _ = _run(shape)
    assert_close(out, ref)


@pytest.mark.parametrize("target", TARGETS, ids=str)
@pytest.mark.parametrize("shape", [SHAPES[0], SHAPES[5], SHAPES[13], SHAPES[15]], ids=str)
def test_conv1d_nwc_owi_target_variants(shape, target):
    out, ref, cfg = _run(shape, target)
    assert_close(out, ref)
    if "mattr" in target:
        _, _, c, o, _, _, _, _, groups = shape
        per_group = o // groups  # no vector spans two groups (depthwise aside: lane o reads channel o)
        assert cfg.lanes == (8 if groups == 1 or per_group == c // groups == 1 else math.gcd(per_group, 8))
    else:
        assert not cfg.parallel and not cfg.columns_parallel


# every loop order x column-parallel or not x channel block, strided with a padded copy of
# the input, and grouped with kernel 128 (the positional conv's loop nest)
@pytest.mark.parametrize("columns_parallel", [True, False])
@pytest.mark.parametrize("channels_outer", [True, False])
@pytest.mark.parametrize(
    "shape, oc_block",
    [
        ((1, 45, 8, 50, 3, 2, 1, 1, 1), 16),
        ((1, 45, 8, 50, 3, 2, 1, 1, 1), 48),
        ((1, 20, 64, 64, 128, 1, 64, 1, 16), 16),
    ],
    ids=str,
)
def test_conv1d_every_schedule_path(shape, oc_block, channels_outer, columns_parallel):
    out, ref, _ = _run(
        shape, oc_block=oc_block, ow_block=4, channels_outer=channels_outer, columns_parallel=columns_parallel
    )
    assert_close(out, ref)


def _config(shape, target="accel"):
    n, w, c, o, k, stride, padding, dilation, groups = shape
    with tvm.target.Target(target):
        return topi_accel.conv1d_config(
            topi_accel.conv1d_geometry((n, w, c), (o, k, c // groups), stride, padding, dilation, groups)
        )


def test_conv1d_config_heuristic():
    # batch 1 with the channel block inner: one row, so the column tiles are what the threads share
    assert _config(SHAPES[2]).columns_parallel
    # the positional conv's 19 MB grouped kernel: each channel block's panel serves every column
    # (channels inner would read the whole kernel once per column tile)
    positional = _config(SHAPES[6])
    assert positional.channels_outer and not positional.columns_parallel  # 48 channel blocks to share
    assert positional.oc_block % positional.lanes == 0
    # depthwise kernels stay small: channel block inner
    assert not _config(SHAPES[12]).channels_outer
    # one core: nothing to share
    assert not _config(SHAPES[2], {"tag": "accel", "num-cores": 1}).columns_parallel
    # the register tile runs along the long W axis: as many columns as the accumulators allow
    cfg = _config(SHAPES[3])
    assert cfg.ow_block * (cfg.oc_block // cfg.lanes) >= 6


def test_conv1d_kernel_takes_3d_tensors_and_is_parallel():
    with tvm.target.Target("accel"):
        geo = topi_accel.conv1d_geometry((1, 100, 16), (64, 3, 16), 1, 1)
        cfg = topi_accel.conv1d_config(geo)
    func = topi_accel.conv1d_nwc_owi_func(geo, cfg)
    shapes = [[int(d) for d in p.ty.shape] for p in func.params]
    assert shapes == [[1, 100, 16], [64 // cfg.oc_block, 3, 16, cfg.oc_block], [1, 100, 64]]
    text = func.script()
    assert "T.parallel" in text and "T.vectorized" in text and 'scope="local"' in text
    # the write-back block keeps conv2d's name: epilogues and the report find it
    assert 'T.sblock("conv2d_nhwc_ohwi")' in text


@pytest.mark.parametrize(
    "data, kernel, attrs, message",
    [
        ((1, 8, 10, 4), (4, 3, 4), {}, "data has rank 4"),
        ((1, 10, 4), (4, 1, 3, 4), {}, "kernel has rank 4"),
        ((1, 10, 6), (4, 3, 4), {"groups": 1}, "kernel in_channels 4 x groups 1 != data channels 6"),
        ((1, 10, 6), (4, 3, 2), {"groups": 3}, "groups=3 must be >= 1 and divide"),
        ((1, 10, 4), (4, 3, 4), {"padding": (1, 2, 3)}, "padding=(1, 2, 3) is not supported"),
        ((1, 10, 4), (4, 3, 4), {"padding": -1}, "padding=-1 is not supported"),
        ((1, 10, 4), (4, 3, 4), {"strides": 0}, "strides=0 is not supported; expected an int >= 1"),
        ((1, 10, 4), (4, 3, 4), {"dilation": (1, 2)}, "dilation=(1, 2) is not supported"),
        ((1, 4, 4), (4, 7, 4), {}, "output size 1x-2 is empty"),
    ],
)
def test_conv1d_geometry_errors_name_op_and_value(data, kernel, attrs, message):
    with pytest.raises(ValueError) as err:
        topi_accel.conv1d_geometry(data, kernel, **attrs)
    assert str(err.value).startswith("conv1d_nwc_owi: ") and message in str(err.value)
