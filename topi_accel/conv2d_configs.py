"""Tile sizes and loop order of conv2d_nhwc_ohwi: the rules as data, and `conv2d_config`,
which reads them (after TVM's x86 conv2d default configs).

A register tile of ``ow_block`` output columns x ``oc_block`` channels keeps
``ow_block * oc_block / lanes`` accumulators; `CPUKnobs.accumulators` is their budget. The
rules, in the order `conv2d_config` applies them:

1. a tuning database's entry (`topi_accel.tuning`), where one is in use;
2. the row tile of the conv's kind (`ROW_TILES`: depthwise, without groups, grouped; a
   grouped conv's vectors stay within one group, `conv_lanes`);
3. for a conv without groups, a tile along its flattened output pixels where its row tile
   keeps too few accumulators or computes too many padded columns (`FLAT_TILES`, tried in
   order; `Conv2DConfig.flat`);
4. the loop order (`channels_outer`), whether the column tiles join the parallel loop, and
   the chunks of rows (`row_chunks`), from the kernel's and the output's sizes.

`conv2d_candidates` lists the configs a tuner tries; `tune_conv2d` times them.
"""

from __future__ import annotations

import math
from dataclasses import asdict, replace

import tvm

from . import tuning
from .conv2d import Conv2DConfig, Conv2DGeometry, conv2d_nhwc_ohwi_func, flat_chunks, flat_tiles, packed_out_channels
from .knobs import MAX_PADDED_FRACTION, ceil_div, cpu_knobs, largest_divisor, pads_little, pick_block, round_up

# Accumulators a register tile needs to cover the FMA latency (two FMA pipes, 4 cycles each).
MIN_FMA_CHAINS = 8
# Narrowest divisor of the output width that a conv's row tile takes instead of a wider tile
# that pads every row.
MIN_DIVISOR_COLUMNS = 4
# Narrowest divisor of the output width that a 1x1 conv's tile of more vectors takes.
MIN_NARROW_COLUMNS = 2
# Accumulators of a 1x1 conv's row tile below which it may take a flat tile: half as many again
# as the FMA latency needs, for the stalls of the loads and the loop.
FLAT_BELOW_ACCUMULATORS = MIN_FMA_CHAINS * 3 // 2
# Work of a row tile (columns and channels computed, padding included, over the output's)
# above which a conv of several taps takes a flat tile that computes less.
FLAT_WINDOW_ABOVE_WORK = 1 + MAX_PADDED_FRACTION
# Input bytes of one image up to which a 1x1 conv whose row tile runs channels inner may take a
# flat tile, whose channel blocks run outermost: each block re-reads the image, from the cache
# while it holds it.
FLAT_MAX_IMAGE_BYTES = 16 << 20
# Output columns of a depthwise conv's register tile, at most.
DEPTHWISE_MAX_COLUMNS = 8
# Bytes of one input image from which a depthwise conv whose vector is half a cache line takes
# two vectors of channels (a whole line of each pixel) in DEPTHWISE_LINE_COLUMNS columns (half
# as many at a stride).
DEPTHWISE_LINE_MIN_BYTES = 1 << 20
DEPTHWISE_LINE_COLUMNS = 4
CACHE_LINE_BYTES = 64
# Kernel bytes up to which a conv without groups may sweep every channel block per output row
# (channels inner: its input rows stay cached, and the whole kernel with them), when its output
# has CHANNELS_INNER_MIN_OUTPUT_PIXELS or more; a larger kernel runs one block's panel over
# every row (channels outer). A grouped conv runs channels inner up to these bytes.
CHANNELS_INNER_MAX_KERNEL_BYTES = 640 * 1024
CHANNELS_INNER_MIN_OUTPUT_PIXELS = 28 * 28
# Parallel iterations per thread below which the output-column tiles join the parallel loop:
# a conv1d (H = 1) at batch 1 with the channel block inner has one row for all the threads.
MIN_PARALLEL_ROWS_PER_CORE = 2
# Kernel bytes up to which a channel-block-outer conv splits its rows, not its channel blocks,
# across the threads (every thread then reads the whole kernel; `row_chunks`).
ROW_CHUNKS_MAX_KERNEL_BYTES = 256 * 1024
# Vectors of channels per block that a tuner tries for a conv without groups.
CANDIDATE_VECTORS = (1, 2, 3)


def conv2d_key(geo: Conv2DGeometry, target: tvm.target.Target | None = None) -> str:
    """The tuning database key of `geo` on `target`."""
    return tuning.kernel_key("conv2d_nhwc_ohwi", asdict(geo), target)


def _kernel_bytes(geo: Conv2DGeometry, dtype: str) -> int:
    """Bytes of `geo`'s OHWI kernel in `dtype`."""
    return tvm.DataType(dtype).itemsize * geo.out_c * geo.kh * geo.kw * (geo.in_c // geo.groups)


def channels_outer(geo: Conv2DGeometry, dtype: str) -> bool:
    """Whether the channel-block loop of `geo` (elements of `dtype`) runs outermost, each
    block's kernel panel reused over every row, rather than innermost (the constants above)."""
    small_kernel = _kernel_bytes(geo, dtype) <= CHANNELS_INNER_MAX_KERNEL_BYTES
    if geo.groups != 1:
        # grouped kernels are mostly tiny, but not all (a long 1-D one of 768 channels in 16
        # groups has megabytes, which channels inner would read once per column tile)
        return not small_kernel
    return not (small_kernel and geo.out_h * geo.out_w >= CHANNELS_INNER_MIN_OUTPUT_PIXELS)


def _columns_parallel(geo: Conv2DGeometry, oc_block: int, outer: bool, knobs) -> bool:
    """Whether the output-column tiles join the parallel loop (MIN_PARALLEL_ROWS_PER_CORE)."""
    rows = geo.batch * geo.out_h * (round_up(geo.out_c, oc_block) // oc_block if outer else 1)
    return knobs.parallel and rows < MIN_PARALLEL_ROWS_PER_CORE * knobs.cores


def row_chunks(geo: Conv2DGeometry, dtype: str, outer: bool, knobs, columns_parallel: bool = False) -> int:
    """Chunks of output rows of a channel-block-outer (`outer`) conv without groups whose
    column tiles are not in its parallel loop: one per thread where its kernel has at most
    ROW_CHUNKS_MAX_KERNEL_BYTES and its rows divide among the threads, else 1.

    The threads take the parallel loop in contiguous slices. With the channel blocks
    outermost, each thread writes some channels of every row, and the next kernel (rows
    outermost) reads part of its input from another core's cache; with a chunk of rows per
    thread outermost, each thread writes whole rows."""
    if columns_parallel or not (outer and knobs.parallel and knobs.cores > 1 and geo.groups == 1):
        return 1
    if _kernel_bytes(geo, dtype) > ROW_CHUNKS_MAX_KERNEL_BYTES or geo.out_h % knobs.cores:
        return 1
    return knobs.cores


def most_vectors(columns: int, knobs) -> int:
    """Vectors of channels a register tile `columns` wide may have (0: none fit): its
    accumulators within the budget, and with a register per vector of weights and one for the
    broadcast input within the registers."""
    return min(knobs.accumulators // columns, (knobs.registers - 1) // (columns + 1))


def _narrow_pointwise_tile(width: int, out_c: int, knobs) -> tuple[int, int] | None:
    """(columns, channels) of a 1x1 conv's tile as wide as the widest divisor of `width` (at
    least MIN_NARROW_COLUMNS) that keeps MIN_FMA_CHAINS accumulators with the most whole
    vectors of channels that divide `out_c` and fit the registers (`most_vectors`: more
    would spill); None if no divisor does."""
    for columns in range(width - 1, MIN_NARROW_COLUMNS - 1, -1):
        if width % columns:
            continue
        most = most_vectors(columns, knobs)
        vectors = next((v for v in range(most, 0, -1) if out_c % (v * knobs.lanes) == 0), 0)
        if columns * vectors >= MIN_FMA_CHAINS:
            return columns, vectors * knobs.lanes
    return None


def _uneven_width_tile(geo: Conv2DGeometry, oc_block: int, knobs) -> tuple[int, int]:
    """(columns, channels) of a conv without groups whose output width no full tile of
    `oc_block` channels divides (for a kernel of several taps: none of MIN_FMA_CHAINS
    accumulators).

    The widest divisor of the width that the accumulators allow, with the vectors they leave.
    Where that keeps fewer than MIN_FMA_CHAINS accumulators: for a 1x1 conv a narrower divisor
    of more vectors (`_narrow_pointwise_tile`); else the full tile's width that pads the fewest
    columns, where it pads at most MAX_PADDED_FRACTION of the row; a kernel of several taps
    takes that width whatever it pads, with as many vectors as fit (`most_vectors`: its
    columns share their input windows). The full tile's widths go down to half its width, for
    a kernel of several taps not below MIN_FMA_CHAINS accumulators (a 1x1 conv's tile of fewer
    gives way to a flat tile). 7-wide rows of a 3x3 conv, for one, take 4 columns of three
    vectors with 12 accumulators (`_flat_window_tile` may then trade them for a flat tile)."""
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
    if not pointwise:
        fewest = max(fewest, ceil_div(MIN_FMA_CHAINS, oc_block // knobs.lanes))
    padded = min(range(cap, fewest - 1, -1), key=lambda c: round_up(width, c))
    if columns < MIN_DIVISOR_COLUMNS:
        return padded, oc_block
    if columns * vectors < MIN_FMA_CHAINS:
        if pads_little(width, padded):
            return padded, oc_block
        if not pointwise:
            return padded, knobs.lanes * min(most_vectors(padded, knobs), ceil_div(geo.out_c, knobs.lanes))
    return columns, knobs.lanes * vectors


def _widening_pointwise_channels(out_c: int, columns: int, oc_block: int, knobs) -> int:
    """Channels of the row tile `columns` wide of a 1x1 conv that widens its channels (so it
    takes no flat tile), with a budget of at most FLAT_BELOW_ACCUMULATORS: as many vectors as
    fit (`most_vectors`), the packed channels padded up to them, where that pads at most
    MAX_PADDED_FRACTION of `out_c`; else `oc_block`. With 12 accumulators, 4 columns of two
    vectors become 4 of three, 2 of four 2 of five."""
    wider = most_vectors(columns, knobs) * knobs.lanes
    if knobs.accumulators <= FLAT_BELOW_ACCUMULATORS and wider > oc_block and pads_little(out_c, wider):
        return wider
    return oc_block


def _dense_tile(geo: Conv2DGeometry, dtype: str, knobs) -> tuple[int, int]:
    """(columns, channels) of the row tile of a conv without groups: `column_block`'s channels
    (the packed kernel zero-padded up to them) in as many columns as the accumulators hold,
    where those divide the width and keep MIN_FMA_CHAINS accumulators or span the whole row;
    else `_uneven_width_tile`, or `_narrow_pointwise_tile` for a 1x1 conv. A 1x1
    conv that widens its channels then takes `_widening_pointwise_channels`."""
    oc_block = knobs.column_block(geo.out_c)
    ow_block = pick_block(geo.out_w, knobs.tile_rows(oc_block))
    pointwise = (geo.kh, geo.kw) == (1, 1)
    few = ow_block * oc_block // knobs.lanes < MIN_FMA_CHAINS and ow_block < geo.out_w
    if geo.out_w % ow_block or (few and not pointwise):
        ow_block, oc_block = _uneven_width_tile(geo, oc_block, knobs)
    elif few:
        ow_block, oc_block = _narrow_pointwise_tile(geo.out_w, geo.out_c, knobs) or (ow_block, oc_block)
    if pointwise and geo.out_c > geo.in_c and ow_block * oc_block // knobs.lanes >= MIN_FMA_CHAINS:
        oc_block = _widening_pointwise_channels(geo.out_c, ow_block, oc_block, knobs)
    return ow_block, oc_block


def _depthwise_tile(geo: Conv2DGeometry, dtype: str, knobs) -> tuple[int, int]:
    """(columns, channels) of a depthwise conv: one vector of channels in up to
    DEPTHWISE_MAX_COLUMNS columns (a tap's input column serves up to kw of them); where a
    vector is half a cache line and one image is DEPTHWISE_LINE_MIN_BYTES or more, two vectors
    in DEPTHWISE_LINE_COLUMNS columns: the input rows that one block of channels sweeps would
    leave L1 before the next block came back for the lines' other halves."""
    itemsize = tvm.DataType(dtype).itemsize
    two = 2 * knobs.lanes
    image_bytes = itemsize * geo.in_h * geo.in_w * geo.in_c  # one image: the batch loop is outside
    if two * itemsize == CACHE_LINE_BYTES and geo.out_c % two == 0 and image_bytes >= DEPTHWISE_LINE_MIN_BYTES:
        columns = DEPTHWISE_LINE_COLUMNS if geo.stride[1] == 1 else DEPTHWISE_LINE_COLUMNS // 2
        return pick_block(geo.out_w, columns), two
    return pick_block(geo.out_w, DEPTHWISE_MAX_COLUMNS), knobs.lanes


def conv_lanes(geo: Conv2DGeometry, knobs) -> int:
    """Lanes of the vectors of `geo`'s kernel: the target's, except for a grouped conv whose
    groups have a number of output channels that no whole vector divides (a RegNet's 8 on
    AVX-512): the widest power of two that divides it, down to scalars. Output channel o reads
    input channel (o // (O / groups)) * (C / groups) + c, so the lanes of a vector within one
    group read one input value, broadcast, and lanes of two groups read several: LLVM then
    gathers them element by element for every FMA, several times slower than the narrower
    vectors (or scalars) that stay in a group."""
    per_group, reads = geo.out_c // geo.groups, geo.in_c // geo.groups
    if geo.groups == 1 or per_group == reads == 1:
        return knobs.lanes  # (depthwise: lane o reads input channel o, a vector load)
    return math.gcd(per_group, knobs.lanes)  # (lanes: a power of two)


def _grouped_tile(geo: Conv2DGeometry, dtype: str, knobs) -> tuple[int, int]:
    """(columns, channels) of a grouped conv: two vectors of `conv_lanes` channels, or one,
    where they divide the channels (channel o reads input group o // (O / groups), so the
    channels cannot be padded), else the largest divisor of up to two vectors."""
    lanes = conv_lanes(geo, knobs)
    whole = [b for b in (2 * lanes, lanes) if geo.out_c % b == 0]
    oc_block = whole[0] if whole else largest_divisor(geo.out_c, 2 * lanes)
    return pick_block(geo.out_w, knobs.tile_rows(oc_block, lanes)), oc_block


def conv_kind(geo: Conv2DGeometry, knobs) -> str:
    """The key of `geo`'s row tile in ROW_TILES: "depthwise" (in whole vectors of channels),
    "dense" (no groups) or "grouped"."""
    if geo.groups > 1 and geo.groups == geo.in_c and geo.out_c % knobs.lanes == 0:
        return "depthwise"
    return "dense" if geo.groups == 1 else "grouped"


# The row tile (columns, channels) of each kind of conv, by `conv_kind`.
ROW_TILES = {"depthwise": _depthwise_tile, "dense": _dense_tile, "grouped": _grouped_tile}


def flat_rows(pixels: int, rows: int, vectors: int) -> int:
    """The pixels of a flat tile of `vectors` vectors and at most `rows` pixels over `pixels`:
    `pick_block`'s divisor, else, of the tiles of MIN_FMA_CHAINS accumulators or more, the one
    that pads the fewest pixels (49 pixels in two vectors: 5, 50 computed; not 6, 54)."""
    block = pick_block(pixels, rows)
    if pixels % block == 0:
        return block
    tiles = range(ceil_div(MIN_FMA_CHAINS, vectors), rows + 1)
    return min(tiles, key=lambda b: (round_up(pixels, b), -b), default=block)


def flat_pointwise(geo: Conv2DGeometry) -> bool:
    """Whether `geo` can take `_flat_pointwise_tile`: a 1x1 conv without padding or groups, of
    more than one output row."""
    return (geo.kh, geo.kw) == (1, 1) and not any(geo.pad) and flat_tiles(geo)


def _flat_pointwise_tile(geo: Conv2DGeometry, row_tile: tuple[int, int], dtype: str, knobs):
    """(pixels, channels, row chunks) of a flat tile for a 1x1 conv (`flat_pointwise`) whose row
    tile (`row_tile`: columns, channels) keeps fewer than FLAT_BELOW_ACCUMULATORS accumulators:
    dense_kn's tile for [pixels, C] x [C, O] (`column_block`'s channels, `flat_rows`' pixels
    over a chunk of rows), in the chunks of rows that `row_chunks` gives a channel-block-outer
    loop, each flattened on its own. A row tile of MIN_FMA_CHAINS accumulators or more gives
    way only to a flat tile of every accumulator, a chunk's last tile padded, where that pads at
    most MAX_PADDED_FRACTION of its pixels and the conv does not widen its channels.

    None where the channel blocks leave a thread idle, where the rows would lose the chunks the
    row tile has (chunks of one row), or where the row tile runs channels inner and one image
    exceeds FLAT_MAX_IMAGE_BYTES (the flat tile's channel blocks run outermost)."""
    accumulators = row_tile[0] * row_tile[1] // knobs.lanes
    if accumulators >= FLAT_BELOW_ACCUMULATORS or not flat_pointwise(geo):
        return None
    enough = accumulators >= MIN_FMA_CHAINS  # the row tile covers the FMA latency, if barely
    if enough and geo.out_c > geo.in_c:
        return None
    image_bytes = tvm.DataType(dtype).itemsize * geo.in_h * geo.in_w * geo.in_c
    if image_bytes > FLAT_MAX_IMAGE_BYTES and not channels_outer(geo, dtype):
        return None
    oc_block = knobs.column_block(geo.out_c)
    if geo.batch * ceil_div(geo.out_c, oc_block) < knobs.cores:
        return None
    asked = row_chunks(geo, dtype, True, knobs)
    chunks = flat_chunks(geo, asked)
    if chunks < asked:
        return None
    pixels, rows = geo.out_h * geo.out_w // chunks, knobs.tile_rows(oc_block)
    if not enough:
        return flat_rows(pixels, rows, oc_block // knobs.lanes), oc_block, chunks
    if not pads_little(pixels, rows):
        return None
    return rows, oc_block, chunks


def _flat_window_tile(geo: Conv2DGeometry, row_tile: tuple[int, int], dtype: str, knobs):
    """(pixels, channels, row chunks) of a flat tile for a conv of several taps without groups,
    channel blocks outer, whose row tile (`row_tile`: columns, channels) computes more than
    FLAT_WINDOW_ABOVE_WORK times its output (padded columns x padded channels), where the flat
    tile computes less: `column_block`'s channels, `flat_rows`' pixels over a chunk of rows
    (7-wide rows in tiles of 4 columns compute 8 columns for 7; 5 pixels, 50 for 49). None
    otherwise (channel blocks inner: a flat tile would have no chunks of rows for the threads)."""
    if (geo.kh, geo.kw) == (1, 1) or not flat_tiles(geo) or not channels_outer(geo, dtype):
        return None

    def work(extent: int, block: int, channels: int) -> float:  # computed over the output
        return round_up(extent, block) * round_up(geo.out_c, channels) / (extent * geo.out_c)

    row_work = work(geo.out_w, *row_tile)
    if row_work <= FLAT_WINDOW_ABOVE_WORK:
        return None
    channels = knobs.column_block(geo.out_c)
    chunks = flat_chunks(geo, row_chunks(geo, dtype, True, knobs))
    span = geo.out_h * geo.out_w // chunks
    pixels = flat_rows(span, knobs.tile_rows(channels), channels // knobs.lanes)
    return (pixels, channels, chunks) if work(span, pixels, channels) < row_work else None


# The flat tiles a conv's row tile may give way to, tried in order; each returns (pixels,
# channels, row chunks) or None.
FLAT_TILES = (_flat_pointwise_tile, _flat_window_tile)


def _tuned_config(tuned: dict, geo: Conv2DGeometry, dtype: str, knobs) -> Conv2DConfig:
    """A tuning database's entry as a config. An entry without row chunks was timed alone,
    where they do not show: it takes the chunks of `row_chunks` for its loop order."""
    cfg = Conv2DConfig(**tuned)
    if "row_chunks" in tuned:
        return cfg
    return replace(cfg, row_chunks=row_chunks(geo, dtype, cfg.channels_outer, knobs, cfg.columns_parallel))


def conv2d_config(geo: Conv2DGeometry, target: tvm.target.Target | None = None, dtype: str = "float32") -> Conv2DConfig:
    """Tile sizes and loop order for `geo` on `target` (elements of `dtype`): the active tuning
    database's entry, else the rules of the module docstring."""
    knobs = cpu_knobs(target)
    tuned = tuning.lookup(conv2d_key(geo, target))
    if tuned is not None:
        return _tuned_config(tuned, geo, dtype, knobs)
    row_tile = ROW_TILES[conv_kind(geo, knobs)](geo, dtype, knobs)
    for flat_tile in FLAT_TILES:
        flat = flat_tile(geo, row_tile, dtype, knobs)
        if flat is not None:
            pixels, oc_block, chunks = flat
            return Conv2DConfig(oc_block, pixels, knobs.lanes, knobs.parallel, flat=True, row_chunks=chunks)
    ow_block, oc_block = row_tile
    outer = channels_outer(geo, dtype)
    columns = _columns_parallel(geo, oc_block, outer, knobs)
    return Conv2DConfig(
        oc_block=oc_block,
        ow_block=ow_block,
        lanes=conv_lanes(geo, knobs),
        parallel=knobs.parallel,
        channels_outer=outer,
        columns_parallel=columns,
        row_chunks=row_chunks(geo, dtype, outer, knobs, columns),
    )


def conv2d_candidates(geo: Conv2DGeometry, target: tvm.target.Target | None = None) -> list[Conv2DConfig]:
    """The configs a tuner tries for `geo`: the rules' own, then other channel blocks,
    register-tile widths and loop orders that fit the register budget, and for a conv without
    groups tiles along its flattened pixels (`flat_tiles`)."""
    knobs = cpu_knobs(target)
    default = conv2d_config(geo, target)
    if geo.groups == 1:
        blocks = [v * knobs.lanes for v in CANDIDATE_VECTORS if v * knobs.lanes <= round_up(geo.out_c, knobs.lanes)]
    else:
        blocks = [b for b in (default.lanes, 2 * default.lanes, default.oc_block) if geo.out_c % b == 0]
    out = [default]
    for oc_block in dict.fromkeys(blocks):
        cap = knobs.tile_rows(oc_block, default.lanes)
        widths = dict.fromkeys(pick_block(geo.out_w, c) for c in range(max(cap // 2, 1), cap + 1))
        for ow_block in widths:
            for outer in (True, False):
                chunks = row_chunks(geo, "float32", outer, knobs, default.columns_parallel)
                cfg = replace(
                    default, oc_block=oc_block, ow_block=ow_block, channels_outer=outer, flat=False, row_chunks=chunks
                )
                if cfg not in out:
                    out.append(cfg)
        if flat_tiles(geo):
            chunks = flat_chunks(geo, row_chunks(geo, "float32", True, knobs))
            pixels = geo.out_h * geo.out_w // chunks
            for ow_block in dict.fromkeys(pick_block(pixels, c) for c in range(max(cap // 2, 1), cap + 1)):
                flat = Conv2DConfig(oc_block, ow_block, knobs.lanes, knobs.parallel, flat=True, row_chunks=chunks)
                if flat not in out:
                    out.append(flat)
    return out


def tune_conv2d(geo: Conv2DGeometry, target: tvm.target.Target, number: int = 5, limit: int | None = None):
    """(fastest config, its ms) among `conv2d_candidates` (the first `limit` of them), each
    timed on random data as the build finishes it (`tuning.finish_kernel`)."""
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
        func = tuning.finish_kernel(conv2d_nhwc_ohwi_func(geo, cfg), target)
        lib = tvm.compile(tvm.IRModule({"main": func}), target).jit()
        ms = lib.time_evaluator("main", dev, number=number, repeat=3)(data_t, kernel, out_t).median * 1e3
        if ms < best_ms:
            best, best_ms = cfg, ms
    return best, best_ms
