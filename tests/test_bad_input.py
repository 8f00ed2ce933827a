"""Bad input: an error naming the op, the offending value and what is supported."""

import pytest
import tvm

import topi_accel
from tests.helpers import conv2d_module, matmul_module, rand

# (data shape, kernel shape OHWI, kwargs, words the message must contain)
CONV_CASES = [
    ((8, 8, 3), (4, 3, 3, 3), {}, ["conv2d_nhwc_ohwi", "rank 3", "4-D NHWC"]),
    ((1, 8, 8, 3), (4, 3, 3), {}, ["conv2d_nhwc_ohwi", "rank 3", "4-D OHWI"]),
    ((1, 8, 8, 8), (4, 3, 3, 3), {}, ["conv2d_nhwc_ohwi", "in_channels 3 x groups 1 != data channels 8"]),
    ((1, 8, 8, 6), (4, 3, 3, 2), {"groups": 4}, ["conv2d_nhwc_ohwi", "groups=4", "in_channels=6"]),
    ((1, 8, 8, 4), (4, 3, 3, 4), {"dtype": "int8"}, ["conv2d_nhwc_ohwi", "int8", "float32"]),
    ((1, 8, 8, 4), (4, 3, 3, 4), {"strides": 0}, ["conv2d_nhwc_ohwi", "strides=(0, 0)", "positive"]),
    ((1, 8, 8, 4), (4, 3, 3, 4), {"padding": (1, 2, 3)}, ["conv2d_nhwc_ohwi", "padding=(1, 2, 3)", "1, 2 or 4"]),
    ((1, 2, 2, 4), (4, 3, 3, 4), {}, ["conv2d_nhwc_ohwi", "empty", "2x2"]),
]


@pytest.mark.parametrize("data_shape,kernel_shape,kwargs,words", CONV_CASES, ids=lambda v: str(v)[:30])
def test_conv2d_bad_input(data_shape, kernel_shape, kwargs, words):
    with pytest.raises(ValueError) as err:
        topi_accel.conv2d_geometry(data_shape, kernel_shape, **kwargs)
    for word in words:
        assert word in str(err.value)


DENSE_CASES = [
    ((2, 3, 4), (4, 5), {}, ["dense_kn", "rank 3", "2-D"]),
    ((2, 4), (4, 5, 1), {}, ["dense_kn", "rank 3", "[in, out]"]),
    ((2, 4), (3, 5), {}, ["dense_kn", "in_features 4 != weight rows 3"]),
    ((2, 4), (4, 5), {"dtype": "float16"}, ["dense_kn", "float16", "float32"]),
]


@pytest.mark.parametrize("data_shape,weight_shape,kwargs,words", DENSE_CASES, ids=lambda v: str(v)[:30])
def test_dense_bad_input(data_shape, weight_shape, kwargs, words):
    with pytest.raises(ValueError) as err:
        topi_accel.check_dense(data_shape, weight_shape, **kwargs)
    for word in words:
        assert word in str(err.value)


def test_packed_kernel_of_wrong_shape_is_rejected():
    with tvm.target.Target("accel"):
        geo = topi_accel.conv2d_geometry((1, 8, 8, 4), (16, 3, 3, 4))
        cfg = topi_accel.conv2d_config(geo)
    data = tvm.te.placeholder((1, 8, 8, 4))
    with pytest.raises(ValueError, match=r"packed kernel shape \[16, 3, 3, 4\]"):
        topi_accel.conv2d_nhwc_ohwi(data, tvm.te.placeholder((16, 3, 3, 4)), geo, cfg)


def test_target_without_llvm_kind_is_rejected():
    with pytest.raises(ValueError, match="not an LLVM CPU target"):
        topi_accel.cpu_knobs(tvm.target.Target("c"))


# Through tvm.compile: Relax checks most of it when the graph is built; the
# strategy checks the rest. Either way a ValueError that says what is wrong.
MODEL_CASES = [
    (
        lambda: conv2d_module(rand(1, 8, 8, 8), rand(4, 3, 3, 3), True),
        ["channel size", "data channel size is T.int64(8)"],
    ),
    (lambda: conv2d_module(rand(1, 6, 8, 8), rand(4, 2, 3, 3), True, groups=4), ["channel size", "groups"]),
    (lambda: conv2d_module(rand(1, 8, 8), rand(4, 8, 3, 3), True), ["relax.nn.conv2d"]),
    (lambda: conv2d_module(rand(1, 8, 8, 8), rand(4, 8, 3, 3), True, data_layout="NCWX"), ["relax.nn.conv2d"]),
    (lambda: conv2d_module(rand(1, 8, 2, 2), rand(4, 8, 3, 3), True), ["conv2d_nhwc_ohwi", "empty"]),
    (lambda: matmul_module(rand(2, 5), rand(4, 3), True), ["reduction dimensions of T.int64(5) and T.int64(4)"]),
]


@pytest.mark.parametrize("make,words", MODEL_CASES, ids=range(len(MODEL_CASES)))
def test_bad_model_through_compile(make, words):
    with pytest.raises(ValueError) as err:
        tvm.compile(make(), target="accel")
    for word in words:
        assert word in str(err.value)


def test_grouped_conv_with_padding_channel_block_is_rejected():
    with tvm.target.Target("accel"):
        geo = topi_accel.conv2d_geometry((1, 8, 8, 24), (24, 3, 3, 1), 1, 1, groups=24)
    cfg = topi_accel.Conv2DConfig(oc_block=16, ow_block=4, lanes=16)  # 16 does not divide 24
    data = tvm.te.placeholder((1, 8, 8, 24))
    with pytest.raises(ValueError, match="oc_block=16 must divide out_channels=24 when groups=24"):
        topi_accel.conv2d_nhwc_ohwi(data, tvm.te.placeholder((2, 3, 3, 1, 16)), geo, cfg)
