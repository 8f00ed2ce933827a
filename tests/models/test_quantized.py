"""Quantized models through accel_target.from_onnx + build, against ONNX Runtime's int8 session.

The models are built here with torch (random weights), exported to ONNX and quantized with ONNX
Runtime's ``quantize_static`` (tests/models/quantized_onnx.py): QDQ format, per-channel int8
weights, uint8 activations, random calibration data. ``reduce_range=True`` (7-bit weights):
without it ONNX Runtime's u8s8 kernels on a CPU without VNNI (AVX2, AVX-512 without VNNI)
saturate int16 pair sums (``vpmaddubsw``) and its int8 session is off by up to ~10 steps (ONNX
Runtime's quantization docs say so); the full-range file is held to ONNX Runtime with its graph
optimizations off, which runs the QDQ graph as written.
"""

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

import accel_target
from tests.helpers import assert_within_one_step, run_executable
from tests.models.quantized_onnx import output_scale, quantized_onnx

RNG = np.random.default_rng(3)
IMAGE = (1, 3, 32, 32)


class Bottleneck(nn.Module):
    def __init__(self, cin, width, stride):
        super().__init__()
        cout = width * 4
        self.body = nn.Sequential(
            nn.Conv2d(cin, width, 1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.Conv2d(width, width, 3, stride, 1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.Conv2d(width, cout, 1, bias=False),
            nn.BatchNorm2d(cout),
        )
        self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        return torch.relu(self.body(x) + self.short(x))


class InvertedResidual(nn.Module):
    """MobileNetV2's block; `keras_pad`: stride-2 depthwise convs pad (0, 1, 0, 1) with a ZeroPad2d
    before them, as MobileNetV2 converted from Keras does."""

    def __init__(self, cin, cout, stride, expand, keras_pad=False):
        super().__init__()
        hidden = cin * expand
        pad = [nn.ZeroPad2d((0, 1, 0, 1))] if keras_pad and stride == 2 else []
        self.body = nn.Sequential(
            nn.Conv2d(cin, hidden, 1, bias=False),
            nn.BatchNorm2d(hidden),
            nn.ReLU6(),
            *pad,
            nn.Conv2d(hidden, hidden, 3, stride, 0 if pad else 1, groups=hidden, bias=False),
            nn.BatchNorm2d(hidden),
            nn.ReLU6(),
            nn.Conv2d(hidden, cout, 1, bias=False),
            nn.BatchNorm2d(cout),
        )
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        return x + self.body(x) if self.residual else self.body(x)


def resnet_like():
    stem = [nn.Conv2d(3, 16, 7, 2, 3, bias=False), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    blocks = [Bottleneck(16, 8, 1), Bottleneck(32, 8, 1), Bottleneck(32, 16, 2)]
    return nn.Sequential(*stem, *blocks, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 100))


def mobilenet_v2_like():
    layers = [nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU6()]
    for cin, cout, stride in [(16, 16, 1), (16, 24, 2), (24, 24, 1), (24, 32, 2), (32, 32, 1)]:
        layers.append(InvertedResidual(cin, cout, stride, 4, keras_pad=True))
    layers += [nn.Conv2d(32, 96, 1, bias=False), nn.BatchNorm2d(96), nn.ReLU6(), nn.AdaptiveAvgPool2d(1)]
    return nn.Sequential(*layers, nn.Flatten(), nn.Linear(96, 100))


def random_batch_norms(model):
    torch.manual_seed(0)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
            m.weight.data.uniform_(0.5, 1.5)
    return model.eval()


def ort_session(path, optimized=True):
    options = onnxruntime.SessionOptions()
    if not optimized:  # the QDQ graph as written: float ops between QuantizeLinear / DequantizeLinear
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    return onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def assert_accuracy_contract(actual: list, expected: list, step: float):
    """Top-1 equal for every input; outputs within one quantization step on >= 99 % of elements."""
    for a, e in zip(actual, expected):
        assert a.argmax() == e.argmax()
    steps = np.abs(np.concatenate([a.ravel() for a in actual]) - np.concatenate([e.ravel() for e in expected])) / step
    assert (steps <= 1.0 + 1e-3).mean() >= 0.99, f"steps off: {np.unique(np.round(steps), return_counts=True)}"


def integer_convs(report) -> tuple[list, list]:
    """(integer conv rows, float conv rows) of a report: the inputs say which ran integer."""
    convs = [r for r in report.rows if r.op == "relax.nn.conv2d"]
    integer = [r for r in convs if r.inputs[0].startswith(("uint8[", "int8[")) and r.inputs[1].startswith("int8[")]
    return integer, [r for r in convs if r not in integer]


CNNS = [
    pytest.param(resnet_like, True, True, id="resnet_like-vs-ort-int8"),
    pytest.param(mobilenet_v2_like, True, True, id="mobilenet_v2_like-vs-ort-int8"),
    pytest.param(mobilenet_v2_like, False, False, id="mobilenet_v2_like-full-range-vs-ort-qdq"),
]


@pytest.mark.slow
@pytest.mark.parametrize("make, reduce_range, ort_int8", CNNS)
def test_quantized_cnn_against_onnxruntime(make, reduce_range, ort_int8, tmp_path):
    path = quantized_onnx(random_batch_norms(make()), IMAGE, tmp_path, reduce_range)
    executable = accel_target.build(accel_target.from_onnx(path), input_layout="NHWC")
    session = ort_session(path, optimized=ort_int8)
    inputs = [RNG.standard_normal(IMAGE).astype("float32") for _ in range(4)]
    expected = [session.run(None, {"x": x})[0] for x in inputs]
    actual = [run_executable(executable, np.ascontiguousarray(x.transpose(0, 2, 3, 1))) for x in inputs]
    assert_accuracy_contract(actual, expected, output_scale(path))

    report = accel_target.report(executable)
    integer, floating = integer_convs(report)
    assert integer and not floating, f"float convs: {[r.inputs for r in floating]}"
    # NHWC in, logits out: no layout change at run time, weights never transposed
    assert report.kernels.activation_transforms == 0
    assert report.kernels.weight_transforms == 0
    assert "uint8[" in str(report)  # the report shows the integer convs


# -- ONNX's own quantized operators, and the pads before them, one op each
def _onnx_model(nodes, inputs, outputs, initializers, opset=13) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "m", inputs, outputs, [numpy_helper.from_array(a, n) for n, a in initializers])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(model)
    return model


def _run_both(model, x, input_layout=None):
    executable = accel_target.build(accel_target.from_onnx(model), input_layout=input_layout)
    feed = np.ascontiguousarray(x.transpose(0, 2, 3, 1)) if input_layout == "NHWC" else x
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return run_executable(executable, feed), session.run(None, {"x": x})[0], accel_target.report(executable)


def test_qlinearconv_becomes_integer_conv():
    """QLinearConv (no converter in TVM 0.27): uint8 x int8 per-channel -> uint8, equal to ONNX Runtime."""
    x = RNG.integers(0, 256, (1, 8, 10, 10)).astype("uint8")
    w = RNG.integers(-64, 64, (16, 8, 3, 3)).astype("int8")  # 7-bit: no u8s8 saturation in ONNX Runtime
    initializers = [
        ("xs", np.float32(0.02)),
        ("xz", np.uint8(128)),
        ("w", w),
        ("ws", RNG.uniform(0.005, 0.01, 16).astype("float32")),
        ("wz", np.zeros(16, "int8")),
        ("ys", np.float32(0.05)),
        ("yz", np.uint8(10)),
        ("b", RNG.integers(-500, 500, 16).astype("int32")),
    ]
    node = helper.make_node(
        "QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"], ["y"], pads=[1, 1, 1, 1], strides=[2, 2]
    )
    model = _onnx_model(
        [node],
        [helper.make_tensor_value_info("x", TensorProto.UINT8, x.shape)],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, (1, 16, 5, 5))],
        initializers,
    )
    actual, expected, report = _run_both(model, x)
    assert_within_one_step(actual, expected)
    integer, floating = integer_convs(report)
    assert len(integer) == 1 and not floating


def test_qlinearmatmul_becomes_integer_matmul():
    """QLinearMatMul (no converter in TVM 0.27), weights per column, equal to ONNX Runtime."""
    x = RNG.integers(0, 256, (6, 32)).astype("uint8")
    initializers = [
        ("xs", np.float32(0.02)),
        ("xz", np.uint8(100)),
        ("w", RNG.integers(-64, 64, (32, 12)).astype("int8")),
        ("ws", np.float32(0.01)),
        ("wz", np.int8(0)),
        ("ys", np.float32(0.1)),
        ("yz", np.uint8(128)),
    ]
    node = helper.make_node("QLinearMatMul", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["y"])
    model = _onnx_model(
        [node],
        [helper.make_tensor_value_info("x", TensorProto.UINT8, x.shape)],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, (6, 12))],
        initializers,
    )
    actual, expected, report = _run_both(model, x)
    assert_within_one_step(actual, expected)
    matmuls = [r for r in report.rows if r.op == "relax.matmul"]
    assert [r.inputs[:2] for r in matmuls] == [("uint8[6, 32]", "int8[32, 12]")]


def test_pads_computed_by_the_graph_import(tmp_path):
    """PyTorch's export of ZeroPad2d computes its pads with shape ops (TVM 0.27: "Dynamic pads are
    not supported yet"); quantized, its constant value is QuantizeLinear -> DequantizeLinear
    (TVM 0.27: "'Call' object has no attribute 'value'"). Both import; the quantized pad stays
    integer and the model runs without layout transforms."""
    model = nn.Sequential(nn.Conv2d(3, 8, 3, 1, 1), nn.ReLU(), nn.ZeroPad2d((0, 1, 0, 1)), nn.Conv2d(8, 8, 3, 2))
    model = model.eval()
    shape = (1, 3, 16, 16)
    x = RNG.standard_normal(shape).astype("float32")
    float_path = tmp_path / "float.onnx"
    torch.onnx.export(model, (torch.from_numpy(x),), str(float_path), dynamo=False, input_names=["x"])
    actual, expected, _ = _run_both(onnx.load(str(float_path)), x)
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-5)

    path = quantized_onnx(model, shape, tmp_path)
    actual, expected, report = _run_both(onnx.load(path), x, input_layout="NHWC")
    step = output_scale(path)
    assert np.abs(actual - expected).max() <= step * 1.001
    integer, floating = integer_convs(report)
    assert len(integer) == 2 and not floating
    assert report.kernels.layout_transforms == 1  # only the 4-D output back to NCHW


class EncoderLayer(nn.Module):
    """BERT's encoder layer, small."""

    def __init__(self, dim=64, heads=4, ffn=128):
        super().__init__()
        self.heads = heads
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.ffn = nn.Sequential(nn.Linear(dim, ffn), nn.GELU(), nn.Linear(ffn, dim))

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).reshape(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        attn = torch.softmax(q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5, dim=-1)
        x = self.norm1(x + self.out((attn @ v).transpose(1, 2).reshape(b, s, d)))
        return self.norm2(x + self.ffn(x))


@pytest.mark.slow
def test_quantized_bert_like_encoder_against_onnxruntime(tmp_path):
    """Static QDQ on the MatMuls of a 2-layer encoder: every dense layer integer ([in, out] int8
    weights); the float output (layer norm) equal to ONNX Runtime's int8 session."""
    torch.manual_seed(0)
    model = nn.Sequential(EncoderLayer(), EncoderLayer()).eval()
    shape = (1, 16, 64)
    path = quantized_onnx(model, shape, tmp_path, op_types_to_quantize=["MatMul", "Gemm"])
    executable = accel_target.build(accel_target.from_onnx(path))
    session = ort_session(path)
    rng = np.random.default_rng(5)
    for _ in range(2):
        x = rng.standard_normal(shape).astype("float32")
        expected = session.run(None, {"x": x})[0]
        actual = run_executable(executable, x)
        # equal but where an intermediate uint8 activation rounds a tie the other way (one step,
        # see the README's accuracy contract): that changes the row of its token, not the rest
        close = np.isclose(actual, expected, rtol=1e-4, atol=1e-4)
        assert close.mean() >= 0.9, f"{(~close).sum()} of {close.size} elements differ"
        assert np.abs(actual - expected).max() < 0.1
    report = accel_target.report(executable)
    dense = [r for r in report.rows if r.op == "relax.matmul" and r.inputs[1].count(",") == 1]
    assert len(dense) == 8
    assert all(r.inputs[0].startswith("uint8[") and r.inputs[1].startswith("int8[") for r in dense)
    assert report.kernels.weight_transforms == 0


def test_onnx_clip_with_constant_bounds_follows_the_layout():
    """Clip (ReLU6) with constant bounds imports as maximum / minimum: it follows NHWC and runs in
    the conv's write-back (TVM 0.27 emits an opaque kernel, kept NCHW between two transposes)."""
    w1, w2 = (RNG.standard_normal(s).astype("float32") * 0.3 for s in ((8, 3, 3, 3), (8, 8, 1, 1)))
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Clip", ["c1", "lo", "hi"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"]),
        helper.make_node("GlobalAveragePool", ["c2"], ["p"]),
        helper.make_node("Flatten", ["p"], ["y"]),
    ]
    model = _onnx_model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 3, 12, 12))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, 8))],
        [("w1", w1), ("w2", w2), ("lo", np.float32(0.0)), ("hi", np.float32(6.0))],
    )
    x = RNG.standard_normal((1, 3, 12, 12)).astype("float32") * 3
    actual, expected, report = _run_both(model, x, input_layout="NHWC")
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)
    assert report.kernels.layout_transforms == 0
    clamps = ("relax.maximum", "relax.minimum")
    assert [r.op for r in report.rows if r.op in clamps] == list(clamps)
