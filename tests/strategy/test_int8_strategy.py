"""Integer relax.nn.conv2d and relax.matmul under Target("accel"): the int8 kernels, their
declines, and a requantize fused into the kernel's write-back."""

import re

import numpy as np
import pytest
import tvm
from tvm import relax

import accel_target
from accel_target.reporting import calls_of
from tests.helpers import _host_flags, isa_params, run_executable, run_relax, single_op_module
from tests.topi.test_conv2d_nhwc_ohwi_int8 import conv_reference
from tests.topi.test_dense_kn_int8 import int_data
from topi_accel import amx

RNG = np.random.default_rng(7)


def conv_int32(data, weight, **attrs):
    return relax.op.nn.conv2d(data, weight, out_dtype="int32", **attrs)


def nchw_reference(x, w, stride, pad, groups):
    out = conv_reference(x.transpose(0, 2, 3, 1), w.transpose(0, 2, 3, 1), (stride,) * 2, (pad,) * 4, (1, 1), groups)
    return out.transpose(0, 3, 1, 2)


# (data NCHW, kernel OIHW, stride, padding, groups)
CONVS = [
    ((1, 16, 12, 12), (24, 16, 3, 3), 1, 1, 1),
    ((2, 3, 11, 11), (8, 3, 3, 3), 2, 1, 1),
    ((1, 32, 10, 10), (32, 1, 3, 3), 1, 1, 32),
]


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
@pytest.mark.parametrize("shape, kernel, stride, pad, groups", CONVS, ids=str)
def test_conv2d_int32_runs_on_conv2d_nhwc_ohwi_int8(shape, kernel, stride, pad, groups, dtype):
    x, w = int_data(shape, dtype, RNG), int_data(kernel, "int8", RNG)
    mod = single_op_module(
        lambda data, weight: conv_int32(data, weight, strides=stride, padding=pad, groups=groups),
        {"data": x},
        {"weight": w},
    )
    with accel_target.recording() as log:
        out = run_relax(mod, [x])
    np.testing.assert_array_equal(out, nchw_reference(x, w, stride, pad, groups))
    assert [d.implementation for d in log] == ["conv2d_nhwc_ohwi_int8.accel"]


@pytest.mark.parametrize("data_shape", [(1, 768), (2, 5, 33), (97, 64), (33,)], ids=str)
@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_matmul_int32_runs_on_dense_kn_int8(data_shape, dtype):
    x, w = int_data(data_shape, dtype, RNG), int_data((data_shape[-1], 40), "int8", RNG)
    mod = single_op_module(
        lambda data, weight: relax.op.matmul(data, weight, out_dtype="int32"), {"data": x}, {"weight": w}
    )
    with accel_target.recording() as log:
        out = run_relax(mod, [x])
    np.testing.assert_array_equal(out, x.astype(np.int64) @ w.astype(np.int64))
    assert [d.implementation for d in log] == ["dense_kn_int8.accel"]


def test_runtime_int8_weights_fall_back_with_the_reason():
    x, w = int_data((1, 8, 6, 6), "uint8", RNG), int_data((8, 8, 3, 3), "int8", RNG)
    mod = single_op_module(lambda data, weight: conv_int32(data, weight, padding=1), {"data": x, "weight": w}, {})
    with accel_target.recording() as log:
        out = run_relax(mod, [x, w])
    np.testing.assert_array_equal(out, nchw_reference(x, w, 1, 1, 1))
    assert log[0].fallback
    assert (
        "conv2d_nhwc_ohwi_int8.accel",
        "the weights are not a constant (int8 kernels are packed at compile time)",
    ) in (log[0].skipped)


def test_grouped_int8_conv_is_declined_with_the_reason():
    x, w = int_data((1, 8, 6, 6), "uint8", RNG), int_data((8, 4, 3, 3), "int8", RNG)
    mod = single_op_module(lambda data, weight: conv_int32(data, weight, groups=2), {"data": x}, {"weight": w})
    with accel_target.recording() as log:
        tvm.compile(mod, target="accel")
    assert (
        dict(log[0].skipped)["conv2d_nhwc_ohwi_int8.accel"]
        == "groups=2 is not supported (supported: 1 and depthwise, groups = 8)"
    )
    with pytest.raises(accel_target.StrictModeError, match="conv2d_nhwc_ohwi_int8.accel: groups=2 is not supported"):
        with accel_target.strict():
            tvm.compile(mod, target="accel")


def requantize(y, scale, bias, zero_point, channel_shape):
    """The graph rewrite's requantize: float scale and bias per channel, round, zero point, clip, uint8."""
    y = relax.op.astype(y, "float32")
    y = relax.op.multiply(y, relax.op.reshape(scale, channel_shape))
    y = relax.op.add(y, relax.op.reshape(bias, channel_shape))
    y = relax.op.add(relax.op.round(y), relax.const(float(zero_point)))
    return relax.op.astype(relax.op.clip(y, 0, 255), "uint8")


def requantize_reference(acc, scale, bias, zero_point):
    y = np.round(acc.astype("float32") * scale + bias) + np.float32(zero_point)
    return np.clip(y, 0, 255).astype("uint8")


def fused_kernel(ex_or_mod):
    lowered = accel_target.optimize(ex_or_mod)
    funcs = [(g.name_hint, f) for g, f in lowered.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    return next((name, f) for name, f in funcs if "int8" in name)


@pytest.mark.parametrize("channels", [24, 48, 144])  # a tail in one channel block; in the last of several
def test_conv2d_with_requantize_fuses_into_the_kernel(channels):
    """conv2d(out_dtype=int32) + requantize through accel_target.build: one int8 kernel with
    the requantize in its write-back, uint8 output equal to numpy's. The channel counts leave
    a tail in the register tile's channel block (16 or 32 lanes), which TVM's own inlining
    checks refuse when there are several blocks."""
    x, w = int_data((1, 16, 9, 9), "uint8", RNG), int_data((channels, 16, 3, 3), "int8", RNG)
    scale = RNG.uniform(1e-3, 1e-2, channels).astype("float32")
    bias = RNG.uniform(-5, 5, channels).astype("float32")

    def model(data, weight, s, b):
        return requantize(conv_int32(data, weight, padding=1), s, b, 3, (1, channels, 1, 1))

    mod = single_op_module(model, {"data": x}, {"weight": w, "s": scale, "b": bias})
    ex = accel_target.build(mod)
    acc = nchw_reference(x, w, 1, 1, 1)
    ref = requantize_reference(acc, scale[None, :, None, None], bias[None, :, None, None], 3)
    np.testing.assert_array_equal(run_executable(ex, x), ref)
    rows = accel_target.report(ex).to_dict()["ops"]
    by_op = {}
    for row in rows:
        by_op.setdefault(row["op"].split(".")[-1], []).append(row["kernel"])
    assert by_op["conv2d"] == ["conv2d_nhwc_ohwi_int8.accel"]
    for op in ("astype", "multiply", "add", "round", "maximum", "minimum"):
        assert by_op[op] and all("conv2d_nhwc_ohwi_int8.accel" in kernel for kernel in by_op[op]), (op, by_op[op])
    name, func = fused_kernel(mod)
    assert name.startswith("fused_conv2d_nhwc_ohwi_int8") and "round" in name
    # the requantize is computed in the kernel's write-back: no block of its own
    blocks = re.findall(r'T\.sblock\("(\w+)"', func.script())
    assert [b for b in blocks if not b.startswith("conv2d_nhwc_ohwi_int8")] == ["root"], blocks


def _asm(executable) -> str:
    """The assembly of an executable's compiled kernels."""
    pending, text = [executable.mod], []
    while pending:
        module = pending.pop()
        pending.extend(module.imports)
        if module.kind == "llvm":
            text.append(module.inspect_source("asm"))
    return "\n".join(text)


@pytest.mark.parametrize("target", isa_params("avx2"))
@pytest.mark.parametrize("low, high, instruction", [(-64, 64, "vpmaddubsw"), (-128, 127, "vpmaddwd")])
def test_strategies_pick_the_instruction_from_the_constant_weights(target, low, high, instruction):
    """On a CPU without VNNI, the conv and the matmul take vpmaddubsw exactly when every
    constant weight fits 7 bits (reduce_range=True), vpmaddwd otherwise; both exact."""
    x = int_data((1, 16, 9, 9), "uint8", RNG)
    w = RNG.integers(low, high + 1, (24, 16, 3, 3)).astype("int8")
    w[0, 0, 0, :2] = low, high
    fc = RNG.integers(low, high + 1, (24 * 81, 10)).astype("int8")

    def model(data, weight, dense):
        y = relax.op.astype(conv_int32(data, weight, padding=1), "uint8")  # wraps: a test, not a model
        return relax.op.matmul(relax.op.reshape(y, (1, 24 * 81)), dense, out_dtype="int32")

    mod = single_op_module(model, {"data": x}, {"weight": w, "dense": fc})
    ex = tvm.compile(mod, target=tvm.target.Target(target))
    conv = nchw_reference(x, w, 1, 1, 1).astype("uint8")
    np.testing.assert_array_equal(run_executable(ex, x), conv.reshape(1, -1).astype(np.int64) @ fc.astype(np.int64))
    asm = _asm(ex)
    assert instruction in asm and ("vpmaddubsw" in asm) == (instruction == "vpmaddubsw")


AMX_TARGET = {"tag": "accel", "mcpu": "sapphirerapids"}


@pytest.mark.skipif(not (amx.request_permission() and "amx_int8" in _host_flags()), reason="host cannot run AMX code")
def test_amx_conv_writing_over_its_residual_is_exact():
    """An int8 conv on AMX tiles whose write-back adds a float residual writes over it
    (WriteInPlace, which lowers match buffers before TVM compacts the tile buffer), equal to
    numpy's (the int8 steps exact, the float ones to rounding). Addressing the accumulators
    through a match buffer wrote past the compacted tile buffer here, and MobileNetV2's int8
    build aborted with a corrupted heap."""
    c = 128
    x = int_data((1, c, 14, 14), "uint8", RNG)
    w1, w2, w3 = (int_data((c, c, k, k), "int8", RNG) for k in (1, 1, 3))
    s = RNG.uniform(1e-4, 1e-3, (3, c)).astype("float32")
    b = RNG.uniform(-5, 5, (3, c)).astype("float32")
    shape = (1, c, 1, 1)

    def model(data, w1, w2, w3, s0, s1, s2, b0, b1, b2):
        a = requantize(conv_int32(data, w1), s0, b0, 3, shape)
        shortcut = relax.op.astype(requantize(conv_int32(data, w2), s1, b1, 3, shape), "float32")
        y = relax.op.astype(conv_int32(a, w3, padding=1), "float32")
        y = relax.op.add(relax.op.multiply(y, relax.op.reshape(s2, shape)), relax.op.reshape(b2, shape))
        return relax.op.add(y, shortcut)  # a float residual, as ResNet's dequantized shortcut

    consts = {"w1": w1, "w2": w2, "w3": w3, **{f"s{i}": s[i] for i in range(3)}, **{f"b{i}": b[i] for i in range(3)}}
    mod = single_op_module(model, {"data": x}, consts)
    target = tvm.target.Target(AMX_TARGET)
    ex = accel_target.build(mod, target=target)
    assert "tdpbusd" in _asm(ex)
    assert calls_of(accel_target.optimize(mod, target=target), ("relax.call_tir_inplace",))
    col = lambda v: v[None, :, None, None]  # noqa: E731
    a = requantize_reference(nchw_reference(x, w1, 1, 0, 1), col(s[0]), col(b[0]), 3)
    shortcut = requantize_reference(nchw_reference(x, w2, 1, 0, 1), col(s[1]), col(b[1]), 3)
    ref = nchw_reference(a, w3, 1, 1, 1).astype("float32") * col(s[2]) + col(b[2]) + shortcut.astype("float32")
    np.testing.assert_allclose(run_executable(ex, x), ref, rtol=1e-6, atol=1e-4)
