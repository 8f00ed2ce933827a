"""AMX tiles for the int8 kernels: ``tdpbusd`` on 16 x 64-byte tile registers.

Where the target has AMX (the ``amx-tile`` and ``amx-int8`` features),
the int8 GEMMs and ungrouped int8 convs of enough rows run their register tile on AMX in
place of vpdpbusd. One ``tdpbusd`` multiplies a tile of ``rows`` x 64 uint8 by 64 x 16
int8 (the weights in vpdpbusd's layout: 16 rows of 16 columns x 4) and adds into
``rows`` x 16 int32: 16 times the products of one vpdpbusd, at about the same issue cost.

A step of the kernel computes 2 x 2 accumulator tiles (``2 * rows`` rows x 32 columns,
tiles 0-3) from two data tiles (4, 5) and two weight tiles (6, 7): zeroed, summed over
the reduction in chunks of 64 (`Reduction`), stored to the kernel's int32 tile buffer,
which the write-back (and the fused requantize) reads as for vpdpbusd. The tiles are
configured at the start of each step (``ldtilecfg``) and released at its end, so a step
needs nothing from the thread that ran the one before.

The data and the weights are bound as match buffers with symbolic strides, which TVM
binds to the buffers they end up as; the accumulators, which TVM's compaction shrinks to
the step after WriteInPlace may have lowered every match buffer, are addressed by element.

Linux lends a process the AMX registers only once it asks (``arch_prctl``
``ARCH_REQ_XCOMP_PERM``), or the first tile instruction faults. `request_permission` asks
from Python, and every AMX kernel asks again on entry (`permission_call`, one cheap
syscall), so a library loaded by TVM's runtime alone also runs.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

import tvm
from tvm import s_tir, tirx
from tvm.target import codegen

from .tir_passes.blocks import root_replaced

FEATURES = ("amx-tile", "amx-int8")
MAX_ROWS = 16  # rows of a tile register
CHUNK = 64  # bytes of a tile row: uint8 data along the reduction
COLUMNS = 16  # int32 columns of an accumulator tile
GROUP = 4  # reduction elements per int32 lane (the weights' innermost axis)
N_BLOCK = 2 * COLUMNS  # columns of a step: two weight tiles
# Linux: arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)
SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA = 158, 0x1023, 18


def available(target: tvm.target.Target | None = None) -> bool:
    """Whether `target` (default: the current one) has AMX int8 tiles."""
    target = target or tvm.target.Target.current(allow_none=True)
    return target is not None and bool(codegen.llvm_cpu_has_features(list(FEATURES), target))


@functools.lru_cache(maxsize=1)
def request_permission() -> bool:
    """Ask Linux for the AMX tile registers for this process; whether it granted them."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0
    except (OSError, AttributeError):  # not Linux
        return False


def permission_call() -> tirx.Stmt:
    """The syscall of `request_permission`, as a statement for a kernel's entry."""
    return tirx.Evaluate(
        tirx.call_extern(
            "int64",
            "syscall",
            *(tirx.const(v, "int64") for v in (SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)),
        )
    )


def with_permission(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """`func` (scheduled, a root block) asking for the tile registers first thing in its root block."""
    return func.with_body(root_replaced(func, body=tirx.SeqStmt([permission_call(), func.body.block.body])))


def tile_rows(extent: int) -> int:
    """Rows per data tile (a step takes two) for an axis of `extent` rows: as few steps as
    16-row tiles need, their rows balanced (56: 2 x 14, not 16, which would pad to 64; 49: 2 x
    13)."""
    steps = -(-extent // (2 * MAX_ROWS))
    return -(-extent // (2 * steps))


@dataclass(frozen=True)
class Reduction:
    """One loop of a step's reduction: its extent and how far the data and the weight
    pointers move per iteration (elements; functions of the matched buffers' strides)."""

    extent: int
    data_step: object  # strides of the data match buffer -> PrimExpr
    weight_step: int


def region(buffer, points, spans=()) -> tirx.BufferRegion:
    """`buffer` at the indices `points` along its first axes, then (min, extent) `spans`,
    then whole along the rest."""
    ranges = [tvm.ir.Range.from_min_extent(x, 1) for x in points]
    ranges += [tvm.ir.Range.from_min_extent(x, e) for x, e in spans]
    ranges += [tvm.ir.Range.from_min_extent(0, int(d)) for d in buffer.shape[len(ranges) :]]
    return tirx.BufferRegion(buffer, ranges)


def _row(acc, starts, row: int, half: int) -> list:
    """Indices along `acc`'s last three axes (rows of a step as (a, b) with b fastest, columns)
    of its row `row` (counted across both) and column block `half`, from `starts`."""
    inner = int(acc.shape[-2])
    return [starts[-3] + row // inner, starts[-2] + row % inner, starts[-1] + half * COLUMNS]


def _call(name: str, *args) -> tirx.Stmt:
    return tirx.Evaluate(tirx.call_llvm_intrin("void", name, *args))


def _tile(i: int) -> tirx.PrimExpr:
    return tirx.const(i, "int8")


def _matched(name: str, source, dtype: str) -> tirx.Buffer:
    """A buffer to match `source` (a TensorRegion) with symbolic strides and offset."""
    region = list(source.region)
    shape = [r.extent for r in region]
    strides = [tirx.Var(f"{name}_s{i}", "int64") for i in range(len(shape))]
    return tirx.decl_buffer(
        shape,
        dtype,
        name,
        strides=strides,
        elem_offset=tirx.Var(f"{name}_offset", "int64"),
        scope=source.source.scope(),
        offset_factor=1,
    )


def _config(rows: int, cfg: tirx.Buffer) -> list:
    """Fill the 64-byte tile configuration: palette 1; tiles 0-5 `rows` x 64 bytes (the
    accumulators and the data), 6-7 16 x 64 bytes (the weights)."""
    config = [0] * 64
    config[0] = 1
    for t in range(8):
        config[16 + 2 * t] = CHUNK  # bytes per row (little-endian uint16)
        config[48 + t] = MAX_ROWS if t >= 6 else rows
    return [tirx.BufferStore(cfg, tirx.const(v, "uint8"), [tirx.const(i, "int32")]) for i, v in enumerate(config)]


def _products(a: tirx.Buffer, b: tirx.Buffer, a_rows, a_off, b_off, second) -> list:
    """One chunk of a step: the two data tiles (4, 5; the second `second` elements after the
    first) and the two weight tiles (6, 7) loaded, and the four tdpbusd into tiles 0-3."""
    return [
        _call("llvm.x86.tileloadd64", _tile(4), a.access_ptr("r", offset=a_off), a_rows),
        _call("llvm.x86.tileloadd64", _tile(5), a.access_ptr("r", offset=a_off + second), a_rows),
        _call("llvm.x86.tileloadd64", _tile(6), b.access_ptr("r", offset=b_off), tirx.const(N_BLOCK * GROUP, "int64")),
        _call(
            "llvm.x86.tileloadd64",
            _tile(7),
            b.access_ptr("r", offset=b_off + COLUMNS * GROUP),
            tirx.const(N_BLOCK * GROUP, "int64"),
        ),
        *(_call("llvm.x86.tdpbusd", _tile(acc), _tile(4 + acc // 2), _tile(6 + acc % 2)) for acc in range(4)),
    ]


def _reduction_nest(a: tirx.Buffer, b: tirx.Buffer, a_rows, second, reductions: list[Reduction]) -> tirx.Stmt:
    """The loops of a step's reduction around `_products`, each moving the data and the weight
    pointers by its `Reduction` steps."""
    loop_vars = [tirx.Var(f"amx_r{i}", "int64") for i in range(len(reductions))]
    a_off = sum((v * r.data_step(a.strides) for v, r in zip(loop_vars, reductions)), tirx.const(0, "int64"))
    b_off = sum((v * r.weight_step for v, r in zip(loop_vars, reductions)), tirx.const(0, "int64"))
    nest = tirx.SeqStmt(_products(a, b, a_rows, a_off, b_off, second))
    for var, red in reversed(list(zip(loop_vars, reductions))):
        nest = tirx.For(var, tirx.const(0, "int64"), tirx.const(red.extent, "int64"), tirx.ForKind.SERIAL, nest)
    return nest


def _stores(acc_region: tirx.BufferRegion, rows: int) -> list:
    """The four accumulator tiles stored to `acc_region`, by element address, not a match
    buffer: they are compacted to the step after scheduling (WriteInPlace lowers match buffers
    before that), and their rows stay whole, so a row is the buffer's last axis."""
    acc, starts = acc_region.source, [r.min for r in acc_region.region]
    return [
        _call(
            "llvm.x86.tilestored64",
            _tile(t),
            tirx.address_of(tirx.BufferLoad(acc, [*starts[:-3], *_row(acc, starts, (t // 2) * rows, t % 2)])),
            tirx.const(int(acc.shape[-1]) * 4, "int64"),
        )
        for t in range(4)
    ]


def emit_step(
    sch: s_tir.Schedule,
    loop,
    rows: int,
    regions,
    data_row_stride,
    data_second_tile,
    reductions: list[Reduction],
) -> None:
    """Replace the loop nest under `loop` (a step: ``2 * rows`` x 32 accumulators and their
    whole reduction) by the AMX step.

    regions: a function of the step's block iteration variables giving the BufferRegions it
    reads of the data and the weights, and writes of the accumulators (whose last two axes
    are its rows and 32 columns, the rows as two axes, contiguous). data_row_stride,
    data_second_tile: functions of the data match buffer's strides giving the elements
    between two rows of a data tile and from the first data tile to the second. The
    weights are packed so that a chunk is 16 rows of (32 columns x 4) int8, contiguous.
    """
    block = sch.blockize(loop)
    old = sch.get(block)
    data_region, weight_region, acc_region = regions([iv.var for iv in old.iter_vars])
    a = _matched("amx_data", data_region, "uint8")
    b = _matched("amx_weight", weight_region, "int8")
    cfg = tirx.decl_buffer((64,), "uint8", "amx_config", scope="local")
    a_rows = tirx.Cast("int64", data_row_stride(a.strides))
    nest = _reduction_nest(a, b, a_rows, data_second_tile(a.strides), reductions)
    body = tirx.SeqStmt(
        [
            *_config(rows, cfg),
            _call("llvm.x86.ldtilecfg", cfg.access_ptr("r")),
            *(_call("llvm.x86.tilezero", _tile(acc)) for acc in range(4)),
            nest,
            *_stores(acc_region, rows),
            _call("llvm.x86.tilerelease"),
        ]
    )
    new = s_tir.SBlock(
        old.iter_vars,
        [data_region, weight_region],
        [acc_region],
        old.name_hint,
        body,
        None,
        [cfg],
        [s_tir.MatchBufferRegion(a, data_region), s_tir.MatchBufferRegion(b, weight_region)],
        old.annotations,
    )
    sch.state.replace(sch.get_sref(block), new, {old: new})
