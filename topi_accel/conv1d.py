"""conv1d_nwc_owi: 1-D convolution, NWC activations, OWI weights, on the conv2d_nhwc_ohwi kernel.

A conv1d is the conv2d with H = 1 and a 1 x K kernel: NWC data ``[N, W, C]`` is
NHWC ``[N, 1, W, C]`` in the same memory, and OWI weights ``[O, K, I]`` are
OHWI ``[O, 1, K, I]``. The kernel is `conv2d_nhwc_ohwi` for that geometry, its
inputs reshaped in place (`s_tir` ``transform_layout`` dropping a size-1 axis,
which changes no address) and its write-back computed 3-D (`conv1d_nwc_owi`): it
takes and returns 3-D tensors, so no reshape runs before or after it, and its
blocks keep their names ("conv2d_nhwc_ohwi",
"conv2d_nhwc_ohwi_acc", "conv2d_nhwc_ohwi_pad"): the epilogues after it (bias,
GELU, residual add) are computed in its write-back, and the report counts it, as
for every conv2d_nhwc_ohwi.

Weights are packed as ``[O/ob, K, C/groups, ob]`` (`conv1d_kernel_pack_map`):
the conv2d packing without its size-1 KH axis. The tile sizes are conv2d's for
the H = 1 geometry (`conv2d_config`): ``ow_block`` columns of the long W axis
per register tile, and the column tiles join the parallel loop when the rows
(batch x channel blocks) are too few for the threads.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import tvm
from tvm import s_tir, te, tirx
from tvm.tirx import IndexMap

from .conv2d import (
    SUPPORTED_DTYPES,
    Conv2DConfig,
    Conv2DGeometry,
    conv2d_geometry,
    conv2d_nhwc_ohwi,
    packed_out_channels,
    schedule_conv2d_nhwc_ohwi,
)
from .conv2d_configs import conv2d_config
from .symbolic import extent, prim_func

OP = "conv1d_nwc_owi"


def _ints(value, name: str, count: int, least: int) -> list[int]:
    """A scalar or a sequence (list, tuple, tvm Array) of 1..`count` ints, each >= `least`."""
    vals = [int(value)] if isinstance(value, (int, tvm.tirx.IntImm)) else [int(v) for v in value]
    if not 1 <= len(vals) <= count or min(vals) < least:
        shown = vals[0] if len(vals) == 1 else tuple(vals)
        expected = "an int" if count == 1 else f"an int or {count} ints (left, right)"
        raise ValueError(f"{OP}: {name}={shown} is not supported; expected {expected} >= {least}")
    return vals


def conv1d_geometry(
    data_shape: Sequence[int],
    kernel_shape: Sequence[int],
    strides=1,
    padding=0,
    dilation=1,
    groups: int = 1,
    dtype: str = "float32",
) -> Conv2DGeometry:
    """Check a conv1d_nwc_owi call and return its geometry as a conv2d with H = 1.

    data_shape: 3-D, NWC: [batch, in_width, in_channel].
    kernel_shape: 3-D, OWI: [out_channel, kernel_w, in_channel / groups].
    strides, dilation: an int (or one-element sequence).
    padding: an int (both sides) or (left, right).
    Raises ValueError naming the offending value and what is supported.
    """
    if len(data_shape) != 3:
        raise ValueError(f"{OP}: data has rank {len(data_shape)} (shape {list(data_shape)}); expected 3-D NWC")
    if len(kernel_shape) != 3:
        raise ValueError(f"{OP}: kernel has rank {len(kernel_shape)} (shape {list(kernel_shape)}); expected 3-D OWI")
    (stride,), (dil,) = _ints(strides, "strides", 1, 1), _ints(dilation, "dilation", 1, 1)
    pads = _ints(padding, "padding", 2, 0)
    left, right = pads * 2 if len(pads) == 1 else pads
    n, w, c = (int(v) for v in data_shape)
    o, k, cg = (int(v) for v in kernel_shape)
    try:
        return conv2d_geometry((n, 1, w, c), (o, 1, k, cg), (1, stride), (0, left, 0, right), (1, dil), groups, dtype)
    except ValueError as err:  # the same checks, named for this op and its 3-D shapes
        raise ValueError(
            f"{OP}: {str(err).removeprefix('conv2d_nhwc_ohwi: ')} "
            f"(data NWC {list(data_shape)}, kernel OWI {list(kernel_shape)}, strides {stride}, "
            f"padding ({left}, {right}), dilation {dil}, groups {groups})"
        ) from None


def conv1d_config(geo: Conv2DGeometry, target: tvm.target.Target | None = None) -> Conv2DConfig:
    """Tile sizes for a conv1d geometry (H = 1) on `target`: conv2d_nhwc_ohwi's."""
    return conv2d_config(geo, target)


def conv1d_kernel_pack_map(cfg: Conv2DConfig) -> IndexMap:
    """OWI -> packed [O/ob, K, I, ob] as an IndexMap (pad O with zeros)."""
    ob = cfg.oc_block
    return IndexMap.from_func(lambda o, w, i: [o // ob, w, i, o % ob])


def _drop_unit_h(sch: s_tir.Schedule, block: str, buffer: str, h_axis: int, extent: int) -> None:
    """Remove the size-1 axis `h_axis` of `buffer` (a parameter): row-major, index h * extent + w."""
    sch.transform_layout(
        block,
        buffer,
        lambda *axes: [*axes[:h_axis], axes[h_axis] * extent + axes[h_axis + 1], *axes[h_axis + 2 :]],
    )


def schedule_conv1d_nwc_owi(func: tirx.PrimFunc, geo: Conv2DGeometry, cfg: Conv2DConfig) -> tirx.PrimFunc:
    """Schedule a PrimFunc made from `conv1d_nwc_owi`: its inputs become NWC data [N, W, C]
    and packed kernel [O/ob, K, C/groups, ob] (same memory), then conv2d_nhwc_ohwi's schedule."""
    sch = s_tir.Schedule(func)
    padded = any(sch.get(b).name_hint == "conv2d_nhwc_ohwi_pad" for b in sch.get_child_blocks(sch.get_sblock("root")))
    _drop_unit_h(sch, "conv2d_nhwc_ohwi_pad" if padded else "conv2d_nhwc_ohwi_acc", "data", 1, geo.in_w)
    _drop_unit_h(sch, "conv2d_nhwc_ohwi_acc", "packed_kernel", 1, geo.kw)
    return schedule_conv2d_nhwc_ohwi(sch.mod["main"], geo, cfg)


def conv1d_nwc_owi(data: te.Tensor, packed_kernel: te.Tensor, geo: Conv2DGeometry, cfg: Conv2DConfig) -> te.Tensor:
    """conv2d_nhwc_ohwi at H = 1, its output written 3-D.

    data: 4-D, NHWC with H = 1: [batch, 1, in_width, in_channel] (made 3-D NWC by the schedule).
    packed_kernel: 5-D: [ceil(out_channel / ob), 1, kernel_w, in_channel / groups, ob] (made 4-D).
    Returns 3-D, NWC: [batch, out_width, out_channel], named "conv2d_nhwc_ohwi" like the
    conv2d's output (an epilogue is inlined into its block: its indices must be the block's own).
    """
    acc = conv2d_nhwc_ohwi(data, packed_kernel, geo, cfg).op.input_tensors[0]  # conv2d_nhwc_ohwi_acc
    batch = data.shape[0]  # symbolic, or geo.batch
    return te.compute((batch, geo.out_w, geo.out_c), lambda n, w, o: acc[n, 0, w, o], name="conv2d_nhwc_ohwi")


@functools.lru_cache(maxsize=256)  # a model repeats shapes; PrimFuncs are immutable
def conv1d_nwc_owi_func(geo: Conv2DGeometry, cfg: Conv2DConfig, dtype: str = "float32", batch=None) -> tirx.PrimFunc:
    """The scheduled PrimFunc (data, packed_kernel) -> out for one conv1d geometry (H = 1);
    batch: None for ``geo.batch``, else a symbolic batch (a tirx.Var or an expression of shape
    variables; `geo.batch` is then the representative size its tiles are chosen for).

    data: 3-D, NWC: [batch, in_width, in_channel].
    packed_kernel: 4-D: [ceil(out_channel / ob), kernel_w, in_channel / groups, ob].
    out: 3-D, NWC: [batch, out_width, out_channel], written by the block "conv2d_nhwc_ohwi".
    """
    if geo.in_h != 1 or geo.kh != 1 or geo.out_h != 1:
        raise ValueError(f"{OP}: geometry {geo} is not a conv1d (in_h, kh and out_h must be 1); use conv1d_geometry")
    if str(dtype) not in SUPPORTED_DTYPES:
        raise ValueError(f"{OP}: dtype {dtype} is not supported; supported: {', '.join(SUPPORTED_DTYPES)}")
    batch = geo.batch if batch is None else extent(batch, "batch")
    data = te.placeholder((batch, 1, geo.in_w, geo.in_c), dtype, name="data")
    kernel = te.placeholder(
        (packed_out_channels(geo, cfg) // cfg.oc_block, 1, geo.kw, geo.in_c // geo.groups, cfg.oc_block),
        dtype,
        name="packed_kernel",
    )
    out = conv1d_nwc_owi(data, kernel, geo, cfg)
    return schedule_conv1d_nwc_owi(prim_func([data, kernel], out), geo, cfg)
