"""Audio models from Hugging Face transformers (small configs, random weights) through
accel_target.build, against PyTorch eager: every conv1d on the accel kernel."""

import pytest
import torch
import tvm

import accel_target
from accel_target.report import calls_of
from tests.helpers import assert_close, run_executable

pytestmark = pytest.mark.slow
transformers = pytest.importorskip("transformers")


class LastHiddenState(torch.nn.Module):
    """The model's last_hidden_state as a plain tensor output."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x).last_hidden_state


def wav2vec2():
    """Wav2Vec2Model: a 3-layer conv feature extractor (k10/5, k3/2, k3/2, group norm, GELU),
    the grouped positional conv (groups 4, kernel 16, weight norm) and 2 transformer layers."""
    config = transformers.Wav2Vec2Config(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        conv_dim=(32, 32, 32),
        conv_stride=(5, 2, 2),
        conv_kernel=(10, 3, 3),
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4,
    )
    return transformers.Wav2Vec2Model(config), torch.randn(1, 4000), 4


def whisper_encoder():
    """WhisperEncoder: conv1d k3 and k3/2 with GELU over 16 mel bins, then 2 transformer layers."""
    from transformers.models.whisper.modeling_whisper import WhisperEncoder  # noqa: PLC0415

    config = transformers.WhisperConfig(
        d_model=64,
        encoder_layers=2,
        encoder_attention_heads=4,
        encoder_ffn_dim=128,
        num_mel_bins=16,
        max_source_positions=50,
    )
    return WhisperEncoder(config), torch.randn(1, 16, 100), 2


@pytest.mark.parametrize("make", [wav2vec2, whisper_encoder], ids=lambda f: f.__name__)
def test_audio_model_runs_every_conv1d_on_accel(make):
    torch.manual_seed(0)
    model, x, n_conv1d = make()
    model = LastHiddenState(model.eval()).eval()
    with torch.no_grad():
        ref = model(x).numpy()
    mod = accel_target.from_torch(model, (x,))
    executable = accel_target.build(mod)
    assert_close(run_executable(executable, x.numpy()), ref)

    report = accel_target.report(executable)
    convs = [r for r in report.rows if r.op == "relax.nn.conv1d"]
    assert len(convs) == n_conv1d
    assert all(r.kind == "accel" and r.kernel == "conv1d_nwc_owi.accel" for r in convs), convs
    assert all("data_layout=NWC kernel_layout=OWI" in r.layouts for r in convs)
    assert report.count("fallback") == 0
    # what the executable calls: one conv2d_nhwc_ohwi kernel (its epilogue fused) per conv1d,
    # and no weight transform at run time
    assert sum("conv2d_nhwc_ohwi" in name for name in report.kernels.calls) == n_conv1d
    assert report.kernels.weight_transforms == 0
    assert "conv1d_nwc_owi.accel" in str(report)

    # every conv1d kernel reads weights packed at compile time: a constant [O/ob, K, I/groups, ob]
    lowered = accel_target.optimize(mod)
    kernels = [
        c
        for c in calls_of(lowered, ("relax.call_tir", "relax.call_tir_inplace"))
        if "conv2d_nhwc_ohwi" in c.args[0].name_hint
    ]
    assert len(kernels) == n_conv1d
    for call in kernels:
        weight = call.args[1].fields[1]
        assert isinstance(weight, tvm.ir.expr.Constant) and len(weight.ty.shape) == 4
