"""PyTorch's quantized models through accel: PT2E's quantize / dequantize ops (quantized_decomposed)
written out by hand, and torchao's PT2E flow (prepare_pt2e / calibrate / convert_pt2e with its
X86InductorQuantizer: per-channel int8 weights, uint8 activations) on a channels-last CNN, through
from_torch, torch.compile(backend="accel") and a .pt2 file, against the converted model in PyTorch."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch import nn

import accel_target
from accel_target.frontends import load_model
from tests.helpers import run_executable
from tests.models.quantized_pt2e import last_activation_scale, quantized_pt2e
from tests.models.test_quantized import integer_convs, random_batch_norms


# -- PyTorch: torch.export of a model as PT2E's convert_pt2e leaves it (torch 2.13 ships the
# quantized_decomposed ops but no quantizer: those live in torchao now), with its q/dq ops written out
class QDQConvNet(nn.Module):
    """conv (per-channel int8 weights, float bias) -> relu -> max pool -> depthwise conv -> residual
    add, every activation between quantize_per_tensor / dequantize_per_tensor."""

    def __init__(self):
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        for name, shape in (("w1", (16, 3, 3, 3)), ("w2", (16, 1, 3, 3))):
            self.register_buffer(name, torch.randint(-127, 128, shape, dtype=torch.int8, generator=gen))
            self.register_buffer(f"{name}_scale", torch.rand(shape[0], generator=gen) * 0.01 + 0.002)
            self.register_buffer(f"{name}_zp", torch.zeros(shape[0], dtype=torch.int64))
        self.register_buffer("bias", torch.randn(16, generator=gen))

    @staticmethod
    def qdq(x, scale, zero_point):
        ops = torch.ops.quantized_decomposed
        q = ops.quantize_per_tensor.default(x, scale, zero_point, 0, 255, torch.uint8)
        return ops.dequantize_per_tensor.default(q, scale, zero_point, 0, 255, torch.uint8)

    def weight(self, name):
        w, scale, zp = (getattr(self, f"{name}{s}") for s in ("", "_scale", "_zp"))
        return torch.ops.quantized_decomposed.dequantize_per_channel.default(w, scale, zp, 0, -127, 127, torch.int8)

    def forward(self, x):
        x = self.qdq(x, 0.0311, 128)
        y = self.qdq(torch.relu(nn.functional.conv2d(x, self.weight("w1"), self.bias, padding=1)), 0.0207, 0)
        y = self.qdq(nn.functional.max_pool2d(y, 2), 0.0207, 0)
        z = self.qdq(nn.functional.conv2d(y, self.weight("w2"), padding=1, groups=16), 0.0493, 120)
        return self.qdq(y + z, 0.0617, 100)


def test_torch_export_of_quantized_model_runs_integer_channels_last():
    import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers quantized_decomposed)

    model = QDQConvNet().eval()
    x = torch.randn(1, 3, 16, 16).to(memory_format=torch.channels_last)
    executable = accel_target.build(accel_target.from_torch(model, (x,)), input_layout="NHWC", output_layout="NHWC")
    actual = run_executable(executable, x.permute(0, 2, 3, 1).contiguous().numpy())
    expected = model(x).permute(0, 2, 3, 1).numpy()
    steps = np.abs(actual - expected) / 0.0617
    assert steps.max() <= 1.001 and (steps < 0.5).mean() >= 0.99
    report = accel_target.report(executable)
    integer, floating = integer_convs(report)
    assert len(integer) == 2 and not floating
    assert report.kernels.layout_transforms == 0
    pools = [r for r in report.rows if r.op == "relax.nn.max_pool2d"]
    assert [r.inputs[0][:6] for r in pools] == ["uint8["]  # the pool stays integer


class QDQLinear(nn.Module):
    """nn.Linear with per-channel int8 weights between quantize / dequantize, as convert_pt2e
    leaves it: the dequantized weight is permuted to [in, out] by the export."""

    def __init__(self, cin=48, cout=40):
        super().__init__()
        gen = torch.Generator().manual_seed(2)
        self.register_buffer("w", torch.randint(-127, 128, (cout, cin), dtype=torch.int8, generator=gen))
        self.register_buffer("w_scale", torch.rand(cout, generator=gen) * 0.01 + 0.002)
        self.register_buffer("w_zp", torch.zeros(cout, dtype=torch.int64))
        self.register_buffer("bias", torch.randn(cout, generator=gen))

    def forward(self, x):
        ops = torch.ops.quantized_decomposed
        w = ops.dequantize_per_channel.default(self.w, self.w_scale, self.w_zp, 0, -127, 127, torch.int8)
        return QDQConvNet.qdq(nn.functional.linear(QDQConvNet.qdq(x, 0.0311, 128), w, self.bias), 0.0589, 110)


def test_torch_export_of_quantized_linear_runs_integer_dense():
    """The dequantized weight is not folded to a float constant at import: the dense is integer."""
    import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers quantized_decomposed)

    model = QDQLinear().eval()
    x = torch.randn(3, 48)
    executable = accel_target.build(accel_target.from_torch(model, (x,)))
    actual, expected = run_executable(executable, x.numpy()), model(x).numpy()
    steps = np.abs(actual - expected) / 0.0589
    assert steps.max() <= 1.001 and (steps < 0.5).mean() >= 0.99
    rows = [r for r in accel_target.report(executable).rows if r.op == "relax.matmul"]
    assert [r.kernel for r in rows] == ["dense_kn_int8.accel"]
    assert rows[0].inputs[0].startswith("uint8[") and rows[0].inputs[1].startswith("int8[")


# -- PT2E with torchao: prepare_pt2e / calibrate / convert_pt2e with X86InductorQuantizer (per-channel
# int8 weights, uint8 activations) on a channels-last CNN, through from_torch, torch.compile and a .pt2
class SmallCNN(nn.Module):
    """conv-bn-relu, strided conv-bn-relu, max pool, 1x1 conv with a residual add and relu."""

    def __init__(self):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16)
        self.c2, self.b2 = nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32)
        self.c3 = nn.Conv2d(32, 32, 1)

    def forward(self, x):
        y = torch.relu(self.b1(self.c1(x)))
        y = nn.functional.max_pool2d(torch.relu(self.b2(self.c2(y))), 2)
        return torch.relu(self.c3(y) + y)


PT2E_SHAPE = (2, 3, 16, 16)


def _pt2e_input(seed: int) -> torch.Tensor:
    x = torch.randn(PT2E_SHAPE, generator=torch.Generator().manual_seed(seed))
    return x.contiguous(memory_format=torch.channels_last)


@pytest.fixture(scope="module")
def pt2e_cnn():
    """(SmallCNN quantized by torchao's PT2E flow, an example input), random weights."""
    pytest.importorskip("torchao")
    torch.manual_seed(0)
    model = random_batch_norms(SmallCNN()).to(memory_format=torch.channels_last)
    return quantized_pt2e(model, _pt2e_input(0)), _pt2e_input(0)


def _assert_pt2e_kernels(report, convs: int = 3):
    """Every conv on the int8 kernel; NHWC in, NHWC out: no layout change at run time."""
    rows = [r for r in report.rows if r.op == "relax.nn.conv2d"]
    assert [(r.kind, r.kernel) for r in rows] == [("accel", "conv2d_nhwc_ohwi_int8.accel")] * convs, [
        (r.kernel, r.inputs, r.reason) for r in rows
    ]
    assert report.kernels.activation_transforms == 0
    assert report.kernels.weight_transforms == 0


def _assert_within_steps(actual: np.ndarray, expected: np.ndarray, converted, steps: float = 2.0):
    step = last_activation_scale(converted)
    off = np.abs(actual - expected) / step
    counts = np.unique(np.round(off), return_counts=True)
    assert off.max() <= steps + 1e-3 and (off <= 1.0 + 1e-3).mean() >= 0.99, counts


def test_pt2e_quantized_cnn_from_torch_runs_int8_channels_last(pt2e_cnn):
    """from_torch takes convert_pt2e's GraphModule as it is (it refuses eval()): every conv on the
    int8 kernel, channels-last in and out without a layout transform, outputs within two steps of
    the converted model's."""
    converted, example = pt2e_cnn
    executable = accel_target.build(
        accel_target.from_torch(converted, (example,)), input_layout="NHWC", output_layout="NHWC"
    )
    _assert_pt2e_kernels(accel_target.report(executable))
    for seed in (1, 2):
        x = _pt2e_input(seed)
        actual = run_executable(executable, x.permute(0, 2, 3, 1).contiguous().numpy())
        with torch.no_grad():
            expected = converted(x).permute(0, 2, 3, 1).numpy()
        _assert_within_steps(actual, expected, converted)


def test_pt2e_quantized_cnn_through_torch_compile(pt2e_cnn, tmp_path, monkeypatch):
    """torch.compile(backend="accel") of the converted model: the same int8 kernels."""
    from accel_target.frontends import dynamo

    monkeypatch.setenv("ACCEL_CACHE_DIR", str(tmp_path))
    converted, _ = pt2e_cnn
    compiled = []

    def backend(gm, example_inputs):
        compiled.append(dynamo.accel_backend(gm, example_inputs, fallback="raise"))
        return compiled[-1]

    torch._dynamo.reset()
    run = torch.compile(converted, backend=backend)
    with torch.no_grad():
        for seed in (1, 2):
            x = _pt2e_input(seed)
            out = run(x)
            assert out.is_contiguous(memory_format=torch.channels_last)
            _assert_within_steps(out.numpy(), converted(x).numpy(), converted)
    torch._dynamo.reset()
    _assert_pt2e_kernels(accel_target.report(compiled[0].accel_model))


_LOAD_PT2 = """
import sys
from collections import Counter
from tvm import relax
from accel_target.frontends import load_model
ops = Counter()
relax.analysis.post_order_visit(
    load_model(sys.argv[1])["main"], lambda e: isinstance(e, relax.Call) and ops.update([str(e.op.name)])
)
print(ops["relax.quantize"], ops["relax.dequantize"], ops["relax.nn.conv2d"])
"""


def test_pt2e_quantized_pt2_file_loads_in_a_fresh_process(pt2e_cnn, tmp_path):
    """A .pt2 of the converted model (torch.export.save) loads where nothing imported torchao or
    registered the quantized_decomposed ops (the CLI's load_model registers them first), its
    quantize / dequantize ops as relax's; loaded so, it builds to the int8 kernels."""
    converted, example = pt2e_cnn
    path = tmp_path / "cnn_int8.pt2"
    torch.export.save(torch.export.export(converted, (example,)), str(path))
    child = subprocess.run(
        [sys.executable, "-c", _LOAD_PT2, str(path)],
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    quantize, dequantize, convs = (int(n) for n in child.stdout.split()[-3:])
    assert quantize >= 3 and dequantize > quantize and convs == 3
    executable = accel_target.build(load_model(str(path)), input_layout="NHWC", output_layout="NHWC")
    _assert_pt2e_kernels(accel_target.report(executable))
    x = _pt2e_input(3)
    actual = run_executable(executable, x.permute(0, 2, 3, 1).contiguous().numpy())
    with torch.no_grad():
        expected = converted(x).permute(0, 2, 3, 1).numpy()
    _assert_within_steps(actual, expected, converted)
