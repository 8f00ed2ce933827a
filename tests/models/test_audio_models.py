"""Audio models from Hugging Face transformers (small configs, random weights) through
accel_target.build, against PyTorch eager: every conv1d on the accel kernel."""

import pytest
import torch
import tvm

import accel_target
from accel_target.reporting import calls_of
from tests.helpers import assert_close, run_executable
from tests.models.hf_zoo import ZOO

pytestmark = pytest.mark.slow
pytest.importorskip("transformers")


# wav2vec2: a 3-layer conv feature extractor (k10/5, k3/2, k3/2, group norm, GELU), the grouped
# positional conv (groups 4, kernel 16, weight norm); Whisper's encoder: conv1d k3 and k3/2 over mel bins
@pytest.mark.parametrize("name, n_conv1d", [("wav2vec2", 4), ("whisper_encoder", 2)])
def test_audio_model_runs_every_conv1d_on_accel(name, n_conv1d):
    model, (x,) = ZOO[name].make()
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
