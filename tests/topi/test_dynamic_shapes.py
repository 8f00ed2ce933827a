"""The accel kernels with a symbolic row / batch extent: one build, run at several sizes (1,
primes, the representative size) against numpy and tvm.topi.testing; the tail is handled
outside the vectorized FMA loop."""

import math

import numpy as np
import pytest
import torch
import tvm
from tvm.script import tirx as T

import topi_accel
from tests.helpers import ISAS, assert_close, compile_primfunc, conv2d_reference, isa_params, pack, rand
from topi_accel.symbolic import REPRESENTATIVE_BATCH, REPRESENTATIVE_ROWS, SYMBOLIC
from topi_accel.tuning import finish_kernel

# runtime sizes of the symbolic axis: 1, primes, the representative size and around it
ROWS = [1, 2, 7, 97, REPRESENTATIVE_ROWS, 131]
BATCHES = [1, 3, 8]
# every ISA's tiles (those this host can run) and single-threaded kernels
TARGETS = [*isa_params(), pytest.param({"tag": "accel", "num-cores": 1}, id="1core")]


def _library(func: tvm.tirx.PrimFunc, target) -> tvm.runtime.Module:
    """`func` as the build makes it (`finish_kernel`), compiled for `target`."""
    target = tvm.target.Target(target)
    return compile_primfunc(finish_kernel(func, target), target).jit()


def _call(lib, inputs, out_shape) -> np.ndarray:
    out = tvm.runtime.tensor(np.zeros(out_shape, "float32"))
    lib(*[tvm.runtime.tensor(a) for a in inputs], out)
    return out.numpy()


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("k, n", [(768, 3072), (33, 1000), (64, 17)], ids=str)
def test_dense_kn_symbolic_rows(k, n, target):
    """One [M, K] x [K, N] kernel with M symbolic, at every size of ROWS."""
    with tvm.target.Target(target):
        cfg = topi_accel.dense_config(SYMBOLIC, n)
        assert cfg == topi_accel.dense_config(REPRESENTATIVE_ROWS, n)  # the static kernel's tiles
    w = rand(k, n)
    lib = _library(topi_accel.dense_kn_func(SYMBOLIC, k, n, cfg), target)
    packed = pack(w, topi_accel.weight_pack_map(cfg))
    for m in ROWS:
        x = rand(m, k)
        assert_close(_call(lib, [x, packed], (m, n)), x @ w)


@pytest.mark.parametrize("target", TARGETS)
def test_dense_kn_rows_product_of_shape_variables(target):
    """Rows ``b * s`` (BERT's batch x sequence, flattened): each shape variable a scalar
    parameter of the kernel, at sizes 1, primes and the representative size."""
    b, s = (tvm.tirx.Var(name, "int64") for name in "bs")
    k, n = 96, 80
    with tvm.target.Target(target):
        cfg = topi_accel.dense_config(b * s, n)
    lib = _library(topi_accel.dense_kn_func((b * s,), k, n, cfg), target)
    w = rand(k, n)
    packed = tvm.runtime.tensor(pack(w, topi_accel.weight_pack_map(cfg)))
    for bs, seq in [(1, 1), (1, 2), (2, 7), (3, 97), (1, REPRESENTATIVE_ROWS), (2, 131)]:
        x = rand(bs * seq, k)
        out = tvm.runtime.tensor(np.zeros((bs * seq, n), "float32"))
        lib(tvm.runtime.tensor(x), packed, bs, seq, out)  # scalar parameters by name: b, s
        assert_close(out.numpy(), x @ w)


@pytest.mark.parametrize("seq", [4, 14, 16, 128, 197])
@pytest.mark.parametrize("n", [32, 768])
def test_dense_kn_symbolic_batch_times_a_static_length(seq, n):
    """Rows ``b * seq`` (a symbolic batch of fixed-length sequences, flattened): the tiles
    dense_config picks schedule (TVM's prover must show that they cover the rows), and the
    kernel computes at several batches."""
    b, k = tvm.tirx.Var("b", "int64"), 24
    with tvm.target.Target("accel"):
        cfg = topi_accel.dense_config(b * seq, n, rows=(b * seq,))
    lib = _library(topi_accel.dense_kn_func((b * seq,), k, n, cfg), "accel")
    w = rand(k, n)
    packed = tvm.runtime.tensor(pack(w, topi_accel.weight_pack_map(cfg)))
    for bs in BATCHES:
        x = rand(bs * seq, k)
        out = tvm.runtime.tensor(np.zeros((bs * seq, n), "float32"))
        lib(tvm.runtime.tensor(x), packed, bs, out)
        assert_close(out.numpy(), x @ w)


def test_dense_kn_symbolic_batch_keeps_rows():
    """data [B, S, K] with B symbolic and S static: the result keeps both axes."""
    s, k, n = 16, 40, 48
    with tvm.target.Target("accel"):
        cfg = topi_accel.dense_config(s, n)
    lib = _library(topi_accel.dense_kn_func((SYMBOLIC, s), k, n, cfg), "accel")
    w = rand(k, n)
    for bs in BATCHES:
        x = rand(bs, s, k)
        assert_close(_call(lib, [x, pack(w, topi_accel.weight_pack_map(cfg))], (bs, s, n)), x @ w)


# (batch axes, M, K, N) with None where symbolic: attention's Q @ K^T (N = sequence) and P @ V
# (K = sequence) with symbolic batch and sequence, and a static N that n_block divides
BATCH_MATMUL = [
    ((SYMBOLIC, 12), SYMBOLIC, 64, SYMBOLIC),
    ((SYMBOLIC, 12), SYMBOLIC, SYMBOLIC, 64),
    ((SYMBOLIC,), SYMBOLIC, 33, 48),
]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("spec", BATCH_MATMUL, ids=str)
def test_batch_matmul_kn_symbolic(spec, target):
    batch, m_spec, k_spec, n_spec = spec
    with tvm.target.Target(target):
        cfg = topi_accel.batch_matmul_config(m_spec, n_spec)
    lib = _library(topi_accel.batch_matmul_kn_func(batch, m_spec, k_spec, n_spec, cfg), target)
    for outer, seq in [(1, 1), (2, 7), (1, 128), (3, 97)]:
        shape = tuple(outer if d is SYMBOLIC else d for d in batch)
        m, k, n = (seq if d is SYMBOLIC else d for d in (m_spec, k_spec, n_spec))
        bs = math.prod(shape)
        a, b = rand(bs, m, k), rand(bs, k, n)
        assert_close(_call(lib, [a, b], (*shape, m, n)), (a @ b).reshape(*shape, m, n))


# (height, width, in_c, out_c, kernel, stride, padding, groups): ResNet-like, strided, tails,
# a large kernel (channel blocks outer, prefetching), depthwise
CONVS = [
    (14, 14, 64, 64, 3, 1, 1, 1),
    (9, 11, 5, 7, 3, 2, 1, 1),
    (7, 7, 512, 512, 1, 1, 0, 1),
    (8, 8, 128, 64, 1, 1, 0, 1),
    (12, 12, 32, 32, 3, 1, 1, 32),
    (9, 9, 24, 24, 3, 2, 1, 24),
]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shape", CONVS, ids=str)
def test_conv2d_nhwc_ohwi_symbolic_batch(shape, target):
    h, w, c, o, k, stride, padding, groups = shape
    wt = rand(o, k, k, c // groups)
    with tvm.target.Target(target):
        geo = topi_accel.conv2d_geometry((REPRESENTATIVE_BATCH, h, w, c), wt.shape, stride, padding, 1, groups)
        cfg = topi_accel.conv2d_config(geo)
    lib = _library(topi_accel.conv2d_nhwc_ohwi_func(geo, cfg, batch=tvm.tirx.Var("batch", "int64")), target)
    packed = pack(wt, topi_accel.kernel_pack_map(cfg))
    for n in BATCHES:
        x = rand(n, h, w, c)
        out = _call(lib, [x, packed], (n, geo.out_h, geo.out_w, o))
        assert_close(out, conv2d_reference(x, wt, geo.stride, geo.pad, geo.dilation, groups))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shape, tile", [((28, 28, 16, 32, 1), 4), ((15, 13, 16, 48, 1), 2)], ids=str)
def test_conv2d_winograd_symbolic_batch(shape, tile, target):
    h, w, c, o, padding = shape
    wt = rand(o, 3, 3, c)
    with tvm.target.Target(target):
        geo = topi_accel.conv2d_geometry((REPRESENTATIVE_BATCH, h, w, c), wt.shape, 1, padding)
        cfg = topi_accel.winograd_config(geo)
        cfg = type(cfg)(tile, cfg.m_block, cfg.n_block, cfg.lanes, cfg.parallel)
    lib = _library(topi_accel.conv2d_winograd_func(geo, cfg, batch=tvm.tirx.Var("batch", "int64")), target)
    for n in BATCHES:
        x = rand(n, h, w, c)
        out = _call(lib, [x, topi_accel.transform_kernel(wt, cfg)], (n, geo.out_h, geo.out_w, o))
        assert_close(out, conv2d_reference(x, wt, geo.stride, geo.pad, geo.dilation, 1))


# 98 F(2x2) tiles an image (13x27): AVX2's products take 6 rows for a static batch, but with a
# symbolic one ceildiv(98 * b, 6) * 6 rows could not be scheduled, so they take 5
@pytest.mark.parametrize("target", TARGETS)
def test_conv2d_winograd_symbolic_batch_takes_rows_it_can_schedule(target):
    wt = rand(48, 3, 3, 16)
    with tvm.target.Target(target):
        geo = topi_accel.conv2d_geometry((REPRESENTATIVE_BATCH, 13, 27, 16), wt.shape, 1, 1)
        static, cfg = (topi_accel.winograd_config(geo, symbolic_batch=symbolic) for symbolic in (False, True))
    assert cfg.tile == static.tile == 2 and cfg.m_block <= static.m_block
    if target == ISAS["avx2"]:
        assert (static.m_block, cfg.m_block) == (6, 5)
    lib = _library(topi_accel.conv2d_winograd_func(geo, cfg, batch=tvm.tirx.Var("batch", "int64")), target)
    for n in BATCHES:
        x = rand(n, 13, 27, 16)
        out = _call(lib, [x, topi_accel.transform_kernel(wt, cfg)], (n, geo.out_h, geo.out_w, 48))
        assert_close(out, conv2d_reference(x, wt, geo.stride, geo.pad, geo.dilation, 1))


@pytest.mark.parametrize("shape", [(100, 16, 64, 3, 1, 1, 1), (37, 12, 12, 5, 1, 2, 12)], ids=str)
def test_conv1d_nwc_owi_symbolic_batch(shape):
    width, c, o, k, stride, padding, groups = shape
    wt = rand(o, k, c // groups)
    with tvm.target.Target("accel"):
        geo = topi_accel.conv1d_geometry((REPRESENTATIVE_BATCH, width, c), wt.shape, stride, padding, 1, groups)
        cfg = topi_accel.conv1d_config(geo)
    lib = _library(topi_accel.conv1d_nwc_owi_func(geo, cfg, batch=tvm.tirx.Var("batch", "int64")), "accel")
    packed = pack(wt, topi_accel.conv1d_kernel_pack_map(cfg))
    for n in BATCHES:
        x = rand(n, width, c)
        ref = torch.nn.functional.conv1d(
            torch.from_numpy(x.transpose(0, 2, 1)),
            torch.from_numpy(wt.transpose(0, 2, 1)),
            None,
            stride,
            padding,
            1,
            groups,
        )
        out = _call(lib, [x, packed], (n, geo.out_w, o))
        assert_close(out, ref.numpy().transpose(0, 2, 1))


@pytest.mark.parametrize("target", [pytest.param(ISAS[name], id=name) for name in ISAS])
def test_symbolic_rows_keep_the_vector_fma_loop(target):
    """The reduction loop of a symbolic-M dense_kn, lowered as the build lowers it, is the static
    kernel's: unrolled rows of whole vectors of the target's lanes, no condition inside (the row
    tail re-reads the last row)."""
    with tvm.target.Target(target):
        cfg = topi_accel.dense_config(SYMBOLIC, 3072)
        script = topi_accel.insert_prefetches(topi_accel.dense_kn_func(SYMBOLIC, 768, 3072, cfg)).script()
    loop = script[script.index("for rk_1 in range") :]
    body = loop[: loop.index("for ax0")]  # up to the write-back
    assert "if " not in body and "T.if_then_else" not in body
    assert f"T.unroll(T.int64({cfg.m_block}))" in body and f"T.vectorized(T.int64({cfg.lanes}))" in body


def _accumulator_indices(script: str, name: str) -> list[str]:
    return [line.split(f"{name}[", 1)[1].split("]", 1)[0] for line in script.splitlines() if f"{name}[" in line]


@pytest.mark.parametrize(
    "kernel",
    [
        pytest.param(lambda cfg: topi_accel.dense_kn_func(SYMBOLIC, 768, 3072, cfg), id="dense-M"),
        pytest.param(
            lambda cfg: topi_accel.dense_kn_func(
                (tvm.tirx.Var("b", "int64") * tvm.tirx.Var("s", "int64"),), 768, 3072, cfg
            ),
            id="dense-b*s",
        ),
    ],
)
def test_symbolic_register_tile_has_the_tiles_indices(kernel):
    """The register tile of a kernel with symbolic rows, lowered as the build lowers it,
    is indexed by the tile's own loops only (LLVM keeps it in registers), also when the rows
    are a product of shape variables (BERT's ``b * s``)."""
    with tvm.target.Target("accel"):
        cfg = topi_accel.dense_config(SYMBOLIC, 3072)
        script = finish_kernel(kernel(cfg), tvm.target.Target("accel")).script()
    name = next(n for n in ("dense_kn_acc_local", "batch_matmul_kn_acc_local") if f"{n}[" in script)
    indices = _accumulator_indices(script, name)
    assert indices and not any("fused" in index or "T.max" in index for index in indices), indices


def _attention_scores(target):
    """Q @ K^T of a dynamic BERT: [batch * 12, seq, 64] x [batch * 12, 64, seq], one ``seq``."""
    batch, seq = tvm.tirx.Var("batch", "int64"), tvm.tirx.Var("seq", "int64")
    with tvm.target.Target(target):
        cfg = topi_accel.batch_matmul_config(seq, seq)
    return topi_accel.batch_matmul_kn_func((batch, 12), seq, 64, seq, cfg)


@pytest.mark.parametrize("target", TARGETS)
def test_symbolic_columns_write_whole_tiles_unguarded(target):
    """A symbolic-N batch matmul writes a whole register tile back without its tail condition
    (vectorized stores), a partial one as before: right at
    sequence lengths around the tile's columns (n_block 16 or 32) and rows."""
    func = _attention_scores(target)
    versioned = topi_accel.whole_tiles(func)
    assert versioned is not None and versioned.script().count('T.sblock("batch_matmul_kn")') == 2
    # K^T's packing copies a whole column block as it is: no bound, no clamp (LLVM vectorizes it)
    pack = next(line for line in func.script().splitlines() if "batch_matmul_kn_pack[v_p, v_jo, v_r, v_ji] =" in line)
    assert "T.if_then_else(v_jo < seq // T.int64(" in pack and "b[v_p, v_r, v_jo * T.int64(" in pack
    lib = _library(func, target)
    for batch, seq in [(1, 1), (1, 15), (2, 16), (1, 17), (1, 31), (1, 32), (2, 33), (1, 97), (1, 128)]:
        a, b = rand(batch * 12, seq, 64), rand(batch * 12, 64, seq)
        assert_close(_call(lib, [a, b], (batch, 12, seq, seq)), (a @ b).reshape(batch, 12, seq, seq))


def _guarded_copy(condition):
    """y[i] = 2 x[i] over 32 elements in vectors of 16, under `condition` (of o, lane, n)."""

    @T.prim_func(s_tir=True)
    def func(x: T.Buffer((32,), "float32"), n: T.int64, y: T.Buffer((32,), "float32")):
        for o in range(T.int64(2)):
            for lane in T.vectorized(T.int64(16)):
                with T.sblock("y"):
                    v = T.axis.spatial(T.int64(32), o * T.int64(16) + lane)
                    T.where(condition(o, lane, n))
                    y[v] = x[v] * T.float32(2)

    return func


def test_whole_tiles_needs_a_condition_that_tightens_along_the_loops():
    """A write-back guarded by ``element < n`` runs unguarded when its last element passes
    (right at every n); one guarded by ``element >= 3``, which the last element passing does
    not imply for the others, is left as it is; so is a static kernel's."""
    below = _guarded_copy(lambda o, lane, n: o * T.int64(16) + lane < n)
    versioned = topi_accel.whole_tiles(below)
    assert versioned is not None and "if " in versioned.script()
    lib = tvm.compile(tvm.IRModule({"main": versioned}), "llvm").jit()
    x = rand(32)
    for n in (0, 3, 15, 16, 17, 31, 32):
        out = tvm.runtime.tensor(np.zeros(32, "float32"))
        lib(tvm.runtime.tensor(x), n, out)
        assert_close(out.numpy(), np.where(np.arange(32) < n, 2 * x, 0))
    assert topi_accel.whole_tiles(_guarded_copy(lambda o, lane, n: T.int64(3) <= o * T.int64(16) + lane)) is None
    with tvm.target.Target("accel"):
        cfg = topi_accel.batch_matmul_config(128, 128)
    assert topi_accel.whole_tiles(topi_accel.batch_matmul_kn_func((1, 12), 128, 64, 128, cfg)) is None
