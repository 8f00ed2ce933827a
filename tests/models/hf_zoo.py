"""Hugging Face transformers vision architectures, small configs, random weights.

``MODELS[name]()`` returns (model in eval mode, example input [1, 3, H, W]). Nothing is
downloaded: every model is built from a config. A model's ``forward`` returns the
logits tensor only (`Logits`), so that torch.export gives one output.
Add an architecture with one entry in MODELS.
"""

from __future__ import annotations

import torch
from torch import nn

SIZE = 64  # input height and width


class Logits(nn.Module):
    """A transformers image classifier returning its logits tensor."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, pixel_values):
        return self.model(pixel_values=pixel_values).logits


def _image(size: int = SIZE) -> torch.Tensor:
    return torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(0))


def _perturb(model: nn.Module) -> None:
    """Give every parameter that its init made constant (zero biases, unit norm weights, a
    layer scale of 1e-6, GRN's zero gamma and beta, a zero-initialised classifier) and
    every batch norm's statistics random values, so that none is a no-op in the test."""
    generator = torch.Generator().manual_seed(1)
    noise = lambda t, scale: scale * (2 * torch.rand(t.shape, generator=generator) - 1)  # noqa: E731
    with torch.no_grad():
        for param in model.parameters():
            if torch.all(param == param.flatten()[0]):
                param.add_(noise(param, 0.25))
        for module in model.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                module.running_mean.copy_(noise(module.running_mean, 0.1))
                module.running_var.copy_(1 + noise(module.running_var, 0.5))


def _classifier(config_name: str, model_name: str, size: int = SIZE, **config):
    """(Logits(model_name(config_name(**config))), image): random weights, seed 0."""
    import transformers

    torch.manual_seed(0)
    model = getattr(transformers, model_name)(getattr(transformers, config_name)(num_labels=10, **config))
    _perturb(model)
    return Logits(model).eval(), _image(size)


def efficientnet():
    return _classifier(
        "EfficientNetConfig",
        "EfficientNetForImageClassification",
        width_coefficient=0.25,
        depth_coefficient=0.2,
        image_size=SIZE,
        hidden_dim=320,
    )


def regnet():
    return _classifier(
        "RegNetConfig",
        "RegNetForImageClassification",
        embedding_size=16,
        hidden_sizes=[16, 32, 48, 64],
        depths=[1, 1, 1, 1],
        groups_width=8,
    )


def segformer():
    return _classifier(
        "SegformerConfig",
        "SegformerForImageClassification",
        num_encoder_blocks=2,
        depths=[1, 1],
        sr_ratios=[4, 2],
        hidden_sizes=[16, 32],
        num_attention_heads=[1, 2],
        mlp_ratios=[2, 2],
        decoder_hidden_size=32,
    )


def cvt():
    # (depth[i] > i: CvT indexes stage i's drop-path rates, depth[i] of them, by i)
    return _classifier(
        "CvtConfig",
        "CvtForImageClassification",
        embed_dim=[16, 32],
        num_heads=[1, 2],
        depth=[1, 2],
        patch_sizes=[7, 3],
        patch_stride=[4, 2],
        patch_padding=[2, 1],
        mlp_ratio=[2.0, 2.0],
        attention_drop_rate=[0.0, 0.0],
        drop_rate=[0.0, 0.0],
        drop_path_rate=[0.0, 0.0],
        qkv_bias=[True, True],
        cls_token=[False, True],
        padding_q=[1, 1],
        padding_kv=[1, 1],
        kernel_qkv=[3, 3],
        stride_kv=[2, 2],
        stride_q=[1, 1],
        qkv_projection_method=["dw_bn", "dw_bn"],
    )


def swin():
    return _classifier(
        "SwinConfig",
        "SwinForImageClassification",
        image_size=SIZE,
        patch_size=4,
        embed_dim=16,
        depths=[1, 1],
        num_heads=[1, 2],
        window_size=4,
        mlp_ratio=2.0,
    )


def poolformer():
    return _classifier(
        "PoolFormerConfig",
        "PoolFormerForImageClassification",
        hidden_sizes=[16, 32, 48, 64],
        depths=[1, 1, 1, 1],
        mlp_ratio=2.0,
    )


def convnext():
    return _classifier(
        "ConvNextConfig", "ConvNextForImageClassification", hidden_sizes=[16, 32, 48, 64], depths=[1, 1, 2, 1]
    )


def convnextv2():
    return _classifier(
        "ConvNextV2Config", "ConvNextV2ForImageClassification", hidden_sizes=[16, 32, 48, 64], depths=[1, 1, 2, 1]
    )


MODELS = {
    "efficientnet": efficientnet,
    "regnet": regnet,
    "segformer": segformer,
    "cvt": cvt,
    "swin": swin,
    "poolformer": poolformer,
    "convnext": convnext,
    "convnextv2": convnextv2,
}
