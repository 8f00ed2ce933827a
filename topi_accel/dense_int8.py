"""dense_kn_int8: uint8/int8 data x int8 weights stored [in, out] (K x N) -> int32.

The instruction comes from the target's CPU features, never from the host
(`int8_dot`): every scheme is exact (int32 results equal an integer reference).

- ``vnni`` (avx512vnni: 512-bit; avxvnni: 256-bit): ``vpdpbusd`` multiplies 4 uint8 by
  4 int8 and adds the 4 products to an int32 lane. It needs unsigned data: int8 data is
  read as ``x + 128`` (a copy that flips the sign bit) and ``128 * sum_k w[k, n]`` is
  subtracted in the write-back.
- ``madd`` (AVX-512BW, AVX2, SSE2): ``vpmaddwd`` multiplies 2 int16 by 2 int16 and adds
  the pair to an int32 lane, exactly. Data is widened to int16 once (a copy, which also
  pads K), the int8 weights in the inner loop.
- ``maddubs`` (AVX-512BW, AVX2), only for 7-bit weights, all in [-64, 64] (what
  quantizing with ``reduce_range=True`` gives; the strategies read the constant weights):
  ``vpmaddubsw`` multiplies 2 pairs of uint8 x int8 and adds each pair to an int16, then
  ``vpmaddwd`` by ones adds the two int16 to an int32 lane: 4 products per lane, on the data
  as it is (uint8; int8 data read as ``x + 128``, as for vpdpbusd). Exact because a pair
  stays within int16: 255 * 64 * 2 = 32640 <= 32767; with full-range weights (255 * 128 * 2)
  it would saturate, so they take ``madd``.

The weights are packed as ``[N/nb, K/g, nb, g]`` (``g`` = the instruction's group: 4 for
vpdpbusd and vpmaddubsw, 2 for vpmaddwd, K zero-padded to a multiple of it), so one vector load gives
``lanes`` columns x ``g`` rows of K. `weight_pack_map_int8` is that layout as an IndexMap.

Schedule: as dense_kn's (parallel over column block, row block; a register tile of
``m_block`` rows x ``n_block`` columns), with the inner (lanes x g) product one instruction (`emit_dot`).

On a target with AMX (`amx.available`), products of 16 rows or more and K of two 64-byte tile
rows or more run on AMX tiles instead (`_dense_amx`: steps of 2 x `amx_rows` rows x 32 columns,
the weights [N/32, K/64, 16, 32, 4], vpdpbusd's order with K padded to 64; `topi_accel.amx`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import s_tir, te, tirx
from tvm.target import codegen
from tvm.tirx import IndexMap
from tvm.topi.utils import ravel_index, unravel_index

from . import amx
from .dense import keeps_rows
from .knobs import cpu_knobs, pick_block, round_up
from .tiles import vectorize_inner

DATA_DTYPES = ("uint8", "int8")
WEIGHT_DTYPES = ("int8",)
# the first LLVM whose vpdpbusd intrinsics take their bytes as i8 vectors
VNNI_BYTES_LLVM = 21


@dataclass(frozen=True)
class Int8Dot:
    """One int8 dot-product instruction: `lanes` int32 accumulators, each adding `group`
    products of a data element (as `data_dtype`) and an int8 weight; `intrinsic` is the
    LLVM intrinsic."""

    scheme: str  # "vnni", "maddubs" or "madd"
    lanes: int
    group: int
    data_dtype: str
    intrinsic: str
    pair_sum: str = ""  # maddubs: the vpmaddwd that adds its int16 pairs into int32 lanes


# rows from which a GEMM runs on AMX tiles where the target has them (fewer: a GEMV, which
# the weights' bandwidth bounds, keeps vpdpbusd)
AMX_MIN_ROWS = 16
# weights all within these take the maddubs scheme (its int16 pair sums cannot saturate)
NARROW_WEIGHTS = (-64, 64)
# best first: (features the target must have, instruction); maddubs only for narrow weights
INT8_DOTS = (
    (("avx512vnni", "avx512bw"), Int8Dot("vnni", 16, 4, "uint8", "llvm.x86.avx512.vpdpbusd.512")),
    (("avxvnni",), Int8Dot("vnni", 8, 4, "uint8", "llvm.x86.avx512.vpdpbusd.256")),
    (
        ("avx512bw",),
        Int8Dot("maddubs", 16, 4, "uint8", "llvm.x86.avx512.pmaddubs.w.512", "llvm.x86.avx512.pmaddw.d.512"),
    ),
    (("avx2",), Int8Dot("maddubs", 8, 4, "uint8", "llvm.x86.avx2.pmadd.ub.sw", "llvm.x86.avx2.pmadd.wd")),
    (("avx512bw",), Int8Dot("madd", 16, 2, "int16", "llvm.x86.avx512.pmaddw.d.512")),
    (("avx2",), Int8Dot("madd", 8, 2, "int16", "llvm.x86.avx2.pmadd.wd")),
    (("sse2",), Int8Dot("madd", 4, 2, "int16", "llvm.x86.sse2.pmadd.wd")),
)


def int8_dot(target: tvm.target.Target | None = None, narrow: bool = False) -> Int8Dot:
    """The int8 instruction of `target` (default: the current one), from its mcpu/mattr, for
    weights that are all `narrow_weights` or not."""
    target = target or tvm.target.Target.current(allow_none=True)
    cpu_knobs(target)  # an LLVM CPU target, or a clear error
    for features, dot in INT8_DOTS:
        if (narrow or dot.scheme != "maddubs") and codegen.llvm_cpu_has_features(list(features), target):
            return dot
    raise ValueError(f"int8 kernels: target {target} has no SSE2; the int8 kernels need an x86 CPU with SSE2 or newer")


def _vector(region, lanes: int) -> list:
    """Indices of a `lanes`-element vector load from the first element of `region` on, along
    the flattened buffer (the last axis may be shorter: packed operands are contiguous)."""
    mins = [r.min for r in region]
    return [*mins[:-1], tirx.Ramp(mins[-1], tirx.const(1, mins[-1].ty.dtype), lanes)]


def _dot_value(dot: Int8Dot, acc: tirx.PrimExpr, data: tirx.PrimExpr, weight: tirx.PrimExpr) -> tirx.PrimExpr:
    """acc (int32 x lanes) plus the products of the data group, broadcast to every lane as one
    int32, and the weight vector (lanes x group int8)."""
    lanes, width = dot.lanes, dot.lanes * dot.group
    broadcast = tirx.Broadcast(tirx.reinterpret("int32", data), lanes)
    if dot.scheme == "vnni":
        # LLVM 21 on takes the bytes as <4*lanes x i8> (earlier LLVMs: <lanes x i32>)
        byte = f"int8x{width}" if codegen.llvm_version_major() >= VNNI_BYTES_LLVM else f"int32x{lanes}"
        return tirx.call_llvm_pure_intrin(
            f"int32x{lanes}", dot.intrinsic, acc, tirx.reinterpret(byte, broadcast), tirx.reinterpret(byte, weight)
        )
    if dot.scheme == "maddubs":  # int16 pair sums, then vpmaddwd by ones: the 4 products in int32
        pairs = tirx.call_llvm_pure_intrin(
            f"int16x{2 * lanes}", dot.intrinsic, tirx.reinterpret(f"int8x{width}", broadcast), weight
        )
        ones = tirx.Broadcast(tirx.const(1, "int16"), 2 * lanes)
        return acc + tirx.call_llvm_pure_intrin(f"int32x{lanes}", dot.pair_sum, pairs, ones)
    pairs = tirx.call_llvm_pure_intrin(
        f"int32x{lanes}",
        dot.intrinsic,
        tirx.reinterpret(f"int16x{width}", broadcast),
        tirx.Cast(f"int16x{width}", weight),  # sign-extended
    )
    return acc + pairs


def emit_dot(sch: s_tir.Schedule, loop, dot: Int8Dot) -> None:
    """Make the loop nest under `loop` (a block ``C[.., j] += int32(A[.., k]) * int32(B[.., j, k])``
    over j < lanes, k < group, with B's last axis of extent `group`) one instruction.

    What ``sch.tensorize`` does with a registered TensorIntrin, by hand: TVM 0.27's tensorize
    crashes (it copies the intrinsic through JSON, and save_json segfaults on any PrimFunc).
    The loop becomes a block (blockize), whose body is replaced by vector loads at the
    first element of its read regions and the instruction.
    """
    block = sch.blockize(loop)
    old = sch.get(block)
    (write,) = old.writes
    out = write.source
    reads = {str(r.source.dtype): r for r in old.reads if not r.source.same_as(out)}
    data, weight = reads[dot.data_dtype], reads["int8"]
    shapes = (
        [int(r.extent) for r in write.region][-1:],
        [int(r.extent) for r in data.region][-1:],
        [int(r.extent) for r in weight.region][-2:],
        [int(weight.source.shape[-1])],
    )
    if shapes != ([dot.lanes], [dot.group], [dot.lanes, dot.group], [dot.group]):
        raise ValueError(f"int8 kernels: block {old.name_hint} is not a {dot.lanes}x{dot.group} dot product")
    value = _dot_value(
        dot,
        tirx.BufferLoad(out, _vector(write.region, dot.lanes)),
        tirx.BufferLoad(data.source, _vector(data.region, dot.group)),
        tirx.BufferLoad(weight.source, _vector(weight.region, dot.lanes * dot.group)),
    )
    body = tirx.BufferStore(out, value, _vector(write.region, dot.lanes))
    new = s_tir.SBlock(
        old.iter_vars,
        old.reads,
        old.writes,
        old.name_hint,
        body,
        None,
        old.alloc_buffers,
        old.match_buffers,
        old.annotations,
    )
    sch.state.replace(sch.get_sref(block), new, {old: new})


@dataclass(frozen=True)
class DenseInt8Config:
    """Schedule knobs: rows and columns of the register tile, the instruction, whether to
    use threads."""

    m_block: int
    n_block: int
    dot: Int8Dot
    parallel: bool = True
    amx_rows: int = 0  # rows per AMX data tile (m_block is two of them); 0: the vector instruction


def check_dense_int8(data_shape, weight_shape, data_dtype: str, weight_dtype: str = "int8") -> tuple[int, int, int]:
    """Check a dense_kn_int8 call and return (M, K, N).

    data_shape: [*rows, in_features], uint8 or int8. weight_shape: 2-D, [in_features,
    out_features], int8.
    """
    if str(data_dtype) not in DATA_DTYPES:
        raise ValueError(
            f"dense_kn_int8: data dtype {data_dtype} is not supported; supported: {', '.join(DATA_DTYPES)}"
        )
    if str(weight_dtype) not in WEIGHT_DTYPES:
        raise ValueError(f"dense_kn_int8: weight dtype {weight_dtype} is not supported; supported: int8")
    if len(data_shape) < 1:
        raise ValueError("dense_kn_int8: data is a scalar; expected [..., K]")
    if len(weight_shape) != 2:
        raise ValueError(
            f"dense_kn_int8: weight has rank {len(weight_shape)} (shape {list(weight_shape)}); expected 2-D [K, N]"
        )
    *rows, k = (int(v) for v in data_shape)
    k2, n = (int(v) for v in weight_shape)
    if k != k2:
        raise ValueError(
            f"dense_kn_int8: data in_features {k} != weight rows {k2} (data {list(data_shape)}, weight {[k2, n]})"
        )
    return math.prod(rows), k, n


def dense_int8_config(
    m: int, n: int, target: tvm.target.Target | None = None, narrow: bool = False, k: int = 0
) -> DenseInt8Config:
    """Tile sizes for an [m, k] x [k, n] int8 product on `target` (weights all `narrow_weights`
    or not); AMX tiles where the target has them, for 16 rows or more and k of two tile rows
    or more (0: unknown, no AMX)."""
    knobs, dot = cpu_knobs(target), int8_dot(target, narrow)
    if m >= AMX_MIN_ROWS and k >= 2 * amx.CHUNK and amx.available(target):
        rows = amx.tile_rows(m)
        return DenseInt8Config(2 * rows, amx.N_BLOCK, dot, knobs.parallel, amx_rows=rows)
    n_block = 2 * dot.lanes if n > dot.lanes else dot.lanes
    rows = knobs.tile_rows(n_block, dot.lanes)
    return DenseInt8Config(m_block=pick_block(m, min(rows, 8)), n_block=n_block, dot=dot, parallel=knobs.parallel)


def weight_pack_map_int8(cfg: DenseInt8Config) -> IndexMap:
    """[K, N] -> packed [N/nb, K/g, nb, g] as an IndexMap (pad N and K with zeros); for AMX
    [N/32, K/64, 16, 32, 4]: the same order, K padded to whole tile rows of 64."""
    nb, g = cfg.n_block, cfg.dot.group
    if cfg.amx_rows:
        c, g = amx.CHUNK, amx.GROUP
        return IndexMap.from_func(lambda k, n: [n // nb, k // c, k % c // g, n % nb, k % g])
    return IndexMap.from_func(lambda k, n: [n // nb, k // g, n % nb, k % g])


def packed_weight_shape(k: int, n: int, cfg: DenseInt8Config) -> tuple[int, ...]:
    """Shape of the [K, N] weight packed by `weight_pack_map_int8`."""
    nb, g = cfg.n_block, cfg.dot.group
    if cfg.amx_rows:
        return (round_up(n, nb) // nb, round_up(k, amx.CHUNK) // amx.CHUNK, amx.CHUNK // amx.GROUP, nb, amx.GROUP)
    return (round_up(n, nb) // nb, round_up(k, g) // g, nb, g)


def narrow_weights(weights: np.ndarray) -> bool:
    """Whether every weight lies in NARROW_WEIGHTS (7 bits), so the maddubs scheme is exact."""
    lo, hi = NARROW_WEIGHTS
    return weights.size > 0 and int(weights.min()) >= lo and int(weights.max()) <= hi


def needs_compensation(data_dtype: str, dot: Int8Dot) -> bool:
    """Whether the kernel takes ``128 * sum_k w[k, n]`` (int32 [N]) to subtract: int8 data
    on an instruction that takes uint8 data (vpdpbusd, vpmaddubsw), read as ``x + 128``."""
    return dot.data_dtype == "uint8" and str(data_dtype) == "int8"


def compensation(weight_kn: np.ndarray) -> np.ndarray:
    """``128 * sum_k w[k, n]``, int32 [N]: what int8 data read as ``x + 128`` adds."""
    return (128 * weight_kn.astype(np.int64).sum(axis=0)).astype("int32")


def data_operand(data: te.Tensor, rows, k: int, dot: Int8Dot, name: str, k_multiple: int = 0, rows_to: int = 0):
    """(tensor the product reads, index of its row i and column c): `data` itself where the
    instruction reads it as it is; else a copy `name`_data [M, K padded to the group], in the
    instruction's dtype (int16, or uint8 x + 128 for int8 data on vpdpbusd or vpmaddubsw).
    AMX tiles read whole rows straight from memory: `k_multiple` pads K to their 64 bytes and
    `rows_to` adds zero rows up to whole steps (either one makes the copy)."""
    m = math.prod(rows)
    rows_to, last = max(rows_to, m), max(rows_to, m) - 1
    k_multiple = k_multiple or dot.group
    if str(data.dtype) == dot.data_dtype and k % k_multiple == 0 and rows_to == m:
        return data, lambda i, c: data[(*unravel_index(tirx.min(i, last), rows), c)]
    kp = round_up(k, k_multiple)

    def convert(x):
        if dot.data_dtype == "int16":
            return x.astype("int16")  # zero- or sign-extended: exact
        return (x.astype("int16") + 128).astype("uint8") if str(data.dtype) == "int8" else x

    copy = te.compute(
        (rows_to, kp),
        lambda i, c: tirx.if_then_else(
            tirx.all(c < k, i < m),
            convert(data[(*unravel_index(tirx.min(i, m - 1), rows), tirx.min(c, k - 1))]),
            tirx.const(0, dot.data_dtype),
        ),
        name=f"{name}_data",
    )
    return copy, lambda i, c: copy[tirx.min(i, last), c]


def dense_kn_int8(data: te.Tensor, packed_weight: te.Tensor, n: int, cfg: DenseInt8Config, compensation=None):
    """data @ weight in int32, with the weight packed by `weight_pack_map_int8`.

    data: [*rows, K] uint8 or int8, ``cfg.m_block`` dividing the last row axis when there
    are several. packed_weight: 4-D int8 [ceil(N / nb), ceil(K / g), nb, g].
    compensation: int32 [N], ``128 * sum_k w[k, n]``, exactly when `needs_compensation`.
    Returns int32 [*rows, N] named "dense_kn_int8"; the register tile "dense_kn_int8_acc"
    covers the padded tile grid of the rows flattened.
    """
    *rows, k = (int(v) for v in data.shape)
    m, mb, nb, dot = math.prod(rows), cfg.m_block, cfg.n_block, cfg.dot
    kg = round_up(k, dot.group) // dot.group
    expected = packed_weight_shape(k, n, cfg)
    if tuple(int(v) for v in packed_weight.shape) != expected:
        raise ValueError(f"dense_kn_int8: packed weight shape {list(packed_weight.shape)} != expected {list(expected)}")
    if not keeps_rows(rows, cfg):
        raise ValueError(f"dense_kn_int8: row axes {rows} need m_block {mb} to divide the last; flatten them to 2-D")
    if (compensation is not None) != needs_compensation(data.dtype, dot):
        raise ValueError(
            f"dense_kn_int8: a compensation is needed exactly for int8 data on vpdpbusd or vpmaddubsw ({dot})"
        )
    if cfg.amx_rows:
        return _dense_amx(data, packed_weight, n, cfg, compensation)
    operand, read = data_operand(data, rows, k, dot, "dense_kn_int8")
    rko = te.reduce_axis((0, kg), name="rko")
    rki = te.reduce_axis((0, dot.group), name="rki")
    acc = te.compute(
        (round_up(m, mb), round_up(n, nb)),
        # rows past M (tail tile) re-read the last row; the write-back drops them
        lambda i, j: te.sum(
            read(i, rko * dot.group + rki).astype("int32") * packed_weight[j // nb, rko, j % nb, rki].astype("int32"),
            axis=[rko, rki],
        ),
        name="dense_kn_int8_acc",
    )
    if compensation is None:
        return te.compute((*rows, n), lambda *i: acc[ravel_index(i[:-1], rows), i[-1]], name="dense_kn_int8")
    return te.compute(
        (*rows, n), lambda *i: acc[ravel_index(i[:-1], rows), i[-1]] - compensation[i[-1]], name="dense_kn_int8"
    )


def dot_tile(sch: s_tir.Schedule, acc, first_reduction, vector_loop, dot: Int8Dot) -> None:
    """Keep block `acc` (its register tile ends in loops (vector columns, group)) in
    registers: zero it at `first_reduction`, vectorized; the update becomes the instruction."""
    sch.set_scope(acc, 0, "local")
    init = sch.decompose_reduction(acc, first_reduction)
    sch.vectorize(sch.get_loops(init)[-1])
    emit_dot(sch, vector_loop, dot)


def schedule_copy(sch: s_tir.Schedule, name: str, lanes: int, parallel: bool, outer_loops: int = 1) -> None:
    """Parallelize the copy block `name` over its first `outer_loops` loops (fused) and
    vectorize its innermost loop, if there is such a block."""
    try:
        block = sch.get_sblock(name)
    except s_tir.schedule.schedule.ScheduleError:
        return
    loops = sch.get_loops(block)
    if parallel and len(loops) > outer_loops:
        sch.parallel(sch.fuse(*loops[:outer_loops]) if outer_loops > 1 else loops[0])
    vectorize_inner(sch, block, lanes)


def schedule_dense_kn_int8(func: tirx.PrimFunc, cfg: DenseInt8Config) -> tirx.PrimFunc:
    """Schedule a PrimFunc made from `dense_kn_int8` (blocks found by name)."""
    dot = cfg.dot
    sch = s_tir.Schedule(func)
    acc = sch.get_sblock("dense_kn_int8_acc")
    out = sch.get_sblock("dense_kn_int8")
    i, j, rko, rki = sch.get_loops(acc)
    io, ii = sch.split(i, [None, cfg.m_block])
    jo, jv, jl = sch.split(j, [None, cfg.n_block // dot.lanes, dot.lanes])
    # column block outermost: its weight panel stays in cache while the rows stream past
    sch.reorder(jo, io, rko, ii, jv, jl, rki)
    outer = sch.fuse(jo, io)
    if cfg.parallel:
        sch.parallel(outer)
    sch.unroll(ii)
    sch.unroll(jv)
    sch.reverse_compute_at(out, outer)
    dot_tile(sch, acc, rko, jl, dot)
    vectorize_inner(sch, out, dot.lanes)
    schedule_copy(sch, "dense_kn_int8_data", dot.lanes, cfg.parallel)
    return sch.mod["main"]


@functools.lru_cache(maxsize=256)  # a model repeats shapes; PrimFuncs are immutable
def dense_kn_int8_func(rows: int | tuple[int, ...], k: int, n: int, cfg: DenseInt8Config, data_dtype: str = "uint8"):
    """The scheduled PrimFunc (data [*rows, K], packed_weight[, compensation]) -> int32 [*rows, N]."""
    rows = (rows,) if isinstance(rows, int) else tuple(rows)
    check_dense_int8((*rows, k), (k, n), data_dtype)
    dot = cfg.dot
    data = te.placeholder((*rows, k), data_dtype, name="data")
    weight = te.placeholder(packed_weight_shape(k, n, cfg), "int8", name="packed_weight")
    comp = te.placeholder((n,), "int32", name="compensation") if needs_compensation(data_dtype, dot) else None
    out = dense_kn_int8(data, weight, n, cfg, comp)
    args = [data, weight] + ([comp] if comp is not None else []) + [out]
    func = te.create_prim_func(args, index_dtype_override="int64")
    if cfg.amx_rows:
        return _schedule_dense_amx(func, cfg)
    return schedule_dense_kn_int8(func, cfg)


def _dense_amx(data: te.Tensor, packed_weight: te.Tensor, n: int, cfg: DenseInt8Config, compensation):
    """dense_kn_int8 on AMX tiles: int32 steps "dense_kn_int8_acc" [M/mb, N/32, 1, mb, 32] over
    data as it is or a copy "dense_kn_int8_data" [M padded to mb, K padded to 64] (uint8;
    int8 data read as x + 128, rows past M zero)."""
    *rows, k = (int(v) for v in data.shape)
    m, mb, nb = math.prod(rows), cfg.m_block, cfg.n_block
    _, flat = data_operand(data, rows, k, cfg.dot, "dense_kn_int8", amx.CHUNK, round_up(m, mb))
    rko = te.reduce_axis((0, int(packed_weight.shape[1])), name="rko")
    rkm = te.reduce_axis((0, amx.CHUNK // amx.GROUP), name="rkm")
    rki = te.reduce_axis((0, amx.GROUP), name="rki")
    acc = te.compute(
        (round_up(m, mb) // mb, round_up(n, nb) // nb, 1, mb, nb),
        lambda io, jo, _, ii, jj: te.sum(
            flat(io * mb + ii, rko * amx.CHUNK + rkm * amx.GROUP + rki).astype("int32")
            * packed_weight[jo, rko, rkm, jj, rki].astype("int32"),
            axis=[rko, rkm, rki],
        ),
        name="dense_kn_int8_acc",
    )

    def value(*i):
        r = ravel_index(i[:-1], rows)
        v = acc[r // mb, i[-1] // nb, 0, r % mb, i[-1] % nb]
        return v if compensation is None else v - compensation[i[-1]]

    return te.compute((*rows, n), value, name="dense_kn_int8")


def _schedule_dense_amx(func: tirx.PrimFunc, cfg: DenseInt8Config) -> tirx.PrimFunc:
    """Schedule `_dense_amx`: parallel over (column step, row step), each one AMX step."""
    sch = s_tir.Schedule(func)
    acc, out = sch.get_sblock("dense_kn_int8_acc"), sch.get_sblock("dense_kn_int8")
    io, jo, _, ii, *_ = sch.get_loops(acc)
    sch.reorder(jo, io)
    outer = sch.fuse(jo, io)
    if cfg.parallel:
        sch.parallel(outer)
    sch.reverse_compute_at(out, outer)
    sch.set_scope(acc, 0, "local")
    block = sch.get(acc)
    acc_buffer = block.writes[0].source
    reads = {r.source.name: r.source for r in block.reads}
    weight, source = reads["packed_weight"], reads.get("dense_kn_int8_data", reads.get("data"))
    rows, mb, tile = [int(v) for v in source.shape[:-1]], cfg.m_block, cfg.amx_rows

    def regions(vars_):
        i_o, j_o = vars_[:2]
        first = unravel_index(i_o * mb, rows)
        return (
            amx.region(source, first[:-1], [(first[-1], mb)]),
            amx.region(weight, [j_o]),
            amx.region(acc_buffer, [i_o, j_o]),
        )

    steps = amx.Reduction(int(weight.shape[1]), lambda strides: amx.CHUNK, amx.CHUNK * cfg.n_block)
    amx.emit_step(sch, ii, tile, regions, lambda s: s[-2], lambda s: tile * s[-2], [steps])
    vectorize_inner(sch, out, cfg.dot.lanes)
    schedule_copy(sch, "dense_kn_int8_data", cfg.dot.lanes, cfg.parallel)
    return amx.with_permission(sch.mod["main"])
