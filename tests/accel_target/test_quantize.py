"""QuantizeQDQ (accel_target/passes/quantize.py) on tiny Relax modules: the integer calls of the int8
contract after the rewrite, results against numpy's reading of the QDQ graph."""

import subprocess
import sys

import numpy as np
import pytest
import tvm
import tvm.topi.testing
from tvm import relax

from accel_target.passes.quantize import quantize_qdq
from accel_target.reporting import calls_of
from strategy.layout import constant_array
from tests.helpers import assert_within_one_step, run_relax

RNG = np.random.default_rng(17)
QDQ = ("relax.quantize", "relax.dequantize")


# -- numpy reading of QDQ: dequantize = (q - zp) * scale; quantize = clip(round(x / scale) + zp)
def dequantize(q, scale, zero_point, axis=None, ndim=None):
    shape = [-1] + [1] * (ndim - 1 - axis) if axis is not None else []
    return (q.astype(np.float64) - np.reshape(zero_point, shape)) * np.reshape(scale, shape)


def quantize(x, scale, zero_point, dtype):
    info = np.iinfo(dtype)
    return np.clip(np.round(x / scale) + zero_point, info.min, info.max).astype(dtype)


def const(value, dtype):
    return relax.const(np.asarray(value, dtype=dtype))


def module(build, *inputs: np.ndarray) -> tvm.IRModule:
    """main(*inputs) returning build(bb, *vars), in one dataflow block."""
    bb = relax.BlockBuilder()
    params = [relax.Var(f"x{i}", relax.TensorType(a.shape, str(a.dtype))) for i, a in enumerate(inputs)]
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(build(bb, *params))
        bb.emit_func_output(out)
    return bb.get()


def emit_dq(bb, x, scale, zero_point, axis=1):
    dtype = str(zero_point.dtype)
    return bb.emit(relax.op.dequantize(x, const(scale, "float32"), const(zero_point, dtype), axis=axis))


def emit_q(bb, x, scale, zero_point, axis=1):
    dtype = str(np.asarray(zero_point).dtype)
    return bb.emit(relax.op.quantize(x, const(scale, "float32"), const(zero_point, dtype), axis=axis, out_dtype=dtype))


def op_calls(mod, op):
    return calls_of(mod, (op,))


# conv: activations, weights per output channel, optional bias and clamp; x zero point 0 and not
CONV_CASES = [
    # (x dtype, x zero point, channels in/out, groups, kernel, stride, padding, bias, clamp)
    ("uint8", 131, 8, 16, 1, 3, 1, 1, True, (0.0, 6.0)),
    ("uint8", 0, 8, 16, 1, 3, 2, 1, False, None),
    ("int8", -5, 6, 10, 1, 1, 1, 0, True, (0.0, np.inf)),
    ("uint8", 100, 12, 12, 12, 3, 2, 1, True, (0.0, 6.0)),  # depthwise
    ("uint8", 7, 8, 8, 2, 3, 1, 2, False, None),  # grouped
]


def conv_case(x_dtype, x_zp, cin, cout, groups, k, stride, pad, bias, clamp):
    info = np.iinfo(x_dtype)
    x_q = RNG.integers(info.min, info.max + 1, (1, cin, 9, 9)).astype(x_dtype)
    w_q = RNG.integers(-127, 128, (cout, cin // groups, k, k)).astype("int8")
    x_s, w_s = 0.05, RNG.uniform(0.002, 0.02, cout).astype("float32")
    b = RNG.standard_normal(cout).astype("float32") if bias else None
    y_s, y_zp = 0.07, np.uint8(3)
    attrs = {"strides": stride, "padding": pad, "groups": groups}

    def build(bb, x):
        xd = emit_dq(bb, x, x_s, np.asarray(x_zp, x_dtype))
        wd = emit_dq(bb, const(w_q, "int8"), w_s, np.zeros(cout, "int8"), axis=0)
        y = bb.emit(relax.op.nn.conv2d(xd, wd, **attrs))
        if bias:
            y = bb.emit(relax.op.add(y, const(b.reshape(1, cout, 1, 1), "float32")))
        if clamp is not None:
            y = bb.emit(relax.op.clip(y, clamp[0], 3.4e38 if np.isinf(clamp[1]) else clamp[1]))
        return relax.op.dequantize(emit_q(bb, y, y_s, y_zp), const(y_s, "float32"), const(y_zp, "uint8"), axis=1)

    x_f = dequantize(x_q, x_s, x_zp)
    w_f = dequantize(w_q, w_s, np.zeros(cout), axis=0, ndim=4)
    ref = tvm.topi.testing.conv2d_nchw_python(x_f, w_f, stride, pad, groups)
    if bias:
        ref = ref + b.reshape(1, cout, 1, 1)
    if clamp is not None:
        ref = np.clip(ref, *clamp)
    return module(build, x_q), x_q, quantize(ref, y_s, y_zp, "uint8"), (y_s, y_zp)


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv_becomes_integer_conv_and_requantize(case):
    mod, x_q, expected, (y_s, y_zp) = conv_case(*case)
    x_dtype, x_zp, pad = case[0], case[1], case[7]
    new = quantize_qdq(mod)
    relax.analysis.well_formed(new)
    assert not calls_of(new, QDQ)
    (conv,) = op_calls(new, "relax.nn.conv2d")
    assert str(conv.attrs.out_dtype) == "int32"
    assert str(conv.args[0].ty.dtype) == x_dtype
    assert isinstance(conv.args[1], tvm.ir.expr.Constant) and str(conv.args[1].ty.dtype) == "int8"
    pads = op_calls(new, "relax.nn.pad")
    if x_zp != 0 and pad:  # the zero point padded explicitly, the conv's padding 0
        assert [float(p.attrs.pad_value) for p in pads] == [float(x_zp)]
        assert [int(p) for p in conv.attrs.padding] == [0, 0, 0, 0]
    else:
        assert not pads and [int(p) for p in conv.attrs.padding] == [pad] * 4
    # the requantize: astype(float32) -> multiply -> add -> round -> add(zp) -> clip -> astype(uint8)
    assert [str(c.attrs.dtype) for c in op_calls(new, "relax.astype")][:2] == ["float32", "uint8"]
    assert op_calls(new, "relax.round") and op_calls(new, "relax.clip")
    out = run_relax(new, [x_q], target="llvm")
    assert_within_one_step(np.round(out / y_s + y_zp), expected)


def test_conv_weights_and_bias_folded_exactly():
    """The int8 weights are the model's; the requantize multiplies by s_x * s_w / s_y and adds
    (bias - zp_x * s_x * s_w * sum(w)) / s_y, per output channel, [1, oc, 1, 1] in NCHW."""
    mod, *_ = conv_case("uint8", 131, 8, 16, 1, 3, 1, 1, True, None)
    new = quantize_qdq(mod)
    (conv,) = op_calls(new, "relax.nn.conv2d")
    w_dq = op_calls(mod, "relax.dequantize")[1]
    w_q, w_s = constant_array(w_dq.args[0]), constant_array(w_dq.args[1])
    np.testing.assert_array_equal(constant_array(conv.args[1]), w_q)
    bias = constant_array(op_calls(mod, "relax.add")[0].args[1]).reshape(-1)
    x_s, y_s = 0.05, 0.07
    scale = x_s * w_s.astype(np.float64)
    folded = bias - 131 * scale * w_q.astype(np.int64).sum(axis=(1, 2, 3))
    multiply = op_calls(new, "relax.multiply")[0]  # (the last one dequantizes the output)
    add = op_calls(new, "relax.add")[0]
    np.testing.assert_allclose(constant_array(multiply.args[1]), (scale / y_s).reshape(1, -1, 1, 1), rtol=1e-6)
    np.testing.assert_allclose(constant_array(add.args[1]), (folded / y_s).reshape(1, -1, 1, 1), rtol=1e-5)


def test_dense_becomes_integer_matmul_with_kn_weight():
    """Gemm's matmul(x, permute_dims(W [out, in])) + bias -> matmul(x_q, W_q [in, out], int32)."""
    x_q = RNG.integers(0, 256, (4, 24)).astype("uint8")
    w_q = RNG.integers(-127, 128, (10, 24)).astype("int8")
    w_s, b = RNG.uniform(0.002, 0.02, 10).astype("float32"), RNG.standard_normal(10).astype("float32")
    x_s, x_zp, y_s, y_zp = 0.03, np.uint8(120), 0.1, np.uint8(128)

    def build(bb, x):
        xd = emit_dq(bb, x, x_s, x_zp)
        wd = emit_dq(bb, const(w_q, "int8"), w_s, np.zeros(10, "int8"), axis=0)
        y = bb.emit(relax.op.matmul(xd, bb.emit(relax.op.permute_dims(wd, [1, 0]))))
        y = bb.emit(relax.op.add(y, const(b, "float32")))
        return emit_q(bb, y, y_s, y_zp)

    new = quantize_qdq(module(build, x_q))
    (matmul,) = op_calls(new, "relax.matmul")
    assert str(matmul.attrs.out_dtype) == "int32" and str(matmul.args[0].ty.dtype) == "uint8"
    np.testing.assert_array_equal(constant_array(matmul.args[1]), w_q.T)
    assert not op_calls(new, "relax.permute_dims") and not calls_of(new, QDQ)
    ref = dequantize(x_q, x_s, x_zp) @ dequantize(w_q, w_s, np.zeros(10), axis=0, ndim=2).T + b
    assert_within_one_step(run_relax(new, [x_q], target="llvm"), quantize(ref, y_s, y_zp, "uint8"))


# what lies between the conv and the quantize: (name, tail(bb, conv) -> output, requantized)
def _bias_dq_max_min(bb, y):
    bias = emit_dq(bb, const(RNG.integers(-500, 500, (1, 6, 1, 1)), "int32"), 0.001, np.int32(0))
    y = bb.emit(relax.op.maximum(bb.emit(relax.op.add(y, bias)), const(0.0, "float32")))
    return emit_q(bb, bb.emit(relax.op.minimum(y, const(6.0, "float32"))), 0.03, np.uint8(5))


def _relu_clip(bb, y):
    return emit_q(bb, bb.emit(relax.op.clip(bb.emit(relax.op.nn.relu(y)), -1.0, 2.5)), 0.02, np.int8(-7))


def _used_twice(bb, y):
    quantized = emit_q(bb, y, 0.05, np.uint8(128))
    return emit_q(bb, bb.emit(relax.op.add(emit_dq(bb, quantized, 0.05, np.uint8(128)), y)), 0.1, np.uint8(128))


def _clamp_then_add(bb, y):
    y = bb.emit(relax.op.add(bb.emit(relax.op.nn.relu(y)), const(np.ones((1, 6, 1, 1)), "float32")))
    return emit_q(bb, y, 0.05, np.uint8(0))


def _through_tuple_item(bb, y):
    return emit_q(bb, bb.emit(relax.TupleGetItem(bb.emit(relax.Tuple([y])), 0)), 0.05, np.uint8(1))


CHAINS = [
    # requantized: a bias that is a dequantized int32 constant, ONNX's Clip as maximum / minimum;
    # a ReLU then a clip, int8 output
    ("bias_dq_max_min", _bias_dq_max_min, True),
    ("relu_clip_int8", _relu_clip, True),
    # quantized elementwise: the conv used elsewhere too, a clamp below the bias, a tuple item between
    ("used_twice", _used_twice, False),
    ("clamp_then_add", _clamp_then_add, False),
    ("through_tuple_item", _through_tuple_item, False),
]


@pytest.mark.parametrize("name, tail, requantized", CHAINS, ids=[c[0] for c in CHAINS])
def test_requantize_chain(name, tail, requantized):
    """The conv is integer either way; the quantize after it becomes its requantize only where
    each value between them is used once, else an elementwise quantize (a divide)."""
    x_q = RNG.integers(0, 256, (1, 4, 8, 8)).astype("uint8")
    w_q, w_s = RNG.integers(-127, 128, (6, 4, 3, 3)).astype("int8"), RNG.uniform(0.002, 0.02, 6).astype("float32")

    def build(bb, x):
        wd = emit_dq(bb, const(w_q, "int8"), w_s, np.zeros(6, "int8"), axis=0)
        return tail(bb, bb.emit(relax.op.nn.conv2d(emit_dq(bb, x, 0.05, np.uint8(100)), wd, padding=1)))

    mod = module(build, x_q)
    new = quantize_qdq(mod)
    relax.analysis.well_formed(new)
    assert not calls_of(new, QDQ)
    (conv,) = op_calls(new, "relax.nn.conv2d")
    assert str(conv.attrs.out_dtype) == "int32" and str(conv.args[1].ty.dtype) == "int8"
    assert bool(op_calls(new, "relax.divide")) != requantized
    # equal to stock TVM's legalization of the QDQ graph, but for rounding at a tie
    assert_within_one_step(run_relax(new, [x_q], "llvm"), run_relax(mod, [x_q], "llvm"))


def test_pool_through_tuple_item_stays_integer():
    """PyTorch's max_pool2d_with_indices: the quantize reads the pool through an item of a tuple."""
    x_q = RNG.integers(0, 256, (1, 4, 8, 8)).astype("uint8")

    def build(bb, x):
        pool = bb.emit(relax.op.nn.max_pool2d(emit_dq(bb, x, 0.1, np.uint8(0)), (2, 2), (2, 2)))
        item = bb.emit(relax.TupleGetItem(bb.emit(relax.Tuple([pool, pool])), 0))
        return emit_q(bb, item, 0.1, np.uint8(0))

    mod = module(build, x_q)
    new = quantize_qdq(mod)
    (pool,) = op_calls(new, "relax.nn.max_pool2d")
    assert str(pool.args[0].ty.dtype) == "uint8" and not calls_of(new, QDQ)
    np.testing.assert_array_equal(run_relax(new, [x_q], "llvm"), run_relax(mod, [x_q], "llvm"))


# ops that only move values stay integer under equal parameters
MOVEMENT = [
    ("max_pool2d", lambda x: relax.op.nn.max_pool2d(x, (3, 3), (2, 2), padding=(1, 1, 1, 1))),
    ("pad", lambda x: relax.op.nn.pad(x, [0, 0, 0, 0, 1, 2, 2, 1], pad_value=0.0)),
    ("reshape", lambda x: relax.op.reshape(x, (1, 4, 2, 49))),
    ("permute_dims", lambda x: relax.op.permute_dims(x, [0, 2, 3, 1])),
]


@pytest.mark.parametrize("name, make", MOVEMENT, ids=[m[0] for m in MOVEMENT])
def test_data_movement_stays_integer(name, make):
    x_q = RNG.integers(0, 256, (1, 4, 7, 14)).astype("uint8")
    s, zp = 0.1, np.uint8(77)

    def build(bb, x):
        return emit_q(bb, bb.emit(make(emit_dq(bb, x, s, zp))), s, zp)

    mod = module(build, x_q)
    new = quantize_qdq(mod)
    assert not calls_of(new, QDQ)
    (moved,) = calls_of(new, (f"relax.{name}", f"relax.nn.{name}"))
    assert str(moved.args[0].ty.dtype) == "uint8"
    if name == "pad":  # pads with the zero point
        assert float(moved.attrs.pad_value) == float(zp)
    # equal to stock TVM's legalization of the QDQ graph
    np.testing.assert_array_equal(run_relax(new, [x_q], "llvm"), run_relax(mod, [x_q], "llvm"))


def test_concat_of_equal_parameters_stays_integer():
    a, b = (RNG.integers(0, 256, (1, 3, 4, 4)).astype("uint8") for _ in range(2))
    s, zp = 0.2, np.uint8(9)

    def build(bb, x, y):
        both = relax.Tuple([emit_dq(bb, x, s, zp), emit_dq(bb, y, s, zp)])
        return emit_q(bb, bb.emit(relax.op.concat(both, axis=1)), s, zp)

    new = quantize_qdq(module(build, a, b))
    (concat,) = op_calls(new, "relax.concat")
    assert str(concat.ty.dtype) == "uint8" and not calls_of(new, QDQ)
    np.testing.assert_array_equal(run_relax(new, [a, b], "llvm"), np.concatenate([a, b], axis=1))


def test_remaining_qdq_become_elementwise():
    """A residual add of two quantized tensors: dequantize and quantize as elementwise ops,
    equal to TVM's own quantize / dequantize."""
    a, b = (RNG.integers(0, 256, (1, 8, 5, 5)).astype("uint8") for _ in range(2))

    def build(bb, x, y):
        total = bb.emit(relax.op.add(emit_dq(bb, x, 0.0537, np.uint8(100)), emit_dq(bb, y, 0.0213, np.uint8(3))))
        return emit_q(bb, total, 0.0611, np.uint8(50))

    mod = module(build, a, b)
    new = quantize_qdq(mod)
    assert not calls_of(new, QDQ)
    expected = quantize(dequantize(a, 0.0537, 100) + dequantize(b, 0.0213, 3), 0.0611, 50, "uint8")
    np.testing.assert_array_equal(run_relax(new, [a, b], "llvm"), run_relax(mod, [a, b], "llvm"))
    assert_within_one_step(run_relax(new, [a, b], "llvm"), expected)


def _conv_with_weight_scale(w_s, axis):
    x_q = RNG.integers(0, 256, (1, 4, 6, 6)).astype("uint8")
    w_q = RNG.integers(-127, 128, (8, 4, 3, 3)).astype("int8")

    def build(bb, x):
        wd = emit_dq(bb, const(w_q, "int8"), w_s, np.zeros(len(w_s), "int8"), axis=axis)
        return emit_q(
            bb, bb.emit(relax.op.nn.conv2d(emit_dq(bb, x, 0.1, np.uint8(10)), wd, padding=1)), 0.5, np.uint8(0)
        )

    return module(build, x_q), x_q


def test_unsupported_weight_scale_stays_float():
    """A scale per input channel cannot be factored out of the sum: the conv stays float, right."""
    mod, x_q = _conv_with_weight_scale(RNG.uniform(0.01, 0.02, 4).astype("float32"), axis=1)
    new = quantize_qdq(mod)
    (conv,) = op_calls(new, "relax.nn.conv2d")
    assert str(conv.args[0].ty.dtype) == "float32" and str(conv.args[1].ty.dtype) == "float32"
    bindings = {b.var: b.value for block in new["main"].body.blocks for b in block.bindings}
    assert isinstance(bindings.get(conv.args[1], conv.args[1]), tvm.ir.expr.Constant)  # dequantized, folded
    np.testing.assert_array_equal(run_relax(new, [x_q], "llvm"), run_relax(mod, [x_q], "llvm"))


def test_module_without_qdq_unchanged():
    x = RNG.standard_normal((1, 3, 8, 8)).astype("float32")
    mod = module(lambda bb, v: relax.op.nn.relu(v), x)
    tvm.ir.assert_structural_equal(quantize_qdq(mod), mod)


def test_import_without_onnx():
    """`import accel_target` needs no onnx (the `models` extra): the ONNX import of quantized
    models (accel_target/onnx_quant.py, which loads TVM's ONNX frontend) is imported by from_onnx."""
    code = "import sys; sys.modules['onnx'] = None; import accel_target"  # None: `import onnx` raises
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
