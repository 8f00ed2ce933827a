"""conv2d_winograd: 3x3 stride-1 convolution by Winograd's minimal filtering F(m x m, 3 x 3).

A direct 3x3 convolution spends 9 multiply-adds per output and input channel;
F(m x m, 3 x 3) spends (m + 2)^2 / m^2 (F(2x2): 4, F(4x4): 2.25) plus transforms
that only add. With ``alpha = m + 2`` and TVM's Cook-Toom matrices A, B, G
(`tvm.topi.nn.winograd_util`), one output tile is ``A^T [U (.) (B^T d B)] A``
for the ``alpha x alpha`` input tile d, where ``U = G g G^T`` is the 3x3
kernel g transformed once, at compile time (`transform_kernel`, numpy).

The kernel is one PrimFunc of four stages, each split across the threads:
"conv2d_winograd_pad" (zero border, covering whole tiles),
"conv2d_winograd_data" (B^T d B of every tile: [alpha^2, tiles, C]),
"conv2d_winograd_gemm" (alpha^2 independent [tiles, C] x [C, O] products, register
tiled like dense_kn, reading U packed as [alpha^2, O/nb, C, nb]) and
"conv2d_winograd" (A^T M A, written as NHWC [N, H, W, O]; elementwise epilogues
are inlined into it like into every accel kernel's write-back).

Each transform runs as two passes over a tile's vector of channels, the first kept in a
local tile ("conv2d_winograd_data_rows": B^T d; "conv2d_winograd_columns": M A). F(4x4)'s
B^T has 26 non-zeros: 2 x 6 x 26 multiply-adds per tile and channel instead of 26^2 for
B^T d B at once; its A^T has 18: 6 x 18 + 4 x 18 instead of 18^2.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import s_tir, te, tirx, topi
from tvm.topi.nn.winograd_util import winograd_transform_matrices

from .conv2d import Conv2DGeometry
from .dense import batch_matmul_config, schedule_matmul
from .knobs import ceil_div, cpu_knobs
from .symbolic import ceil_to, extent, prim_func
from .tiles import vectorize_inner

SUPPORTED_TILES = (2, 4)
KERNEL_SIZE = 3


@dataclass(frozen=True)
class WinogradConfig:
    """Schedule knobs: output tile side m, tiles x output channels of the GEMM's
    register tile, float32 vector lanes, whether to use threads."""

    tile: int
    m_block: int
    n_block: int
    lanes: int
    parallel: bool = True

    @property
    def alpha(self) -> int:
        return self.tile + KERNEL_SIZE - 1


# Output tile by the pixels of the whole output (batch x height x width), largest first: the
# transformed weights ((m + 2)^2 / 9 times the direct kernel's, 17-37 MB for a 512-channel 3x3)
# are read once per call, so the tiles they serve decide. 392 pixels or more (2x14x14) take
# F(4x4), 98 or more (2x7x7) F(2x2); fewer (one 7x7 image) the direct kernel.
TILE_BY_OUTPUT_PIXELS = ((2 * 14 * 14, 4), (2 * 7 * 7, 2))


def winograd_tile(geo: Conv2DGeometry) -> int | None:
    """The output tile side for `geo` by TILE_BY_OUTPUT_PIXELS, None below its smallest size
    (`geo.batch` is the representative batch of a symbolic one)."""
    pixels = geo.batch * geo.out_h * geo.out_w
    return next((tile for least, tile in TILE_BY_OUTPUT_PIXELS if pixels >= least), None)


def _unsupported(geo: Conv2DGeometry) -> str | None:
    """Why the compute cannot do `geo` (not 3x3, strided, dilated or grouped), or None."""
    if (geo.kh, geo.kw) != (KERNEL_SIZE, KERNEL_SIZE):
        return f"kernel {geo.kh}x{geo.kw} is not 3x3"
    if geo.stride != (1, 1) or geo.dilation != (1, 1):
        return f"strides {geo.stride} and dilation {geo.dilation} are not (1, 1)"
    if geo.groups != 1:
        return f"groups={geo.groups} is not 1"
    return None


def winograd_condition(geo: Conv2DGeometry, target: tvm.target.Target | None = None) -> str | None:
    """None when conv2d_winograd can compute `geo` and should, else why not."""
    lanes = cpu_knobs(target).lanes
    reason = _unsupported(geo)
    if reason is not None:
        return reason
    if geo.in_c % lanes or geo.out_c % lanes:
        return f"channels {geo.in_c}->{geo.out_c} are not multiples of {lanes}"
    if winograd_tile(geo) is None:
        least = TILE_BY_OUTPUT_PIXELS[-1][0]
        return f"output {geo.batch}x{geo.out_h}x{geo.out_w} has fewer than {least} pixels (the direct kernel is faster)"
    return None


@functools.cache
def winograd_matrices(tile: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(A [alpha, m], B [alpha, alpha], G [alpha, 3]) of F(m x m, 3 x 3), float64: TVM's
    Cook-Toom matrices (TOPI gives them as constant tensors, evaluated here once)."""
    if tile not in SUPPORTED_TILES:
        raise ValueError(f"conv2d_winograd: tile {tile} is not supported; supported: {SUPPORTED_TILES}")
    tensors = winograd_transform_matrices(tile, KERNEL_SIZE, "float64")
    func = te.create_prim_func(list(tensors))
    outputs = [tvm.runtime.tensor(np.zeros([int(d) for d in t.shape], "float64")) for t in tensors]
    tvm.compile(tvm.IRModule({"main": func}), target="llvm")["main"](*outputs)
    return tuple(o.numpy() for o in outputs)


def winograd_config(
    geo: Conv2DGeometry, target: tvm.target.Target | None = None, symbolic_batch: bool = False
) -> WinogradConfig:
    """Output tile by `winograd_tile`; the products' register tile is batch_matmul_kn's for
    [tiles, C] x [C, O], its rows a divisor of the tiles where one is good (`pick_block`), not
    the full tile that pads a few. With a symbolic batch (`symbolic_batch`: `geo.batch` is the
    representative batch), the rows are as many as `_symbolic_rows` allows: the transforms of
    some grids cannot be scheduled beside other row tiles."""
    tile = winograd_tile(geo) or SUPPORTED_TILES[0]
    n_h, n_w = _grid(geo, tile)
    gemm = batch_matmul_config(geo.batch * n_h * n_w, geo.out_c, target, pad_rows=False)
    rows = _symbolic_rows(n_h * n_w, gemm.m_block) if symbolic_batch else gemm.m_block
    return WinogradConfig(tile, rows, gemm.n_block, gemm.lanes, gemm.parallel)


def _symbolic_rows(per_image: int, rows: int) -> int:
    """The most rows, up to `rows`, of a product tile that a symbolic batch of images of
    `per_image` tiles each can take: rows that divide per_image, or that have no factor in
    common with it and are fewer. The accumulator is ``ceildiv(b * per_image, rows) * rows``
    rows long; otherwise TVM's analyzer cannot show that it covers the ``b * per_image`` that
    the next stage reads (``98 * b - (98 * b + 5) // 6 * 6 <= 0``), and compute_at fails ("not
    a stage pipeline"). Checked against the schedule: every grid of 5..20 x 5..20 in F(2x2)
    and F(4x4) tiles with rows of 3 to 6 schedules exactly where this allows them; for 98 tiles
    an image (13x27 in F(2x2)) AVX2's 6 rows become 5."""
    return next(r for r in range(rows, 0, -1) if per_image % r == 0 or (math.gcd(per_image, r) == 1 and per_image > r))


def transform_kernel(kernel_ohwi: np.ndarray, cfg: WinogradConfig) -> np.ndarray:
    """U = G g G^T of an OHWI 3x3 kernel, packed [alpha^2, O/nb, I, nb] (float32)."""
    _, _, g = winograd_matrices(cfg.tile)
    o, kh, kw, i = kernel_ohwi.shape
    if (kh, kw) != (KERNEL_SIZE, KERNEL_SIZE) or o % cfg.n_block:
        raise ValueError(
            f"conv2d_winograd: kernel {list(kernel_ohwi.shape)} is not OHWI 3x3 with O a multiple of {cfg.n_block}"
        )
    u = np.einsum("ak,bl,okli->abio", g, g, kernel_ohwi.astype(np.float64))  # [alpha, alpha, I, O]
    u = u.reshape(cfg.alpha**2, i, o // cfg.n_block, cfg.n_block).transpose(0, 2, 1, 3)
    return np.ascontiguousarray(u, dtype=kernel_ohwi.dtype)


def _sum(terms):
    return functools.reduce(lambda s, t: s + t, terms)


def _entry(matrix: np.ndarray, row, col: int):
    """matrix[row, col] for a symbolic `row` (folded to a constant once `row`'s loop is unrolled)."""
    value = tirx.const(0.0, "float32")
    for r in range(matrix.shape[0]):
        if matrix[r, col] != 0:
            value = tirx.Select(row == r, tirx.const(float(matrix[r, col]), "float32"), value)
    return value


def _grid(geo: Conv2DGeometry, tile: int) -> tuple[int, int]:
    """Tiles down and across the output."""
    return ceil_div(geo.out_h, tile), ceil_div(geo.out_w, tile)


def conv2d_winograd(data: te.Tensor, packed_kernel: te.Tensor, geo: Conv2DGeometry, cfg: WinogradConfig) -> te.Tensor:
    """Convolution of NHWC data with a kernel transformed by `transform_kernel`.

    data: 4-D NHWC [batch, in_height, in_width, in_channel].
    packed_kernel: 4-D [alpha^2, out_channel / nb, in_channel, nb].
    Returns 4-D NHWC [batch, out_height, out_width, out_channel] named "conv2d_winograd".
    The batch is data's: it may be symbolic (`geo` then has a representative batch).
    """
    reason = _unsupported(geo)
    if reason is not None:
        raise ValueError(f"conv2d_winograd: {reason}; supported: 3x3, strides (1, 1), dilation (1, 1), groups 1")
    m, alpha = cfg.tile, cfg.alpha
    a_mat, b_mat, _ = winograd_matrices(m)
    n_h, n_w = _grid(geo, m)
    batch = data.shape[0]
    tiles = batch * n_h * n_w
    expected = (alpha * alpha, geo.out_c // cfg.n_block, geo.in_c, cfg.n_block)
    if tuple(int(v) for v in packed_kernel.shape) != expected:
        raise ValueError(
            f"conv2d_winograd: packed kernel shape {list(packed_kernel.shape)} != expected {list(expected)}"
        )
    pt, pl = geo.pad[0], geo.pad[1]
    after_h = (n_h - 1) * m + alpha - geo.in_h - pt
    after_w = (n_w - 1) * m + alpha - geo.in_w - pl
    padded = topi.nn.pad(data, [0, pt, pl, 0], [0, after_h, after_w, 0], name="conv2d_winograd_pad")

    def tile_of(p):
        return p // (n_h * n_w), (p // n_w) % n_h * m, p % n_w * m

    def rows(r, b, p, c):  # B^T d at (r, b)
        n, y, x = tile_of(p)
        return _sum(_entry(b_mat.T, r, a) * padded[n, y + a, x + b, c] for a in range(alpha))

    rows_t = te.compute((alpha, alpha, tiles, geo.in_c), rows, name="conv2d_winograd_data_rows")

    def transformed(e, p, c):  # (B^T d) B at (e // alpha, e % alpha)
        return _sum(rows_t[e // alpha, b, p, c] * _entry(b_mat.T, e % alpha, b) for b in range(alpha))

    data_t = te.compute((alpha * alpha, tiles, geo.in_c), transformed, name="conv2d_winograd_data")
    nb, last = cfg.n_block, tiles - 1
    rc = te.reduce_axis((0, geo.in_c), name="rc")
    acc = te.compute(
        (alpha * alpha, ceil_to(tiles, cfg.m_block), geo.out_c),
        lambda e, p, o: te.sum(data_t[e, tirx.min(p, last), rc] * packed_kernel[e, o // nb, rc, o % nb], axis=rc),
        name="conv2d_winograd_gemm_acc",
    )
    product = te.compute((alpha * alpha, tiles, geo.out_c), lambda e, p, o: acc[e, p, o], name="conv2d_winograd_gemm")

    def columns(a, w, p, o):  # M A at (a, w)
        return _sum(_entry(a_mat.T, w, b) * product[a * alpha + b, p, o] for b in range(alpha))

    columns_t = te.compute((alpha, m, tiles, geo.out_c), columns, name="conv2d_winograd_columns")

    def inverse(n, h, w, o):  # A^T (M A) at (h % m, w % m)
        p = (n * n_h + h // m) * n_w + w // m
        return _sum(_entry(a_mat.T, h % m, a) * columns_t[a, w % m, p, o] for a in range(alpha))

    return te.compute((batch, geo.out_h, geo.out_w, geo.out_c), inverse, name="conv2d_winograd")


def schedule_conv2d_winograd(func: tirx.PrimFunc, geo: Conv2DGeometry, cfg: WinogradConfig) -> tirx.PrimFunc:
    """Schedule a PrimFunc made from `conv2d_winograd` (blocks found by name)."""
    lanes, m = cfg.lanes, cfg.tile
    sch = s_tir.Schedule(func)
    parallel = sch.parallel if cfg.parallel else (lambda loop: None)

    pad = sch.get_sblock("conv2d_winograd_pad")
    loops = sch.get_loops(pad)
    parallel(sch.fuse(loops[0], loops[1]))
    vectorize_inner(sch, pad, lanes)

    data_t = sch.get_sblock("conv2d_winograd_data")
    e, p, c = sch.get_loops(data_t)
    co, ci = sch.split(c, [None, lanes])
    sch.reorder(p, co, e, ci)
    parallel(p)
    sch.unroll(e)
    sch.vectorize(ci)
    _transform_pass_local(sch, "conv2d_winograd_data_rows", co)

    out = sch.get_sblock("conv2d_winograd")
    n, h, w, o = sch.get_loops(out)
    ho, hi = sch.split(h, [None, m])
    wo, wi = sch.split(w, [None, m])
    oo, oi = sch.split(o, [None, lanes])
    sch.reorder(n, ho, wo, oo, hi, wi, oi)
    parallel(sch.fuse(n, ho))
    sch.unroll(hi)
    sch.unroll(wi)
    sch.vectorize(oi)
    _transform_pass_local(sch, "conv2d_winograd_columns", oo)
    # the alpha^2 products: register tiles as dense_kn's, parallel over (plane, column block,
    # row block); after the transforms' compute_at, which some grids refuse once the products
    # are scheduled ("not a stage pipeline": 16x17 with F(4x4))
    return schedule_matmul(sch.mod["main"], "conv2d_winograd_gemm", geo.out_c, cfg, prefetch_weights=True)


def _transform_pass_local(sch: s_tir.Schedule, name: str, loop) -> None:
    """Compute the first pass `name` of a transform under `loop` (a tile's vector of channels):
    its alpha x alpha (or alpha x m) vectors become a local tile, unrolled (a stack array by
    stacktiles, which LLVM keeps in registers as far as they go)."""
    block = sch.get_sblock(name)
    sch.compute_at(block, loop)
    sch.set_scope(block, 0, "local")
    loops = sch.get_loops(block)
    at = next(i for i, candidate in enumerate(loops) if sch.get(candidate).same_as(sch.get(loop)))
    first, second, channels = loops[at + 1 :]  # the loops compute_at made (the tile's is a point)
    sch.unroll(first)
    sch.unroll(second)
    sch.vectorize(channels)


@functools.lru_cache(maxsize=256)  # a model repeats shapes; PrimFuncs are immutable
def conv2d_winograd_func(geo: Conv2DGeometry, cfg: WinogradConfig, dtype: str = "float32", batch=None) -> tirx.PrimFunc:
    """The scheduled PrimFunc (data, packed_kernel) -> out for one geometry.

    batch: None for ``geo.batch``; else a symbolic batch (a tirx.Var or an expression of
    shape variables; `geo.batch` is then the representative size its tiles are chosen for).
    """
    batch = geo.batch if batch is None else extent(batch, "batch")
    data = te.placeholder((batch, geo.in_h, geo.in_w, geo.in_c), dtype, name="data")
    kernel = te.placeholder(
        (cfg.alpha**2, geo.out_c // cfg.n_block, geo.in_c, cfg.n_block), dtype, name="packed_kernel"
    )
    out = conv2d_winograd(data, kernel, geo, cfg)
    return schedule_conv2d_winograd(prim_func([data, kernel], out), geo, cfg)
