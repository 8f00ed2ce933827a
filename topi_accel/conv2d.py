"""conv2d_nhwc_ohwi: 2-D convolution, NHWC activations, OHWI weights.

The kernel reads its weights packed as ``[O/ob, KH, KW, C/groups, ob]`` (``ob`` =
``Conv2DConfig.oc_block``, O padded up to a multiple of ``ob`` when groups == 1) so that one
vector load gives ``ob`` output channels. `kernel_pack_map` is that layout as an IndexMap: the
strategy applies it to constant weights at compile time and emits it as a visible
layout_transform for runtime weights.

Schedule: parallel over (output-channel block, batch, output row), or with the channel block
innermost (`Conv2DConfig.channels_outer`); a register tile of ``ow_block`` output columns x
``oc_block`` channels accumulates over (kh, kw, c) with the input broadcast (loaded as a
vector when depthwise) and the weights vector-loaded. With the channel block outermost, each
output row prefetches its share of the next block's kernel (`topi_accel.tir_passes.prefetch`),
and a small kernel's rows may come in one chunk per thread outside the channel blocks
(`Conv2DConfig.row_chunks`), so that a thread writes the rows the next kernel's thread reads.

A conv without groups may run its tiles along the output pixels in row-major order instead (h
and w flattened, as dense_kn runs along its rows; `Conv2DConfig.flat`), channel blocks
outermost, the pixels of each chunk of rows flattened on their own: each tile writes its pixels
from the registers straight to their rows and columns of the output, epilogue included
(`_flat_output_nhwc`), each pixel's window read from the padded input.

`topi_accel.conv2d_configs` chooses the config.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import tvm
from tvm import s_tir, te, tirx, topi
from tvm.tirx import IndexMap

from .knobs import round_up
from .symbolic import extent, prim_func
from .tiles import register_tile, vectorize_inner
from .tir_passes.prefetch import prefetch_next_panel

SUPPORTED_DTYPES = ("float32",)
# Taps (kh x kw) of a depthwise kernel up to which its tap loops are unrolled (7x7: ConvNeXt).
MAX_UNROLLED_TAPS = 49
# annotation of the output block of a kernel whose every thread reads the whole input (channel
# blocks split across the threads, each over every row): accel_target.passes.inplace reads it
THREADS_READ_WHOLE_INPUT = "accel.threads_read_whole_input"
# An image's channels (grey, RGB, RGBA): a model's first conv may read its input NCHW.
NCHW_DATA_MAX_CHANNELS = 4


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
    """Schedule knobs (chosen by `topi_accel.conv2d_configs`).

    oc_block: output channels per register tile. ow_block: output columns per register tile
    (with `flat`: output pixels). lanes: float32 lanes of the target's vectors. parallel:
    whether to use threads. channels_outer: whether the channel-block loop is outermost (a
    weight panel reused across all rows) or innermost (every channel block of an output row
    while its input rows are cached). columns_parallel: whether the output-column tiles join
    the parallel loop (too few rows for the threads: H = 1, conv1d). row_chunks: in how many
    chunks of output rows, one after the other, a channel-block-outer loop runs (1: the channel
    blocks split across the threads; one per thread: the rows do). flat: whether the tiles run
    along the flattened output pixels of each chunk of rows.
    """

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


def flat_tiles(geo: Conv2DGeometry) -> bool:
    """Whether `geo` can take tiles along its flattened output pixels (`Conv2DConfig.flat`): a
    conv without groups, of more than one output row."""
    return geo.groups == 1 and geo.out_h > 1


def flat_chunks(geo: Conv2DGeometry, chunks: int) -> int:
    """The chunks of rows a flat conv's accumulator is in, for `chunks` asked: those where they
    divide the rows (as `channels_outer_loop` takes them) into chunks of several rows, else 1."""
    return chunks if geo.out_h % chunks == 0 and geo.out_h // chunks > 1 else 1


def grid_extent(geo: Conv2DGeometry, ow_block: int) -> tuple[int, int]:
    """Rows and columns of the padded input that a tile grid `ow_block` columns wide reads."""
    need_h = (geo.out_h - 1) * geo.stride[0] + (geo.kh - 1) * geo.dilation[0] + 1
    need_w = (round_up(geo.out_w, ow_block) - 1) * geo.stride[1] + (geo.kw - 1) * geo.dilation[1] + 1
    return need_h, need_w


def input_extent(geo: Conv2DGeometry, cfg) -> tuple[int, int] | None:
    """Rows and columns the tile grid of `cfg` (any config with an ``ow_block``) reads, or
    None when it reads only the unpadded input (a flat tile's grid: the output's columns)."""
    need_h, need_w = grid_extent(geo, 1 if getattr(cfg, "flat", False) else cfg.ow_block)
    if geo.pad[0] == 0 and geo.pad[1] == 0 and need_h <= geo.in_h and need_w <= geo.in_w:
        return None
    return need_h, need_w


def packed_out_channels(geo: Conv2DGeometry, cfg: Conv2DConfig) -> int:
    """Output channels of the packed kernel: O padded up to a multiple of ``cfg.oc_block``."""
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
    chunks = flat_chunks(geo, cfg.row_chunks) if cfg.parallel and isinstance(batch, tirx.IntImm) else 1
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


def _pad_input(data: te.Tensor, geo: Conv2DGeometry, cfg: Conv2DConfig) -> te.Tensor:
    """Zero-pad NHWC `data` to the rows/columns the tile grid reads ("conv2d_nhwc_ohwi_pad";
    a negative pad after drops rows/columns the grid never reads)."""
    extent = input_extent(geo, cfg)
    if extent is None:
        return data
    need_h, need_w = extent
    pt, pl = geo.pad[0], geo.pad[1]
    after = [0, need_h - geo.in_h - pt, need_w - geo.in_w - pl, 0]
    return topi.nn.pad(data, [0, pt, pl, 0], after, name="conv2d_nhwc_ohwi_pad")


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


def _flat_output_nhwc(sch: s_tir.Schedule, out, geo: Conv2DGeometry) -> None:
    """Lay out the output of `_flat_conv`, [batch, chunks, a chunk's pixels, channels], as
    NHWC: pixel p of chunk z is row z * rows + p // width, column p % width. Its block keeps
    iterating the accumulator's axes, so a tile's write-back (the epilogue's too, inlined later)
    runs under the tile, from the registers, straight to the output."""
    chunks, width = int(sch.get(out).iter_vars[1].dom.extent), geo.out_w
    rows = geo.out_h // chunks
    sch.transform_layout(out, ("write", 0), lambda n, z, p, o: [n, z * rows + p // width, p % width, o])


def _prefetch_panels(sch: s_tir.Schedule, rc, geo: Conv2DGeometry, cfg: Conv2DConfig, batch, rows: int, chunks: int):
    """Make each iteration of a channel-block-outer loop (`chunks` of the `rows` it runs per
    image) prefetch its share of the next channel block's kernel panel."""
    panel = geo.kh * geo.kw * geo.in_c * cfg.oc_block  # one channel block's kernel
    if chunks > 1:  # (batch, chunk) outside the panels
        per_panel = rows // chunks
    else:
        per_panel = batch * rows * (round_up(geo.out_w, cfg.ow_block) // cfg.ow_block if cfg.columns_parallel else 1)
    prefetch_next_panel(sch, rc, 1, panel, per_panel, batch * geo.out_h * geo.out_w)


def _tile_loops(sch: s_tir.Schedule, loops, geo: Conv2DGeometry, cfg: Conv2DConfig, batch) -> tuple:
    """Split the accumulator's `loops` (n, h, w, o, rkh, rkw, rc) into the register tile and
    order them for `cfg`: (the parallel loop, the loop the write-back goes under, the tile's
    column loop, its channel loop, whether the parallel loop runs the channel blocks of a conv
    without groups outermost over every row: each thread then reads the whole input)."""
    n, h, w, o, rkh, rkw, rc = loops
    wo, wi = sch.split(w, [None, cfg.ow_block])
    oo, oi = sch.split(o, [None, cfg.oc_block])
    columns = [wo] if cfg.columns_parallel else []  # column tiles in the parallel loop too
    if not cfg.channels_outer:
        sch.reorder(n, h, wo, oo, rkh, rkw, rc, wi, oi)
        return sch.fuse(n, h, *columns), oo, wi, oi, False
    sch.reorder(oo, n, h, wo, rkh, rkw, rc, wi, oi)
    rows = int(sch.get(h).extent)  # the output rows; a flat conv's chunks of them
    outer, chunks = channels_outer_loop(sch, cfg, oo, n, h, columns)
    if geo.groups == 1:
        _prefetch_panels(sch, rc, geo, cfg, batch, rows, chunks)
    return outer, outer if columns else wo, wi, oi, chunks == 1 and geo.groups == 1


def _schedule_pad(sch: s_tir.Schedule, geo: Conv2DGeometry, cfg: Conv2DConfig) -> None:
    """The padded copy of the input, if there is one: made once, parallel over its rows; for a
    depthwise conv inlined instead, the border tested in the tile loop (one select per vector
    of channels, where a dense conv would test one scalar per FMA)."""
    if input_extent(geo, cfg) is None:
        return
    pad = sch.get_sblock("conv2d_nhwc_ohwi_pad")
    if geo.groups == geo.in_c:
        sch.compute_inline(pad)
        return
    loops = sch.get_loops(pad)
    rows = sch.fuse(*loops[: 3 if cfg.columns_parallel else 2])
    if cfg.parallel:
        sch.parallel(rows)
    vectorize_inner(sch, pad, cfg.lanes)


def schedule_conv2d_nhwc_ohwi(func: tirx.PrimFunc, geo: Conv2DGeometry, cfg: Conv2DConfig) -> tirx.PrimFunc:
    """Schedule a PrimFunc made from `conv2d_nhwc_ohwi` (blocks found by name); its batch
    (the data's first axis) may be symbolic."""
    batch = func.params[0].ty.shape[0]
    sch = s_tir.Schedule(func)
    acc = sch.get_sblock("conv2d_nhwc_ohwi_acc")
    out = sch.get_sblock("conv2d_nhwc_ohwi")
    if cfg.flat:
        _flat_output_nhwc(sch, out, geo)
    loops = sch.get_loops(acc)
    rkh, rkw = loops[4], loops[5]
    outer, tile, wi, oi, whole_input = _tile_loops(sch, loops, geo, cfg, batch)
    if cfg.parallel:
        sch.parallel(outer)
        if whole_input:
            sch.annotate(out, THREADS_READ_WHOLE_INPUT, True)
    register_tile(sch, wi, oi, cfg.lanes)
    if geo.groups == geo.in_c and geo.kh * geo.kw <= MAX_UNROLLED_TAPS:
        # depthwise: one load and one FMA per tap and vector, so the taps unrolled let LLVM
        # reuse a column's loads across the tile's columns and drop the loop
        sch.unroll(rkh)
        sch.unroll(rkw)
    sch.reverse_compute_at(out, tile)
    sch.set_scope(acc, 0, "local")
    sch.decompose_reduction(acc, rkh)
    vectorize_inner(sch, out, cfg.lanes)
    _schedule_pad(sch, geo, cfg)
    return sch.mod["main"]


def nchw_data_reason(geo: Conv2DGeometry) -> str | None:
    """None when `conv2d_nhwc_ohwi_func` takes this conv's data NCHW, else why not: a conv
    without groups of few input channels (a model's first, on the image) that pads its top or
    left and reads every row and column of its input, whose kernel makes a padded NHWC copy
    of the input anyway and transposes it there, which saves the model its input's transpose
    (a copy that drops rows or columns cannot take the transpose inlined)."""
    if geo.groups != 1:
        return f"groups={geo.groups} (NCHW data: only groups=1)"
    if geo.in_c > NCHW_DATA_MAX_CHANNELS:
        return f"{geo.in_c} input channels (NCHW data: at most {NCHW_DATA_MAX_CHANNELS})"
    if not (geo.pad[0] or geo.pad[1]):
        return f"padding {list(geo.pad)} (NCHW data: the top or left padded, transposed in the padded copy)"
    need_h, need_w = grid_extent(geo, 1)  # the fewest a tile grid reads: the output's columns
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
