"""dense_kn_int8 against numpy's integer matmul (exact int32), per ISA."""

import subprocess
import sys

import numpy as np
import pytest
import tvm

import topi_accel
from tests.helpers import (
    ISAS,
    _host_flags,
    compile_primfunc,
    isa_params,
    pack,
    run_compiled,
    run_primfunc,
    runs_here,
)
from topi_accel import amx, dense_int8

# targets with VNNI (vpdpbusd): their code is compiled and checked on any host, run where it has VNNI
VNNI_ISAS = {
    "avx512vnni": {"tag": "accel", "mcpu": "cascadelake"},
    "avxvnni": {"tag": "accel", "mcpu": "alderlake"},
}
# a target with AMX (tdpbusd on tiles) for the GEMMs and convs that take it, vpdpbusd beside
AMX_ISAS = {"amx": {"tag": "accel", "mcpu": "sapphirerapids"}}
VNNI_FLAGS = {"avx512vnni": "avx512_vnni", "avxvnni": "avx_vnni", "amx": "amx_int8"}


def all_isa_params() -> list:
    """isa_params() and the VNNI and AMX targets, each skipped where this host cannot run it
    (AMX code also needs Linux to lend the process the tile registers)."""
    special = [
        pytest.param(
            target,
            id=name,
            marks=pytest.mark.skipif(
                not (runs_here(target) and VNNI_FLAGS[name] in _host_flags())
                or (name == "amx" and not amx.request_permission()),
                reason=f"host cannot run {name} code",
            ),
        )
        for name, target in {**VNNI_ISAS, **AMX_ISAS}.items()
    ]
    return [*isa_params(), *special]


def int_data(shape, dtype, rng):
    """Random integers over the whole range of `dtype`."""
    info = np.iinfo(dtype)
    return rng.integers(info.min, int(info.max) + 1, shape).astype(dtype)


def run_int8(func, inputs, out_shape, target) -> np.ndarray:
    """run_primfunc with an int32 output (test_conv2d_nhwc_ohwi_int8 imports this name)."""
    return run_primfunc(func, inputs, out_shape, target, dtype="int32")


def dense_inputs(x, w, cfg):
    """The kernel's inputs: data, packed weight and (int8 data on vpdpbusd or vpmaddubsw) the compensation."""
    inputs = [x, pack(w, dense_int8.weight_pack_map_int8(cfg))]
    if dense_int8.needs_compensation(x.dtype, cfg.dot):
        inputs.append(dense_int8.compensation(w))
    return inputs


# (M, K, N)
SHAPES = [
    # BERT-base layers (seq 128), its pooler / a GEMV (M = 1)
    (128, 768, 768),
    (128, 3072, 768),
    (1, 768, 3072),
    (1, 768, 768),
    # AMX: whole tiles read in place; rows, K and N all with tails (a copy pads them)
    (64, 256, 40),
    (100, 200, 70),
    # tails: prime M, K and N not multiples of the group or the vector
    (97, 33, 17),
    (7, 37, 50),
    (5, 3, 130),
    (1, 1, 1),
]


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
@pytest.mark.parametrize("target", [*all_isa_params(), pytest.param({"tag": "accel", "num-cores": 1}, id="1core")])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_dense_kn_int8(shape, target, dtype):
    m, k, n = shape
    rng = np.random.default_rng(m * k + n)
    x, w = int_data((m, k), dtype, rng), int_data((k, n), "int8", rng)
    with tvm.target.Target(target):
        cfg = dense_int8.dense_int8_config(m, n, k=k)
    assert bool(cfg.amx_rows) == (amx.available(tvm.target.Target(target)) and m >= 16 and k >= 128)
    func = dense_int8.dense_kn_int8_func(m, k, n, cfg, dtype)
    out = run_primfunc(func, dense_inputs(x, w, cfg), (m, n), target, dtype="int32")
    np.testing.assert_array_equal(out, x.astype(np.int64) @ w.astype(np.int64))


@pytest.mark.parametrize("dtype, value", [("uint8", 255), ("int8", -128)])
def test_dense_kn_int8_extremes_do_not_saturate(dtype, value):
    """Pairs of 255 * -128 (or -128 * -128) overflow int16 (vpmaddubsw saturates there)."""
    m, k, n = 3, 4096, 16
    x = np.full((m, k), value, dtype)
    w = np.full((k, n), -128, "int8")
    w[:, 1::2] = 127
    with tvm.target.Target("accel"):
        cfg = dense_int8.dense_int8_config(m, n)
    func = dense_int8.dense_kn_int8_func(m, k, n, cfg, dtype)
    out = run_primfunc(func, dense_inputs(x, w, cfg), (m, n), dtype="int32")
    np.testing.assert_array_equal(out, x.astype(np.int64) @ w.astype(np.int64))


@pytest.mark.parametrize("dtype, value", [("uint8", 255), ("int8", -128)])
@pytest.mark.parametrize("target", isa_params("avx512", "avx2"))
def test_dense_kn_int8_narrow_weights_take_vpmaddubsw_exactly(target, dtype, value):
    """Weights of 7 bits ([-64, 64], reduce_range=True) on a CPU without VNNI: vpmaddubsw,
    whose int16 pair sums cannot saturate there (255 * 64 * 2 = 32640); exact at the extremes.
    One weight out of that range and the kernel keeps vpmaddwd."""
    m, k, n = 3, 1030, 20
    x = np.full((m, k), value, dtype)
    x[1] = int_data((k,), dtype, np.random.default_rng(2))
    w = np.full((k, n), -64, "int8")
    w[:, 1::2] = 64
    assert dense_int8.narrow_weights(w)
    for weights, scheme in ((w, "maddubs"), (np.where(w == 64, 65, w).astype("int8"), "madd")):
        with tvm.target.Target(target):
            cfg = dense_int8.dense_int8_config(m, n, narrow=dense_int8.narrow_weights(weights))
        assert cfg.dot.scheme == scheme
        lib = compile_primfunc(dense_int8.dense_kn_int8_func(m, k, n, cfg, dtype), target)
        assert ("vpmaddubsw" in lib.mod.inspect_source("asm")) == (scheme == "maddubs")
        out = run_compiled(lib, dense_inputs(x, weights, cfg), (m, n), dtype="int32")
        np.testing.assert_array_equal(out, x.astype(np.int64) @ weights.astype(np.int64))


@pytest.mark.parametrize("rows", [(2, 64), (3, 5, 7)], ids=str)
def test_dense_kn_int8_keeps_leading_axes(rows):
    """data [*rows, K] -> [*rows, N] when the row tile divides the last row axis."""
    k, n, rng = 40, 24, np.random.default_rng(1)
    x, w = int_data((*rows, k), "uint8", rng), int_data((k, n), "int8", rng)
    with tvm.target.Target("accel"):
        cfg = dense_int8.dense_int8_config(int(np.prod(rows)), n)
    cfg = dense_int8.DenseInt8Config(topi_accel.knobs.largest_divisor(rows[-1], cfg.m_block), cfg.n_block, cfg.dot)
    func = dense_int8.dense_kn_int8_func(rows, k, n, cfg, "uint8")
    out = run_primfunc(func, dense_inputs(x, w, cfg), (*rows, n), dtype="int32")
    np.testing.assert_array_equal(out, x.astype(np.int64) @ w.astype(np.int64))


# target -> (scheme, int32 lanes, products per lane)
INSTRUCTIONS = {
    "avx512vnni": ("vnni", 16, 4),
    "avxvnni": ("vnni", 8, 4),
    "avx512": ("madd", 16, 2),
    "avx2": ("madd", 8, 2),
    "sse": ("madd", 4, 2),
}


@pytest.mark.parametrize("isa", INSTRUCTIONS)
def test_int8_instruction_follows_the_target(isa):
    """The instruction comes from the target's features, and its code uses it: vpdpbusd with
    VNNI, the exact vpmaddwd without; never the saturating vpmaddubsw."""
    target = tvm.target.Target({**ISAS, **VNNI_ISAS}[isa])
    dot = dense_int8.int8_dot(target)
    assert (dot.scheme, dot.lanes, dot.group) == INSTRUCTIONS[isa]
    with target:
        cfg = dense_int8.dense_int8_config(16, 64)
    for dtype in ("uint8", "int8"):
        func = dense_int8.dense_kn_int8_func(16, 64, 64, cfg, dtype)
        asm = tvm.tirx.build(tvm.IRModule({"main": func}), target).inspect_source("asm")
        assert ("vpdpbusd" if dot.scheme == "vnni" else "pmaddwd") in asm
        assert "pmaddubsw" not in asm


@pytest.mark.parametrize("isa, amx_code", [("amx", True), ("avx512vnni", False)])
@pytest.mark.parametrize("m, k, amx_rows", [(128, 768, 16), (40, 128, 10), (1, 768, 0), (128, 64, 0)])
def test_dense_int8_takes_amx_tiles_where_the_target_has_them(isa, amx_code, m, k, amx_rows):
    """AMX targets: tdpbusd on tiles for 16 rows and K of two tile rows or more (rows per tile
    from the rows' tail: 40 = 2 x 2 x 10), vpdpbusd for a GEMV or a short K; VNNI targets never
    (on any host: the code is compiled, not run)."""
    target = tvm.target.Target({**VNNI_ISAS, **AMX_ISAS}[isa])
    with target:
        cfg = dense_int8.dense_int8_config(m, 64, k=k)
    assert cfg.amx_rows == (amx_rows if amx_code else 0)
    asm = compile_primfunc(dense_int8.dense_kn_int8_func(m, k, 64, cfg), target).mod.inspect_source("asm")
    assert ("tdpbusd" in asm and "ldtilecfg" in asm) == bool(cfg.amx_rows)
    assert "vpdpbusd" in asm or cfg.amx_rows


def test_amx_tile_rows_waste_least():
    """Rows per data tile (a step takes two): 16 where that pads least, else fewer."""
    assert [amx.tile_rows(n) for n in (128, 56, 28, 14, 7, 40, 1)] == [16, 14, 14, 7, 4, 10, 1]


def test_dense_kn_int8_rejects_bad_input():
    with pytest.raises(ValueError, match=r"dense_kn_int8: data dtype float32 is not supported; supported: uint8, int8"):
        dense_int8.check_dense_int8((4, 8), (8, 2), "float32")
    with pytest.raises(ValueError, match=r"dense_kn_int8: data in_features 8 != weight rows 9"):
        dense_int8.check_dense_int8((4, 8), (9, 2), "uint8")
    with pytest.raises(ValueError, match=r"dense_kn_int8: weight dtype int16 is not supported"):
        dense_int8.check_dense_int8((4, 8), (8, 2), "uint8", "int16")


@pytest.mark.skipif(not (amx.request_permission() and "amx_int8" in _host_flags()), reason="host cannot run AMX code")
def test_amx_kernel_asks_for_the_tile_registers_itself(tmp_path):
    """An exported AMX kernel runs exactly in a process with TVM alone, which never asked Linux
    for the tile registers (accel_target asks at import): the kernel asks on entry. Without
    that, the first tile instruction kills the process (SIGILL)."""
    m, k, n = 64, 256, 64
    target = tvm.target.Target(AMX_ISAS["amx"])
    with target:
        cfg = dense_int8.dense_int8_config(m, n, k=k)
    assert cfg.amx_rows
    compile_primfunc(dense_int8.dense_kn_int8_func(m, k, n, cfg), target).export_library(str(tmp_path / "k.so"))
    rng = np.random.default_rng(4)
    x, w = int_data((m, k), "uint8", rng), int_data((k, n), "int8", rng)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "w.npy", pack(w, dense_int8.weight_pack_map_int8(cfg)))
    code = (
        "import sys, numpy as np, tvm\n"
        f"m = tvm.runtime.load_module({str(tmp_path / 'k.so')!r})\n"
        f"out = tvm.runtime.tensor(np.zeros(({m}, {n}), 'int32'))\n"
        f"m['main'](*(tvm.runtime.tensor(np.load({str(tmp_path)!r} + f)) for f in ('/x.npy', '/w.npy')), out)\n"
        f"np.save({str(tmp_path / 'out.npy')!r}, out.numpy())\n"
        "assert 'accel_target' not in sys.modules\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), x.astype(np.int64) @ w.astype(np.int64))
