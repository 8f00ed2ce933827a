"""What the zoo's transformers asked of the layout clean-up (SimplifyLayouts), on a model small
enough to build in seconds: a ViT-style patch embedding (the conv's output flattened and
permuted to tokens) costs no transpose."""

import pytest
import torch

import accel_target
from tests.helpers import assert_close, run_executable


class PatchEmbedding(torch.nn.Module):
    """Conv patches -> [tokens, channels] -> Linear; plus two reductions of the conv's NCHW
    output flattened another way (they follow the conv's NHWC layout too)."""

    def __init__(self):
        super().__init__()
        self.patches, self.proj = torch.nn.Conv2d(3, 8, 3, stride=2, padding=1), torch.nn.Linear(8, 4)

    def forward(self, x):
        y = self.patches(x)
        tokens = self.proj(y.flatten(2).transpose(1, 2))
        channels = y.reshape(1, 8, -1)
        return tokens + channels.sum(1, keepdim=True).transpose(1, 2) * channels.mean(1, keepdim=True).transpose(1, 2)


def _model():
    torch.manual_seed(0)
    return PatchEmbedding().eval(), torch.randn(1, 3, 8, 16)


@pytest.mark.parametrize("input_layout, transposes", [(None, 0), ("NHWC", 0)])
def test_patch_embedding_transposes(input_layout, transposes):
    model, x = _model()
    executable = accel_target.build(accel_target.from_torch(model, (x,)), input_layout=input_layout)
    data = x.permute(0, 2, 3, 1).contiguous() if input_layout else x
    assert_close(run_executable(executable, data.numpy()), model(x).detach().numpy())
    # none for the tokens; none for the NCHW reshape's sum and mean either (the reshape merges
    # H and W, side by side in NHWC too, and the reductions follow: FollowLayouts); none for
    # the NCHW input (the conv reads it as it is: ReadInputNCHW)
    calls = accel_target.report(executable).kernels
    assert calls.activation_transforms == transposes, calls.calls
