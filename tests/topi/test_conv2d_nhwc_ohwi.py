"""conv2d_nhwc_ohwi against tvm.topi.testing.conv2d_nhwc_python."""

from dataclasses import replace

import pytest
import torch
import tvm

import accel_target
import topi_accel
from tests.helpers import (
    ISAS,
    assert_close,
    compile_primfunc,
    conv2d_reference,
    isa_params,
    pack,
    rand,
    run_compiled,
    run_executable,
    run_primfunc,
    runs_here,
)
from topi_accel.knobs import ceil_div, round_up

# (batch, height, width, in_c, out_c, kernel, stride, padding, dilation, groups)
SHAPES = [
    # ResNet-50: stem, 3x3 of each stage, strided 1x1 shortcut
    (1, 224, 224, 3, 64, 7, 2, 3, 1, 1),
    (1, 56, 56, 64, 64, 3, 1, 1, 1, 1),
    (1, 14, 14, 256, 256, 3, 1, 1, 1, 1),
    (1, 7, 7, 512, 512, 3, 1, 1, 1, 1),
    (1, 56, 56, 256, 512, 1, 2, 0, 1, 1),
    # 1x1 over many channels, at 7x7 and with a column tail
    (1, 7, 7, 512, 128, 1, 1, 0, 1, 1),
    (1, 9, 9, 256, 64, 1, 1, 0, 1, 1),
    # tails: odd channels and widths, O not a multiple of the vector
    (1, 17, 19, 5, 7, 3, 1, 1, 1, 1),
    (2, 13, 11, 3, 1000, 1, 1, 0, 1, 1),
    (3, 9, 23, 33, 17, 3, 2, 1, 1, 1),
    # asymmetric padding (top, left, bottom, right), non-square kernels via stride
    (1, 16, 15, 8, 24, 3, 2, (0, 1, 2, 1), 1, 1),
    (1, 10, 10, 16, 16, 5, 1, (2, 0, 1, 3), 1, 1),
    # dilation
    (1, 20, 18, 8, 16, 3, 1, 2, 2, 1),
    (2, 15, 15, 6, 12, 3, 1, 0, (2, 3), 1),
    # groups, including depthwise (groups == channels) and MobileNetV2 depthwise
    (1, 17, 19, 6, 9, 3, 1, 2, 2, 3),
    (1, 12, 12, 32, 64, 3, 1, 1, 1, 4),
    (1, 28, 28, 32, 32, 3, 2, 1, 1, 32),
    (2, 14, 14, 144, 144, 3, 1, 1, 1, 144),
    (1, 9, 9, 7, 7, 3, 1, 1, 1, 7),
]

# float32 lanes of each ISA's vectors
LANES = {"avx512": 16, "avx2": 8, "sse": 4}


def _run(shape, target, **config):
    n, h, w, c, o, k, stride, padding, dilation, groups = shape
    x, wt = rand(n, h, w, c), rand(o, k, k, c // groups)
    target = tvm.target.Target(target)
    with target:
        geo = topi_accel.conv2d_geometry(x.shape, wt.shape, stride, padding, dilation, groups)
        cfg = replace(topi_accel.conv2d_config(geo), **config)
    packed = pack(wt, topi_accel.kernel_pack_map(cfg))
    out = run_primfunc(topi_accel.conv2d_nhwc_ohwi_func(geo, cfg), [x, packed], (n, geo.out_h, geo.out_w, o), target)
    return out, conv2d_reference(x, wt, geo.stride, geo.pad, geo.dilation, groups), cfg


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_conv2d_nhwc_ohwi(shape):
    out, ref, _ = _run(shape, "accel")
    assert_close(out, ref)


# every ISA's tiles (those this host can run) and single-threaded kernels: the other schedule paths
@pytest.mark.parametrize("target", [*isa_params(), {"tag": "accel", "num-cores": 1}], ids=str)
@pytest.mark.parametrize("shape", [SHAPES[1], SHAPES[2], SHAPES[5], SHAPES[8], SHAPES[14]], ids=str)
def test_conv2d_nhwc_ohwi_target_variants(shape, target):
    out, ref, cfg = _run(shape, target)
    assert_close(out, ref)
    isa = next((name for name, pinned in ISAS.items() if pinned == target), None)
    c, o, groups = shape[3], shape[4], shape[-1]
    grouped = groups > 1 and not o == c == groups  # (its vectors: test_grouped_conv_vectors_stay_in_a_group)
    if isa:
        assert (grouped or cfg.lanes == LANES[isa]) and cfg.parallel
    else:
        assert not cfg.parallel


# grouped convs of 8, 4, 2 and 1 output channels a group (RegNet: 8; 1 with 4 inputs), 24 and
# 48 a group (RegNet's wider stages), each ISA's tiles: the widest vector that stays in a group
# (lanes of two groups would read several input channels: gathered, several times slower)
@pytest.mark.parametrize("target", isa_params(), ids=str)
@pytest.mark.parametrize("per_group, groups", [(8, 7), (4, 4), (2, 8), (1, 8), (24, 2), (48, 2)])
def test_grouped_conv_vectors_stay_in_a_group(target, per_group, groups):
    reads = 4 if per_group == 1 else per_group
    shape = (1, 10, 12, reads * groups, per_group * groups, 3, 1, 1, 1, groups)
    out, ref, cfg = _run(shape, target)
    assert_close(out, ref)
    widest = LANES[next(name for name, pinned in ISAS.items() if pinned == target)]
    assert per_group % cfg.lanes == 0 and (cfg.lanes == widest or per_group % (2 * cfg.lanes)), cfg


# a depthwise conv over 1 MB of input, each ISA's tiles: AVX2 takes two vectors of channels
# (a cache line of each pixel), at stride 1 and 2, with a 5x5 kernel too (EfficientNet)
@pytest.mark.parametrize("target", isa_params(), ids=str)
@pytest.mark.parametrize("stride, k", [(1, 3), (2, 3), (1, 5)])
def test_depthwise_conv_over_a_large_image(target, stride, k):
    shape = (1, 64, 64, 64, 64, k, stride, k // 2, 1, 64)
    out, ref, cfg = _run(shape, target)
    assert_close(out, ref)
    assert cfg.oc_block == (16 if target == ISAS["avx2"] else cfg.lanes), cfg


# every loop order x channel block, strided and not, asymmetric padding (a padded copy of the
# input; depthwise tests the border in the tile loop instead: SHAPES has those)
@pytest.mark.parametrize("channels_outer", [True, False])
@pytest.mark.parametrize("oc_block", [16, 32, 48])
@pytest.mark.parametrize(
    "shape", [(1, 13, 11, 8, 50, 3, 2, 1, 1, 1), (1, 9, 10, 5, 48, 3, 1, (1, 0, 2, 1), 1, 1)], ids=str
)
def test_conv2d_every_schedule_path(shape, oc_block, channels_outer):
    out, ref, _ = _run(shape, "accel", oc_block=oc_block, ow_block=4, channels_outer=channels_outer)
    assert_close(out, ref)


# tiles along the flattened output pixels (1x1 convs): tiles that divide the pixels and a tail
# tile (49 in 6s, 63 in 4s), several images, a stride, channel tails (40 in 16s, 20 in 24s); in
# one chunk of rows, or in 2 or 3, each with its tail tile (3 x 21 pixels in 4s), where they
# divide the rows (9 in 3, 8 in 2; else one chunk)
@pytest.mark.parametrize("row_chunks", [1, 2, 3])
@pytest.mark.parametrize("ow_block, oc_block", [(6, 16), (4, 24), (7, 8)])
@pytest.mark.parametrize(
    "shape",
    [(1, 7, 7, 64, 128, 1, 1, 0, 1, 1), (2, 14, 14, 24, 40, 1, 2, 0, 1, 1), (3, 9, 7, 16, 20, 1, 1, 0, 1, 1)]
    + [(2, 8, 10, 16, 40, 1, 1, 0, 1, 1)],
    ids=str,
)
def test_conv2d_flat_pixel_tiles(shape, ow_block, oc_block, row_chunks):
    config = dict(ow_block=ow_block, oc_block=oc_block, row_chunks=row_chunks)
    target = {"tag": "accel", "num-cores": 2}
    out, ref, cfg = _run(shape, target, **config, flat=True, channels_outer=True, columns_parallel=False)
    assert cfg.parallel
    assert_close(out, ref)


def test_conv2d_flat_pixel_tiles_take_no_groups_and_several_rows():
    with tvm.target.Target(ISAS["avx2"]):
        for data, kernel, groups, what in [
            ((1, 7, 7, 16), (16, 3, 3, 8), 2, "groups 2, 7 output rows"),
            ((1, 1, 7, 16), (16, 1, 1, 16), 1, "groups 1, 1 output rows"),
        ]:
            geo = topi_accel.conv2d_geometry(data, kernel, 1, (kernel[1] - 1) // 2, groups=groups)
            cfg = replace(topi_accel.conv2d_config(geo), flat=True, columns_parallel=False)
            with pytest.raises(
                ValueError, match=f"flat tiles take a conv of several output rows without groups, not {what}"
            ):
                topi_accel.conv2d_nhwc_ohwi_func(geo, cfg)
        geo = topi_accel.conv2d_geometry((1, 7, 7, 16), (16, 1, 1, 16), 1, 0)
        cfg = replace(topi_accel.conv2d_config(geo), flat=True, columns_parallel=True)
        with pytest.raises(ValueError, match="flat tiles do not take columns_parallel=True"):
            topi_accel.conv2d_nhwc_ohwi_func(geo, cfg)


# NCHW data (a model's first conv, on the image), transposed in the padded copy: ResNet-50's and
# MobileNetV2's stems (smaller), grey and RGBA, only the left padded, flat tiles; each ISA's tiles,
# and a symbolic batch run at 1 and 3
NCHW_STEMS = [
    (2, 40, 36, 3, 16, 7, 2, 3, 1, 1),
    (1, 33, 30, 3, 32, 3, 2, 1, 1, 1),
    (1, 17, 19, 1, 24, 3, 1, 1, 1, 1),
    (1, 17, 19, 4, 8, 5, 1, (0, 2, 0, 2), 1, 1),
]


@pytest.mark.parametrize("flat", [False, True])
@pytest.mark.parametrize("target", isa_params(), ids=str)
@pytest.mark.parametrize("shape", NCHW_STEMS, ids=str)
def test_conv2d_reads_nchw_data(shape, target, flat):
    n, h, w, c, o, k, stride, padding, dilation, groups = shape
    x, wt = rand(n, h, w, c), rand(o, k, k, c)
    nchw = x.transpose(0, 3, 1, 2).copy()
    with tvm.target.Target(target):
        geo = topi_accel.conv2d_geometry(x.shape, wt.shape, stride, padding, dilation, groups)
        cfg = topi_accel.conv2d_config(geo)
    cfg = replace(cfg, flat=True, columns_parallel=False) if flat else cfg
    assert topi_accel.nchw_data_reason(geo) is None
    packed = pack(wt, topi_accel.kernel_pack_map(cfg))
    ref = conv2d_reference(x, wt, geo.stride, geo.pad, geo.dilation, groups)
    func = topi_accel.conv2d_nhwc_ohwi_func(geo, cfg, data_layout="NCHW")
    assert [int(d) for d in func.params[0].ty.shape] == [n, c, h, w]
    assert_close(run_primfunc(func, [nchw, packed], ref.shape, target), ref)
    symbolic = topi_accel.conv2d_nhwc_ohwi_func(geo, cfg, batch=tvm.tirx.Var("batch", "int64"), data_layout="NCHW")
    lib = compile_primfunc(symbolic, target)
    for batch in (1, 3):
        xs = rand(batch, h, w, c)
        want = conv2d_reference(xs, wt, geo.stride, geo.pad, geo.dilation, groups)
        assert_close(run_compiled(lib, [xs.transpose(0, 3, 1, 2).copy(), packed], want.shape), want)


@pytest.mark.parametrize(
    "data, kernel, padding, groups, layout, what",
    [
        ((1, 16, 16, 8), (8, 3, 3, 8), 1, 1, "NCHW", "8 input channels \\(NCHW data: at most 4\\)"),
        ((1, 16, 16, 4), (4, 3, 3, 1), 1, 4, "NCHW", "groups=4 \\(NCHW data: only groups=1\\)"),
        ((1, 16, 16, 3), (8, 3, 3, 3), (0, 0, 1, 1), 1, "NCHW", "padding \\[0, 0, 1, 1\\] \\(NCHW data: the top"),
        ((1, 16, 16, 3), (8, 3, 3, 3), 1, 1, "NCWH", "only NHWC and NCHW"),
        ((1, 1, 1, 1), (1, 1, 1, 1), (1, 0, 0, 0), 1, "NCHW", "a window that skips the input's last rows"),
    ],
)
def test_conv2d_nchw_data_names_what_it_does_not_take(data, kernel, padding, groups, layout, what):
    geo = topi_accel.conv2d_geometry(data, kernel, 2 if data[1] == 1 else 1, padding, groups=groups)
    cfg = topi_accel.conv2d_config(geo, tvm.target.Target(ISAS["avx2"]))
    with pytest.raises(ValueError, match=f"conv2d_nhwc_ohwi: data_layout {layout} is not supported: {what}"):
        topi_accel.conv2d_nhwc_ohwi_func(geo, cfg, data_layout=layout)


# a channel-block-outer loop in chunks of rows, one per thread: 2 and 3 chunks of batch x rows
# (6: 2 x 3 strided and padded; 12 with a column tail) and rows the chunks do not divide (7, 14 in 3:
# the channel blocks split instead)
@pytest.mark.parametrize("row_chunks", [2, 3])
@pytest.mark.parametrize(
    "shape",
    [(1, 7, 7, 24, 40, 1, 1, 0, 1, 1), (2, 6, 10, 8, 50, 3, 2, 1, 1, 1), (1, 14, 14, 64, 384, 1, 1, 0, 1, 1)]
    + [(1, 12, 9, 16, 40, 3, 1, 1, 1, 1)],
    ids=str,
)
def test_conv2d_rows_in_chunks(shape, row_chunks):
    out, ref, cfg = _run(shape, "accel", channels_outer=True, row_chunks=row_chunks, columns_parallel=False)
    assert cfg.parallel
    assert_close(out, ref)


@pytest.mark.parametrize("cores", [1, 2, 4])
def test_a_small_kernel_outer_over_few_rows_gives_each_thread_its_rows(cores):
    """A channel-block-outer conv whose kernel every thread can read splits its rows across
    the target's threads (the next kernel's thread then reads the rows this one wrote); a
    large kernel keeps its channel blocks split, as do rows that do not divide among the
    threads, and a single thread has one chunk."""
    with tvm.target.Target({"tag": "accel", "num-cores": cores}):

        def config(h, c, o):
            return topi_accel.conv2d_config(topi_accel.conv2d_geometry((1, h, h, c), (o, 1, 1, c)))

        small, large, uneven = config(16, 64, 384), config(8, 512, 2048), config(15, 64, 384)  # 96 KB, 4 MB
    assert small.channels_outer and large.channels_outer and uneven.channels_outer
    assert small.row_chunks == cores and large.row_chunks == 1 and uneven.row_chunks == 1


# per ISA: (out channels, the block chosen) -- three vectors when that divides the channels,
# else two (144 on AVX-512: 48, not 32 padded to 160; 64: 32) -- and the widest
# row of outputs the register budget holds with two vectors (24 zmm / 12 ymm accumulators)
OC_BLOCKS = {
    "avx512": [(144, 48), (64, 32), (96, 48)],
    "avx2": [(144, 24), (64, 16), (24, 24), (40, 16)],
    "sse": [(144, 12), (12, 12), (64, 8)],
}
OW_BLOCK_TWO_VECTORS = {"avx512": 12, "avx2": 6, "sse": 6}


@pytest.mark.parametrize("isa", ISAS)
def test_conv2d_config_heuristic(isa):
    with tvm.target.Target(ISAS[isa]):

        def config(h, c, o, k):
            return topi_accel.conv2d_config(topi_accel.conv2d_geometry((1, h, h, c), (o, k, k, c), 1, k // 2))

        assert not config(56, 64, 64, 3).channels_outer  # large image, small kernel: channels inner
        assert config(7, 512, 512, 3).channels_outer  # 9 MB kernel: channels outer
        for out_c, block in OC_BLOCKS[isa]:
            assert config(56, 24, out_c, 1).oc_block == block, out_c
        assert config(48, 64, 2 * LANES[isa], 1).ow_block == OW_BLOCK_TWO_VECTORS[isa]


@pytest.mark.parametrize("isa", ISAS)
def test_conv2d_tile_columns_fit_the_output_width(isa):
    """A conv's register tile fits ResNet-50's and MobileNetV2's output widths: it divides the
    width (AVX2's and SSE's 6 columns of two vectors do not divide 14 or 7: 7 columns of one
    vector do), or, where that tile would keep fewer accumulators than the FMA latency needs
    (7 on AVX2's 14-wide rows), a 1x1 conv takes a narrower divisor with more vectors (2
    columns of 4, and of 5 for this conv, which widens its channels: 512 padded to 520) and a
    3x3 conv a full tile that pads at most a tenth of the row (5 columns: 15). Where no divisor
    of 8 or more accumulators does (7-wide rows with 12 accumulators: AVX2 and SSE), a 1x1 conv
    runs its tiles along the flattened pixels (5 of two vectors: 50 for 49, where 6, every
    accumulator, would compute 54), and so does a 3x3 conv, whose widest full row tile (4
    columns of three vectors) would compute 8 columns for 7 and 528 channels for 512."""
    knobs = topi_accel.knobs.cpu_knobs(tvm.target.Target(ISAS[isa]))
    with tvm.target.Target(ISAS[isa]):
        for width in (56, 28, 14, 7):
            for k in (1, 3):
                cfg = topi_accel.conv2d_config(
                    topi_accel.conv2d_geometry((1, width, width, 256), (512, k, k, 256), 1, k // 2)
                )
                accumulators = cfg.ow_block * cfg.oc_block // knobs.lanes
                assert accumulators <= knobs.accumulators, (width, k, cfg)
                # and the registers: a vector of weights each, the broadcast input
                assert accumulators + cfg.oc_block // knobs.lanes + 1 <= knobs.registers, (width, k, cfg)
                # 7 columns of one vector, the widest divisor, are too few accumulators for 12
                assert cfg.flat == (width == 7 and knobs.accumulators == 12), (width, k, cfg)
                if cfg.flat:  # two vectors of channels (512 = 32 x 16, not 24s), the fewest padded pixels
                    assert (cfg.ow_block, accumulators) == (5, 10), (width, k, cfg)
                elif width % cfg.ow_block:
                    padded = -(-width // cfg.ow_block) * cfg.ow_block
                    assert padded <= 1.1 * width and accumulators >= 8, (width, k, cfg)
                if isa == "avx2" and width == 14:  # a 1x1 kernel: 2 columns of 5 vectors
                    assert (cfg.ow_block, cfg.oc_block) == ((2, 40) if k == 1 else (5, 16)), (k, cfg)
            if isa == "avx2":  # 576 channels: 2 columns of 5 vectors (600 computed), not of 3 (6) or 6 (spilled)
                geo = topi_accel.conv2d_geometry((1, width, width, 96), (576, 1, 1, 96), 1, 0)
                cfg = topi_accel.conv2d_config(geo)
                assert width != 14 or (cfg.ow_block, cfg.oc_block) == (2, 40), cfg
        # depthwise (MobileNetV2's widths): one vector of channels, up to 8 columns dividing the
        # width; where a vector is half a cache line (AVX2) and the input 1 MB or more, two
        # vectors (a whole line of each pixel) of 4 columns, 2 at stride 2
        for width in (112, 56, 28, 14, 7):
            for stride in (1, 2):
                geo = topi_accel.conv2d_geometry((1, width, width, 96), (96, 3, 3, 1), stride, 1, groups=96)
                cfg = topi_accel.conv2d_config(geo)
                if knobs.lanes * 4 == 32 and 4 * width * width * 96 >= (1 << 20):
                    assert (cfg.oc_block, cfg.ow_block) == (16, 4 if stride == 1 else 2), (width, stride, cfg)
                else:
                    assert cfg.oc_block == knobs.lanes and cfg.ow_block <= 8, (width, stride, cfg)
                    assert geo.out_w % cfg.ow_block == 0, (width, stride, cfg)


# flat_rows(pixels, rows, vectors): pick_block's tile where it divides the pixels (the pixels
# if at most `rows`, else the largest divisor of at most `rows` if it is at least rows / 2),
# else, of the tiles of MIN_FMA_CHAINS (8) accumulators or more up to `rows` pixels, the one
# that pads the fewest pixels, the wider on a tie
@pytest.mark.parametrize(
    "pixels, rows, vectors, expected",
    [
        (49, 6, 2, 5),  # 50 computed, not 54
        (49, 4, 3, 3),  # 51, not 52
        (169, 6, 2, 5),  # 170 (13x13), not 174
        (48, 6, 2, 6),  # divides
        (27, 6, 2, 3),  # divides, though 6 accumulators: pick_block's tile
        (19, 6, 2, 5),  # 20, as 4 would: the wider on a tie (6 pads to 24)
        (3, 6, 2, 3),  # the tile is the pixels
    ],
)
def test_flat_rows_pads_the_fewest_pixels(pixels, rows, vectors, expected):
    assert topi_accel.conv2d_configs.flat_rows(pixels, rows, vectors) == expected


def test_flat_rows_divides_or_pads_the_fewest():
    chains = topi_accel.conv2d_configs.MIN_FMA_CHAINS
    for vectors, rows in ((1, 12), (2, 6), (3, 4), (4, 3), (2, 12), (3, 8)):
        tiles = range(ceil_div(chains, vectors), rows + 1)
        for pixels in range(1, 200):
            block = topi_accel.conv2d_configs.flat_rows(pixels, rows, vectors)
            assert block <= rows, (pixels, rows, vectors, block)
            if pixels % block:
                assert block * vectors >= chains, (pixels, rows, vectors, block)
                fewest = min(round_up(pixels, t) for t in tiles)
                assert round_up(pixels, block) == fewest, (pixels, rows, vectors, block)


# a 3x3 conv whose rows no tile of MIN_FMA_CHAINS accumulators divides, with 12 accumulators
# (AVX2, SSE): 7-wide rows' row tile is 4 columns of three vectors (8 columns for 7, channel
# tails: 40 in 24s, 20 in 12s), which gives way to a flat tile of 5 pixels of two vectors (50 for
# 49) where that computes less (`_flat_window_tile`: 40 channels take 48 either way; 20 take 32
# in AVX2's 16s, so the row tile stays, and 24 in SSE's 8s); 13-wide rows, and 14- and 10-wide
# rows of 48 channels (a divisor tile of 2 columns of three vectors), a tile of 8 or more
# accumulators. Expected by lanes: (flat, columns or pixels, vectors)
@pytest.mark.parametrize("target", isa_params("avx2", "sse"), ids=str)
@pytest.mark.parametrize(
    "shape, expected",
    [
        ((1, 7, 7, 32, 40, 3, 1, 1, 1, 1), {8: (True, 5, 2), 4: (True, 5, 2)}),
        ((2, 14, 14, 16, 20, 3, 2, 1, 1, 1), {8: (False, 4, 3), 4: (True, 5, 2)}),
        ((1, 13, 13, 8, 48, 3, 1, 1, 1, 1), None),
        ((1, 14, 14, 8, 48, 3, 1, 1, 1, 1), None),
        ((1, 10, 10, 8, 48, 3, 1, 1, 1, 1), None),
    ],
    ids=str,
)
def test_a_3x3_conv_over_rows_of_few_divisors_keeps_the_fma_chains(target, shape, expected):
    out, ref, cfg = _run(shape, target)
    assert_close(out, ref)
    vectors = cfg.oc_block // cfg.lanes
    assert cfg.ow_block * vectors >= topi_accel.conv2d_configs.MIN_FMA_CHAINS, cfg
    if expected:
        assert (cfg.flat, cfg.ow_block, vectors) == expected[cfg.lanes], cfg


# a 1x1 conv that widens its channels (so no flat tile) and whose row tile has 8 of 12
# accumulators (AVX2, SSE) takes as many vectors as fit, its channels padded: 4 columns of three
# vectors (AVX2 24s / SSE 12s: 256 -> 264, 160 -> 168), 2 of five (40s / 20s: 256 -> 280 / 260)
@pytest.mark.parametrize("target", isa_params("avx2", "sse"), ids=str)
@pytest.mark.parametrize(
    "shape, columns, vectors",
    [
        ((1, 8, 8, 16, 256, 1, 1, 0, 1, 1), 4, 3),
        ((2, 16, 16, 32, 160, 1, 2, 0, 1, 1), 4, 3),
        ((1, 14, 14, 16, 256, 1, 1, 0, 1, 1), 2, 5),
    ],
    ids=str,
)
def test_a_widening_pointwise_row_tile_takes_the_vectors_that_fit(target, shape, columns, vectors):
    out, ref, cfg = _run(shape, target)
    assert_close(out, ref)
    assert not cfg.flat and (cfg.ow_block, cfg.oc_block // cfg.lanes) == (columns, vectors), cfg
    assert shape[4] % cfg.oc_block, cfg  # the packed kernel's channels padded


@pytest.mark.parametrize("isa", ISAS)
def test_a_pointwise_row_tile_of_eight_accumulators_gives_way_to_a_flat_tile_of_all(isa):
    """With 12 accumulators (AVX2, SSE), a 1x1 conv whose row tile keeps 8 (ResNet-50's
    14x14x1024->512 and ->256: 2 columns of 4 vectors; 28x28x512->256 and 56x56x256->128: 4 of
    2) takes a flat tile of all 12 (6 pixels of two vectors, the last tile padded), in a chunk
    of rows per thread where its kernel is small (56x56x256->128, on 2 cores), unless it widens
    its channels (14x14x256->1024), a flat tile of 12 would pad more than a tenth of its pixels
    (5x5: 30 for 25), or its channel blocks would leave the cache a 26 MB image, which its row
    tile reads once, channels inner (112x112x512->128). AVX-512's row tiles keep 14 or more of
    its 24 here (at 5x5, 10: a flat tile of 12 pixels would pad 36)."""
    target = tvm.target.Target({**ISAS[isa], "num-cores": 2})  # the row chunks split among 2
    knobs = topi_accel.knobs.cpu_knobs(target)
    twelve = knobs.accumulators == 12
    shapes = {  # (width, in_c, out_c): flat with 12 accumulators, in how many chunks
        (14, 1024, 512): 1,
        (14, 1024, 256): 1,
        (28, 512, 256): 1,
        (56, 256, 128): 2,
        (14, 256, 1024): 0,
        (5, 512, 512): 0,
        (112, 512, 128): 0,
    }
    with target:
        for (width, in_c, out_c), chunks in shapes.items():
            geo = topi_accel.conv2d_geometry((1, width, width, in_c), (out_c, 1, 1, in_c), 1, 0)
            cfg = topi_accel.conv2d_config(geo)
            accumulators = cfg.ow_block * cfg.oc_block // knobs.lanes
            assert cfg.flat == (chunks > 0 and twelve), (width, in_c, out_c, cfg)
            if cfg.flat:
                assert (cfg.ow_block, accumulators, cfg.row_chunks) == (6, 12, chunks) and cfg.channels_outer, cfg
            else:
                assert accumulators >= (14 if not twelve and width > 5 else 8), (width, in_c, out_c, cfg)


def test_conv2d_schedule_is_vectorized_and_parallel():
    with tvm.target.Target("accel"):
        geo = topi_accel.conv2d_geometry((1, 56, 56, 64), (64, 3, 3, 64), 1, 1)
        cfg = topi_accel.conv2d_config(geo)
    text = topi_accel.conv2d_nhwc_ohwi_func(geo, cfg).script()
    assert "T.parallel" in text and "T.vectorized" in text and "T.unroll" in text
    assert 'scope="local"' in text  # the register tile


# (ISA, out channels, write-back width): fewer channels than one block of two vectors, which
# the write-back copies in vectors of the widest width dividing them (MobileNetV2's 24 on
# AVX-512: 3 x 8), not one scalar at a time
CHANNEL_TAILS = [("avx512", 24, 8), ("avx512", 20, 4), ("avx2", 12, 4)]


@pytest.mark.parametrize("isa, out_c, width", CHANNEL_TAILS)
def test_conv2d_channel_tail_write_back_is_vectorized(isa, out_c, width):
    with tvm.target.Target(ISAS[isa]):
        geo = topi_accel.conv2d_geometry((1, 10, 8, 16), (out_c, 1, 1, 16))
        cfg = topi_accel.conv2d_config(geo)
    assert cfg.oc_block == 2 * LANES[isa]
    write_back = topi_accel.conv2d_nhwc_ohwi_func(geo, cfg).script().split('T.sblock("conv2d_nhwc_ohwi_acc_update")')[1]
    assert f"T.vectorized(T.int64({width}))" in write_back


@pytest.mark.parametrize("out_c", [24, 20, 12])
@pytest.mark.parametrize("target", isa_params(), ids=str)
def test_conv2d_channel_tail(target, out_c):
    out, ref, _ = _run((1, 10, 8, 16, out_c, 1, 1, 0, 1, 1), target)
    assert_close(out, ref)


class _LastStage(torch.nn.Module):
    """ResNet-50's last stage in small: a 1x1 conv at 14x14 with a small kernel (64 KB: its
    rows in a chunk per thread), 1x1 convs at 7x7 without row chunks (kernels of 128-320 KB;
    7 rows do not split between 2 threads), a strided 1x1 shortcut, biases, ReLUs and a
    residual add."""

    def __init__(self):
        super().__init__()
        self.squeeze = torch.nn.Conv2d(256, 64, 1)
        self.shortcut = torch.nn.Conv2d(64, 512, 1, stride=2)
        self.reduce = torch.nn.Conv2d(512, 160, 1)
        self.expand = torch.nn.Conv2d(160, 512, 1)

    def forward(self, x):
        s = self.shortcut(torch.relu(self.squeeze(x)))
        return torch.relu(self.expand(torch.relu(self.reduce(s))) + s)


def _flat_pixels(func) -> tuple[int, int] | None:
    """(chunks, pixels of a chunk) that a flat conv's output block iterates, None in a function
    without one. Asserts that such a block reads the local accumulator and writes the
    function's output, 4-D (so the epilogue was inlined into it)."""
    sch = tvm.s_tir.Schedule(func)
    try:
        out = sch.get(sch.get_sblock("conv2d_nhwc_ohwi"))
    except tvm.s_tir.schedule.schedule.ScheduleError:
        return None
    extents = tuple(int(v.dom.extent) for v in out.iter_vars)
    written = out.writes[0].source
    if extents == tuple(int(d) for d in written.shape):
        return None  # a row tile's output block: it iterates rows and columns
    acc = [r.source for r in out.reads if r.source.name.startswith("conv2d_nhwc_ohwi_acc")]
    assert len(acc) == 1 and acc[0].scope() == "local", out
    assert written.same_as(func.params[-1]), out
    assert len(written.shape) == 4 and extents[1] * extents[2] == int(written.shape[1]) * int(written.shape[2])
    return extents[1:3]


@pytest.mark.parametrize("isa", ISAS)
def test_flat_pixel_tiles_in_a_model(isa):
    """With 12 accumulators (AVX2, SSE), the 1x1 convs take flat tiles, their epilogues (bias,
    ReLU, the residual add) written with each tile, from the registers, to NHWC: the three
    7-wide ones in one chunk, the 14-wide one (2 columns of 4 vectors: 8) in a chunk of 7 rows
    per thread; with 24 (AVX-512), 7 columns of two vectors are enough. Run against PyTorch
    where the host runs the code."""
    torch.manual_seed(0)
    model, x = _LastStage().eval(), torch.randn(1, 256, 14, 14)
    target = tvm.target.Target({**ISAS[isa], "num-cores": 2})  # the row chunks split among 2
    mod = accel_target.optimize(accel_target.from_torch(model, x), target=target)
    flat = [_flat_pixels(f) for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    twelve = topi_accel.knobs.cpu_knobs(target).accumulators == 12
    # 49 pixels (tiles of 5: two vectors; 160 and 512 channels are not 24s); the 14-wide row
    # tile's 8 accumulators give way to every one of the 12: 98 pixels a chunk (tiles of 6)
    assert sorted(filter(None, flat)) == ([(1, 49), (1, 49), (1, 49), (2, 98)] if twelve else []), flat
    # the reduce conv's threads split its channel blocks, each reading the whole shortcut, so the
    # last conv does not write over the shortcut it adds (accel_target.passes.inplace)
    assert "R.call_tir_inplace" not in mod["main"].script()
    if runs_here(target):
        with torch.no_grad():
            ref = model(x).numpy()
        assert_close(
            run_executable(accel_target.build(accel_target.from_torch(model, x), target=target), x.numpy()), ref
        )


@pytest.mark.parametrize(
    "shape, config, whole",
    [
        ((1, 14, 14, 64, 96, 1, 1, 0, 1, 1), dict(channels_outer=True, row_chunks=1), True),
        ((1, 14, 14, 64, 96, 1, 1, 0, 1, 1), dict(channels_outer=True, row_chunks=2), False),
        ((1, 14, 14, 64, 96, 1, 1, 0, 1, 1), dict(channels_outer=False, row_chunks=1), False),
        ((1, 14, 14, 64, 64, 3, 1, 1, 1, 64), dict(channels_outer=True, row_chunks=1), False),  # depthwise
    ],
    ids=["channel-blocks-split", "rows-in-chunks", "channels-inner", "depthwise"],
)
def test_a_conv_whose_every_thread_reads_the_whole_input_says_so(shape, config, whole):
    """The output block is annotated THREADS_READ_WHOLE_INPUT (for WriteInPlace) exactly when
    the threads split the channel blocks of a conv without groups, each over every row."""
    n, h, w, c, o, k, stride, padding, dilation, groups = shape
    with tvm.target.Target("accel"):
        geo = topi_accel.conv2d_geometry((n, h, w, c), (o, k, k, c // groups), stride, padding, dilation, groups)
        cfg = replace(topi_accel.conv2d_config(geo), parallel=True, columns_parallel=False, flat=False, **config)
    sch = tvm.s_tir.Schedule(topi_accel.conv2d_nhwc_ohwi_func(geo, cfg))
    annotations = [sch.get(b).annotations for b in topi_accel.epilogue.all_blocks(sch)]
    assert sum(topi_accel.conv2d.THREADS_READ_WHOLE_INPUT in a for a in annotations) == int(whole)
    out, ref, _ = _run(shape, "accel", parallel=True, columns_parallel=False, flat=False, **config)
    assert_close(out, ref)
