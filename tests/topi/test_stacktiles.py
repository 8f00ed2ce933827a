"""Register tiles on the stack (topi_accel/tir_passes/stacktiles.py, the TIR pipeline "accel"):
TVM 0.27 puts every local buffer in its workspace pool, where LLVM cannot keep an accumulator
in a register."""

import pytest
import tvm
from tvm import tirx

import topi_accel
from tests.helpers import ISAS, assert_close, compile_primfunc, pack, rand, run_compiled
from topi_accel.tir_passes import stacktiles


def _dense(m: int, k: int, n: int, target):
    with target:
        cfg = topi_accel.dense_config(m, n)
        return cfg, topi_accel.tuning.finish_kernel(topi_accel.dense_kn_func(m, k, n, cfg), target)


@pytest.mark.parametrize("isa", ["avx512", "avx2"])
def test_register_tiles_stay_in_registers(isa):
    """Either ISA's code (any x86 host compiles it): dense_kn's tile (8 x 48 on AVX-512, 24
    vectors in 1536 bytes; 4 x 24 on AVX2, 12 in 384) built for an accel target allocates
    nothing from the workspace pool and calls no memset; built through TVM's own TIR pipeline,
    the same kernel allocates its tile there, and zeroes the large one with memset."""
    target = tvm.target.Target(ISAS[isa])
    _, func = _dense(128, 768, 2304, target)
    accel = compile_primfunc(func, target).mod.inspect_source("asm")
    plain = tvm.compile(tvm.IRModule({"main": func}), target).mod.inspect_source("asm")
    assert "TVMBackendAllocWorkspace" in plain and ("memset" in plain) == (isa == "avx512")
    assert "TVMBackendAllocWorkspace" not in accel and "memset" not in accel


def test_stacked_tiles_compute_the_same():
    """The kernel with its tile on the stack, on this host's widest ISA, against numpy."""
    target = tvm.target.Target("accel")
    cfg, func = _dense(64, 96, 480, target)
    x, w = rand(64, 96), rand(96, 480)
    lib = compile_primfunc(func, target)
    assert_close(run_compiled(lib, [x, pack(w, topi_accel.weight_pack_map(cfg))], (64, 480)), x @ w)


def _allocations(*buffers) -> tirx.PrimFunc:
    body = tirx.SeqStmt([tirx.AllocBuffer(b) for b in buffers] + [tirx.Evaluate(1)])  # (0, a no-op, would be dropped)
    return tirx.PrimFunc([], body)


def test_only_local_buffers_of_a_tiles_size_are_marked():
    """Local buffers of up to STACK_TILE_BYTES get TVM's mark; a larger one or a global one
    does not, and a function with none is left as it was (None)."""
    limit = stacktiles.STACK_TILE_BYTES // 4
    tile = tirx.decl_buffer((limit,), "float32", "tile", scope="local")
    larger = tirx.decl_buffer((limit + 1,), "float32", "larger", scope="local")
    shared = tirx.decl_buffer((16,), "float32", "shared", scope="global")
    marked = stacktiles.stack_register_tiles(_allocations(tile, larger, shared))
    found = {}
    for stmt in marked.body.seq:
        if isinstance(stmt, tirx.AllocBuffer):
            found[stmt.buffer.name] = stacktiles.ON_STACK in stmt.annotations
    assert found == {"tile": True, "larger": False, "shared": False}
    assert stacktiles.stack_register_tiles(_allocations(larger, shared)) is None


def test_the_pass_leaves_other_targets_alone():
    from accel_target.pipeline import lowered_step

    stack_tiles = lowered_step("StackRegisterTiles", stacktiles.stack_register_tiles)
    tile = tirx.decl_buffer((16,), "float32", "tile", scope="local")
    func = _allocations(tile)
    for target, expected in (("llvm", False), (tvm.target.Target("accel"), True)):
        mod = stack_tiles(tvm.IRModule({"main": func.with_attr("target", tvm.target.Target(target))}))
        (stmt,) = [s for s in mod["main"].body.seq if isinstance(s, tirx.AllocBuffer)]
        assert (stacktiles.ON_STACK in stmt.annotations) is expected, target


def test_tvms_own_tir_pipeline_is_left_as_it_is():
    """``import accel_target`` adds the TIR pipeline "accel" and leaves TVM's default alone."""
    from tvm.tirx import compilation_pipeline

    from accel_target import pipeline

    assert compilation_pipeline.PIPELINE_MAP["s_tir"].__module__.startswith("tvm.")
    assert compilation_pipeline.PIPELINE_MAP["accel"] is pipeline.tir_pipeline
    pipeline.register()
    assert compilation_pipeline.PIPELINE_MAP["accel"] is pipeline.tir_pipeline
