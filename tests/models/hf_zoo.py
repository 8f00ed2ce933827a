"""The model zoo: Hugging Face transformers architectures (small configs, random weights) and
our own PyTorch-built networks (tests/models/zoo.py).

``ZOO[name].make()`` returns (model in eval mode, example inputs as a tuple). Nothing is
downloaded: every model is built from a config. A model's ``forward`` returns one tensor
(`Output`), so that torch.export gives one output. Add an architecture with one entry in
the table of its family (VISION, AUDIO, ENCODERS, DECODERS).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from tests import torchvision_shim
from tests.models import zoo

SIZE = 64  # input height and width
TOKENS = 16  # length of a text input
VOCAB = 100


@dataclass(frozen=True)
class Entry:
    """One architecture of the zoo."""

    make: Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]]  # () -> (model, inputs)
    family: str  # a few words: what kind of network it is
    image: bool = False  # one NCHW image input: channels-last input applies
    image_output: bool = False  # its output is an NCHW image (a segmentation map)


class Output(nn.Module):
    """A transformers model returning one field of its output (``logits``, ``last_hidden_state``),
    called with fixed keyword arguments (``use_cache=False`` for a decoder)."""

    def __init__(self, model: nn.Module, field: str = "logits", **kwargs):
        super().__init__()
        self.model, self.field, self.kwargs = model, field, kwargs

    def forward(self, x):
        return getattr(self.model(x, **self.kwargs), self.field)


def _image(size: int = SIZE) -> torch.Tensor:
    return torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(0))


def _tokens(length: int = TOKENS) -> torch.Tensor:
    return torch.randint(0, VOCAB, (1, length), generator=torch.Generator().manual_seed(0))


def _audio(samples: int = 4000) -> torch.Tensor:
    return torch.randn(1, samples, generator=torch.Generator().manual_seed(0))


def perturb_weights(model: nn.Module) -> None:
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


def _build(config_name: str, model_name: str, perturb: bool = True, **config) -> nn.Module:
    """transformers.model_name(transformers.config_name(**config)), random weights (seed 0).
    transformers' vision and audio models import torchvision: its shim goes first."""
    torchvision_shim.install()
    import transformers

    torch.manual_seed(0)
    model = getattr(transformers, model_name)(getattr(transformers, config_name)(**config))
    if perturb:
        perturb_weights(model)
    return model.eval()


def _classifier(config_name: str, model_name: str, size: int = SIZE, **config):
    """(Output(model_name(config_name(**config))), (image,)): random weights, seed 0."""
    return Output(_build(config_name, model_name, num_labels=10, **config)).eval(), (_image(size),)


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


def resnet():
    return _classifier(
        "ResNetConfig", "ResNetForImageClassification", embedding_size=16, hidden_sizes=[16, 32, 48, 64], depths=[1] * 4
    )


def deeplabv3():
    """MobileNetV2 (inverted residuals, depthwise convs, ReLU6) with the DeepLabV3 head
    (dilated last stage, atrous spatial pyramid pooling): [1, 5, 8, 8] logits."""
    model = _build("MobileNetV2Config", "MobileNetV2ForSemanticSegmentation", depth_multiplier=0.35, num_labels=5)
    return Output(model).eval(), (_image(),)


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


def mobilevit():
    """MobileNetV2 blocks, then transformers over unfolded 2x2 patches, folded back and fused
    with the block's input by a conv."""
    return _classifier(
        "MobileViTConfig",
        "MobileViTForImageClassification",
        image_size=SIZE,
        hidden_sizes=[32, 48, 64],
        neck_hidden_sizes=[8, 16, 24, 32, 48, 64, 96],
        num_attention_heads=2,
        expand_ratio=2.0,
    )


def mobilevitv2():
    """MobileViT with separable linear attention; patches unfolded and folded back by
    nn.Unfold / nn.Fold (index.Tensor with broadcasting indices, index_put)."""
    return _classifier("MobileViTV2Config", "MobileViTV2ForImageClassification", image_size=SIZE, width_multiplier=0.25)


def levit():
    """Conv stem, attention with learned position biases, BN after every linear layer,
    shrinking attention between stages."""
    return _classifier(
        "LevitConfig",
        "LevitForImageClassification",
        image_size=SIZE,
        hidden_sizes=[32, 48, 64],
        num_attention_heads=[1, 2, 2],
        depths=[1, 1, 1],
        key_dim=[8, 8, 8],
    )


def mobilenet_v1():
    return _classifier("MobileNetV1Config", "MobileNetV1ForImageClassification", depth_multiplier=0.25, image_size=SIZE)


def timesformer():
    """Video (2 frames): attention over time, then over space, per patch."""
    config = dict(image_size=SIZE, patch_size=8, num_frames=2, num_labels=10, **ENCODER)
    video = torch.randn(1, 2, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(0))
    return Output(_build("TimesformerConfig", "TimesformerForVideoClassification", **config)).eval(), (video,)


# a plain transformer encoder's size, for the vision and text transformers
ENCODER = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)


def vit():
    return _classifier("ViTConfig", "ViTForImageClassification", image_size=SIZE, patch_size=8, **ENCODER)


def deit():
    """ViT with a distillation token: two heads averaged."""
    return _classifier("DeiTConfig", "DeiTForImageClassificationWithTeacher", image_size=SIZE, patch_size=8, **ENCODER)


def beit():
    """ViT with relative position biases in every layer, layer scale, mean pooling."""
    return _classifier(
        "BeitConfig",
        "BeitForImageClassification",
        image_size=SIZE,
        patch_size=8,
        use_relative_position_bias=True,
        **ENCODER,
    )


def dinov2():
    """ViT with layer scale, position embeddings interpolated to the input (bicubic)."""
    config = {k: v for k, v in ENCODER.items() if k != "intermediate_size"}
    return _classifier("Dinov2Config", "Dinov2ForImageClassification", image_size=SIZE, patch_size=8, **config)


VISION = {
    # convolutional: squeeze-excitation, grouped, dilated, depthwise convs
    "efficientnet": Entry(efficientnet, "CNN: depthwise, squeeze-excitation", image=True),
    "regnet": Entry(regnet, "CNN: grouped convs, squeeze-excitation", image=True),
    "resnet": Entry(resnet, "CNN: bottlenecks, max pooling", image=True),
    "deeplabv3": Entry(deeplabv3, "segmentation: MobileNetV2 + DeepLabV3 (dilated, ASPP)", True, True),
    "poolformer": Entry(poolformer, "metaformer: pooling token mixer, layer scale", image=True),
    "convnext": Entry(convnext, "CNN: depthwise 7x7, channels-last LayerNorm + MLP", image=True),
    "convnextv2": Entry(convnextv2, "CNN: ConvNeXt with global response norm", image=True),
    # hybrid conv-attention and hierarchical vision transformers
    "mobilevit": Entry(mobilevit, "hybrid: MobileNetV2 blocks + transformers on patches", image=True),
    "levit": Entry(levit, "hybrid: conv stem, attention with position biases", image=True),
    "cvt": Entry(cvt, "hybrid: convolutional token embedding and projections", image=True),
    "segformer": Entry(segformer, "hierarchical transformer: overlapping patches, reduced attention", image=True),
    "swin": Entry(swin, "hierarchical transformer: shifted windows", image=True),
    # plain vision transformers
    "vit": Entry(vit, "vision transformer", image=True),
    "deit": Entry(deit, "vision transformer with a distillation token", image=True),
    "beit": Entry(beit, "vision transformer: relative position biases", image=True),
    "dinov2": Entry(dinov2, "vision transformer: layer scale, interpolated positions", image=True),
    "mobilevitv2": Entry(mobilevitv2, "hybrid: separable attention on patches (unfold / fold)", image=True),
    "mobilenet_v1": Entry(mobilenet_v1, "CNN: depthwise separable convs, TF-style padding", image=True),
    "timesformer": Entry(timesformer, "video transformer: divided space-time attention"),
}


def _speech(config_name: str, model_name: str, **config):
    """(model's last_hidden_state, 4000 samples): a 3-layer conv feature extractor (k10/5,
    k3/2, k3/2, group norm, GELU), the grouped positional conv (groups 4, kernel 16, weight
    norm) and 2 transformer layers."""
    model = _build(
        config_name,
        model_name,
        perturb=False,
        **ENCODER,
        conv_dim=(32, 32, 32),
        conv_stride=(5, 2, 2),
        conv_kernel=(10, 3, 3),
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4,
        **config,
    )
    return Output(model, "last_hidden_state").eval(), (_audio(),)


def wav2vec2():
    return _speech("Wav2Vec2Config", "Wav2Vec2Model")


def hubert():
    return _speech("HubertConfig", "HubertModel")


def wav2vec2_conformer():
    """Conformer layers: a depthwise conv1d module, rotary position embeddings."""
    return _speech(
        "Wav2Vec2ConformerConfig",
        "Wav2Vec2ConformerModel",
        conv_depthwise_kernel_size=7,
        position_embeddings_type="rotary",
    )


def whisper_encoder():
    """WhisperEncoder: conv1d k3 and k3/2 with GELU over 16 mel bins, then 2 transformer layers."""
    import transformers
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    torch.manual_seed(0)
    config = transformers.WhisperConfig(
        d_model=64,
        encoder_layers=2,
        encoder_attention_heads=4,
        encoder_ffn_dim=128,
        num_mel_bins=16,
        max_source_positions=50,
    )
    mel = torch.randn(1, 16, 100, generator=torch.Generator().manual_seed(0))
    return Output(WhisperEncoder(config).eval(), "last_hidden_state").eval(), (mel,)


AUDIO = {
    "wav2vec2": Entry(wav2vec2, "audio: conv1d feature extractor, grouped positional conv, encoder"),
    "hubert": Entry(hubert, "audio: wav2vec2's front end, another encoder"),
    "wav2vec2_conformer": Entry(wav2vec2_conformer, "audio: conformer (depthwise conv1d, rotary)"),
    "whisper_encoder": Entry(whisper_encoder, "audio: conv1d over mel bins, encoder"),
}

TEXT = dict(ENCODER, vocab_size=VOCAB, max_position_embeddings=64)


def _text_encoder(config_name: str, model_name: str, **config):
    return Output(_build(config_name, model_name, **config), "last_hidden_state").eval(), (_tokens(),)


ENCODERS = {
    "bert": Entry(lambda: _text_encoder("BertConfig", "BertModel", **TEXT), "text encoder"),
    # position ids from the input (a cumsum over the tokens that are not padding)
    "roberta": Entry(
        lambda: _text_encoder("RobertaConfig", "RobertaModel", **{**TEXT, "max_position_embeddings": 80}),
        "text encoder: position ids from the input (cumsum)",
    ),
    "distilbert": Entry(
        lambda: _text_encoder(
            "DistilBertConfig",
            "DistilBertModel",
            dim=64,
            n_layers=2,
            n_heads=4,
            hidden_dim=128,
            vocab_size=VOCAB,
            max_position_embeddings=64,
        ),
        "text encoder: distilled BERT",
    ),
    "albert": Entry(
        lambda: _text_encoder("AlbertConfig", "AlbertModel", embedding_size=32, **TEXT),
        "text encoder: factorized embedding, one layer shared",
    ),
    "deberta_v2": Entry(
        lambda: _text_encoder(
            "DebertaV2Config",
            "DebertaV2Model",
            relative_attention=True,
            pos_att_type=["c2p", "p2c"],
            position_buckets=16,
            **TEXT,
        ),
        "text encoder: disentangled attention (relative positions gathered)",
    ),
    # span-based dynamic conv: nn.Unfold (index.Tensor with broadcasting indices)
    "convbert": Entry(
        lambda: _text_encoder(
            "ConvBertConfig", "ConvBertModel", embedding_size=64, head_ratio=2, conv_kernel_size=5, **TEXT
        ),
        "text encoder: span-based dynamic convolution beside attention",
    ),
    "squeezebert": Entry(
        lambda: _text_encoder(
            "SqueezeBertConfig", "SqueezeBertModel", embedding_size=64, q_groups=2, k_groups=2, v_groups=2, **TEXT
        ),
        "text encoder: grouped 1x1 conv1d layers for linear ones",
    ),
    # a bool mask compared with 0, an empty 1-D cache concatenated (accel_target/torch_ops.py)
    "xlm": Entry(
        lambda: _text_encoder(
            "XLMConfig", "XLMModel", emb_dim=64, n_layers=2, n_heads=4, vocab_size=VOCAB, max_position_embeddings=64
        ),
        "text encoder: a bool padding mask compared with 0",
    ),
    "t5_encoder": Entry(
        lambda: _text_encoder(
            "T5Config", "T5EncoderModel", d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4, vocab_size=VOCAB
        ),
        "text encoder: RMSNorm, relative position buckets",
    ),
}

# (GPT-2 and Llama: tests/models/test_decoders.py tests them on their own, at batch 2 and with a mask too)
GPT2 = dict(n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=64, bos_token_id=0, eos_token_id=0)
# Llama-style decoders: grouped-query attention, rotary embeddings, RMSNorm, gated SiLU MLP
LLAMA = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=VOCAB,
    max_position_embeddings=64,
    bos_token_id=0,
    eos_token_id=0,
)


def _causal_lm(config_name: str, model_name: str, **config):
    """(the language model's logits, 8 tokens), exported without the key/value cache."""
    model = _build(config_name, model_name, perturb=False, **config)
    return Output(model, "logits", use_cache=False).eval(), (_tokens(8),)


DECODERS = {
    "gpt2": Entry(lambda: _causal_lm("GPT2Config", "GPT2LMHeadModel", **GPT2), "decoder: Conv1D [in, out] weights"),
    "llama": Entry(lambda: _causal_lm("LlamaConfig", "LlamaForCausalLM", **LLAMA), "decoder: GQA, rotary, RMSNorm"),
    "mistral": Entry(lambda: _causal_lm("MistralConfig", "MistralForCausalLM", **LLAMA), "decoder: Llama-style"),
    "qwen2": Entry(lambda: _causal_lm("Qwen2Config", "Qwen2ForCausalLM", **LLAMA), "decoder: q/k/v biases"),
    # picks its key and value heads with negative indices, qkv[..., [-2], :] (accel_target/indexing.py)
    "falcon": Entry(
        lambda: _causal_lm(
            "FalconConfig",
            "FalconForCausalLM",
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_kv_heads=2,
            new_decoder_architecture=True,
            vocab_size=VOCAB,
            bos_token_id=0,
            eos_token_id=0,
        ),
        "decoder: grouped heads split by negative indices, parallel attention and MLP",
    ),
    "mamba": Entry(
        lambda: _causal_lm(
            "MambaConfig", "MambaForCausalLM", hidden_size=64, num_hidden_layers=2, vocab_size=VOCAB, state_size=8
        ),
        "decoder: state space (causal depthwise conv1d, selective scan)",
    ),
    "phi": Entry(
        lambda: _causal_lm("PhiConfig", "PhiForCausalLM", **{**LLAMA, "num_key_value_heads": 4}),
        "decoder: partial rotary, parallel attention and MLP, tanh GELU",
    ),
}


def _ours(name: str) -> Callable:
    def make():
        model, x, _ = zoo.make(name)
        return model, (x,)

    return make


# our own, in plain PyTorch (tests/models/test_models.py tests them)
OURS = {
    "residual_cnn": Entry(_ours("residual_cnn"), "CNN (ours): ResNet-style", image=True),
    "depthwise_separable_cnn": Entry(_ours("depthwise_separable_cnn"), "CNN (ours): MobileNet-style", image=True),
    "convnext_like": Entry(_ours("convnext_like"), "CNN (ours): ConvNeXt-style block", image=True),
    "transformer_encoder": Entry(_ours("transformer_encoder"), "encoder (ours): nn.TransformerEncoderLayer"),
}

ZOO: dict[str, Entry] = {**VISION, **AUDIO, **ENCODERS, **DECODERS, **OURS}
