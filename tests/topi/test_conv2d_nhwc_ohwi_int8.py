"""conv2d_nhwc_ohwi_int8 against a numpy integer convolution (exact int32), per ISA."""

import numpy as np
import pytest
import tvm

from tests.helpers import ISAS, compile_primfunc, isa_params, pack, run_compiled
from tests.topi.test_dense_kn_int8 import AMX_ISAS, VNNI_ISAS, all_isa_params, int_data, run_int8
from topi_accel import conv2d_int8


def conv_reference(x, w, strides, padding, dilation, groups):
    """NHWC x OHWI in int64 with numpy: windows of the zero-padded input times the kernel.

    padding: (top, left, bottom, right); groups: 1 or depthwise (groups = channels)."""
    (sh, sw), (dh, dw), (pt, pl, pb, pr) = strides, dilation, padding
    o, kh, kw, _ = w.shape
    xp = np.pad(x.astype(np.int64), ((0, 0), (pt, pb), (pl, pr), (0, 0)))
    oh = (xp.shape[1] - dh * (kh - 1) - 1) // sh + 1
    ow = (xp.shape[2] - dw * (kw - 1) - 1) // sw + 1
    taps = [
        xp[:, i * dh : i * dh + sh * (oh - 1) + 1 : sh, j * dw : j * dw + sw * (ow - 1) + 1 : sw, :]
        for i in range(kh)
        for j in range(kw)
    ]
    cols = np.stack(taps, axis=3)  # [N, OH, OW, KH*KW, C]
    wk = w.astype(np.int64).reshape(o, kh * kw, -1)
    if groups == 1:
        return np.einsum("nhwtc,otc->nhwo", cols, wk)
    mult = o // x.shape[3]
    return np.einsum("nhwtc,ctm->nhwcm", cols, wk[:, :, 0].reshape(-1, mult, kh * kw).transpose(0, 2, 1)).reshape(
        *cols.shape[:3], o
    )


CASES = [
    # (data NHWC, kernel OHWI, strides, padding (top, left, bottom, right), dilation, groups)
    # ResNet-50: stem, 3x3 and 1x1 layers, the stride-2 projection
    ((1, 224, 224, 3), (64, 7, 7, 3), (2, 2), (3, 3, 3, 3), (1, 1), 1),
    ((1, 56, 56, 64), (64, 3, 3, 64), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    ((1, 56, 56, 64), (256, 1, 1, 64), (1, 1), (0, 0, 0, 0), (1, 1), 1),
    ((1, 14, 14, 1024), (256, 1, 1, 1024), (1, 1), (0, 0, 0, 0), (1, 1), 1),
    ((1, 28, 28, 256), (512, 1, 1, 256), (2, 2), (0, 0, 0, 0), (1, 1), 1),
    ((1, 7, 7, 512), (512, 3, 3, 512), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    # MobileNetV2: depthwise (stride 1 and 2), pointwise expansion and projection
    ((1, 112, 112, 32), (32, 3, 3, 1), (1, 1), (1, 1, 1, 1), (1, 1), 32),
    ((1, 56, 56, 144), (144, 3, 3, 1), (2, 2), (0, 0, 1, 1), (1, 1), 144),
    ((1, 56, 56, 24), (144, 1, 1, 24), (1, 1), (0, 0, 0, 0), (1, 1), 1),
    ((1, 7, 7, 960), (320, 1, 1, 960), (1, 1), (0, 0, 0, 0), (1, 1), 1),
    # odd channels, batch 2, asymmetric padding, dilation, a channel multiplier
    ((1, 9, 9, 13), (20, 3, 3, 13), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    ((2, 7, 9, 3), (5, 3, 2, 3), (2, 1), (1, 0, 2, 1), (2, 1), 1),
    ((1, 8, 8, 7), (7, 3, 3, 1), (1, 1), (2, 2, 2, 2), (2, 2), 7),
    ((1, 8, 8, 4), (8, 3, 3, 1), (1, 1), (1, 1, 1, 1), (1, 1), 4),
    # AMX tiles: batch 2, stride 2, asymmetric padding, 40 channels out (a tail); dilation 2
    ((2, 9, 11, 128), (40, 3, 3, 128), (2, 2), (1, 0, 2, 1), (1, 1), 1),
    ((1, 10, 10, 64), (32, 3, 3, 64), (1, 1), (2, 2, 2, 2), (2, 2), 1),
]


def conv_inputs(x, w, geo, cfg):
    """The kernel's inputs: data, packed kernel and (int8 data on vpdpbusd or vpmaddubsw) the compensation."""
    inputs = [x, pack(w, conv2d_int8.kernel_pack_map_int8(geo, cfg))]
    if conv2d_int8.takes_compensation(geo, cfg, str(x.dtype)):
        inputs.append(conv2d_int8.compensation(w))
    return inputs


def run_conv(x, w, strides, padding, dilation, groups, target):
    geo = conv2d_int8.conv2d_int8_geometry(x.shape, w.shape, strides, padding, dilation, groups, str(x.dtype))
    with tvm.target.Target(target):
        cfg = conv2d_int8.conv2d_int8_config(geo)
    func = conv2d_int8.conv2d_nhwc_ohwi_int8_func(geo, cfg, str(x.dtype))
    return run_int8(func, conv_inputs(x, w, geo, cfg), (geo.batch, geo.out_h, geo.out_w, geo.out_c), target)


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
@pytest.mark.parametrize("target", all_isa_params())
@pytest.mark.parametrize("shape, kernel, strides, padding, dilation, groups", CASES, ids=str)
def test_conv2d_nhwc_ohwi_int8(shape, kernel, strides, padding, dilation, groups, target, dtype):
    rng = np.random.default_rng(sum(shape) + sum(kernel))
    x, w = int_data(shape, dtype, rng), int_data(kernel, "int8", rng)
    out = run_conv(x, w, strides, padding, dilation, groups, target)
    np.testing.assert_array_equal(out, conv_reference(x, w, strides, padding, dilation, groups))


def test_conv2d_nhwc_ohwi_int8_single_core():
    rng = np.random.default_rng(3)
    x, w = int_data((1, 10, 10, 16), "uint8", rng), int_data((32, 3, 3, 16), "int8", rng)
    out = run_conv(x, w, (1, 1), (1, 1, 1, 1), (1, 1), 1, {"tag": "accel", "num-cores": 1})
    np.testing.assert_array_equal(out, conv_reference(x, w, (1, 1), (1, 1, 1, 1), (1, 1), 1))


@pytest.mark.parametrize("target", all_isa_params())
@pytest.mark.parametrize(
    "shape, kernel, padding",
    [((1, 14, 14, 1024), (256, 1, 1, 1024), (0, 0, 0, 0)), ((2, 10, 10, 64), (32, 3, 3, 64), (1, 1, 1, 1))],
    ids=str,
)
def test_conv2d_int8_rows_in_a_chunk_per_thread(shape, kernel, padding, target):
    """A small kernel's channel blocks outermost, its rows in a chunk per thread (2 threads;
    a 256 KB kernel, and batch 2 on AMX where the target has it), exact."""
    target = {**target, "num-cores": 2}
    geo = conv2d_int8.conv2d_int8_geometry(shape, kernel, 1, padding)
    with tvm.target.Target(target):
        cfg = conv2d_int8.conv2d_int8_config(geo)
    assert cfg.channels_outer and cfg.row_chunks == 2
    rng = np.random.default_rng(5)
    x, w = int_data(shape, "uint8", rng), int_data(kernel, "int8", rng)
    out = run_conv(x, w, (1, 1), padding, (1, 1), 1, target)
    np.testing.assert_array_equal(out, conv_reference(x, w, (1, 1), padding, (1, 1), 1))


@pytest.mark.parametrize("isa", [*ISAS, *VNNI_ISAS])
def test_conv2d_int8_code_uses_the_instruction(isa):
    """vpdpbusd on VNNI targets, vpmaddwd elsewhere, never vpmaddubsw for full-range weights
    (its int16 pair sums would saturate)."""
    target = tvm.target.Target({**ISAS, **VNNI_ISAS}[isa])
    geo = conv2d_int8.conv2d_int8_geometry((1, 8, 8, 32), (32, 3, 3, 32), 1, 1)
    with target:
        cfg = conv2d_int8.conv2d_int8_config(geo)
    asm = tvm.tirx.build(
        tvm.IRModule({"main": conv2d_int8.conv2d_nhwc_ohwi_int8_func(geo, cfg)}), target
    ).inspect_source("asm")
    assert ("vpdpbusd" if "vnni" in isa else "pmaddwd") in asm
    assert "pmaddubsw" not in asm


# (data, kernel, stride) -> (output columns per AMX data tile, output rows per step); (0, 1): vpdpbusd
AMX_CONVS = [
    ((1, 14, 14, 256), (256, 3, 3, 256), 1, (14, 2)),  # a row per tile, two rows per step
    ((1, 56, 56, 256), (64, 1, 1, 256), 1, (14, 1)),  # two tiles along a row of 56: 14 + 14
    ((1, 28, 28, 256), (512, 1, 1, 256), 2, (14, 2)),
    ((1, 7, 7, 2048), (512, 1, 1, 2048), 1, (7, 2)),
    ((1, 56, 56, 64), (256, 1, 1, 64), 1, (0, 1)),  # one tile row of reduction
    ((1, 14, 14, 96), (576, 1, 1, 96), 1, (0, 1)),  # channels not whole tile rows
    ((1, 7, 7, 512), (64, 1, 1, 512), 2, (0, 1)),  # a 1x1 on 4-column tiles
    ((1, 56, 56, 64), (64, 3, 3, 64), 1, (14, 1)),
    ((1, 28, 28, 64), (64, 3, 3, 1), 1, (0, 1)),  # depthwise
]


@pytest.mark.parametrize("isa", ["amx", "avx512vnni"])
@pytest.mark.parametrize("shape, kernel, stride, rows", AMX_CONVS, ids=str)
def test_conv2d_int8_takes_amx_tiles_where_they_pay(shape, kernel, stride, rows, isa):
    """On AMX targets the convs `_takes_amx` picks run tdpbusd (compiled, on any host); the
    others, and every conv on a VNNI target, vpdpbusd."""
    target = tvm.target.Target({**VNNI_ISAS, **AMX_ISAS}[isa])
    groups = shape[3] if kernel[3] == 1 else 1
    geo = conv2d_int8.conv2d_int8_geometry(shape, kernel, stride, kernel[1] // 2, 1, groups)
    with target:
        cfg = conv2d_int8.conv2d_int8_config(geo)
    expected = rows if isa == "amx" else (0, 1)
    assert (cfg.amx_rows, cfg.oh_block) == expected
    if kernel[1] == 3 and groups == 1:  # compile one of each kind
        asm = compile_primfunc(conv2d_int8.conv2d_nhwc_ohwi_int8_func(geo, cfg), target).mod.inspect_source("asm")
        assert ("tdpbusd" in asm) == bool(expected[0])


# output columns of a 32-channel register tile (14x14x256 3x3): vpdpbusd with 32 registers keeps
# 28 accumulators (only the data broadcast and two weight vectors beside them); vpmaddwd keeps
# the float budget (24 on AVX-512, 12 on 16 registers), avxvnni has 16 registers (16-channel tiles)
TILE_COLUMNS = {"avx512vnni": (32, 14), "avx512": (32, 7), "avxvnni": (16, 6), "avx2": (16, 6)}


@pytest.mark.parametrize("isa", sorted(TILE_COLUMNS))
def test_conv2d_int8_tile_follows_the_instruction_and_registers(isa):
    target = tvm.target.Target({**ISAS, **VNNI_ISAS}[isa])
    geo = conv2d_int8.conv2d_int8_geometry((1, 14, 14, 256), (256, 3, 3, 256), 1, 1)
    with target:
        cfg = conv2d_int8.conv2d_int8_config(geo)
    assert (cfg.oc_block, cfg.ow_block) == TILE_COLUMNS[isa]


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
@pytest.mark.parametrize("target", isa_params("avx512", "avx2"))
def test_conv2d_int8_narrow_weights_take_vpmaddubsw_exactly(target, dtype):
    """7-bit weights ([-64, 64]) on a CPU without VNNI: vpmaddubsw, exact with the extremes
    (data 255 or -128 against weights -64 and 64, padding included)."""
    rng = np.random.default_rng(5)
    x, w = int_data((1, 9, 9, 13), dtype, rng), rng.integers(-64, 65, (20, 3, 3, 13)).astype("int8")
    x[0, :3] = 255 if dtype == "uint8" else -128
    w[:2] = 64
    w[2:4] = -64
    geo = conv2d_int8.conv2d_int8_geometry(x.shape, w.shape, 1, 1, 1, 1, dtype)
    with tvm.target.Target(target):
        cfg = conv2d_int8.conv2d_int8_config(geo, narrow=True)
    assert cfg.dot.scheme == "maddubs"
    lib = compile_primfunc(conv2d_int8.conv2d_nhwc_ohwi_int8_func(geo, cfg, dtype), target)
    assert "vpmaddubsw" in lib.mod.inspect_source("asm")
    out = run_compiled(lib, conv_inputs(x, w, geo, cfg), (1, 9, 9, 20), dtype="int32")
    np.testing.assert_array_equal(out, conv_reference(x, w, (1, 1), (1, 1, 1, 1), (1, 1), 1))


def test_conv2d_int8_rejects_bad_input():
    with pytest.raises(
        ValueError, match=r"conv2d_nhwc_ohwi_int8: groups=2 is not supported; supported: 1 and depthwise"
    ):
        conv2d_int8.conv2d_int8_geometry((1, 8, 8, 4), (4, 3, 3, 2), groups=2)
    with pytest.raises(ValueError, match=r"conv2d_nhwc_ohwi_int8: data dtype float32 is not supported"):
        conv2d_int8.conv2d_int8_geometry((1, 8, 8, 4), (4, 3, 3, 4), data_dtype="float32")
    with pytest.raises(ValueError, match=r"conv2d_nhwc_ohwi_int8: kernel in_channels 3 x groups 1 != data channels 4"):
        conv2d_int8.conv2d_int8_geometry((1, 8, 8, 4), (4, 3, 3, 3))
