"""The patterns of real networks that kept runtime transposes before layouts followed by
principle: timm's CSPDarknet stages (conv, BN, LeakyReLU or Mish, split, residual, concat) and a
Keras-style image normalization before the first conv, each fed NHWC."""

import pytest
import torch
from torch import nn

import accel_target
from accel_target.compiler import graph_module
from tests.helpers import assert_close, run_executable
from tests.models.zoo import randomize_norms


class ConvBnAct(nn.Sequential):
    def __init__(self, cin, cout, kernel=1, stride=1, act=nn.LeakyReLU):
        conv = nn.Conv2d(cin, cout, kernel, stride, kernel // 2, bias=False)
        super().__init__(conv, nn.BatchNorm2d(cout), act())


class DarkBlock(nn.Module):
    """timm's DarkBlock: 1x1 down to half the channels, 3x3 back, residual add."""

    def __init__(self, channels, act):
        super().__init__()
        self.conv1, self.conv2 = (
            ConvBnAct(channels, channels // 2, act=act),
            ConvBnAct(channels // 2, channels, 3, act=act),
        )

    def forward(self, x):
        return x + self.conv2(self.conv1(x))


class CrossStage(nn.Module):
    """timm's CrossStage: strided 3x3, 1x1 expansion split in two halves along the channels,
    dark blocks on the second, transitions, concat."""

    def __init__(self, cin, cout, act):
        super().__init__()
        self.conv_down = ConvBnAct(cin, cout, 3, 2, act=act)
        self.conv_exp = ConvBnAct(cout, 2 * cout, act=act)
        self.blocks = nn.Sequential(DarkBlock(cout, act), DarkBlock(cout, act))
        self.conv_transition_b = ConvBnAct(cout, cout, act=act)
        self.conv_transition = ConvBnAct(2 * cout, cout, act=act)

    def forward(self, x):
        y = self.conv_exp(self.conv_down(x))
        xs, xb = y.split(y.shape[1] // 2, dim=1)
        xb = self.conv_transition_b(self.blocks(xb))
        return self.conv_transition(torch.cat([xs, xb], dim=1))


class CSPDarknetLike(nn.Module):
    def __init__(self, act):
        super().__init__()
        self.stem = ConvBnAct(3, 16, 3, act=act)
        self.stages = nn.Sequential(CrossStage(16, 32, act), CrossStage(32, 64, act))
        self.head = nn.Linear(64, 10)

    def forward(self, x):
        return self.head(self.stages(self.stem(x)).mean(dim=(2, 3)))


@pytest.mark.parametrize("act", [nn.LeakyReLU, nn.Mish], ids=["leakyrelu", "mish"])
def test_csp_darknet_stages_fed_nhwc_have_no_transpose(act):
    torch.manual_seed(0)
    model, x = randomize_norms(CSPDarknetLike(act)), torch.randn(1, 3, 32, 32)
    executable = accel_target.build(accel_target.from_torch(model, (x,)), input_layout="NHWC")
    out = run_executable(executable, x.permute(0, 2, 3, 1).contiguous().numpy())
    assert_close(out, model(x).detach().numpy())
    assert accel_target.report(executable).kernels.activation_transforms == 0


class Normalized(nn.Module):
    """A Keras-style input pipeline: rescale to [0, 1], subtract the mean, divide by the standard
    deviation (per channel), then the convs."""

    def __init__(self):
        super().__init__()
        self.register_buffer("mean", torch.tensor([0.485, 0.456, 0.406]).reshape(1, 3, 1, 1))
        self.register_buffer("std", torch.tensor([0.229, 0.224, 0.225]).reshape(1, 3, 1, 1))
        self.a, self.b = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        x = (x / 255.0 - self.mean) / self.std
        return self.b(torch.relu(self.a(x))).mean(dim=(2, 3))


def test_image_normalization_runs_in_nhwc_its_scale_in_the_first_conv():
    torch.manual_seed(0)
    model, x = Normalized().eval(), 255 * torch.rand(1, 3, 16, 16)
    mod = accel_target.from_torch(model, (x,))
    nhwc = x.permute(0, 2, 3, 1).contiguous().numpy()
    executable = accel_target.build(mod, input_layout="NHWC")
    assert_close(run_executable(executable, nhwc), model(x).detach().numpy())
    assert accel_target.report(executable).kernels.activation_transforms == 0
    # what reaches the first conv: the input rescaled and shifted, in NHWC; the division by the
    # standard deviation is in the conv's weights (the shift is not: at the zero-padded border
    # it would not be exact)
    main = graph_module(mod, input_layout="NHWC")["main"]
    bindings = [b for block in main.body.blocks for b in block.bindings]
    ops = [b.value.op.name for b in bindings if hasattr(b.value, "op") and hasattr(b.value.op, "name")]
    first = ops.index("relax.nn.conv2d")
    assert ops[:first] == ["relax.divide", "relax.subtract"], ops


class UnfoldedPatches(nn.Module):
    """MobileViT-v2's patch block: nn.Unfold into non-overlapping 2x2 patches, [N, C, 4, L]
    normalized and projected by a 1x1 conv with a residual add, nn.Fold back."""

    def __init__(self, channels=16, patch=2):
        super().__init__()
        self.patch = patch
        self.pre, self.post = nn.Conv2d(channels, channels, 3, padding=1), nn.Conv2d(channels, channels, 1)
        self.norm, self.proj = nn.GroupNorm(1, channels), nn.Conv2d(channels, channels, 1)

    def forward(self, x):
        x = self.pre(x)
        n, c, h, w = x.shape
        p = self.patch
        patches = nn.functional.unfold(x, p, stride=p).reshape(n, c, p * p, -1)
        patches = patches + self.proj(self.norm(patches))
        return self.post(nn.functional.fold(patches.reshape(n, c * p * p, -1), (h, w), p, stride=p))


def test_unfolded_patches_fed_nhwc_keep_one_transpose_each_way():
    """The patches are a regrouping of the spatial axes: unfold and fold are one transpose each,
    the norm, conv and residual between them run in NHWC (was 4 copies and an index_put)."""
    torch.manual_seed(0)
    model, x = randomize_norms(UnfoldedPatches()), torch.randn(1, 16, 8, 12)
    executable = accel_target.build(accel_target.from_torch(model, (x,)), input_layout="NHWC", output_layout="NHWC")
    out = run_executable(executable, x.permute(0, 2, 3, 1).contiguous().numpy())
    assert_close(out, model(x).detach().permute(0, 2, 3, 1).numpy())
    assert accel_target.report(executable).kernels.activation_transforms == 2


class EfficientChannelAttention(nn.Module):
    """timm's EcaModule after a conv: the image's channel means as a 1-D signal [N, 1, C], a
    conv1d over the channels, the sigmoid as a gate [N, C, 1, 1] expanded to the image's shape."""

    def __init__(self, channels=16):
        super().__init__()
        self.pre, self.post = nn.Conv2d(channels, channels, 3, padding=1), nn.Conv2d(channels, channels, 1)
        self.gate = nn.Conv1d(1, 1, 3, padding=1, bias=False)

    def forward(self, x):
        x = torch.relu(self.pre(x))
        y = self.gate(x.mean((2, 3)).view(x.shape[0], 1, -1)).sigmoid().view(x.shape[0], -1, 1, 1)
        return self.post(x * y.expand_as(x))


def test_efficient_channel_attention_fed_nhwc_has_no_transpose():
    """ConvertLayout permutes the expanded gate to NHWC for the product: a transpose of the whole
    image, where the gate itself needs only a reshape ([N, C, 1, 1] to [N, 1, 1, C])."""
    torch.manual_seed(0)
    model, x = EfficientChannelAttention().eval(), torch.randn(2, 16, 8, 8)
    executable = accel_target.build(accel_target.from_torch(model, (x,)), input_layout="NHWC", output_layout="NHWC")
    out = run_executable(executable, x.permute(0, 2, 3, 1).contiguous().numpy())
    assert_close(out, model(x).detach().permute(0, 2, 3, 1).numpy())
    assert accel_target.report(executable).kernels.activation_transforms == 0


class InputAsResidual(nn.Module):
    """relu(conv(relu(conv(x))) + x) on the model's NCHW input: x read by a conv and an add."""

    def __init__(self, channels=16):
        super().__init__()
        self.a, self.b = nn.Conv2d(channels, channels, 3, padding=1), nn.Conv2d(channels, channels, 1)

    def forward(self, x):
        return torch.relu(self.b(torch.relu(self.a(x))) + x)


def test_an_nchw_input_read_twice_is_transposed_once():
    """ConvertLayout gives each reader of the input its own permute to NHWC; one is kept."""
    torch.manual_seed(0)
    model, x = nn.Sequential(InputAsResidual(), InputAsResidual()).eval(), torch.randn(1, 16, 8, 8)
    executable = accel_target.build(accel_target.from_torch(model, (x,)))
    assert_close(run_executable(executable, x.numpy()), model(x).detach().numpy())
    assert accel_target.report(executable).kernels.activation_transforms == 2  # the input's and the output's


class PreActivation(nn.Module):
    """Batch norms that no conv's weights can take: after a conv with a bias, and after a
    concatenation (DenseNet's, pre-activation ResNets')."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(16, 8, 1)
        self.norm_a, self.norm_b = nn.BatchNorm2d(8), nn.BatchNorm2d(16)

    def forward(self, x):
        y = torch.relu(self.norm_a(self.a(x)))
        return self.b(torch.relu(self.norm_b(torch.cat([y, y * 2], 1))))


def test_a_relu_after_an_unfolded_batch_norm_fuses_with_it():
    """TVM's inference form of a batch norm is a tuple (result, mean, variance): its relu read
    the result through the tuple and FuseOps made it a kernel of its own."""
    torch.manual_seed(0)
    model, x = randomize_norms(PreActivation()), torch.randn(1, 3, 8, 8)
    executable = accel_target.build(accel_target.from_torch(model, (x,)), input_layout="NHWC", output_layout="NHWC")
    out = run_executable(executable, x.permute(0, 2, 3, 1).contiguous().numpy())
    assert_close(out, model(x).detach().permute(0, 2, 3, 1).numpy())
    calls = accel_target.report(executable).kernels.calls
    assert not [name for name in calls if name.startswith(("relu", "fused_relu"))], calls
