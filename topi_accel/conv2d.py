"""conv2d_nhwc_ohwi: 2-D convolution, NHWC activations, OHWI weights.

The kernel reads its weights packed as ``[O/ob, KH, KW, C/groups, ob]``
(``ob`` = ``Conv2DConfig.oc_block``, O padded up to a multiple of ``ob`` when
groups == 1) so that one vector load gives ``ob`` output channels.
`kernel_pack_map` is that layout as an IndexMap: the strategy applies it to
constant weights at compile time and emits it as a visible layout_transform
for runtime weights.

Schedule: parallel over (output-channel block, batch, output row) — channel
block innermost instead for grouped/depthwise convs; a register tile of
``ow_block`` output columns x ``oc_block`` channels accumulates over
(kh, kw, c) with the input broadcast (loaded as a vector when depthwise) and
the weights vector-loaded. With the channel block outermost, each output row
prefetches its share of the next block's kernel (`topi_accel.prefetch`); a small kernel's
rows then come in one chunk per thread outside the channel blocks, so that a thread writes
the rows the next kernel's thread reads (`Conv2DConfig.row_chunks`).

A 1x1 conv whose output width leaves a row's tile too few accumulators (of AVX2's 12: 7 at 7
columns, 8 at 14, 28 and 56) runs its tiles along the output pixels in row-major order instead
(h and w flattened, as dense_kn runs along its rows; `Conv2DConfig.flat`, `_flat_pointwise_tile`
says when), channel blocks outermost, the pixels of each chunk of rows flattened on their own:
each tile writes its pixels from the registers straight to their rows and columns of the
output, epilogue included (the output block iterates a chunk's pixels; `_flat_output_nhwc`
lays its buffer out NHWC). So does a conv of a wider window whose row tile would compute much
more than its output (AVX2's 7-wide 3x3 convs: 8 columns for 7; `_flat_window_tile`), each
pixel's window read from the padded input.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace

import tvm
from tvm import s_tir, te, tirx, topi
from tvm.tirx import IndexMap

from . import tuning
from .knobs import MAX_PADDED_FRACTION, ceil_div, cpu_knobs, largest_divisor, pads_little, pick_block, round_up
from .prefetch import prefetch_next_panel
from .symbolic import extent, prim_func
from .tiles import register_tile, vectorize_inner

SUPPORTED_DTYPES = ("float32",)


@dataclass(frozen=True)
class Conv2DGeometry:
    """Validated shapes and attributes of one conv2d_nhwc_ohwi call."""

    batch: int
    in_h: int
    in_w: int
    in_c: int
    out_c: int
    kh: int
    kw: int
    stride: tuple[int, int]
    pad: tuple[int, int, int, int]  # top, left, bottom, right
    dilation: tuple[int, int]
    groups: int

    @property
    def out_h(self) -> int:
        return (self.in_h + self.pad[0] + self.pad[2] - self.dilation[0] * (self.kh - 1) - 1) // self.stride[0] + 1

    @property
    def out_w(self) -> int:
        return (self.in_w + self.pad[1] + self.pad[3] - self.dilation[1] * (self.kw - 1) - 1) // self.stride[1] + 1


@dataclass(frozen=True)
class Conv2DConfig:
    """Schedule knobs: output channels per vector tile, output columns per register tile,
    float32 lanes of the target's vectors, whether to use threads, whether the
    channel-block loop is outermost (a weight panel reused across all rows: large kernels)
    or innermost (every channel block of an output row while its input rows are cached:
    large images with small kernels, small grouped and depthwise kernels), whether the
    output-column tiles join the parallel loop (too few rows for the threads: H = 1, conv1d),
    and in how many chunks of output rows, one after the other, a channel-block-outer loop
    runs (1: the channel blocks split across the threads; one per thread: the rows do, so
    that each thread writes the rows the next kernel's thread reads, `_row_chunks`), and
    whether the tiles run along the flattened output pixels (``ow_block`` pixels then, across
    the rows of a chunk; a 1x1 conv's: `_flat_pointwise_tile`, a wider window's:
    `_flat_window_tile`)."""

    oc_block: int
    ow_block: int
    lanes: int
    parallel: bool = True
    channels_outer: bool = True
    columns_parallel: bool = False
    row_chunks: int = 1
    flat: bool = False


def _as_list(value, repeat: int) -> list:
    """A scalar repeated `repeat` times, or any sequence (list, tuple, tvm Array) as a list."""
    if isinstance(value, (int, tvm.tirx.IntImm)):
        return [value] * repeat
    return list(value)


def _pair(value, name: str) -> tuple[int, int]:
    vals = [int(v) for v in _as_list(value, 2)]
    if len(vals) != 2 or min(vals) < 1:
        raise ValueError(f"conv2d_nhwc_ohwi: {name}={tuple(vals)} is not supported; expected two positive ints")
    return vals[0], vals[1]


def _padding(value) -> tuple[int, int, int, int]:
    vals = [int(v) for v in _as_list(value, 1)]
    if len(vals) == 1:
        vals *= 4
    elif len(vals) == 2:
        vals = [vals[0], vals[1], vals[0], vals[1]]
    if len(vals) != 4 or min(vals) < 0:
        raise ValueError(
            f"conv2d_nhwc_ohwi: padding={tuple(vals)} is not supported; expected 1, 2 or 4 "
            "non-negative ints (all; (h, w); or (top, left, bottom, right))"
        )
    return tuple(vals)


def conv2d_geometry(
    data_shape: Sequence[int],
    kernel_shape: Sequence[int],
    strides=1,
    padding=0,
    dilation=1,
    groups: int = 1,
    dtype: str = "float32",
) -> Conv2DGeometry:
    """Check a conv2d_nhwc_ohwi call and return its geometry.

    data_shape: 4-D, NHWC: [batch, in_height, in_width, in_channel].
    kernel_shape: 4-D, OHWI: [out_channel, kernel_h, kernel_w, in_channel / groups].
    Raises ValueError naming the offending value and what is supported.
    """
    if str(dtype) not in SUPPORTED_DTYPES:
        raise ValueError(f"conv2d_nhwc_ohwi: dtype {dtype} is not supported; supported: {', '.join(SUPPORTED_DTYPES)}")
    if len(data_shape) != 4:
        raise ValueError(
            f"conv2d_nhwc_ohwi: data has rank {len(data_shape)} (shape {list(data_shape)}); expected 4-D NHWC"
        )
    if len(kernel_shape) != 4:
        raise ValueError(
            f"conv2d_nhwc_ohwi: kernel has rank {len(kernel_shape)} (shape {list(kernel_shape)}); expected 4-D OHWI"
        )
    n, h, w, c = (int(v) for v in data_shape)
    o, kh, kw, cg = (int(v) for v in kernel_shape)
    groups = int(groups)
    if groups < 1 or c % groups or o % groups:
        raise ValueError(
            f"conv2d_nhwc_ohwi: groups={groups} must be >= 1 and divide in_channels={c} and out_channels={o}"
        )
    if cg * groups != c:
        raise ValueError(
            f"conv2d_nhwc_ohwi: kernel in_channels {cg} x groups {groups} != data channels {c} "
            f"(data {list(data_shape)}, kernel {list(kernel_shape)})"
        )
    geo = Conv2DGeometry(
        n, h, w, c, o, kh, kw, _pair(strides, "strides"), _padding(padding), _pair(dilation, "dilation"), groups
    )
    if geo.out_h < 1 or geo.out_w < 1:
        raise ValueError(
            f"conv2d_nhwc_ohwi: output size {geo.out_h}x{geo.out_w} is empty for input {h}x{w}, "
            f"kernel {kh}x{kw}, padding {geo.pad}, dilation {geo.dilation}"
        )
    return geo


def conv2d_key(geo: Conv2DGeometry, target: tvm.target.Target | None = None) -> str:
    """The tuning database key of `geo` on `target`."""
    return tuning.kernel_key("conv2d_nhwc_ohwi", asdict(geo), target)


def conv2d_config(geo: Conv2DGeometry, target: tvm.target.Target | None = None, dtype: str = "float32") -> Conv2DConfig:
    """Tile sizes for `geo` on `target` (elements of `dtype`): the active tuning database's
    entry, else derived from the vector width and register budget."""
    tuned = tuning.lookup(conv2d_key(geo, target))
    knobs = cpu_knobs(target)
    if tuned is not None:
        cfg = Conv2DConfig(**tuned)
        if "row_chunks" in tuned:
            return cfg
        # a database written before the row chunks: the tuner timed each kernel alone, where
        # they do not show, so the chunks are the heuristic's for the loop order it chose
        return replace(cfg, row_chunks=_row_chunks(geo, dtype, cfg.channels_outer, knobs, cfg.columns_parallel))
    if geo.groups > 1 and geo.groups == geo.in_c and geo.out_c % knobs.lanes == 0:
        oc_block, ow_block = _depthwise_tile(geo, dtype, knobs)
    elif geo.groups == 1:
        # the packed kernel is zero-padded up to a multiple of oc_block: dense_kn's columns
        # (three vectors where they divide the channels, 96 -> 48, else two, 64 -> 32; the
        # tiles below may take others)
        oc_block = knobs.column_block(geo.out_c)
        ow_block = pick_block(geo.out_w, knobs.tile_rows(oc_block))
        few = ow_block * oc_block // knobs.lanes < MIN_FMA_CHAINS and ow_block < geo.out_w
        if geo.out_w % ow_block or (few and (geo.kh, geo.kw) != (1, 1)):
            # (a divisor tile of too few accumulators: AVX2 3x3 14x14x384->384 in 2 columns of
            # three vectors 2764-2828 us, 3 of three 2339-2353; 10x10x384->384 1446-1492 ->
            # 10 of one 1150-1168 (5 of two 1066-1084); Zen 5, 2 threads, alone)
            ow_block, oc_block = _uneven_width_tile(geo, oc_block, knobs)
        elif few:
            # a 1x1 conv's divisor tile of too few accumulators (2 columns of three vectors:
            # 14-wide rows with AVX2, 576 channels), as in _uneven_width_tile
            ow_block, oc_block = _narrow_pointwise_tile(geo.out_w, geo.out_c, knobs) or (ow_block, oc_block)
        accumulators = ow_block * oc_block // knobs.lanes
        flat = _flat_pointwise_tile(geo, dtype, accumulators, knobs)
        flat = flat or _flat_window_tile(geo, (ow_block, oc_block), dtype, knobs)
        if flat is not None:
            pixels, oc_block, chunks = flat
            return Conv2DConfig(oc_block, pixels, knobs.lanes, knobs.parallel, flat=True, row_chunks=chunks)
        if (geo.kh, geo.kw) == (1, 1) and geo.out_c > geo.in_c and accumulators >= MIN_FMA_CHAINS:
            oc_block = _widening_pointwise_channels(geo.out_c, ow_block, oc_block, knobs)
    else:
        # grouped: channel o reads input group o // (O / groups), so no padding (whole
        # vectors when the channels allow)
        two = 2 * knobs.lanes
        whole = [b for b in (two, knobs.lanes) if geo.out_c % b == 0]
        oc_block = whole[0] if whole else largest_divisor(geo.out_c, two)
        ow_block = pick_block(geo.out_w, knobs.tile_rows(oc_block))
    outer = _channels_outer(geo, dtype)
    columns = _columns_parallel(geo, oc_block, outer, knobs)
    return Conv2DConfig(
        oc_block=oc_block,
        ow_block=ow_block,
        lanes=knobs.lanes,
        parallel=knobs.parallel,
        channels_outer=outer,
        columns_parallel=columns,
        row_chunks=_row_chunks(geo, dtype, outer, knobs, columns),
    )


def _uneven_width_tile(geo: Conv2DGeometry, oc_block: int, knobs) -> tuple[int, int]:
    """(columns, channels) of a dense conv's register tile for an output width that no
    width of a full tile of `oc_block` channels divides (for a kernel of several taps, none
    of MIN_FMA_CHAINS accumulators): a divisor of the width as wide as the accumulators
    allow, with the vectors they leave; but where that tile has fewer than
    MIN_FMA_CHAINS accumulators, for a 1x1 kernel a narrower divisor with more vectors
    (`_narrow_pointwise_tile`), else the full tile's width that pads the fewest columns, if
    they are at most `knobs.MAX_PADDED_FRACTION` of the row; a kernel of several taps takes
    that width whatever it pads, with as many vectors as fit (`_most_vectors`) and the channels
    fill. The full tile's widths go down to half its width, and for a kernel of several taps
    not to fewer than MIN_FMA_CHAINS accumulators (a 1x1 conv's tile of fewer gives way to a
    flat one): a 3x3 13x13x384->384 with AVX2 took 2 columns of three vectors (14 computed, 6
    accumulators), 2737-2781 us; 3 of three, the fewest columns now, take 2225-2274 (4 of
    three 2233-2252, 5 of two 2141-2216; Zen 5, 2 threads, alone). With one vector of channels
    that means 8 columns or more (16 for 13, not 7 for 14: unmeasured), and SSE (12
    accumulators, no FMA) follows AVX2's rule unmeasured.

    Measured, 2 threads, Zen 4: AVX-512 keeps the divisor tile (13x13x384->384 1x1: 13 columns
    of one vector 240 us, 7 of three 356; 17x17x768->192 393 / 469). With AVX2 the 14-wide rows
    of ResNet-50 divide into 7 columns of one vector, which leaves the FMA latency uncovered: 5
    columns of two (15 computed) take 14x14x1024->256 694 -> 599 us, 256->1024 576 -> 551, 3x3/2
    28x28x256->256 1360 -> 1240 (6 of two, 18 computed, were slower than both); a 1x1 conv's
    7-wide rows keep 7 of one where they take no flat tile (4 of two or three pad 14%:
    7x7x512->2048 564 against 581-607 us).

    A 3x3 conv with 7-wide rows instead takes 4 columns of three vectors (8 columns and up to
    16 channels of 512 computed for 7; `_flat_window_tile` then trades it for a flat tile),
    AVX2 code, 2 threads, Zen 5, alone, us, 7 of one / 4 of three (4 of two, 2 of five):
    7x7x512->512 1175-1190 / 1102-1117 (1221-1230, 1197-1207); 3x3/2 14x14x512->512 1252-1265 /
    1133-1146 (1210-1229); 7x7x256->256 312-330 / 296-312; 3x3/2 14x14x256->256 344-348 /
    319-327; 7x7x384->384 685-693 / 614-627; 7x7x160->320 262-274 / 241-244; 7x7x128->128
    108-111 / 105-109."""
    width = geo.out_w
    columns = largest_divisor(width, knobs.accumulators)
    vectors = max(1, knobs.accumulators // columns)
    pointwise = geo.kh == geo.kw == 1
    if columns * vectors < MIN_FMA_CHAINS and pointwise:
        narrow = _narrow_pointwise_tile(width, geo.out_c, knobs)
        if narrow is not None:
            return narrow
    cap = knobs.tile_rows(oc_block)
    fewest = (cap + 1) // 2
    if not pointwise:  # (a 1x1 conv's row tile of few accumulators gives way to a flat tile)
        fewest = max(fewest, ceil_div(MIN_FMA_CHAINS, oc_block // knobs.lanes))
    padded = min(range(cap, fewest - 1, -1), key=lambda c: round_up(width, c))
    if columns < MIN_DIVISOR_COLUMNS:
        return padded, oc_block
    if columns * vectors < MIN_FMA_CHAINS:
        if pads_little(width, padded):
            return padded, oc_block
        if not pointwise:
            return padded, knobs.lanes * min(_most_vectors(padded, knobs), ceil_div(geo.out_c, knobs.lanes))
    return columns, knobs.lanes * vectors


def _most_vectors(columns: int, knobs) -> int:
    """Vectors of channels a register tile `columns` wide may have (0: none fit): its
    accumulators within the budget, and with a register per vector of weights and one for the
    broadcast input within the registers."""
    return min(knobs.accumulators // columns, (knobs.registers - 1) // (columns + 1))


def _widening_pointwise_channels(out_c: int, columns: int, oc_block: int, knobs) -> int:
    """Channels of the row tile `columns` wide of a 1x1 conv that widens its channels (so it
    takes no flat tile) and keeps MIN_FMA_CHAINS accumulators or more, with a budget of
    FLAT_BELOW_ACCUMULATORS (AVX2, SSE): as many vectors as fit (`_most_vectors`), the packed
    channels padded up to them, where that pads at most `knobs.MAX_PADDED_FRACTION` of
    `out_c`; else `oc_block`. Of the tiles `conv2d_config` gives, those of 8 accumulators
    change: 4 columns of two vectors -> of three, 2 of four -> of five.

    Measured, AVX2 code, 2 threads, Zen 5, alone, us (channels padded to 24s, 40s):
    56x56x64->256 452-468 -> 414-429, 28x28x128->512 466-470 -> 411-424, 1x1/2 56x56x256->512
    886-889 -> 824-832, 28x28x96->2048 1373-1376 -> 1202-1206; 14x14x256->1024 450-471 ->
    418-434, 14x14x256->512 236-247 -> 216-224, 1x1/2 28x28x512->1024 901-917 -> 838-858,
    MobileNetV2's 14x14x96->576 101-112 -> 99-102. ResNet-50 built for AVX2 in the model:
    0.973 of the time (`bench_ab.py --base`, 16 rounds), MobileNetV2 0.996. SSE follows
    unmeasured. AVX-512's budget of 24 keeps its tiles: its 4- and 5-wide rows would take 24
    and 20; 4x4x1024->2048 gained (161-169 -> 149-154 us), but its 5-wide kernels of 10-30 us
    measured both ways in turn."""
    wider = _most_vectors(columns, knobs) * knobs.lanes
    if knobs.accumulators <= FLAT_BELOW_ACCUMULATORS and wider > oc_block and pads_little(out_c, wider):
        return wider
    return oc_block


def _narrow_pointwise_tile(width: int, out_c: int, knobs) -> tuple[int, int] | None:
    """(columns, channels) of a tile as wide as the widest divisor of `width` (at least
    MIN_NARROW_COLUMNS) that, with the most whole vectors of channels that divide `out_c` and
    fit the accumulators and the registers (a vector of weights each, and the broadcast input),
    keeps MIN_FMA_CHAINS accumulators; None if no divisor does. Past the registers, 2 columns of
    six vectors spilled: MobileNetV2's 14x14x96->576 took 253 us against 145 for 2 columns of
    three (the divisor tile it had) and 131 for 2 of four, which `_widening_pointwise_channels`
    now widens to 2 of five (14x14x576->96: 145 -> 120).

    Measured, AVX2 code, 2 threads, Zen 4, alone: ResNet-50's 14-wide 1x1 convs take 2 columns
    of four vectors instead of 5 of two (15 computed): 14x14x1024->512 1128 -> 1041 us,
    1024->256 591 -> 525, 256->1024 578 -> 522, 1x1/2 28x28x512->1024 1101 -> 1027. A 3x3
    conv keeps the padded tile (3x3/2 28x28x256->256: 1265 against 1306 us), whose columns
    share their input windows. Those that do not widen their channels take a flat tile of all 12
    accumulators instead, where `_flat_pointwise_tile` allows it."""
    for columns in range(width - 1, MIN_NARROW_COLUMNS - 1, -1):
        if width % columns:
            continue
        most = _most_vectors(columns, knobs)
        vectors = next((v for v in range(most, 0, -1) if out_c % (v * knobs.lanes) == 0), 0)
        if columns * vectors >= MIN_FMA_CHAINS:
            return columns, vectors * knobs.lanes
    return None


def flat_pointwise(geo: Conv2DGeometry) -> bool:
    """Whether `geo` can take tiles along its flattened output pixels (`Conv2DConfig.flat`):
    a 1x1 conv without padding or groups, of more than one output row."""
    return (geo.kh, geo.kw) == (1, 1) and not any(geo.pad) and flat_tiles(geo)


def flat_tiles(geo: Conv2DGeometry) -> bool:
    """Whether `geo` can take tiles along its flattened output pixels at all: a conv without
    groups, of more than one output row (`flat_pointwise` and `_flat_window_tile` say when)."""
    return geo.groups == 1 and geo.out_h > 1


def _flat_rows(pixels: int, rows: int, vectors: int) -> int:
    """The pixels of a flat tile of `vectors` vectors and at most `rows` pixels over `pixels`:
    `pick_block`'s divisor, else, of the tiles of MIN_FMA_CHAINS accumulators or more, the one
    that pads the fewest pixels (49 pixels in two vectors: 5, 50 computed; not 6, 54).

    Measured, AVX2 code, 2 threads, Zen 5, alone, three timings each (6 -> 5 pixels of two
    vectors): 7x7x320->1280 194-218 -> 174-179 us, 7x7x512->2048 463-474 -> 439-458, 1x1/2
    14x14x1024->2048 884-938 -> 849-902, 1x1/2 13x13x384->2048 335-340 -> 326-330; as fast
    either way 7x7x2048->512, 7x7x960->320, 7x7x960->160, 7x7x576->160, 13x13x256->256 and
    13x13x1024->256; three vectors, 4 -> 3 pixels, 7x7x160->960 68-76 -> 73-75."""
    block = pick_block(pixels, rows)
    if pixels % block == 0:
        return block
    tiles = range(ceil_div(MIN_FMA_CHAINS, vectors), rows + 1)
    return min(tiles, key=lambda b: (round_up(pixels, b), -b), default=block)


def _flat_pointwise_tile(geo: Conv2DGeometry, dtype: str, accumulators: int, knobs) -> tuple[int, int, int] | None:
    """(pixels, channels, row chunks) of a tile along the flattened output pixels for a 1x1 conv
    whose row tile has `accumulators` < FLAT_BELOW_ACCUMULATORS: dense_kn's tile for [pixels, C]
    x [C, O] (`column_block`'s channels; pixels: `_flat_rows`' tile over a chunk's pixels, at
    most as many as the accumulators hold), in the chunks of rows that `_row_chunks` gives
    a channel-block-outer loop (a small kernel: one per thread, each flattened on its own); None
    where `geo` cannot take it, its channel blocks leave a thread idle, its rows would lose the
    chunks the row tile has (chunks of one row), or, where its row tile runs channels inner, one
    image's input exceeds FLAT_MAX_IMAGE_BYTES (the flat tile's channel blocks run outermost,
    each re-reading the image). A row tile of MIN_FMA_CHAINS accumulators or more (but fewer
    than FLAT_BELOW_ACCUMULATORS) gives way only to a flat tile of every accumulator, a chunk's
    last tile padded, where that pads at most `knobs.MAX_PADDED_FRACTION` of its pixels and the
    conv does not widen its channels (measured when a flat tile stored to a buffer that a copy
    moved to the output, twice the output's stores, which a wider output than input did not
    repay; not measured again since the tiles write the output directly).

    Measured, AVX2 code, 2 threads, Zen 4, alone (row tile -> flat tile): ResNet-50's 7x7x512
    ->2048 638 -> 547 us, 7x7x2048->512 757 -> 611, 1x1/2 14x14x1024->2048 1324 -> 1224;
    MobileNetV2's 7x7x960->160 121 -> 110, 7x7x320->1280 307 -> 267, 14x14x96->576 (2 columns of
    three vectors) 135 -> 110. In the model (`bench_ab.py`, 20-30 rounds), ResNet-50 built for
    AVX2 runs 1.01x faster; MobileNetV2 1.01x slower with its small-kernel 1x1 convs flat too
    (their row chunks lost), 1.03x faster with only the others.

    Row tiles of 8-11 accumulators (AVX2's 4 or 5 columns of two vectors, 2 of four, 3 of
    three): on Zen 5, AVX2 code, 2 threads, alone, a flat tile of 12 takes 28x28x512->256 908 ->
    836 us, 14x14x1024->512 931 -> 840, 14x14x1024->256 469 -> 420, 8x8x2048->1024 1191 -> 1115,
    10x10x1024->960 (5 of two) 793 -> 764, but widening convs lose (28x28x96->2048 1406 -> 1564,
    56x56x64->256 454 -> 489, 1x1/2 56x56x256->512 923 -> 952); ResNet-50 in the model 1.03x
    faster (`bench_ab.py --base`, 30 rounds), but 1.12x slower with its row-chunked 1x1 convs
    flat in one chunk. Flat in their chunks (one per thread, channels outer where the row tile
    ran channels inner), alone: 56x56x256->128 951 -> 845 us, 56x56x256->64 478 -> 442,
    28x28x512->128 481 -> 432, MobileNetV2's 14x14x576->96 104 -> 97 but 14x14x384->64 52 -> 55,
    28x28x192->32 50 -> 52; in the model ResNet-50 0.991 and MobileNetV2 0.979 of the time
    (`bench_ab.py`, 30 rounds). AVX-512's row tiles have 14 or more at ResNet-50's and
    MobileNetV2's widths (flat ones of 24 were slower: 14x14x1024->256 218 -> 235 us); its
    4-wide rows of two vectors gain (6x4x1024->1024 126 -> 111 us, 12x4x512->512 68 -> 60),
    5-wide ones about break even (16x5x512->256 52 -> 53), and at 5x5 a flat tile of 12 pixels
    pads 36 for 25 (5x5x512->512 stays: 39 against 49 us)."""
    if accumulators >= FLAT_BELOW_ACCUMULATORS or not flat_pointwise(geo):
        return None
    enough = accumulators >= MIN_FMA_CHAINS  # the row tile covers the FMA latency, if barely
    if enough and geo.out_c > geo.in_c:
        return None
    image_bytes = tvm.DataType(dtype).itemsize * geo.in_h * geo.in_w * geo.in_c
    if image_bytes > FLAT_MAX_IMAGE_BYTES and not _channels_outer(geo, dtype):  # keep channels inner
        return None
    oc_block = knobs.column_block(geo.out_c)
    if geo.batch * ceil_div(geo.out_c, oc_block) < knobs.cores:
        return None
    asked = _row_chunks(geo, dtype, True, knobs)
    chunks = _flat_chunks(geo, asked)
    if chunks < asked:  # rows in one chunk where the row tile has one per thread (2 rows on 2 cores)
        return None
    pixels, rows = geo.out_h * geo.out_w // chunks, knobs.tile_rows(oc_block)
    if not enough:
        return _flat_rows(pixels, rows, oc_block // knobs.lanes), oc_block, chunks
    if not pads_little(pixels, rows):
        return None
    return rows, oc_block, chunks  # every accumulator, a chunk's last tile padded


def _flat_window_tile(geo: Conv2DGeometry, row_tile: tuple[int, int], dtype: str, knobs) -> tuple[int, int, int] | None:
    """(pixels, channels, row chunks) of a flat tile for a conv of several taps whose row tile
    (`row_tile`: columns, channels) computes more than FLAT_WINDOW_ABOVE_WORK times its output
    (padded columns x padded channels), where a flat tile computes less: `column_block`'s
    channels, `_flat_rows`' pixels over a chunk; None for a 1x1 conv (`_flat_pointwise_tile`),
    one with groups, or one whose channel blocks run inner (its flat tiles would have no chunks
    of rows for the threads).

    AVX2's 7-wide rows (ResNet-50's last stage) take 4 columns of three vectors, 8 columns and
    528 channels computed for 7 and 512 (`_uneven_width_tile`); flat, 5 pixels of two vectors
    compute 50 pixels for 49. AVX2 code, 2 threads, Zen 4, 30 turns of 20 calls in one process,
    median (us, row tile -> flat): 7x7x512->512 1700 -> 1541, 3x3/2 14x14x512->512 1773 -> 1600
    (the same 4 columns of three, flat: 1614, 1686). Where the row tile pads little, flat tiles
    gain nothing: 3x3/2 28x28x256->256 (5 columns of two vectors, 15 for 14) 1505 -> 1491 with 6
    pixels of two, 3x3/2 56x56x128->128 (4 columns of two) 1427 -> 1437 (6 pixels of two)."""
    if (geo.kh, geo.kw) == (1, 1) or not flat_tiles(geo) or not _channels_outer(geo, dtype):
        return None

    def work(extent: int, block: int, channels: int) -> float:  # computed over the output
        return round_up(extent, block) * round_up(geo.out_c, channels) / (extent * geo.out_c)

    row_work = work(geo.out_w, *row_tile)
    if row_work <= FLAT_WINDOW_ABOVE_WORK:
        return None
    channels = knobs.column_block(geo.out_c)
    chunks = _flat_chunks(geo, _row_chunks(geo, dtype, True, knobs))
    span = geo.out_h * geo.out_w // chunks
    pixels = _flat_rows(span, knobs.tile_rows(channels), channels // knobs.lanes)
    return (pixels, channels, chunks) if work(span, pixels, channels) < row_work else None


# Loop order of a dense (groups == 1) conv, measured over the ResNet-50 and MobileNetV2
# layers: sweeping every channel block per output row (channels inner) keeps the input
# rows in cache and wins on large images while the whole kernel stays cached (up to
# 2.1x at 112x112x16->96); one channel block's kernel over every row (channels outer)
# wins once the kernel is large (1.3-2.1x at 7x7 and 14x14 with 1-9 MB kernels).
CHANNELS_INNER_MAX_KERNEL_BYTES = 640 * 1024
# Narrowest divisor of the output width that a dense conv's register tile takes instead of a
# wider tile that pads every row.
MIN_DIVISOR_COLUMNS = 4
# Narrowest divisor of the output width that a 1x1 conv's tile of more vectors takes (_narrow_pointwise_tile).
MIN_NARROW_COLUMNS = 2
# Accumulators a register tile needs to cover the FMA latency (two FMA pipes, 4 cycles); the
# padding a full tile may add instead is `knobs.MAX_PADDED_FRACTION` of the axis.
MIN_FMA_CHAINS = 8
# Work of a row tile (columns and channels computed, padding included, over the output's) above
# which a conv of several taps takes a flat tile that computes less (`_flat_window_tile`; inf: never).
FLAT_WINDOW_ABOVE_WORK = 1 + MAX_PADDED_FRACTION
# Accumulators of a 1x1 conv's row tile below which its tiles may run along the flattened
# pixels instead (_flat_pointwise_tile; 0: never): half as many again as the FMA latency needs,
# for the loads' and the loop's stalls (12: every row tile that does not fill AVX2's 12).
FLAT_BELOW_ACCUMULATORS = MIN_FMA_CHAINS * 3 // 2
# Input bytes of one image up to which a 1x1 conv whose row tile runs channels inner may take
# flat tiles, whose channel blocks run outermost: the threads then read the image once per
# block, from the cache while it holds it (half of a 32 MB L3). AVX2 code, 2 threads, Zen 5,
# alone (row tile -> flat tile): 64x64x960->32 (15 MB) 1150 -> 1020 us, 112x112x256->64 1870
# -> 1790; 112x112x512->128 (26 MB) 8050 -> 12800 (channels outer with the row tile: 11000).
FLAT_MAX_IMAGE_BYTES = 16 << 20
# Output columns of a depthwise conv's register tile, at most.
DEPTHWISE_MAX_COLUMNS = 8
# Bytes of an input image from which a depthwise conv whose vector is half a cache line (AVX2, float32)
# takes two vectors of channels, a whole line of each pixel (`_depthwise_tile`).
DEPTHWISE_LINE_MIN_BYTES = 1 << 20
CACHE_LINE_BYTES = 64
# Taps (kh x kw) of a depthwise kernel up to which its tap loops are unrolled (7x7: ConvNeXt).
MAX_UNROLLED_TAPS = 49
CHANNELS_INNER_MIN_OUTPUT_PIXELS = 28 * 28


def _depthwise_tile(geo: Conv2DGeometry, dtype: str, knobs) -> tuple[int, int]:
    """(oc_block, ow_block) of a depthwise conv: one vector of channels, up to 8 columns (a
    tap's input column serves up to kw of them). Against two vectors of 6 or 4 columns, 2
    threads: AVX2 14x14x384 17.9 -> 10.8 us, 7x7x960 15.0 -> 6.6, 28x28x192 24.3 -> 18.9;
    AVX-512 112x112x32 59.7 -> 44.5, 56x56x144 55.2 -> 48.6.

    But where a vector is half a cache line (AVX2, float32) and the image is large
    (DEPTHWISE_LINE_MIN_BYTES or more), two vectors, a whole line of each pixel, in 4 columns
    (2 at stride 2): the input rows one block of channels sweeps leave L1 before the next
    block comes back for the lines' other halves. Tuned alone with AVX2 code (2 threads, Zen
    4, us): 112x112x32 46 in two vectors of 4 columns, 56x56x144 62 (one vector of 8:
    74-88), 56x56x144/2 27 in two of 2, 112x112x96/2 57; from 28x28x192 (602 KB) on, one
    vector of 7 columns is the best. MobileNetV2 with AVX2 code: 0.965 of the time
    (`bench_ab.py --base 082f6e3 --models mobilenet_v2 --mcpu haswell --rounds 40`)."""
    itemsize = tvm.DataType(dtype).itemsize
    two = 2 * knobs.lanes
    image_bytes = itemsize * geo.in_h * geo.in_w * geo.in_c  # one image: the batch loop is outside
    if two * itemsize == CACHE_LINE_BYTES and geo.out_c % two == 0 and image_bytes >= DEPTHWISE_LINE_MIN_BYTES:
        return two, pick_block(geo.out_w, 4 if geo.stride[1] == 1 else 2)
    return knobs.lanes, pick_block(geo.out_w, DEPTHWISE_MAX_COLUMNS)


def _channels_outer(geo: Conv2DGeometry, dtype: str) -> bool:
    kernel_bytes = tvm.DataType(dtype).itemsize * geo.out_c * geo.kh * geo.kw * (geo.in_c // geo.groups)
    small_kernel = kernel_bytes <= CHANNELS_INNER_MAX_KERNEL_BYTES
    if geo.groups != 1:
        # depthwise/grouped kernels are tiny, but not all: wav2vec2's positional conv (groups 16,
        # 1x128, 768 channels) has 19 MB, which channels inner would read once per column tile
        return not small_kernel
    return not (small_kernel and geo.out_h * geo.out_w >= CHANNELS_INNER_MIN_OUTPUT_PIXELS)


# Parallel iterations per thread below which the output-column tiles join the parallel loop:
# a conv1d (H = 1) at batch 1 with the channel block inner has one row for all the threads.
MIN_PARALLEL_ROWS_PER_CORE = 2


def _columns_parallel(geo: Conv2DGeometry, oc_block: int, channels_outer: bool, knobs) -> bool:
    rows = geo.batch * geo.out_h * (round_up(geo.out_c, oc_block) // oc_block if channels_outer else 1)
    return knobs.parallel and rows < MIN_PARALLEL_ROWS_PER_CORE * knobs.cores


# Kernel bytes up to which a channel-block-outer conv splits its rows, not its channel blocks,
# across the threads (every thread then reads the whole kernel; see _row_chunks).
ROW_CHUNKS_MAX_KERNEL_BYTES = 256 * 1024


def _row_chunks(geo: Conv2DGeometry, dtype: str, channels_outer: bool, knobs, columns_parallel: bool = False) -> int:
    """Chunks of output rows of a channel-block-outer dense conv whose column tiles are not
    in its parallel loop: one per thread when its kernel is small enough for every thread to
    read it all and its rows divide among the threads, else 1.

    The threads take the parallel loop in contiguous slices (`topi_accel.workshare`). With
    the channel blocks outermost, a thread writes some channels of every row; the next
    kernel (a depthwise conv, a pointwise conv: rows outermost) then reads half of its input
    from the other core's cache. With a chunk of rows per thread outermost, each thread
    writes whole rows. 2 threads, Zen 4, AVX-512: MobileNetV2's 14x14x384 depthwise conv,
    timed in a loop right after the 1x1 conv that makes its input, 28.7 -> 17.0 us, and the
    model 1.04-1.11x faster (`benchmarks/bench_ab.py`; int8 about the same)."""
    if columns_parallel or not (channels_outer and knobs.parallel and knobs.cores > 1 and geo.groups == 1):
        return 1
    kernel_bytes = tvm.DataType(dtype).itemsize * geo.out_c * geo.kh * geo.kw * geo.in_c
    if kernel_bytes > ROW_CHUNKS_MAX_KERNEL_BYTES or geo.out_h % knobs.cores:
        return 1
    return knobs.cores


def channels_outer_loop(sch: s_tir.Schedule, cfg, oo, n, h, columns=()) -> tuple:
    """The parallel loop of a channel-block-outer schedule over the adjacent loops (oo, n, h):
    (channel block, batch, row[, `columns`]), or, for a parallel `cfg` (any config with
    ``parallel`` and ``row_chunks``) whose chunks divide the rows, and no `columns`, (batch,
    chunk of rows, channel block, row in the chunk): each thread's contiguous slice is then
    its rows, as for a kernel parallel over (batch, row). Returns (the loop, the chunks it
    has): 1 also for a symbolic batch."""
    chunks = cfg.row_chunks if cfg.parallel else 1
    batch, rows = sch.get(n).extent, sch.get(h).extent
    static = isinstance(batch, tirx.IntImm) and isinstance(rows, tirx.IntImm)
    if chunks == 1 or columns or not static or int(rows) % chunks:
        return sch.fuse(oo, n, h, *columns), 1
    chunk, row = sch.split(h, [chunks, None])
    sch.reorder(n, chunk, oo)
    return sch.fuse(n, chunk, oo, row), chunks


def packed_out_channels(geo: Conv2DGeometry, cfg: Conv2DConfig) -> int:
    return round_up(geo.out_c, cfg.oc_block)


def kernel_pack_map(cfg: Conv2DConfig) -> IndexMap:
    """OHWI -> packed [O/ob, KH, KW, I, ob] as an IndexMap (pad O with zeros)."""
    ob = cfg.oc_block
    return IndexMap.from_func(lambda o, h, w, i: [o // ob, h, w, i, o % ob])


def conv2d_nhwc_ohwi(
    data: te.Tensor,
    packed_kernel: te.Tensor,
    geo: Conv2DGeometry,
    cfg: Conv2DConfig,
) -> te.Tensor:
    """Convolution of NHWC data with an OHWI kernel packed by `kernel_pack_map`.

    data: 4-D, NHWC: [batch, in_height, in_width, in_channel].
    packed_kernel: 5-D: [ceil(out_channel / ob), kernel_h, kernel_w, in_channel / groups, ob].
    Returns 4-D, NHWC: [batch, out_height, out_width, out_channel], named
    "conv2d_nhwc_ohwi" (with `cfg.flat`: [batch, row chunks, a chunk's pixels, out_channel],
    which the schedule lays out NHWC; `_flat_conv`). The intermediate "conv2d_nhwc_ohwi_acc"
    covers the padded tile grid; the schedule keeps it in registers. The batch is data's: it
    may be symbolic (`geo` then has a representative batch).
    """
    ob, owb = cfg.oc_block, cfg.ow_block
    if geo.groups > 1 and geo.out_c % ob:  # padded channels would read past the input's groups
        raise ValueError(
            f"conv2d_nhwc_ohwi: oc_block={ob} must divide out_channels={geo.out_c} when groups={geo.groups} > 1"
        )
    o_pad, ow_pad = packed_out_channels(geo, cfg), round_up(geo.out_w, owb)
    expected = (o_pad // ob, geo.kh, geo.kw, geo.in_c // geo.groups, ob)
    if tuple(int(v) for v in packed_kernel.shape) != expected:
        raise ValueError(
            f"conv2d_nhwc_ohwi: packed kernel shape {list(packed_kernel.shape)} != expected {list(expected)}"
        )
    if cfg.flat:
        return _flat_conv(data, packed_kernel, geo, cfg)
    (sh, sw), (dh, dw) = geo.stride, geo.dilation
    padded = _pad_input(data, geo, cfg)
    cg, og = geo.in_c // geo.groups, geo.out_c // geo.groups
    rkh = te.reduce_axis((0, geo.kh), name="rkh")
    rkw = te.reduce_axis((0, geo.kw), name="rkw")
    rc = te.reduce_axis((0, cg), name="rc")
    chan = (lambda o: rc) if geo.groups == 1 else (lambda o: (o // og) * cg + rc)
    batch = data.shape[0]
    acc = te.compute(
        (batch, geo.out_h, ow_pad, o_pad),
        lambda n, h, w, o: te.sum(
            padded[n, h * sh + rkh * dh, w * sw + rkw * dw, chan(o)] * packed_kernel[o // ob, rkh, rkw, rc, o % ob],
            axis=[rkh, rkw, rc],
        ),
        name="conv2d_nhwc_ohwi_acc",
    )
    return te.compute(
        (batch, geo.out_h, geo.out_w, geo.out_c),
        lambda n, h, w, o: acc[n, h, w, o],
        name="conv2d_nhwc_ohwi",
    )


def _flat_conv(data: te.Tensor, packed_kernel: te.Tensor, geo: Conv2DGeometry, cfg: Conv2DConfig) -> te.Tensor:
    """`conv2d_nhwc_ohwi` of a conv without groups with `cfg.flat`: the accumulator [batch,
    row chunks, a chunk's pixels rounded up to ow_block, padded channels] runs along each
    chunk's output pixels in row-major order (a tail tile re-reads the chunk's last pixel, as
    dense_kn's rows do; a pixel's window starts where its row and column put it in the padded
    input). Its output is the accumulator without the tail tiles' padding, [batch, chunks, a
    chunk's pixels, out_channel]: `schedule_conv2d_nhwc_ohwi` lays it out NHWC."""
    if not flat_tiles(geo):
        raise ValueError(
            f"conv2d_nhwc_ohwi: flat tiles take a conv of several output rows without groups, "
            f"not groups {geo.groups}, {geo.out_h} output rows"
        )
    if cfg.columns_parallel:  # a parallel iteration must hold whole channel blocks of every pixel
        raise ValueError("conv2d_nhwc_ohwi: flat tiles do not take columns_parallel=True")
    ob, (sh, sw), (dh, dw), width = cfg.oc_block, geo.stride, geo.dilation, geo.out_w
    batch, o_pad = data.shape[0], packed_out_channels(geo, cfg)
    padded = _pad_input(data, geo, cfg)
    # as channels_outer_loop takes them: a parallel loop over a static batch
    chunks = _flat_chunks(geo, cfg.row_chunks) if cfg.parallel and isinstance(batch, tirx.IntImm) else 1
    rows = geo.out_h // chunks
    span = rows * width  # a chunk's pixels
    rkh = te.reduce_axis((0, geo.kh), name="rkh")
    rkw = te.reduce_axis((0, geo.kw), name="rkw")
    rc = te.reduce_axis((0, geo.in_c), name="rc")

    def read(n, z, p):
        q = z * span + tirx.min(p, span - 1)
        return padded[n, q // width * sh + rkh * dh, q % width * sw + rkw * dw, rc]

    acc = te.compute(
        (batch, chunks, round_up(span, cfg.ow_block), o_pad),
        lambda n, z, p, o: te.sum(read(n, z, p) * packed_kernel[o // ob, rkh, rkw, rc, o % ob], axis=[rkh, rkw, rc]),
        name="conv2d_nhwc_ohwi_acc",
    )
    return te.compute((batch, chunks, span, geo.out_c), lambda n, z, p, o: acc[n, z, p, o], name="conv2d_nhwc_ohwi")


def _flat_output_nhwc(sch: s_tir.Schedule, out, geo: Conv2DGeometry) -> None:
    """Lay out the output of `_flat_conv`, [batch, chunks, a chunk's pixels, channels], as
    NHWC: pixel p of chunk z is row z * rows + p // width, column p % width. Its block keeps
    iterating the accumulator's axes, so a tile's write-back (the epilogue's too, inlined later)
    runs under the tile, from the registers, straight to the output."""
    chunks, width = int(sch.get(out).iter_vars[1].dom.extent), geo.out_w
    rows = geo.out_h // chunks
    sch.transform_layout(out, ("write", 0), lambda n, z, p, o: [n, z * rows + p // width, p % width, o])


def _flat_chunks(geo: Conv2DGeometry, chunks: int) -> int:
    """The chunks of rows a flat conv's accumulator is in, for `chunks` asked: those where they
    divide the rows (as `channels_outer_loop` takes them) into chunks of several rows (as
    `flat_pointwise` asks of the whole output), else 1."""
    return chunks if geo.out_h % chunks == 0 and geo.out_h // chunks > 1 else 1


def _grid_extent(geo: Conv2DGeometry, ow_block: int) -> tuple[int, int]:
    """Rows and columns of the padded input that a tile grid `ow_block` columns wide reads."""
    need_h = (geo.out_h - 1) * geo.stride[0] + (geo.kh - 1) * geo.dilation[0] + 1
    need_w = (round_up(geo.out_w, ow_block) - 1) * geo.stride[1] + (geo.kw - 1) * geo.dilation[1] + 1
    return need_h, need_w


def _input_extent(geo: Conv2DGeometry, cfg) -> tuple[int, int] | None:
    """Rows and columns the tile grid of `cfg` (any config with an ``ow_block``) reads, or
    None when it reads only the unpadded input (a flat tile's grid: the output's columns)."""
    need_h, need_w = _grid_extent(geo, 1 if getattr(cfg, "flat", False) else cfg.ow_block)
    if geo.pad[0] == 0 and geo.pad[1] == 0 and need_h <= geo.in_h and need_w <= geo.in_w:
        return None
    return need_h, need_w


def _pad_input(data: te.Tensor, geo: Conv2DGeometry, cfg: Conv2DConfig) -> te.Tensor:
    """Zero-pad NHWC `data` to the rows/columns the tile grid reads ("conv2d_nhwc_ohwi_pad";
    a negative pad after drops rows/columns the grid never reads)."""
    extent = _input_extent(geo, cfg)
    if extent is None:
        return data
    need_h, need_w = extent
    pt, pl = geo.pad[0], geo.pad[1]
    after = [0, need_h - geo.in_h - pt, need_w - geo.in_w - pl, 0]
    return topi.nn.pad(data, [0, pt, pl, 0], after, name="conv2d_nhwc_ohwi_pad")


def schedule_conv2d_nhwc_ohwi(func: tirx.PrimFunc, geo: Conv2DGeometry, cfg: Conv2DConfig) -> tirx.PrimFunc:
    """Schedule a PrimFunc made from `conv2d_nhwc_ohwi` (blocks found by name); its batch
    (the data's first axis) may be symbolic."""
    lanes = cfg.lanes
    batch = func.params[0].ty.shape[0]
    sch = s_tir.Schedule(func)
    acc = sch.get_sblock("conv2d_nhwc_ohwi_acc")
    out = sch.get_sblock("conv2d_nhwc_ohwi")
    if cfg.flat:
        _flat_output_nhwc(sch, out, geo)
    n, h, w, o, rkh, rkw, rc = sch.get_loops(acc)
    wo, wi = sch.split(w, [None, cfg.ow_block])
    oo, oi = sch.split(o, [None, cfg.oc_block])
    columns = [wo] if cfg.columns_parallel else []  # column tiles in the parallel loop too
    if cfg.channels_outer:
        sch.reorder(oo, n, h, wo, rkh, rkw, rc, wi, oi)
        rows = int(sch.get(h).extent)  # the output rows; a flat conv's chunks of them
        outer, chunks = channels_outer_loop(sch, cfg, oo, n, h, columns)
        tile = outer if columns else wo
        if geo.groups == 1:
            panel = geo.kh * geo.kw * geo.in_c * cfg.oc_block  # one channel block's kernel
            if chunks > 1:  # (batch, chunk) outside the panels
                per_panel = rows // chunks
            else:
                per_panel = batch * rows * (round_up(geo.out_w, cfg.ow_block) // cfg.ow_block if columns else 1)
            prefetch_next_panel(sch, rc, 1, panel, per_panel, batch * geo.out_h * geo.out_w)
    else:
        sch.reorder(n, h, wo, oo, rkh, rkw, rc, wi, oi)
        outer, tile = sch.fuse(n, h, *columns), oo
    if cfg.parallel:
        sch.parallel(outer)
    register_tile(sch, wi, oi, lanes)
    if geo.groups == geo.in_c and geo.kh * geo.kw <= MAX_UNROLLED_TAPS:
        # depthwise: one load and one FMA per tap and vector, so the taps unrolled let LLVM
        # reuse a column's loads across the tile's columns and drop the loop: MobileNetV2's
        # stride-1 layers 1.1-1.4x faster (14x14x384 29 -> 21 us, 56x56x144 114 -> 85 us)
        sch.unroll(rkh)
        sch.unroll(rkw)
    sch.reverse_compute_at(out, tile)
    sch.set_scope(acc, 0, "local")
    sch.decompose_reduction(acc, rkh)
    vectorize_inner(sch, out, lanes)
    if _input_extent(geo, cfg) is None:
        return sch.mod["main"]
    pad = sch.get_sblock("conv2d_nhwc_ohwi_pad")
    if geo.groups == geo.in_c:
        # depthwise: test the border in the tile loop, one select per vector of channels;
        # 1.6-1.9x faster than a padded copy on the MobileNetV2 layers (dense convs, which
        # load one scalar per FMA, get 1.1-2.3x slower this way)
        sch.compute_inline(pad)
        return sch.mod["main"]
    loops = sch.get_loops(pad)  # a padded copy of the input, made once
    rows = sch.fuse(*loops[: 3 if cfg.columns_parallel else 2])
    if cfg.parallel:
        sch.parallel(rows)
    vectorize_inner(sch, pad, lanes)
    return sch.mod["main"]


# an image's channels (grey, RGB, RGBA): a model's first conv may read its input NCHW
NCHW_DATA_MAX_CHANNELS = 4


def nchw_data_reason(geo: Conv2DGeometry) -> str | None:
    """None when `conv2d_nhwc_ohwi_func` takes this conv's data NCHW, else why not: a conv
    without groups of few input channels (a model's first, on the image) that pads its top or
    left and reads every row and column of its input, whose kernel makes a padded NHWC copy
    of the input anyway and transposes it there (a copy that drops rows or columns cannot take
    the transpose inlined).
    That saves the model its input's transpose: AVX2 code, 2 threads, MobileNetV2's 3x3/2
    224x224x3->32 conv took 219 us with the transpose before it and 173 us without."""
    if geo.groups != 1:
        return f"groups={geo.groups} (NCHW data: only groups=1)"
    if geo.in_c > NCHW_DATA_MAX_CHANNELS:
        return f"{geo.in_c} input channels (NCHW data: at most {NCHW_DATA_MAX_CHANNELS})"
    if not (geo.pad[0] or geo.pad[1]):
        return f"padding {list(geo.pad)} (NCHW data: the top or left padded, transposed in the padded copy)"
    need_h, need_w = _grid_extent(geo, 1)  # the fewest a tile grid reads: the output's columns
    if need_h < geo.pad[0] + geo.in_h or need_w < geo.pad[1] + geo.in_w:
        return "a window that skips the input's last rows or columns (NCHW data: the whole input read)"
    return None


@functools.lru_cache(maxsize=256)  # a model repeats shapes; PrimFuncs are immutable
def conv2d_nhwc_ohwi_func(
    geo: Conv2DGeometry, cfg: Conv2DConfig, dtype: str = "float32", batch=None, data_layout: str = "NHWC"
) -> tirx.PrimFunc:
    """The scheduled PrimFunc (data, packed_kernel) -> out (NHWC) for one geometry.

    batch: None for ``geo.batch``; else a symbolic batch (a tirx.Var or an expression of
    shape variables; `geo.batch` is then the representative size its tiles are chosen for).
    data_layout: "NHWC", or "NCHW" where `nchw_data_reason` allows it (the transpose is
    inlined into the padded copy of the input).
    """
    batch = geo.batch if batch is None else extent(batch, "batch")
    nhwc = (batch, geo.in_h, geo.in_w, geo.in_c)
    if data_layout == "NHWC":
        data = conv_data = te.placeholder(nhwc, dtype, name="data")
    elif data_layout == "NCHW" and (reason := nchw_data_reason(geo)) is None:
        data = te.placeholder((batch, geo.in_c, geo.in_h, geo.in_w), dtype, name="data")
        conv_data = te.compute(nhwc, lambda n, h, w, c: data[n, c, h, w], name="conv2d_nhwc_ohwi_data")
    else:
        why = reason if data_layout == "NCHW" else "only NHWC and NCHW"
        raise ValueError(f"conv2d_nhwc_ohwi: data_layout {data_layout} is not supported: {why}")
    o_pad = packed_out_channels(geo, cfg)
    kernel = te.placeholder(
        (o_pad // cfg.oc_block, geo.kh, geo.kw, geo.in_c // geo.groups, cfg.oc_block), dtype, name="packed_kernel"
    )
    func = prim_func([data, kernel], conv2d_nhwc_ohwi(conv_data, kernel, geo, cfg))
    if conv_data is not data:
        sch = s_tir.Schedule(func)
        sch.compute_inline(sch.get_sblock("conv2d_nhwc_ohwi_data"))
        func = sch.mod["main"]
    return schedule_conv2d_nhwc_ohwi(func, geo, cfg)


def conv2d_candidates(geo: Conv2DGeometry, target: tvm.target.Target | None = None) -> list[Conv2DConfig]:
    """The configs a tuner tries for `geo`: the heuristic's, then other channel blocks,
    register-tile widths and loop orders that fit the register budget, and for a conv without
    groups tiles along its flattened pixels (`flat_tiles`)."""
    knobs = cpu_knobs(target)
    default = conv2d_config(geo, target)
    if geo.groups == 1:
        blocks = [b * knobs.lanes for b in (1, 2, 3) if b * knobs.lanes <= round_up(geo.out_c, knobs.lanes)]
    else:
        blocks = [b for b in (knobs.lanes, 2 * knobs.lanes, default.oc_block) if geo.out_c % b == 0]
    out = [default]
    for oc_block in dict.fromkeys(blocks):
        cap = knobs.tile_rows(oc_block)
        widths = dict.fromkeys(pick_block(geo.out_w, c) for c in range(max(cap // 2, 1), cap + 1))
        for ow_block in widths:
            for outer in (True, False):
                chunks = _row_chunks(geo, "float32", outer, knobs, default.columns_parallel)
                cfg = replace(
                    default, oc_block=oc_block, ow_block=ow_block, channels_outer=outer, flat=False, row_chunks=chunks
                )
                if cfg not in out:
                    out.append(cfg)
        if flat_tiles(geo):
            chunks = _flat_chunks(geo, _row_chunks(geo, "float32", True, knobs))
            pixels = geo.out_h * geo.out_w // chunks
            for ow_block in dict.fromkeys(pick_block(pixels, c) for c in range(max(cap // 2, 1), cap + 1)):
                flat = Conv2DConfig(oc_block, ow_block, knobs.lanes, knobs.parallel, flat=True, row_chunks=chunks)
                if flat not in out:
                    out.append(flat)
    return out


def tune_conv2d(geo: Conv2DGeometry, target: tvm.target.Target, number: int = 5, limit: int | None = None):
    """(fastest config, its ms) among `conv2d_candidates`, timed on random data."""
    import numpy as np

    rng = np.random.default_rng(0)
    data = rng.standard_normal((geo.batch, geo.in_h, geo.in_w, geo.in_c)).astype("float32")
    candidates = conv2d_candidates(geo, target)[: max(limit, 1) if limit is not None else None]

    dev = tvm.cpu()
    data_t = tvm.runtime.tensor(data)
    out_t = tvm.runtime.tensor(np.zeros((geo.batch, geo.out_h, geo.out_w, geo.out_c), "float32"))
    best, best_ms = None, float("inf")
    for cfg in candidates:
        kernel = tvm.runtime.tensor(
            rng.standard_normal(
                (packed_out_channels(geo, cfg) // cfg.oc_block, geo.kh, geo.kw, geo.in_c // geo.groups, cfg.oc_block)
            ).astype("float32")
        )
        func = tuning.finish_kernel(conv2d_nhwc_ohwi_func(geo, cfg), target)  # as the build runs it
        lib = tvm.compile(tvm.IRModule({"main": func}), target).jit()
        ms = lib.time_evaluator("main", dev, number=number, repeat=3)(data_t, kernel, out_t).median * 1e3
        if ms < best_ms:
            best, best_ms = cfg, ms
    return best, best_ms
