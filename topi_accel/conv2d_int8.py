"""conv2d_nhwc_ohwi_int8: uint8/int8 NHWC data x int8 OHWI weights -> int32 NHWC.

Ungrouped convs use the target's int8 dot-product instruction (`dense_int8.int8_dot`:
vpdpbusd with VNNI, else vpmaddubsw for 7-bit weights, else the exact vpmaddwd on data
widened to int16) over groups of input channels. Their weights are packed as ``[O/ob, KH, KW, C/g, ob, g]`` (``ob`` =
``Conv2DInt8Config.oc_block``, a multiple of the instruction's lanes, ``g`` its group;
O and C zero-padded), so that one vector load gives ``lanes`` output channels x ``g``
input channels; `kernel_pack_map_int8` is that layout as an IndexMap. The input is copied
once ("conv2d_nhwc_ohwi_int8_pad") where the instruction needs another dtype, padding or
channels padded to the group; it is zero-padded before the conversion, so a padded pixel
adds nothing (int8 data on vpdpbusd or vpmaddubsw reads ``x + 128``: ``128 * sum(w)`` per
output channel, `compensation`, is subtracted in the write-back).

Depthwise convs (groups == in_channels) have no channel reduction for a dot product:
int32 products vectorized over the channels (LLVM widens the 8-bit operands), the
weights packed as the float kernel's, ``[O/ob, KH, KW, 1, ob]``, the border tested in
the tile loop.

Schedule (as conv2d_nhwc_ohwi's): parallel over (output-channel block, batch, output row),
the channel block outermost when the kernel is large; a register tile of ``ow_block``
output columns x ``oc_block`` channels accumulates in int32 registers.

On a target with AMX, ungrouped convs that `_takes_amx` run on AMX tiles instead (`_amx_acc`,
`_schedule_amx`; `topi_accel.amx`): weights [O/32, KH, KW, C/64, 16, 32, 4], and a step of two
data tiles (of `amx_rows` output columns, along one row or in two rows) x 32 channels.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import s_tir, te, tirx
from tvm.tirx import IndexMap

from . import amx
from .conv2d import Conv2DGeometry, channels_outer_loop, conv2d_geometry, grid_extent, input_extent, kernel_pack_map
from .conv2d_configs import channels_outer, row_chunks
from .dense_int8 import DATA_DTYPES, Int8Dot, dot_tile, int8_dot, needs_compensation, schedule_copy
from .dense_int8 import compensation as dense_compensation
from .knobs import cpu_knobs, largest_divisor, pick_block, round_up
from .tiles import vectorize_inner

NAME = "conv2d_nhwc_ohwi_int8"
# a 1x1 conv runs on AMX from tiles of this many rows (output columns) on
AMX_MIN_ROWS_1X1 = 7


@dataclass(frozen=True)
class Conv2DInt8Config:
    """Schedule knobs: output channels per register tile (whole vectors of int32), output
    columns per register tile, the instruction (unused by depthwise convs: `lanes` is its
    vector), whether to use threads, whether the channel-block loop is outermost, and in how
    many chunks of rows it runs (as `conv2d.Conv2DConfig`'s, from `conv2d_configs`)."""

    oc_block: int
    ow_block: int
    dot: Int8Dot
    parallel: bool = True
    channels_outer: bool = True
    amx_rows: int = 0  # output columns per AMX data tile; 0: the vector instruction
    oh_block: int = 1  # output rows per AMX step: 2 (a data tile per row) where a row fits a tile
    row_chunks: int = 1

    @property
    def lanes(self) -> int:
        return self.dot.lanes


def conv2d_int8_geometry(
    data_shape, kernel_shape, strides=1, padding=0, dilation=1, groups: int = 1, data_dtype="uint8", kernel_dtype="int8"
) -> Conv2DGeometry:
    """Check a conv2d_nhwc_ohwi_int8 call and return its geometry.

    data_shape: 4-D, NHWC: [batch, in_height, in_width, in_channel], uint8 or int8.
    kernel_shape: 4-D, OHWI: [out_channel, kernel_h, kernel_w, in_channel / groups], int8.
    groups: 1, or in_channel (depthwise, out_channel a multiple of it).
    """
    if str(data_dtype) not in DATA_DTYPES:
        raise ValueError(f"{NAME}: data dtype {data_dtype} is not supported; supported: {', '.join(DATA_DTYPES)}")
    if str(kernel_dtype) != "int8":
        raise ValueError(f"{NAME}: kernel dtype {kernel_dtype} is not supported; supported: int8")
    try:
        geo = conv2d_geometry(data_shape, kernel_shape, strides, padding, dilation, groups)
    except ValueError as err:
        raise ValueError(str(err).replace("conv2d_nhwc_ohwi:", f"{NAME}:", 1)) from None
    if geo.groups not in (1, geo.in_c):
        raise ValueError(
            f"{NAME}: groups={geo.groups} is not supported; "
            f"supported: 1 and depthwise (groups = in_channels = {geo.in_c})"
        )
    return geo


def is_depthwise(geo: Conv2DGeometry) -> bool:
    return geo.groups > 1


def takes_compensation(geo: Conv2DGeometry, cfg: Conv2DInt8Config, data_dtype: str) -> bool:
    """Whether the kernel takes `compensation` (int8 data of an ungrouped conv on vpdpbusd or vpmaddubsw)."""
    return not is_depthwise(geo) and needs_compensation(data_dtype, cfg.dot)


def conv2d_int8_config(
    geo: Conv2DGeometry, target: tvm.target.Target | None = None, narrow: bool = False
) -> Conv2DInt8Config:
    """Tile sizes for `geo` on `target`, from its int8 instruction (for weights all
    `dense_int8.narrow_weights` or not) and register budget."""
    knobs, dot = cpu_knobs(target), int8_dot(target, narrow and not is_depthwise(geo))
    lanes, two = dot.lanes, 2 * dot.lanes
    outer = channels_outer(geo, "int8")
    chunks = row_chunks(geo, "int8", outer, knobs)
    if _takes_amx(geo, target):
        rows, oh_block = _amx_tile(geo)
        ow_block = rows * (3 - oh_block)  # a step: two tiles along the row, or one in each of two rows
        return Conv2DInt8Config(amx.N_BLOCK, ow_block, dot, knobs.parallel, outer, rows, oh_block, chunks)
    if is_depthwise(geo):
        whole = [b for b in (two, lanes) if geo.out_c % b == 0]
        oc_block = whole[0] if whole else largest_divisor(geo.out_c, two)
    else:
        oc_block = two if geo.out_c > lanes else lanes
    ow_block = pick_block(geo.out_w, _tile_rows(knobs, oc_block, dot))
    return Conv2DInt8Config(oc_block, ow_block, dot, knobs.parallel, outer, row_chunks=chunks)


def _takes_amx(geo: Conv2DGeometry, target) -> bool:
    """Whether an ungrouped conv runs on AMX tiles: the target has them, the input channels
    fill whole 64-byte tile rows (96 channels padded to 128 would waste a quarter of them),
    the reduction is two tile rows or more (a 1x1 of 64 channels, one tile row, keeps
    vpdpbusd) and, for a 1x1 kernel, a tile has AMX_MIN_ROWS_1X1 rows or more."""
    if is_depthwise(geo) or geo.in_c % amx.CHUNK or geo.kh * geo.kw * geo.in_c < 2 * amx.CHUNK:
        return False
    if geo.kh * geo.kw == 1 and _amx_tile(geo)[0] < AMX_MIN_ROWS_1X1:
        return False
    return amx.available(target)


def _amx_tile(geo: Conv2DGeometry) -> tuple[int, int]:
    """(output columns per data tile, output rows per step): a row of up to 16 columns is one
    tile and a step takes two rows (7x7: tiles of 7, not two of 4 in one row); a longer row
    takes balanced tiles, two per step."""
    if geo.out_w <= amx.MAX_ROWS:
        return geo.out_w, 2
    return amx.tile_rows(geo.out_w), 1


def _tile_rows(knobs, oc_block: int, dot: Int8Dot) -> int:
    """Output columns per register tile of `oc_block` channels. vpdpbusd keeps nothing but
    its accumulators, the broadcast data group and one row of weight vectors live, so with
    AVX-512's 32 registers it takes 28 accumulators (14 columns of 32 channels: a 14-wide row
    in one tile) where the float budget keeps 24. Otherwise (vpmaddwd also needs its products
    in registers, and AVX2 has 16), the float budget."""
    vectors = max(oc_block // dot.lanes, 1)
    if dot.scheme == "vnni" and knobs.registers == 32:
        return (knobs.registers - 1 - vectors - 1) // vectors
    return knobs.tile_rows(oc_block, dot.lanes)


def packed_kernel_shape(geo: Conv2DGeometry, cfg: Conv2DInt8Config) -> tuple[int, ...]:
    """Shape of the kernel packed by `kernel_pack_map_int8`."""
    ob, g = cfg.oc_block, cfg.dot.group
    if is_depthwise(geo):
        return (geo.out_c // ob, geo.kh, geo.kw, 1, ob)
    if cfg.amx_rows:
        chunks = round_up(geo.in_c, amx.CHUNK) // amx.CHUNK
        return (round_up(geo.out_c, ob) // ob, geo.kh, geo.kw, chunks, amx.CHUNK // amx.GROUP, ob, amx.GROUP)
    return (round_up(geo.out_c, ob) // ob, geo.kh, geo.kw, round_up(geo.in_c, g) // g, ob, g)


def kernel_pack_map_int8(geo: Conv2DGeometry, cfg: Conv2DInt8Config) -> IndexMap:
    """OHWI -> the packed kernel layout (see the module docstring) as an IndexMap (zero-padded)."""
    if is_depthwise(geo):
        return kernel_pack_map(cfg)
    ob, g = cfg.oc_block, cfg.dot.group
    if cfg.amx_rows:  # [O/32, KH, KW, C/64, 16, 32, 4]: vpdpbusd's order, C in whole tile rows
        c = amx.CHUNK
        return IndexMap.from_func(lambda o, h, w, i: [o // ob, h, w, i // c, i % c // g, o % ob, i % g])
    return IndexMap.from_func(lambda o, h, w, i: [o // ob, h, w, i // g, o % ob, i % g])


def compensation(kernel_ohwi: np.ndarray) -> np.ndarray:
    """``128 * sum(w)`` per output channel, int32 [O]: what int8 data read as ``x + 128`` adds."""
    return dense_compensation(kernel_ohwi.reshape(kernel_ohwi.shape[0], -1).T)


def _padded_input(data: te.Tensor, geo: Conv2DGeometry, cfg: Conv2DInt8Config, dtype: str) -> te.Tensor:
    """`data` as the tile grid reads it: in `dtype`, zero-padded around (before the
    conversion), channels zero-padded to the group ("conv2d_nhwc_ohwi_int8_pad"); `data`
    itself when none of that is needed."""
    g = 1 if is_depthwise(geo) else amx.CHUNK if cfg.amx_rows else cfg.dot.group
    need_h, need_w = grid_extent(geo, cfg.ow_block)
    need_h += (round_up(geo.out_h, cfg.oh_block) - geo.out_h) * geo.stride[0]  # the rows of a step's grid
    inside = need_h <= geo.in_h and input_extent(geo, cfg) is None
    if inside and str(data.dtype) == dtype and geo.in_c % g == 0:
        return data
    pt, pl = geo.pad[0], geo.pad[1]
    flip = dtype == "uint8" and str(data.dtype) == "int8"  # vpdpbusd reads int8 data as x + 128

    def value(n, y, x, c):
        inside = tirx.all(y >= pt, y < pt + geo.in_h, x >= pl, x < pl + geo.in_w, c < geo.in_c)
        v = data[
            n,
            tirx.min(tirx.max(y - pt, 0), geo.in_h - 1),
            tirx.min(tirx.max(x - pl, 0), geo.in_w - 1),
            tirx.min(c, geo.in_c - 1),
        ]
        v = tirx.if_then_else(inside, v, tirx.const(0, data.dtype))
        return (v.astype("int16") + 128).astype("uint8") if flip else v.astype(dtype)

    return te.compute((geo.batch, need_h, need_w, round_up(geo.in_c, g)), value, name=f"{NAME}_pad")


def conv2d_nhwc_ohwi_int8(
    data: te.Tensor, packed_kernel: te.Tensor, geo: Conv2DGeometry, cfg: Conv2DInt8Config, comp: te.Tensor | None = None
) -> te.Tensor:
    """Integer convolution of NHWC data with an OHWI kernel packed by `kernel_pack_map_int8`.

    data: 4-D, NHWC: [batch, in_height, in_width, in_channel], uint8 or int8.
    packed_kernel: int8, `packed_kernel_shape(geo, cfg)`.
    comp: int32 [out_channel] (`compensation`), exactly when `needs_compensation` (int8
    data on vpdpbusd or vpmaddubsw) for an ungrouped conv.
    Returns int32 4-D, NHWC: [batch, out_height, out_width, out_channel], named
    "conv2d_nhwc_ohwi_int8"; "conv2d_nhwc_ohwi_int8_acc" covers the padded tile grid.
    """
    if tuple(int(v) for v in packed_kernel.shape) != packed_kernel_shape(geo, cfg):
        raise ValueError(
            f"{NAME}: packed kernel shape {list(packed_kernel.shape)} != expected {list(packed_kernel_shape(geo, cfg))}"
        )
    if takes_compensation(geo, cfg, data.dtype) != (comp is not None):
        raise ValueError(
            f"{NAME}: a compensation is needed exactly for ungrouped convs of int8 data on vpdpbusd or vpmaddubsw"
        )
    if is_depthwise(geo) and geo.out_c % cfg.oc_block:
        raise ValueError(f"{NAME}: oc_block={cfg.oc_block} must divide out_channels={geo.out_c} when depthwise")
    shape = (geo.batch, geo.out_h, geo.out_w, geo.out_c)
    if cfg.amx_rows:
        acc = _amx_acc(data, packed_kernel, geo, cfg)
        hb, wb, ob = cfg.oh_block, cfg.ow_block, cfg.oc_block

        def value(n, h, w, o):
            v = acc[n, h // hb, w // wb, o // ob, h % hb, w % wb, o % ob]
            return v if comp is None else v - comp[o]

        return te.compute(shape, value, name=NAME)
    acc = (_depthwise_acc if is_depthwise(geo) else _dot_acc)(data, packed_kernel, geo, cfg)
    if comp is None:
        return te.compute(shape, lambda n, h, w, o: acc[n, h, w, o], name=NAME)
    return te.compute(shape, lambda n, h, w, o: acc[n, h, w, o] - comp[o], name=NAME)


def _dot_acc(data, packed_kernel, geo: Conv2DGeometry, cfg: Conv2DInt8Config) -> te.Tensor:
    """The int32 register tiles of an ungrouped conv: sums over (kh, kw, channel group, channel)."""
    ob, g = cfg.oc_block, cfg.dot.group
    padded = _padded_input(data, geo, cfg, cfg.dot.data_dtype)
    (sh, sw), (dh, dw) = geo.stride, geo.dilation
    rkh = te.reduce_axis((0, geo.kh), name="rkh")
    rkw = te.reduce_axis((0, geo.kw), name="rkw")
    rco = te.reduce_axis((0, round_up(geo.in_c, g) // g), name="rco")
    rci = te.reduce_axis((0, g), name="rci")
    return te.compute(
        (geo.batch, geo.out_h, round_up(geo.out_w, cfg.ow_block), round_up(geo.out_c, ob)),
        lambda n, h, w, o: te.sum(
            padded[n, h * sh + rkh * dh, w * sw + rkw * dw, rco * g + rci].astype("int32")
            * packed_kernel[o // ob, rkh, rkw, rco, o % ob, rci].astype("int32"),
            axis=[rkh, rkw, rco, rci],
        ),
        name=f"{NAME}_acc",
    )


def _amx_acc(data, packed_kernel, geo: Conv2DGeometry, cfg: Conv2DInt8Config) -> te.Tensor:
    """The int32 steps of an AMX conv, [N, OH/hb, W/wb, O/32, hb, wb, 32] (hb, wb = `oh_block`,
    `ow_block`): sums over (kh, kw, channel chunk of 64, group of 4, channel)."""
    hb, wb, ob, c, g = cfg.oh_block, cfg.ow_block, cfg.oc_block, amx.CHUNK, amx.GROUP
    padded = _padded_input(data, geo, cfg, "uint8")
    (sh, sw), (dh, dw) = geo.stride, geo.dilation
    rkh = te.reduce_axis((0, geo.kh), name="rkh")
    rkw = te.reduce_axis((0, geo.kw), name="rkw")
    rco = te.reduce_axis((0, round_up(geo.in_c, c) // c), name="rco")
    rcm = te.reduce_axis((0, c // g), name="rcm")
    rci = te.reduce_axis((0, g), name="rci")
    return te.compute(
        (
            geo.batch,
            round_up(geo.out_h, hb) // hb,
            round_up(geo.out_w, wb) // wb,
            round_up(geo.out_c, ob) // ob,
            hb,
            wb,
            ob,
        ),
        lambda n, ho, wo, oo, hi, wi, oi: te.sum(
            padded[n, (ho * hb + hi) * sh + rkh * dh, (wo * wb + wi) * sw + rkw * dw, rco * c + rcm * g + rci].astype(
                "int32"
            )
            * packed_kernel[oo, rkh, rkw, rco, rcm, oi, rci].astype("int32"),
            axis=[rkh, rkw, rco, rcm, rci],
        ),
        name=f"{NAME}_acc",
    )


def _schedule_amx(sch: s_tir.Schedule, geo: Conv2DGeometry, cfg: Conv2DInt8Config) -> None:
    """Parallel over (channel step, batch, rows) or (batch, rows); a step of 2 x `amx_rows`
    output columns x 32 channels per AMX step."""
    acc, out = sch.get_sblock(f"{NAME}_acc"), sch.get_sblock(NAME)
    n, h, wo, oo, hi, *_ = sch.get_loops(acc)
    if cfg.channels_outer:
        sch.reorder(oo, n, h, wo)
        outer, tile = channels_outer_loop(sch, cfg, oo, n, h)[0], wo
    else:
        outer, tile = sch.fuse(n, h), oo
    if cfg.parallel:
        sch.parallel(outer)
    sch.reverse_compute_at(out, tile)
    sch.set_scope(acc, 0, "local")
    block = sch.get(acc)
    acc_buffer = block.writes[0].source
    padded, kernel = (r.source for r in block.reads)
    (sh, sw), (dh, dw) = geo.stride, geo.dilation
    hb, wb, rows = cfg.oh_block, cfg.ow_block, cfg.amx_rows
    chunks = int(kernel.shape[3])
    h_extent, w_extent = (hb - 1) * sh + (geo.kh - 1) * dh + 1, (wb - 1) * sw + (geo.kw - 1) * dw + 1

    def regions(vars_):
        v_n, v_h, v_wo, v_oo = vars_[:4]
        return (
            amx.region(padded, [v_n], [(v_h * hb * sh, h_extent), (v_wo * wb * sw, w_extent)]),
            amx.region(kernel, [v_oo]),
            amx.region(acc_buffer, [v_n, v_h, v_wo, v_oo]),
        )

    chunk = amx.CHUNK * amx.N_BLOCK  # weight elements of one chunk of 64 channels
    reductions = [
        amx.Reduction(geo.kh, lambda s: dh * s[1], geo.kw * chunks * chunk),
        amx.Reduction(geo.kw, lambda s: dw * s[2], chunks * chunk),
        amx.Reduction(chunks, lambda s: amx.CHUNK, chunk),
    ]
    # the second data tile: the next output row, or the next columns of the same row
    second = (lambda s: sh * s[1]) if hb == 2 else (lambda s: rows * sw * s[2])
    amx.emit_step(sch, hi, rows, regions, lambda s: sw * s[2], second, reductions)


def _depthwise_acc(data, packed_kernel, geo: Conv2DGeometry, cfg: Conv2DInt8Config) -> te.Tensor:
    """The int32 register tiles of a depthwise conv: sums over (kh, kw)."""
    ob, mult = cfg.oc_block, geo.out_c // geo.in_c
    padded = _padded_input(data, geo, cfg, str(data.dtype))
    (sh, sw), (dh, dw) = geo.stride, geo.dilation
    rkh = te.reduce_axis((0, geo.kh), name="rkh")
    rkw = te.reduce_axis((0, geo.kw), name="rkw")
    return te.compute(
        (geo.batch, geo.out_h, round_up(geo.out_w, cfg.ow_block), geo.out_c),
        lambda n, h, w, o: te.sum(
            padded[n, h * sh + rkh * dh, w * sw + rkw * dw, o // mult].astype("int32")
            * packed_kernel[o // ob, rkh, rkw, 0, o % ob].astype("int32"),
            axis=[rkh, rkw],
        ),
        name=f"{NAME}_acc",
    )


def _tile_loops(sch: s_tir.Schedule, loops, cfg: Conv2DInt8Config, inner: list):
    """Order (n, h, w, o) + reductions for the register tile: returns (outer loop, tile loop)
    with the tile's columns and channel loops `inner(wi, oi)` innermost."""
    n, h, w, o, *reductions = loops
    wo, wi = sch.split(w, [None, cfg.ow_block])
    oo, oi = sch.split(o, [None, cfg.oc_block])
    tile_inner = inner(wi, oi)
    if cfg.channels_outer:
        sch.reorder(oo, n, h, wo, *reductions, *tile_inner)
        outer, tile = channels_outer_loop(sch, cfg, oo, n, h)[0], wo
    else:
        sch.reorder(n, h, wo, oo, *reductions, *tile_inner)
        outer, tile = sch.fuse(n, h), oo
    if cfg.parallel:
        sch.parallel(outer)
    return outer, tile


def schedule_conv2d_nhwc_ohwi_int8(func: tirx.PrimFunc, geo: Conv2DGeometry, cfg: Conv2DInt8Config) -> tirx.PrimFunc:
    """Schedule a PrimFunc made from `conv2d_nhwc_ohwi_int8` (blocks found by name)."""
    sch = s_tir.Schedule(func)
    lanes = cfg.lanes
    if cfg.amx_rows:
        _schedule_amx(sch, geo, cfg)
        vectorize_inner(sch, sch.get_sblock(NAME), lanes)
        schedule_copy(sch, f"{NAME}_pad", lanes, cfg.parallel, outer_loops=2)
        return amx.with_permission(sch.mod["main"])
    acc, out = sch.get_sblock(f"{NAME}_acc"), sch.get_sblock(NAME)
    loops = sch.get_loops(acc)
    if is_depthwise(geo):
        _, tile = _tile_loops(sch, loops, cfg, lambda wi, oi: [wi, *sch.split(oi, [None, lanes])])
        wi, ov, ol = sch.get_loops(acc)[-3:]
        sch.unroll(wi)
        sch.unroll(ov)
        sch.vectorize(ol)
        sch.reverse_compute_at(out, tile)
        sch.set_scope(acc, 0, "local")
        sch.decompose_reduction(acc, loops[4])  # rkh
        if input_extent(geo, cfg) is not None:  # the border tested in the tile loop, one select per vector
            sch.compute_inline(sch.get_sblock(f"{NAME}_pad"))
    else:
        rco, rci = loops[-2:]

        def inner(wi, oi):
            ov, ol = sch.split(oi, [None, lanes])
            return [wi, ov, ol, rci]

        _, tile = _tile_loops(sch, loops[:-1], cfg, inner)
        wi, ov, ol, _ = sch.get_loops(acc)[-4:]
        sch.unroll(wi)
        sch.unroll(ov)
        sch.reverse_compute_at(out, tile)
        dot_tile(sch, acc, loops[4], ol, cfg.dot)  # zeroed at rkh
        schedule_copy(sch, f"{NAME}_pad", lanes, cfg.parallel, outer_loops=2)
    vectorize_inner(sch, out, lanes)
    return sch.mod["main"]


@functools.lru_cache(maxsize=256)  # a model repeats shapes; PrimFuncs are immutable
def conv2d_nhwc_ohwi_int8_func(geo: Conv2DGeometry, cfg: Conv2DInt8Config, data_dtype: str = "uint8") -> tirx.PrimFunc:
    """The scheduled PrimFunc (data, packed_kernel[, compensation]) -> int32 out for one geometry."""
    data = te.placeholder((geo.batch, geo.in_h, geo.in_w, geo.in_c), data_dtype, name="data")
    kernel = te.placeholder(packed_kernel_shape(geo, cfg), "int8", name="packed_kernel")
    compensated = takes_compensation(geo, cfg, data_dtype)
    comp = te.placeholder((geo.out_c,), "int32", name="compensation") if compensated else None
    out = conv2d_nhwc_ohwi_int8(data, kernel, geo, cfg, comp)
    args = [data, kernel] + ([comp] if comp is not None else []) + [out]
    return schedule_conv2d_nhwc_ohwi_int8(te.create_prim_func(args, index_dtype_override="int64"), geo, cfg)
