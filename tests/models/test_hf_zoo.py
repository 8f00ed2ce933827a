"""The model zoo (tests/models/hf_zoo.py) through accel_target.build: every architecture
builds, matches PyTorch eager, runs every conv and matmul on an accel kernel, no step of
ours declines anything, and the runtime transposes are at most the model's own (+ 2 with
NCHW image input: in and out of channels-last; + 0 with NHWC input).

(wav2vec2 and Whisper: tests/models/test_audio_models.py; GPT-2 and Llama:
tests/models/test_decoders.py; our own networks: tests/models/test_models.py.)
"""

import io

import pytest
import torch
import tvm
from tvm import relax

import accel_target
from accel_target.reporting import TRANSFORM_KERNELS
from tests.helpers import assert_close, run_executable
from tests.models.hf_zoo import AUDIO, DECODERS, ENCODERS, OURS, ZOO
from tests.models.test_models import _check_report

pytestmark = pytest.mark.slow
TESTED_ELSEWHERE = {"wav2vec2", "whisper_encoder", "gpt2", "llama", *OURS}
# benchmarked only (benchmarks/bench_zoo.py): a minute or more to build each
BENCHMARK_ONLY = {"levit", "mobilevit"}
# text encoders: at batch 2 with a padding mask (test_text_encoder_...), the harder input
NAMES = [name for name in ZOO if name not in TESTED_ELSEWHERE | BENCHMARK_ONLY | set(ENCODERS)]
# with NHWC input, not one layout transform at run time
CONV_NETS = ["efficientnet", "regnet", "resnet", "deeplabv3", "poolformer", "convnext", "convnextv2", "mobilenet_v1"]
ACCEL_OPS = ("relax.nn.conv1d", "relax.nn.conv2d", "relax.matmul")


def own_transposes(mod: tvm.IRModule) -> int:
    """The permute_dims of activations in the imported model (a Linear's weight transpose,
    of a constant, is not one)."""
    found = []

    def visit(expr):
        if isinstance(expr, relax.Call) and getattr(expr.op, "name", None) == "relax.permute_dims":
            found.append(not isinstance(expr.args[0], tvm.ir.expr.Constant))

    relax.analysis.post_order_visit(mod["main"], visit)
    return sum(found)


def check_kernels(executable):
    """`executable`'s report, checked: every conv and matmul on an accel kernel (for conv2d, as
    the executable's calls say too), no step of ours declined anything."""
    report = accel_target.report(executable)
    if not any(r.op == "relax.nn.conv1d" for r in report.rows):  # (conv1d runs on conv2d_nhwc_ohwi kernels)
        _check_report(executable, report)
    # conv1d, and batched matmuls (attention), too
    assert all(r.kind == "accel" for r in report.rows if r.op in ACCEL_OPS), str(report)
    assert report.declines == (), str(report)
    assert report.count("accel") > 0
    return report


def transpose_kernels(report) -> list[str]:
    """The runtime kernels that transpose or transform a layout (an assertion's message)."""
    return [k for k in report.kernels.calls if any(t in k for t in TRANSFORM_KERNELS)]


@pytest.mark.parametrize("name", NAMES)
def test_zoo_model_builds_and_matches_pytorch(name):
    entry = ZOO[name]
    model, inputs = entry.make()
    mod = accel_target.from_torch(model, inputs)
    executable = accel_target.build(mod)
    assert_close(run_executable(executable, *[x.numpy() for x in inputs]), model(*inputs).detach().numpy())
    converted = entry.image or name in AUDIO  # NCHW / NCW input converted to channels-last
    _check_transforms(name, mod, executable, 2 * converted)


def _check_transforms(name, mod, executable, extra: int) -> None:
    """Every kernel check of `check_kernels`; the runtime transposes at most the model's own +
    `extra`, no weight transform."""
    report = check_kernels(executable)
    assert report.kernels.activation_transforms <= own_transposes(mod) + extra, transpose_kernels(report)
    assert report.kernels.weight_transforms == 0
    if name in DECODERS:
        assert report.count("fallback") == 0


@pytest.mark.parametrize("name", CONV_NETS)
def test_zoo_conv_net_with_nhwc_input_has_no_layout_transform(name):
    entry = ZOO[name]
    model, (x,) = entry.make()
    mod = accel_target.from_torch(model, (x,))
    output_layout = "NHWC" if entry.image_output else None
    executable = accel_target.build(mod, input_layout="NHWC", output_layout=output_layout)
    ref = model(x).detach()
    out = run_executable(executable, x.permute(0, 2, 3, 1).contiguous().numpy())
    assert_close(out, (ref.permute(0, 2, 3, 1) if entry.image_output else ref).numpy())
    report = check_kernels(executable)
    assert report.kernels.layout_transforms == 0, transpose_kernels(report)


class _Padded(torch.nn.Module):
    """A text encoder of the zoo called with a padding mask as its second input."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids, mask):
        return self.model(input_ids=ids, attention_mask=mask).last_hidden_state


@pytest.mark.parametrize("name", list(ENCODERS))
def test_text_encoder_at_batch_2_with_a_padding_mask_builds_and_matches_pytorch(name):
    """The second sequence padded on the right: masked attention, and every position (padding
    too) as PyTorch computes it; the checks of test_zoo_model_builds_and_matches_pytorch."""
    wrapped, (ids,) = ENCODERS[name].make()
    model = _Padded(wrapped.model).eval()
    ids = torch.cat([ids, ids.flip(-1)])
    mask = torch.ones_like(ids)
    mask[1, -5:] = 0
    mod = accel_target.from_torch(model, (ids, mask))
    executable = accel_target.build(mod)
    with torch.no_grad():
        expected = model(ids, mask).numpy()
    assert_close(run_executable(executable, ids.numpy(), mask.numpy()), expected)
    _check_transforms(name, mod, executable, 0)


# Exported to ONNX with fixed sizes, these compute a reshape's, expand's or pad's shape from
# other tensors' shapes; TVM's ONNX importer alone fails on each ("Reshape requires the input
# new shape to be Shape", "broadcast_to expects ...", "Dynamic pads are not supported yet"):
# accel_target.from_onnx folds those shapes first (accel_target/onnx_quant.py). Sizes fixed at
# export, or a symbolic batch fixed by from_onnx's shape_dict ("given": ConvBERT's and
# SqueezeBERT's exports then leave shapes that onnx's inference cannot tell, and TVM's Expand
# converter fails on them). BEIT imports in TVM's importer too: its ConstantOfShape vectors feed
# converters that read them as constants (they failed when from_onnx made them ``full``).
ONNX_SHAPE_ARITHMETIC = [
    ("swin", "exported"),
    ("swin", "given"),
    ("convbert", "exported"),
    ("squeezebert", "exported"),
    ("beit", "exported"),
]


@pytest.mark.parametrize(("name", "sizes"), ONNX_SHAPE_ARITHMETIC)
def test_zoo_model_exported_to_onnx_with_fixed_sizes_builds_and_matches_pytorch(name, sizes):
    onnx = pytest.importorskip("onnx")
    model, inputs = ZOO[name].make()
    exported = io.BytesIO()
    batch = {"x": {0: "batch"}} if sizes == "given" else None
    torch.onnx.export(model.eval(), inputs, exported, dynamo=False, input_names=["x"], dynamic_axes=batch)
    shape_dict = {"x": list(inputs[0].shape)} if sizes == "given" else None
    executable = accel_target.build(accel_target.from_onnx(onnx.load_from_string(exported.getvalue()), shape_dict))
    with torch.no_grad():
        expected = model(*inputs).numpy()
    assert_close(run_executable(executable, *[x.numpy() for x in inputs]), expected)
