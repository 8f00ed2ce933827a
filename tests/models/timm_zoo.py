"""timm image classifiers, one or two of each CNN family the target should run: random weights
(``pretrained=False``, seed 0), every constant parameter and batch norm statistic randomized
(hf_zoo.perturb_weights), small inputs.

``TIMM[name].make()`` returns (model in eval mode, (NCHW image,)). Nothing is downloaded. timm
imports torchvision, which needs tests/torchvision_shim.py beside PyPI's CUDA build: installed
here before the import (tests/conftest.py installs it too).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from tests import torchvision_shim
from tests.models.hf_zoo import perturb_weights

SIZE = 64  # input height and width


@dataclass(frozen=True)
class TimmModel:
    """One timm architecture: ``timm.create_model(name, **kwargs)`` on a [1, 3, size, size] image."""

    family: str  # a few words: what kind of network it is
    kwargs: dict = field(default_factory=dict)  # create_model's arguments beyond the name
    size: int = SIZE
    name: str = ""  # timm's name, when the zoo's key is not (a smaller configuration of it)

    def make(self, key: str) -> tuple[nn.Module, tuple[torch.Tensor]]:
        torchvision_shim.install()
        import timm

        torch.manual_seed(0)
        model = timm.create_model(self.name or key, pretrained=False, **self.kwargs)
        perturb_weights(model)
        image = torch.randn(1, 3, self.size, self.size, generator=torch.Generator().manual_seed(0))
        return model.eval(), (image,)


TIMM = {
    # grouped convs (8 channels a group), squeeze-excitation
    "regnetx_002": TimmModel("RegNetX: grouped 3x3 convs, 8 channels a group"),
    "regnety_002": TimmModel("RegNetY: grouped convs, squeeze-excitation"),
    # depthwise, squeeze-excitation, swish / hard swish
    "efficientnet_b0": TimmModel("EfficientNet: depthwise, squeeze-excitation, swish"),
    "mobilenetv3_small_100": TimmModel("MobileNetV3: depthwise, squeeze-excitation, hard swish"),
    # cross-stage partial stages (half the channels through the blocks, concatenated back) with
    # LeakyReLU: cs3darknet_s (SiLU by default) given cspdarknet53's activation, the same
    # stages in a smaller network, quicker to build
    "cs3darknet_s_leaky": TimmModel(
        "CSPDarknet (CS3): cross-stage partial stages, LeakyReLU", {"act_layer": "leaky_relu"}, name="cs3darknet_s"
    ),
    # split attention: a softmax over the radix splits weights their sum
    "resnest14d": TimmModel("ResNeSt: split attention (radix 2), deep stem, avg-pool downsampling"),
    "skresnet18": TimmModel("SKNet: selective kernel (3x3 and dilated 3x3 branches, attention over them)"),
    # dense blocks: each layer's output concatenated to its input; densenet121's 58 layers of
    # distinct widths take long to build, 8 show the pattern
    "densenet_small": TimmModel(
        "DenseNet: concatenated dense blocks, transitions", {"block_config": (2, 2, 2, 2)}, name="densenet121"
    ),
    "ghostnet_100": TimmModel("GhostNet: ghost modules (cheap depthwise features concatenated), SE"),
    "repvgg_a0": TimmModel("RepVGG: 3x3, 1x1 and identity branches summed (training form)"),
    "mobilevitv2_050": TimmModel("MobileViTv2: separable self-attention over unfolded patches"),
    "convnext_atto": TimmModel("ConvNeXt: depthwise 7x7, channels-last LayerNorm and MLP, layer scale"),
}


def make(name: str) -> tuple[nn.Module, tuple[torch.Tensor]]:
    """(model in eval mode, (NCHW image,)) of TIMM[name]."""
    return TIMM[name].make(name)
