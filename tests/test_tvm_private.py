"""What accel_target/tvm_private.py relies on in TVM: these fail when a TVM release changes it."""

import ctypes
import os

import numpy as np
import tvm
from tvm import te

import accel_target  # noqa: F401  (registers the target)
from accel_target import tvm_private
from accel_target.runtime import pool


def test_this_tvm_is_the_release_the_private_parts_were_written_for():
    assert tvm.__version__.startswith(tvm_private.TESTED)
    assert tvm_private.supported("a test")


def _parallel_library(tmp_path) -> str:
    x = te.placeholder((64, 64), name="x")
    y = te.compute((64, 64), lambda i, j: x[i, j] * 2.0, name="y")
    sch = tvm.s_tir.Schedule(te.create_prim_func([x, y]))
    sch.parallel(sch.get_loops(sch.get_sblock("y"))[0])
    path = str(tmp_path / "parallel.so")
    tvm.compile(tvm.IRModule({"main": sch.mod["main"]}), "llvm").export_library(path)
    return path


def test_a_built_library_launches_through_the_pointer_accels_pool_takes(tmp_path):
    """A library with a parallel loop exports __TVMBackendParallelLaunch (and no barrier
    pointer), and pointed at accel's pool it launches there with TVM's TVMParallelGroupEnv."""
    path = _parallel_library(tmp_path)
    module = tvm.runtime.load_module(path)
    handle = ctypes.CDLL(os.path.abspath(path), mode=os.RTLD_NOLOAD)
    ctypes.c_void_p.in_dll(handle, tvm_private.LAUNCH)

    assert pool.install(path)
    before = pool.stats()["launches"]
    x = np.arange(64 * 64, dtype="float32").reshape(64, 64)
    out = tvm.runtime.tensor(np.zeros((64, 64), "float32"))
    module["main"](tvm.runtime.tensor(x), out)
    assert pool.stats()["launches"] == before + 1
    np.testing.assert_array_equal(out.numpy(), 2 * x)


def test_tvms_onnx_importer_reads_its_table_where_accel_adds_converters():
    from tvm.relax.frontend.onnx import onnx_frontend

    table = onnx_frontend._get_convert_map()
    assert "Conv" in table and "QuantizeLinear" in table
    with tvm_private.onnx_converters({"AccelTest": object}):
        assert "AccelTest" in onnx_frontend._get_convert_map()
    assert "AccelTest" not in onnx_frontend._get_convert_map()


def test_tvms_pytorch_importer_calls_the_ops_accel_wraps_by_their_module_attributes():
    """TVM's converters look the conv, matmul, linear, norm, reduction and power ops up in
    relax.op when they run (and ask the products for float32): wrapped within torch_importer, restored
    after."""
    import inspect

    from tvm import relax
    from tvm.relax.frontend.torch import base_fx_graph_translator

    source = inspect.getsource(base_fx_graph_translator)
    assert "relax.op.nn.conv2d(" in source and 'out_dtype="float32"' in source
    wrapped = tvm_private._FLOAT32_ACCUMULATING + tvm_private._NORMS + list(tvm_private._HALF_IN_FLOAT32)
    originals = [getattr(module, name) for module, name in wrapped]
    from tvm.relax.frontend.torch.exported_program_translator import ExportedProgramImporter as importer

    convert = vars(importer)[tvm_private._CONVERT_TENSOR]
    assert isinstance(convert, staticmethod)
    with tvm_private.torch_importer():
        assert relax.op.nn.conv2d is not originals[2] and relax.op.nn.layer_norm.__wrapped__ is not None
        assert vars(importer)[tvm_private._CONVERT_TENSOR] is not convert
    assert [getattr(module, name) for module, name in wrapped] == originals
    assert vars(importer)[tvm_private._CONVERT_TENSOR] is convert
    for name, arguments in [("layer_norm", {"gamma", "beta", "axes", "epsilon"}), ("rms_norm", {"weight", "axes"})]:
        assert arguments <= set(inspect.signature(getattr(relax.op.nn, name)).parameters)
