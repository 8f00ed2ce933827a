"""Shared test helpers: references come from tvm.topi.testing, numpy or PyTorch."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
import tvm.testing
import tvm.topi.testing
from tvm import relax
from tvm.target import codegen

import accel_target
from accel_target.reporting import module_kernels
from strategy.layout import array_constant, map_array

RNG = np.random.default_rng(0)

# Targets pinned to one x86 ISA whatever the host, so that every test expectation comes
# from a target's features: schedule decisions and generated code are checked for each
# ISA on any machine; kernels run for those this host can execute (`runs_here`).
ISAS = {
    "avx512": {"tag": "accel", "mcpu": "skylake-avx512"},  # 512-bit vectors, 32 registers
    "avx2": {"tag": "accel", "mcpu": "haswell"},  # 256-bit vectors + FMA, 16 registers
    "sse": {"tag": "accel", "mcpu": "x86-64"},  # 128-bit vectors, no FMA: a host without AVX
}
# LLVM feature -> /proc/cpuinfo flag, for what the ISAs above need
_FLAGS = {"avx512f": "avx512f", "avx2": "avx2", "fma": "fma", "avx": "avx"}


def _host_flags() -> set[str]:
    with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
        line = next((row for row in cpuinfo if row.startswith("flags")), "")
    return set(line.split(":", 1)[-1].split())


def runs_here(target) -> bool:
    """Whether this host can execute code built for `target` (a name, dict or Target)."""
    target = tvm.target.Target(target)
    needed = [flag for feature, flag in _FLAGS.items() if codegen.llvm_cpu_has_features([feature], target)]
    return set(needed) <= _host_flags()


def isa_params(*names: str) -> list:
    """pytest params of the ISA targets `names` (default: all) whose kernels run here; the
    others are skipped, naming the feature the host lacks."""
    params = []
    for name in names or ISAS:
        mark = pytest.mark.skipif(not runs_here(ISAS[name]), reason=f"host cannot run {name} code")
        params.append(pytest.param(ISAS[name], id=name, marks=mark))
    return params


def rand(*shape, dtype="float32"):
    return RNG.standard_normal(shape).astype(dtype)


def pack(array: np.ndarray, index_map) -> np.ndarray:
    """Apply a kernel's IndexMap to a weight, checked against TVM's own IndexMap.map_tensor
    (test_map_array_matches_map_tensor), padding with zeros."""
    return map_array(index_map, array)


def conv2d_reference(x_nhwc, w_ohwi, strides, padding, dilation, groups):
    """NHWC conv by PyTorch in float64 (padding: top, left, bottom, right). Not
    tvm.topi.testing's conv2d_nhwc_python: it convolves one channel pair at a time in Python
    (minutes for a 512-channel layer at batch 8)."""
    import torch

    top, left, bottom, right = padding
    x = torch.nn.functional.pad(torch.from_numpy(x_nhwc).double().permute(0, 3, 1, 2), (left, right, top, bottom))
    w = torch.from_numpy(w_ohwi).double().permute(0, 3, 1, 2)
    out = torch.nn.functional.conv2d(x, w, None, tuple(strides), 0, tuple(dilation), groups)
    return out.permute(0, 2, 3, 1).numpy().astype(x_nhwc.dtype)


def compile_primfunc(func: tvm.tirx.PrimFunc, target="accel"):
    """`func` compiled for `target`, through the TIR pipeline "accel" for an accel target, as
    the build compiles its kernels (its code: `.mod.inspect_source("asm")`; run it with
    `run_compiled`)."""
    target = tvm.target.Target(target)
    pipeline = "accel" if accel_target.is_accel(target) else "default"
    return tvm.compile(tvm.IRModule({"main": func}), target, tir_pipeline=pipeline)


def run_compiled(lib, inputs, out_shape, dtype="float32") -> np.ndarray:
    """`lib(*inputs, out)` for a `compile_primfunc` result, with `out` of `out_shape` and `dtype`."""
    args = [tvm.runtime.tensor(a) for a in inputs]
    out = tvm.runtime.tensor(np.zeros(out_shape, dtype))
    lib.jit()(*args, out)
    return out.numpy()


def run_primfunc(func: tvm.tirx.PrimFunc, inputs, out_shape, target="accel", dtype="float32") -> np.ndarray:
    """`func(*inputs, out)` compiled for `target`, with `out` of `out_shape` and `dtype`."""
    return run_compiled(compile_primfunc(func, target), inputs, out_shape, dtype)


def run_executable(executable, *inputs: np.ndarray) -> np.ndarray:
    """main(*inputs) of a compiled Relax executable, on the CPU."""
    vm = relax.VirtualMachine(executable, tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in inputs]).numpy()


def run_outputs(executable, *inputs: np.ndarray) -> list[np.ndarray]:
    """Every output of main(*inputs) (a tuple's fields, or the one tensor) of a compiled Relax
    executable, on the CPU through the VM: unlike the model callable, it takes NaN and Inf."""
    out = relax.VirtualMachine(executable, tvm.cpu())["main"](*[tvm.runtime.tensor(a) for a in inputs])
    return [out.numpy()] if hasattr(out, "numpy") else [o.numpy() for o in out]


def run_relax(mod: tvm.IRModule, inputs, target="accel") -> np.ndarray:
    return run_executable(tvm.compile(mod, target=target), *inputs)


def single_op_module(make_call, params: dict[str, np.ndarray], consts: dict[str, np.ndarray]) -> tvm.IRModule:
    """`main(*params)` returning make_call(**vars) where each const is bound as a Constant."""
    bb = relax.BlockBuilder()
    args = {name: relax.Var(name, relax.TensorType(a.shape, str(a.dtype))) for name, a in params.items()}
    with bb.function("main", list(args.values())):
        with bb.dataflow():
            values = dict(args)
            values.update({name: array_constant(a) for name, a in consts.items()})
            out = bb.emit_output(make_call(**values))
        bb.emit_func_output(out)
    return bb.get()


def conv2d_module(x, w, const_weight: bool, **attrs) -> tvm.IRModule:
    """A module with one relax.nn.conv2d; `w` is a parameter or a bound constant."""
    call = lambda data, weight: relax.op.nn.conv2d(data, weight, **attrs)  # noqa: E731
    if const_weight:
        return single_op_module(call, {"data": x}, {"weight": w})
    return single_op_module(call, {"data": x, "weight": w}, {})


def matmul_module(x, w, const_weight: bool) -> tvm.IRModule:
    call = lambda data, weight: relax.op.matmul(data, weight)  # noqa: E731
    if const_weight:
        return single_op_module(call, {"data": x}, {"weight": w})
    return single_op_module(call, {"data": x, "weight": w}, {})


def legalized(mod: tvm.IRModule, target="accel") -> tvm.IRModule:
    with tvm.target.Target(target):
        return relax.transform.LegalizeOps()(mod)


def called_kernels(mod: tvm.IRModule) -> list[str]:
    """Names of the PrimFuncs `main` calls through call_tir, in order."""
    return list(module_kernels(mod).calls)


def float_onnx_model(nodes, inputs: dict, outputs: dict, initializers=()):
    """An ONNX model (opset 17) of float32 inputs and outputs, {name: shape} (a str in a shape
    a dim_param, None an unnamed dim), `initializers` its TensorProto weights."""
    from onnx import TensorProto, helper

    info = lambda name, shape: helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)  # noqa: E731
    ins, outs = [info(n, s) for n, s in inputs.items()], [info(n, s) for n, s in outputs.items()]
    graph = helper.make_graph(nodes, "g", ins, outs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def assert_close(out: np.ndarray, ref: np.ndarray, rtol: float = 1e-4) -> None:
    """Equal within `rtol`, and within 1e-5 of the output's scale near zero
    (float32 sums in another order differ by that much)."""
    assert out.shape == ref.shape, (out.shape, ref.shape)
    scale = float(np.abs(ref).max()) if ref.size else 0.0
    tvm.testing.assert_allclose(out, ref, rtol=rtol, atol=1e-5 * max(scale, 1.0))


def assert_within_one_step(actual: np.ndarray, expected: np.ndarray):
    """Integer outputs: equal but for float rounding at a tie (never more than one step)."""
    diff = np.abs(actual.astype(np.int64) - expected.astype(np.int64))
    assert diff.max() <= 1
    assert (diff == 0).mean() >= 0.99
