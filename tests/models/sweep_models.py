"""The architectures of the sweep (`python -m tests.models.sweep`): transformers models of
small configs and random weights that the zoo (tests/models/hf_zoo.py) does not hold, each a
function returning (model, inputs) with ``model(*inputs)`` one tensor. Where a model's
default init leaves its output hardly depending on its input, its weights are rescaled
(`_rescale`), so that a match means something; randomness (masking, noise) is fixed."""

# ruff: noqa: E501
import torch
import transformers as T
from torch import nn

from tests.models.hf_zoo import LLAMA, VOCAB, Output, _audio, _build, _image, _tokens

ENC = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=128,
    vocab_size=VOCAB,
    max_position_embeddings=64,
)
# LLAMA, every head its own keys and values
DEC = {key: value for key, value in LLAMA.items() if key != "num_key_value_heads"}
VIT = dict(
    hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, image_size=64, patch_size=8
)
SPEECH = dict(
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


def text(cfg, model, field="last_hidden_state", **c):
    return Output(_build(cfg, model, **c), field).eval(), (_tokens(),)


def causal(cfg, model, **c):
    return Output(_build(cfg, model, perturb=False, **c), "logits", use_cache=False).eval(), (_tokens(8),)


def vision(cfg, model, field="logits", size=64, **c):
    return Output(_build(cfg, model, **c), field).eval(), (_image(size),)


def audio(cfg, model, field="last_hidden_state", **c):
    return Output(_build(cfg, model, **c), field).eval(), (_audio(),)


def dpt():
    """DPT's depth head ends in a ReLU: its last conv's bias lifted, so the output is not all zero."""
    model, inputs = vision(
        "DPTConfig",
        "DPTForDepthEstimation",
        field="predicted_depth",
        image_size=64,
        patch_size=8,
        neck_hidden_sizes=[16, 32, 48, 64],
        fusion_hidden_size=32,
        backbone_out_indices=[0, 1, 2, 3],
        num_hidden_layers=4,
        hidden_size=64,
        num_attention_heads=4,
        intermediate_size=128,
    )
    last = [m for m in model.modules() if isinstance(m, nn.Conv2d)][-1]
    with torch.no_grad():
        last.bias.add_(1.0)
    return model, inputs


# seq2seq (BART-like) encoder configs
S2S = dict(
    vocab_size=VOCAB,
    d_model=64,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=128,
    decoder_ffn_dim=128,
    max_position_embeddings=64,
    pad_token_id=1,
    bos_token_id=0,
    eos_token_id=2,
    decoder_start_token_id=2,
    forced_eos_token_id=2,
)
# T5-like configs
T5 = dict(
    vocab_size=VOCAB,
    d_model=64,
    d_kv=16,
    d_ff=128,
    num_layers=2,
    num_decoder_layers=2,
    num_heads=4,
    pad_token_id=0,
    eos_token_id=1,
    decoder_start_token_id=0,
)


def encoder(cfg, model, **c):
    """The encoder (.get_encoder()) of an encoder-decoder model."""
    return Output(_build(cfg, model, **c).get_encoder(), "last_hidden_state").eval(), (_tokens(),)


def xmod():
    m = _build(
        "XmodConfig", "XmodModel", languages=["en_XX", "de_DE"], pad_token_id=1, bos_token_id=0, eos_token_id=2, **ENC
    )
    m.set_default_language("de_DE")
    return Output(m, "last_hidden_state").eval(), (_tokens(),)


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


class Fn(nn.Module):
    """model(*inputs) -> fn(self.model, *inputs): a wrapper for models needing other inputs/outputs."""

    def __init__(self, model, fn):
        super().__init__()
        self.model, self.fn = model, fn

    def forward(self, *xs):
        return self.fn(self.model, *xs)


def _rescale(model, gain=1.0):
    """Scale every conv/linear weight to std gain/sqrt(fan_in) (a weight-normed one through its magnitude g), so
    that activations keep their scale: with transformers' init (std 0.02) some models' outputs hardly depend on
    their input (bias-dominated; checked with sens.py), which makes a match meaningless."""
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, (nn.Conv1d, nn.Conv2d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.Linear)):
                w = mod.weight
                fan_in = (
                    w[0].numel()
                    if not isinstance(mod, (nn.ConvTranspose1d, nn.ConvTranspose2d))
                    else w.shape[0] * w[0, 0].numel()
                )
                factor = gain / fan_in**0.5 / float(w.std())
                p = getattr(mod, "parametrizations", None)
                if p is not None and "weight" in p:
                    p.weight.original0.mul_(factor)
                elif hasattr(mod, "weight_g"):
                    mod.weight_g.mul_(factor)
                else:
                    mod.weight.mul_(factor)
    return model


def _swin(**c):
    d = dict(
        image_size=64,
        patch_size=4,
        embed_dim=16,
        depths=[1, 1, 1, 1],
        num_heads=[1, 1, 2, 2],
        window_size=4,
        out_features=["stage1", "stage2", "stage3", "stage4"],
        drop_path_rate=0.0,
    )
    d.update(c)
    return T.SwinConfig(**d)


def vitmae():
    m = _build(
        "ViTMAEConfig",
        "ViTMAEForPreTraining",
        mask_ratio=0.0,
        decoder_hidden_size=32,
        decoder_num_hidden_layers=2,
        decoder_num_attention_heads=2,
        decoder_intermediate_size=64,
        **VIT,
    )
    n = (64 // 8) ** 2
    # noise = arange: argsort is the identity, so no shuffling (and mask_ratio=0 keeps every patch)
    return Fn(m, lambda m, x: m(x, noise=torch.arange(n, dtype=torch.float32)[None]).logits).eval(), (_image(64),)


def zoedepth():
    bb = T.BeitConfig(
        hidden_size=32,
        num_hidden_layers=4,
        num_attention_heads=2,
        intermediate_size=64,
        image_size=64,
        patch_size=8,
        out_indices=[1, 2, 3, 4],
        use_relative_position_bias=True,
        reshape_hidden_states=False,
    )
    m = _build(
        "ZoeDepthConfig",
        "ZoeDepthForDepthEstimation",
        backbone_config=bb,
        neck_hidden_sizes=[16, 16, 32, 32],
        fusion_hidden_size=16,
        bottleneck_features=16,
        num_relative_features=8,
        bin_embedding_dim=16,
        num_attractors=[4, 4, 2, 1],
        bin_configurations=[{"n_bins": 8, "min_depth": 0.001, "max_depth": 10.0}],
        patch_transformer_hidden_size=16,
        patch_transformer_intermediate_size=32,
        patch_transformer_num_attention_heads=2,
        initializer_range=0.16,
    )
    # initializer_range 0.16 (default 0.02): with 0.02 the depth hardly depends on the image (relative change 3e-7);
    # with 0.2 PyTorch fp32 itself is 1.5e-4 off fp64 (attractors amplify); 0.16: change 0.1, fp32-vs-fp64 3.5e-7
    return Output(m, "predicted_depth").eval(), (_image(64),)


def superpoint_dense():
    """SuperPoint's fixed-shape part: encoder, keypoint score map (softmax, pixel shuffle, NMS by max-pool) and the
    L2-normalised dense descriptor map (the full model's keypoint extraction is data-dependent: torch.nonzero)."""
    m = _build(
        "SuperPointConfig",
        "SuperPointForKeypointDetection",
        encoder_hidden_sizes=[16, 16, 32, 32],
        decoder_hidden_size=32,
        descriptor_decoder_dim=32,
    )
    _rescale(m)

    def f(m, x):
        x = m.extract_one_channel_pixel_values(x)
        enc = m.encoder(x, return_dict=True).last_hidden_state
        scores = m.keypoint_decoder._get_pixel_scores(enc)  # (1, 64, 64)
        d = m.descriptor_decoder
        desc = nn.functional.normalize(d.conv_descriptor_b(d.relu(d.conv_descriptor_a(enc))), p=2, dim=1)
        return torch.cat([scores.flatten(), desc.flatten()])

    return Fn(m, f).eval(), (_image(64),)


def mask2former():
    m = _build(
        "Mask2FormerConfig",
        "Mask2FormerForUniversalSegmentation",
        backbone_config=_swin(),
        feature_size=32,
        mask_feature_size=32,
        hidden_dim=32,
        encoder_feedforward_dim=64,
        encoder_layers=2,
        decoder_layers=2,
        num_attention_heads=2,
        dim_feedforward=64,
        num_queries=8,
        num_labels=5,
        common_stride=4,
    )
    return Fn(
        m, lambda m, x: torch.cat([(o := m(x)).masks_queries_logits.flatten(), o.class_queries_logits.flatten()])
    ).eval(), (_image(64),)


def maskformer():
    dec = T.DetrConfig(
        d_model=32,
        decoder_layers=2,
        decoder_attention_heads=2,
        decoder_ffn_dim=64,
        encoder_layers=1,
        encoder_attention_heads=2,
        encoder_ffn_dim=64,
        num_queries=8,
        use_timm_backbone=False,
        backbone_config=T.ResNetConfig(),
        use_pretrained_backbone=False,
    )
    m = _build(
        "MaskFormerConfig",
        "MaskFormerForInstanceSegmentation",
        backbone_config=_swin(),
        decoder_config=dec,
        fpn_feature_size=32,
        mask_feature_size=32,
        num_labels=5,
    )
    return Fn(
        m, lambda m, x: torch.cat([(o := m(x)).masks_queries_logits.flatten(), o.class_queries_logits.flatten()])
    ).eval(), (_image(64),)


def rtdetr():
    bb = T.RTDetrResNetConfig(
        embedding_size=16,
        hidden_sizes=[16, 32, 48, 64],
        depths=[1, 1, 1, 1],
        layer_type="basic",
        out_features=["stage2", "stage3", "stage4"],
    )
    m = _build(
        "RTDetrConfig",
        "RTDetrForObjectDetection",
        backbone_config=bb,
        encoder_in_channels=[32, 48, 64],
        encoder_hidden_dim=32,
        encoder_ffn_dim=64,
        encoder_attention_heads=2,
        d_model=32,
        num_queries=10,
        decoder_in_channels=[32, 32, 32],
        decoder_ffn_dim=64,
        decoder_layers=2,
        decoder_attention_heads=2,
        decoder_n_points=2,
        num_labels=5,
        initializer_range=0.3,
    )
    # initializer_range 0.3 (default 0.01): with 0.01 the hybrid encoder's features are nearly constant over
    # positions, and the query selection (topk of the class scores) picks among exact ties: ill-posed
    return Fn(m, lambda m, x: torch.cat([(o := m(x)).logits.flatten(), o.pred_boxes.flatten()])).eval(), (_image(64),)


def _detr(cfg, model):
    bb = T.ResNetConfig(
        embedding_size=16,
        hidden_sizes=[16, 32, 48, 64],
        depths=[1, 1, 1, 1],
        layer_type="basic",
        out_features=["stage4"],
    )
    m = _build(
        cfg,
        model,
        use_timm_backbone=False,
        backbone_config=bb,
        use_pretrained_backbone=False,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        num_queries=10,
        num_labels=5,
    )
    _rescale(m)
    return Fn(m, lambda m, x: torch.cat([(o := m(x)).logits.flatten(), o.pred_boxes.flatten()])).eval(), (_image(64),)


def vitpose():
    bb = T.VitPoseBackboneConfig(
        image_size=[64, 48],
        patch_size=[8, 8],
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        mlp_ratio=2,
        out_indices=[2],
    )
    m = _build("VitPoseConfig", "VitPoseForPoseEstimation", backbone_config=bb, num_labels=5)
    return Output(m, "heatmaps").eval(), (_randn(1, 3, 64, 48),)


def whisper():
    m = _build(
        "WhisperConfig",
        "WhisperModel",
        d_model=64,
        encoder_layers=2,
        encoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_layers=1,
        decoder_attention_heads=4,
        decoder_ffn_dim=128,
        num_mel_bins=16,
        max_source_positions=32,
        vocab_size=VOCAB,
        max_target_positions=16,
        pad_token_id=0,
        bos_token_id=0,
        eos_token_id=0,
        decoder_start_token_id=0,
        begin_suppress_tokens=None,
    )
    return Output(m.get_encoder(), "last_hidden_state").eval(), (_randn(1, 16, 64),)


def clap_audio():
    m = _build(
        "ClapAudioConfig",
        "ClapAudioModel",
        spec_size=64,
        num_mel_bins=16,
        window_size=4,
        patch_size=2,
        patch_stride=2,
        hidden_size=32,
        patch_embeds_hidden_size=16,
        depths=[1, 1],
        num_attention_heads=[1, 2],
        num_hidden_layers=2,
        projection_dim=32,
    )
    return Output(m, "pooler_output").eval(), (_randn(1, 1, 64, 16),)


def speech2text():
    m = _build(
        "Speech2TextConfig",
        "Speech2TextModel",
        d_model=64,
        encoder_layers=2,
        encoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_layers=1,
        decoder_ffn_dim=128,
        conv_channels=32,
        input_feat_per_channel=16,
        max_source_positions=64,
        vocab_size=VOCAB,
        max_target_positions=32,
    )
    return Output(m.get_encoder(), "last_hidden_state").eval(), (_randn(1, 40, 16),)


def wav2vec2bert():
    m = _build(
        "Wav2Vec2BertConfig",
        "Wav2Vec2BertModel",
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        feature_projection_input_dim=32,
        conv_depthwise_kernel_size=5,
        output_hidden_size=64,
        layerdrop=0.0,
    )
    return Output(m, "last_hidden_state").eval(), (_randn(1, 20, 32),)


def moonshine():
    m = _build(
        "MoonshineConfig",
        "MoonshineModel",
        hidden_size=64,
        intermediate_size=128,
        encoder_num_hidden_layers=2,
        decoder_num_hidden_layers=1,
        encoder_num_attention_heads=4,
        decoder_num_attention_heads=4,
        encoder_num_key_value_heads=4,
        decoder_num_key_value_heads=4,
        vocab_size=VOCAB,
    )
    return Output(m.get_encoder(), "last_hidden_state").eval(), (_audio(4000),)


def dac():
    m = _build(
        "DacConfig",
        "DacModel",
        encoder_hidden_size=8,
        downsampling_ratios=[2, 4],
        decoder_hidden_size=32,
        upsampling_ratios=[4, 2],
        n_codebooks=2,
        codebook_size=16,
        codebook_dim=4,
        hidden_size=32,
        hop_length=8,
    )
    _rescale(m)
    return Output(m, "audio_values").eval(), (_audio(400)[None],)


def mimi():
    m = _build(
        "MimiConfig",
        "MimiModel",
        hidden_size=32,
        num_filters=8,
        upsampling_ratios=[4, 2],
        codebook_size=16,
        codebook_dim=16,
        num_quantizers=2,
        vector_quantization_hidden_dimension=16,
        num_semantic_quantizers=1,
        upsample_groups=32,
        num_hidden_layers=2,
        intermediate_size=64,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=16,
        sliding_window=16,
        sampling_rate=800,
        frame_rate=None,
    )
    return Output(m, "audio_values").eval(), (_audio(800)[None],)


def univnet():
    m = _build(
        "UnivNetConfig",
        "UnivNetModel",
        model_in_channels=8,
        model_hidden_channels=8,
        num_mel_bins=20,
        resblock_kernel_sizes=[3, 3],
        resblock_stride_sizes=[4, 4],
        resblock_dilation_sizes=[[1, 3], [1, 3]],
        kernel_predictor_num_blocks=1,
        kernel_predictor_hidden_channels=8,
    )  # (= model_in_channels: its residual blocks use that)
    _rescale(m)
    # the noise sequence is an input (else the model draws it with torch.randn)
    return Fn(m, lambda m, mel, noise: m(mel, noise_sequence=noise).waveforms).eval(), (
        _randn(1, 10, 20),
        _randn(1, 10, 8, seed=1),
    )


def fastspeech2():
    m = _build(
        "FastSpeech2ConformerConfig",
        "FastSpeech2ConformerModel",
        hidden_size=32,
        vocab_size=VOCAB,
        num_mel_bins=16,
        encoder_layers=1,
        decoder_layers=1,
        encoder_linear_units=64,
        decoder_linear_units=64,
        speech_decoder_postnet_layers=2,
        speech_decoder_postnet_units=32,
        encoder_kernel_size=3,
        decoder_kernel_size=3,
        duration_predictor_channels=32,
        energy_predictor_channels=32,
        pitch_predictor_layers=2,
        pitch_predictor_channels=32,
    )
    return Output(m, "spectrogram").eval(), (_tokens(8),)


TS = dict(
    prediction_length=4,
    context_length=8,
    lags_sequence=[1, 2, 3],
    num_time_features=1,
    d_model=32,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=2,
    decoder_attention_heads=2,
    encoder_ffn_dim=32,
    decoder_ffn_dim=32,
)


def _ts(cfg, model, **c):
    m = _build(cfg, model, **{**TS, **c})
    past = 8 + 3  # context_length + max(lags_sequence)
    ins = (
        _randn(1, past).abs() + 0.5,
        _randn(1, past, 1, seed=1),
        torch.ones(1, past),
        _randn(1, 4, seed=2).abs() + 0.5,
        _randn(1, 4, 1, seed=3),
    )

    def f(m, pv, pt, pm, fv, ft):
        return m(
            past_values=pv,
            past_time_features=pt,
            past_observed_mask=pm,
            future_values=fv,
            future_time_features=ft,
            use_cache=False,
        ).last_hidden_state

    return Fn(m, f).eval(), ins


def autoformer():
    # d_model=16, 2 heads: head_dim 8 = every sequence length. Under torch.export (tracing), transformers
    # materialises the all-visible attention mask and AutoformerAttention adds it with
    # attn_weights.view(bsz, heads, tgt_len, src_len), whose size is bsz*heads*tgt_len*head_dim: export fails
    # unless head_dim == src_len (eager passes None and never hits it).
    return _ts("AutoformerConfig", "AutoformerModel", label_length=4, moving_average=5, d_model=16)


def patchtsmixer():
    m = _build(
        "PatchTSMixerConfig",
        "PatchTSMixerForPrediction",
        context_length=32,
        patch_length=8,
        patch_stride=8,
        num_input_channels=2,
        d_model=16,
        num_layers=2,
        prediction_length=4,
        mode="mix_channel",
        self_attn=True,
        self_attn_heads=2,
        use_positional_encoding=True,
    )
    return Output(m, "prediction_outputs").eval(), (_randn(1, 32, 2),)


def timesfm():
    m = _build(
        "TimesFmConfig",
        "TimesFmModelForPrediction",
        patch_length=8,
        context_length=32,
        horizon_length=8,
        num_hidden_layers=2,
        hidden_size=32,
        intermediate_size=64,
        head_dim=16,
        num_attention_heads=2,
    )

    def f(m, x):
        return m(past_values=[x[0]], freq=[0]).mean_predictions

    return Fn(m, f).eval(), (_randn(1, 32).abs() + 1.0,)


# DeepSeek V2 / V3: latent attention, 4 routed experts in groups, one shared
DEEPSEEK = dict(
    num_key_value_heads=4,
    moe_intermediate_size=32,
    n_shared_experts=1,
    n_routed_experts=4,
    num_experts_per_tok=2,
    n_group=2,
    topk_group=1,
    first_k_dense_replace=1,
    kv_lora_rank=16,
    q_lora_rank=32,
    qk_rope_head_dim=8,
    v_head_dim=16,
    qk_nope_head_dim=16,
    **DEC,
)

MODELS = {
    # (swept 2026-11-26, first batch)
    # text encoders
    "electra": lambda: text("ElectraConfig", "ElectraModel", embedding_size=32, **ENC),
    "mpnet": lambda: text("MPNetConfig", "MPNetModel", **ENC),
    "roformer": lambda: text("RoFormerConfig", "RoFormerModel", embedding_size=64, **ENC),
    "mobilebert": lambda: text(
        "MobileBertConfig",
        "MobileBertModel",
        embedding_size=32,
        intra_bottleneck_size=32,
        true_hidden_size=32,
        num_feedforward_networks=2,
        **ENC,
    ),
    "funnel": lambda: text(
        "FunnelConfig",
        "FunnelModel",
        d_model=64,
        n_head=4,
        d_head=16,
        d_inner=128,
        block_sizes=[1, 1],
        vocab_size=VOCAB,
    ),
    "fnet": lambda: text("FNetConfig", "FNetModel", **{k: v for k, v in ENC.items() if k != "num_attention_heads"}),
    "nystromformer": lambda: text(
        "NystromformerConfig",
        "NystromformerModel",
        num_landmarks=4,
        segment_means_seq_len=16,
        **{**ENC, "max_position_embeddings": 80},
    ),
    "esm": lambda: text(
        "EsmConfig",
        "EsmModel",
        position_embedding_type="rotary",
        pad_token_id=1,
        **{**ENC, "max_position_embeddings": 80},
    ),
    "modernbert": lambda: text(
        "ModernBertConfig",
        "ModernBertModel",
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        cls_token_id=1,
        sep_token_id=2,
        **ENC,
    ),
    "xlm_roberta": lambda: text("XLMRobertaConfig", "XLMRobertaModel", **{**ENC, "max_position_embeddings": 80}),
    "big_bird": lambda: text("BigBirdConfig", "BigBirdModel", attention_type="original_full", **ENC),
    "ernie": lambda: text("ErnieConfig", "ErnieModel", **ENC),
    "layoutlm": lambda: text("LayoutLMConfig", "LayoutLMModel", **ENC),
    "canine": lambda: text(
        "CanineConfig",
        "CanineModel",
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        num_hash_buckets=64,
        downsampling_rate=4,
    ),
    "bart_encoder": lambda: (
        Output(
            _build(
                "BartConfig",
                "BartModel",
                d_model=64,
                encoder_layers=2,
                decoder_layers=2,
                encoder_attention_heads=4,
                decoder_attention_heads=4,
                encoder_ffn_dim=128,
                decoder_ffn_dim=128,
                vocab_size=VOCAB,
                max_position_embeddings=64,
            ).get_encoder(),
            "last_hidden_state",
        ).eval(),
        (_tokens(),),
    ),
    # decoders
    "opt": lambda: causal(
        "OPTConfig",
        "OPTForCausalLM",
        hidden_size=64,
        ffn_dim=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        vocab_size=VOCAB,
        max_position_embeddings=64,
        word_embed_proj_dim=64,
    ),
    "bloom": lambda: causal("BloomConfig", "BloomForCausalLM", hidden_size=64, n_layer=2, n_head=4, vocab_size=VOCAB),
    "gpt_neox": lambda: causal("GPTNeoXConfig", "GPTNeoXForCausalLM", **DEC),
    "gptj": lambda: causal(
        "GPTJConfig", "GPTJForCausalLM", n_embd=64, n_layer=2, n_head=4, rotary_dim=8, vocab_size=VOCAB, n_positions=64
    ),
    "gpt_neo": lambda: causal(
        "GPTNeoConfig",
        "GPTNeoForCausalLM",
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        attention_types=[[["global", "local"], 1]],
        window_size=4,
        vocab_size=VOCAB,
        max_position_embeddings=64,
    ),
    "gemma": lambda: causal("GemmaConfig", "GemmaForCausalLM", head_dim=16, num_key_value_heads=2, **DEC),
    "gemma2": lambda: causal(
        "Gemma2Config", "Gemma2ForCausalLM", head_dim=16, num_key_value_heads=2, sliding_window=4, **DEC
    ),
    "phi3": lambda: causal("Phi3Config", "Phi3ForCausalLM", num_key_value_heads=2, pad_token_id=0, **DEC),
    "stablelm": lambda: causal("StableLmConfig", "StableLmForCausalLM", num_key_value_heads=2, **DEC),
    "olmo": lambda: causal("OlmoConfig", "OlmoForCausalLM", num_key_value_heads=2, pad_token_id=0, **DEC),
    "cohere": lambda: causal("CohereConfig", "CohereForCausalLM", num_key_value_heads=2, pad_token_id=0, **DEC),
    "starcoder2": lambda: causal("Starcoder2Config", "Starcoder2ForCausalLM", num_key_value_heads=2, **DEC),
    "codegen": lambda: causal(
        "CodeGenConfig",
        "CodeGenForCausalLM",
        n_embd=64,
        n_layer=2,
        n_head=4,
        rotary_dim=8,
        vocab_size=VOCAB,
        n_positions=64,
        n_ctx=64,
    ),
    "biogpt": lambda: causal("BioGptConfig", "BioGptForCausalLM", **DEC),
    "xglm": lambda: causal(
        "XGLMConfig",
        "XGLMForCausalLM",
        d_model=64,
        num_layers=2,
        attention_heads=4,
        ffn_dim=128,
        vocab_size=VOCAB,
        max_position_embeddings=64,
    ),
    "granite": lambda: causal("GraniteConfig", "GraniteForCausalLM", num_key_value_heads=2, **DEC),
    "mixtral": lambda: causal(
        "MixtralConfig", "MixtralForCausalLM", num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, **DEC
    ),
    "rwkv": lambda: (
        Output(
            _build(
                "RwkvConfig",
                "RwkvForCausalLM",
                hidden_size=64,
                num_hidden_layers=2,
                attention_hidden_size=64,
                intermediate_size=128,
                vocab_size=VOCAB,
                context_length=64,
            ),
            "logits",
            use_cache=False,
        ).eval(),
        (_tokens(8),),
    ),
    "mamba2": lambda: causal(
        "Mamba2Config",
        "Mamba2ForCausalLM",
        hidden_size=64,
        num_hidden_layers=2,
        state_size=16,
        expand=2,
        num_heads=8,
        head_dim=16,
        n_groups=1,
        vocab_size=VOCAB,
        chunk_size=8,
    ),
    # vision
    "swinv2": lambda: vision(
        "Swinv2Config",
        "Swinv2ForImageClassification",
        image_size=64,
        patch_size=4,
        embed_dim=16,
        depths=[1, 1],
        num_heads=[2, 2],
        window_size=4,
        num_labels=10,
    ),
    "focalnet": lambda: vision(
        "FocalNetConfig",
        "FocalNetForImageClassification",
        image_size=64,
        embed_dim=16,
        depths=[1, 1],
        hidden_sizes=[16, 32],
        num_labels=10,
    ),
    "pvt_v2": lambda: vision(
        "PvtV2Config",
        "PvtV2ForImageClassification",
        hidden_sizes=[16, 32, 48, 64],
        num_attention_heads=[1, 2, 4, 8],
        depths=[1, 1, 1, 1],
        num_labels=10,
    ),
    "data2vec_vision": lambda: vision(
        "Data2VecVisionConfig",
        "Data2VecVisionForImageClassification",
        image_size=64,
        patch_size=8,
        use_relative_position_bias=True,
        num_labels=10,
        **{k: v for k, v in ENC.items() if k not in ("vocab_size", "max_position_embeddings")},
    ),
    "dpt": dpt,
    "glpn": lambda: vision(
        "GLPNConfig",
        "GLPNForDepthEstimation",
        field="predicted_depth",
        hidden_sizes=[16, 32, 48, 64],
        decoder_hidden_size=32,
        depths=[1, 1, 1, 1],
        num_attention_heads=[1, 1, 2, 2],
    ),
    "hiera": lambda: vision(
        "HieraConfig",
        "HieraForImageClassification",
        image_size=[64, 64],
        embed_dim=16,
        depths=[1, 1, 1, 1],
        num_heads=[1, 1, 2, 2],
        num_labels=10,
    ),
    "hgnet_v2": lambda: vision("HGNetV2Config", "HGNetV2ForImageClassification", num_labels=10),
    "textnet": lambda: vision("TextNetConfig", "TextNetForImageClassification", num_labels=10),
    "mobilenet_v2_cls": lambda: vision(
        "MobileNetV2Config", "MobileNetV2ForImageClassification", depth_multiplier=0.35, num_labels=10
    ),
    "resnext": lambda: vision(
        "ResNetConfig",
        "ResNetForImageClassification",
        embedding_size=16,
        hidden_sizes=[32, 64, 96, 128],
        depths=[1] * 4,
        num_labels=10,
        layer_type="bottleneck",
    ),
    "clip_vision": lambda: vision(
        "CLIPVisionConfig",
        "CLIPVisionModel",
        field="pooler_output",
        image_size=64,
        patch_size=8,
        **{k: v for k, v in ENC.items() if k not in ("vocab_size", "max_position_embeddings")},
    ),
    "siglip_vision": lambda: vision(
        "SiglipVisionConfig",
        "SiglipVisionModel",
        field="pooler_output",
        image_size=64,
        patch_size=8,
        **{k: v for k, v in ENC.items() if k not in ("vocab_size", "max_position_embeddings")},
    ),
    "yolos": lambda: vision(
        "YolosConfig",
        "YolosForObjectDetection",
        image_size=[64, 64],
        patch_size=8,
        num_detection_tokens=5,
        num_labels=10,
        **{k: v for k, v in ENC.items() if k not in ("vocab_size", "max_position_embeddings")},
    ),
    # audio
    "wavlm": lambda: audio("WavLMConfig", "WavLMModel", num_buckets=32, max_bucket_distance=64, **SPEECH),
    "sew": lambda: audio("SEWConfig", "SEWModel", squeeze_factor=2, **SPEECH),
    "sew_d": lambda: audio(
        "SEWDConfig", "SEWDModel", squeeze_factor=2, max_position_embeddings=64, position_buckets=16, **SPEECH
    ),
    "unispeech": lambda: audio("UniSpeechConfig", "UniSpeechModel", **SPEECH),
    "data2vec_audio": lambda: audio("Data2VecAudioConfig", "Data2VecAudioModel", **SPEECH),
    "ast": lambda: (
        Output(
            _build(
                "ASTConfig",
                "ASTForAudioClassification",
                hidden_size=64,
                num_hidden_layers=2,
                num_attention_heads=4,
                intermediate_size=128,
                num_mel_bins=16,
                max_length=32,
                patch_size=8,
                frequency_stride=8,
                time_stride=8,
                num_labels=5,
            ),
            "logits",
        ).eval(),
        (torch.randn(1, 32, 16, generator=torch.Generator().manual_seed(0)),),
    ),
    # time series
    "patchtst": lambda: (
        Output(
            _build(
                "PatchTSTConfig",
                "PatchTSTModel",
                num_input_channels=3,
                context_length=32,
                patch_length=8,
                patch_stride=8,
                d_model=32,
                num_attention_heads=4,
                num_hidden_layers=2,
                ffn_dim=64,
            ),
            "last_hidden_state",
        ).eval(),
        (torch.randn(1, 32, 3, generator=torch.Generator().manual_seed(0)),),
    ),
    "deberta": lambda: text(
        "DebertaConfig", "DebertaModel", relative_attention=True, pos_att_type=["c2p", "p2c"], **ENC
    ),
    "xlnet": lambda: text("XLNetConfig", "XLNetModel", d_model=64, n_layer=2, n_head=4, d_inner=128, vocab_size=VOCAB),
    "megatron_bert": lambda: text("MegatronBertConfig", "MegatronBertModel", **ENC),
    "longformer": lambda: text(
        "LongformerConfig", "LongformerModel", attention_window=4, **{**ENC, "max_position_embeddings": 80}
    ),
    "reformer": lambda: text(
        "ReformerConfig",
        "ReformerModel",
        hidden_size=64,
        num_attention_heads=2,
        attention_head_size=32,
        feed_forward_size=128,
        attn_layers=["local", "local"],
        axial_pos_shape=[4, 4],
        axial_pos_embds_dim=[32, 32],
        vocab_size=VOCAB,
        max_position_embeddings=16,
        local_attn_chunk_length=4,
    ),
    "mpt": lambda: causal(
        "MptConfig", "MptForCausalLM", d_model=64, n_heads=4, n_layers=2, vocab_size=VOCAB, max_seq_len=64
    ),
    "gpt_bigcode": lambda: causal(
        "GPTBigCodeConfig", "GPTBigCodeForCausalLM", n_embd=64, n_layer=2, n_head=4, vocab_size=VOCAB, n_positions=64
    ),
    "qwen3": lambda: causal("Qwen3Config", "Qwen3ForCausalLM", head_dim=16, num_key_value_heads=2, **DEC),
    "olmo2": lambda: causal("Olmo2Config", "Olmo2ForCausalLM", num_key_value_heads=2, pad_token_id=0, **DEC),
    "persimmon": lambda: causal("PersimmonConfig", "PersimmonForCausalLM", **DEC),
    "glm": lambda: causal("GlmConfig", "GlmForCausalLM", head_dim=16, num_key_value_heads=2, pad_token_id=0, **DEC),
    "nemotron": lambda: causal("NemotronConfig", "NemotronForCausalLM", head_dim=16, num_key_value_heads=2, **DEC),
    "swin2sr": lambda: (
        Output(
            _build(
                "Swin2SRConfig",
                "Swin2SRForImageSuperResolution",
                image_size=32,
                patch_size=1,
                embed_dim=16,
                depths=[1, 1],
                num_heads=[2, 2],
                window_size=4,
                upscale=2,
            ),
            "reconstruction",
        ).eval(),
        (_image(32),),
    ),
    "upernet": lambda: vision(
        "UperNetConfig",
        "UperNetForSemanticSegmentation",
        backbone_config={
            "model_type": "convnext",
            "hidden_sizes": [16, 32, 48, 64],
            "depths": [1, 1, 1, 1],
            "out_features": ["stage1", "stage2", "stage3", "stage4"],
        },
        hidden_size=32,
        auxiliary_in_channels=48,
        num_labels=5,
    ),
    "vitdet": lambda: vision(
        "VitDetConfig",
        "VitDetModel",
        field="last_hidden_state",
        image_size=64,
        patch_size=8,
        pretrain_image_size=64,
        **{k: v for k, v in ENC.items() if k not in ("vocab_size", "max_position_embeddings", "intermediate_size")},
    ),
    "encodec": lambda: (
        Output(
            _build(
                "EncodecConfig",
                "EncodecModel",
                num_filters=4,
                hidden_size=16,
                codebook_size=32,
                codebook_dim=16,
                upsampling_ratios=[4, 2],
                num_lstm_layers=1,
            ),
            "audio_values",
        ).eval(),
        (torch.randn(1, 1, 800, generator=torch.Generator().manual_seed(0)),),
    ),
    # (second batch)
    # --- text encoders
    "rembert": lambda: text(
        "RemBertConfig",
        "RemBertModel",
        input_embedding_size=32,
        output_embedding_size=32,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        **ENC,
    ),
    "roc_bert": lambda: text(
        "RoCBertConfig",
        "RoCBertModel",
        pronunciation_embed_dim=32,
        pronunciation_vocab_size=20,
        shape_embed_dim=32,
        shape_vocab_size=20,
        **ENC,
    ),
    "luke": lambda: text(
        "LukeConfig",
        "LukeModel",
        entity_vocab_size=10,
        entity_emb_size=32,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        **ENC,
    ),
    "markuplm": lambda: text("MarkupLMConfig", "MarkupLMModel", pad_token_id=1, bos_token_id=0, eos_token_id=2, **ENC),
    "mra": lambda: text("MraConfig", "MraModel", pad_token_id=1, bos_token_id=0, eos_token_id=2, **ENC),
    "yoso": lambda: text("YosoConfig", "YosoModel", pad_token_id=1, bos_token_id=0, eos_token_id=2, **ENC),
    # Lilt: its layout embedding is 6 slices of hidden_size // 6, so hidden_size must be a multiple of 6 (and of 4 heads x shrink 4)
    "lilt": lambda: text("LiltConfig", "LiltModel", pad_token_id=1, **{**ENC, "hidden_size": 48}),
    "xmod": xmod,
    "bert_generation": lambda: text(
        "BertGenerationConfig", "BertGenerationEncoder", pad_token_id=0, bos_token_id=2, eos_token_id=1, **ENC
    ),
    "data2vec_text": lambda: text(
        "Data2VecTextConfig", "Data2VecTextModel", pad_token_id=1, bos_token_id=0, eos_token_id=2, **ENC
    ),
    "splinter": lambda: text("SplinterConfig", "SplinterModel", pad_token_id=0, question_token_id=5, **ENC),
    "ibert": lambda: text("IBertConfig", "IBertModel", pad_token_id=1, bos_token_id=0, eos_token_id=2, **ENC),
    "flaubert": lambda: text(
        "FlaubertConfig",
        "FlaubertModel",
        vocab_size=VOCAB,
        emb_dim=64,
        n_layers=2,
        n_heads=4,
        max_position_embeddings=64,
    ),
    "mt5_encoder": lambda: text("MT5Config", "MT5EncoderModel", **T5),
    "umt5_encoder": lambda: text("UMT5Config", "UMT5EncoderModel", **T5),
    "longt5_encoder": lambda: text("LongT5Config", "LongT5EncoderModel", local_radius=4, global_block_size=4, **T5),
    # LongT5 / SwitchTransformers encoders build no attention mask under torch.export (is_torchdynamo_compiling): pass one
    "longt5_encoder_mask": lambda: (
        Output(
            _build("LongT5Config", "LongT5EncoderModel", local_radius=4, global_block_size=4, **T5),
            "last_hidden_state",
            attention_mask=torch.ones(1, 16, dtype=torch.long),
        ).eval(),
        (_tokens(),),
    ),
    "marian_encoder": lambda: encoder("MarianConfig", "MarianMTModel", decoder_vocab_size=VOCAB, **S2S),
    "pegasus_encoder": lambda: encoder("PegasusConfig", "PegasusForConditionalGeneration", **S2S),
    "m2m100_encoder": lambda: encoder("M2M100Config", "M2M100ForConditionalGeneration", **S2S),
    "switch_transformers_encoder": lambda: text(
        "SwitchTransformersConfig",
        "SwitchTransformersEncoderModel",
        num_experts=4,
        expert_capacity=8,
        num_sparse_encoder_layers=1,
        num_sparse_decoder_layers=1,
        encoder_sparse_step=2,
        decoder_sparse_step=2,
        **T5,
    ),
    "switch_transformers_encoder_mask": lambda: (
        Output(
            _build(
                "SwitchTransformersConfig",
                "SwitchTransformersEncoderModel",
                num_experts=4,
                expert_capacity=8,
                num_sparse_encoder_layers=1,
                num_sparse_decoder_layers=1,
                encoder_sparse_step=2,
                decoder_sparse_step=2,
                **T5,
            ),
            "last_hidden_state",
            attention_mask=torch.ones(1, 16, dtype=torch.long),
        ).eval(),
        (_tokens(),),
    ),
    # --- decoders
    "qwen2_moe": lambda: causal(
        "Qwen2MoeConfig",
        "Qwen2MoeForCausalLM",
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=64,
        num_key_value_heads=2,
        **DEC,
    ),
    "olmoe": lambda: causal(
        "OlmoeConfig",
        "OlmoeForCausalLM",
        num_experts=4,
        num_experts_per_tok=2,
        num_key_value_heads=2,
        pad_token_id=1,
        **DEC,
    ),
    "granitemoe": lambda: causal(
        "GraniteMoeConfig",
        "GraniteMoeForCausalLM",
        num_local_experts=4,
        num_experts_per_tok=2,
        num_key_value_heads=2,
        pad_token_id=1,
        **DEC,
    ),
    "jetmoe": lambda: causal(
        "JetMoeConfig",
        "JetMoeForCausalLM",
        num_local_experts=4,
        num_experts_per_tok=2,
        num_key_value_heads=2,
        kv_channels=16,
        **{k: v for k, v in DEC.items() if k != "num_attention_heads"},
    ),
    "deepseek_v3": lambda: causal(
        "DeepseekV3Config",
        "DeepseekV3ForCausalLM",
        **DEEPSEEK,
    ),
    "deepseek_v2": lambda: causal(
        "DeepseekV2Config",
        "DeepseekV2ForCausalLM",
        **DEEPSEEK,
    ),
    "recurrent_gemma": lambda: causal(
        "RecurrentGemmaConfig",
        "RecurrentGemmaForCausalLM",
        lru_width=64,
        attention_window_size=16,
        num_key_value_heads=2,
        block_types=["recurrent", "attention"],
        pad_token_id=0,
        **{k: v for k, v in DEC.items() if k != "max_position_embeddings"},
    ),
    "falcon_mamba": lambda: causal(
        "FalconMambaConfig",
        "FalconMambaForCausalLM",
        vocab_size=VOCAB,
        hidden_size=64,
        state_size=8,
        num_hidden_layers=2,
        expand=2,
        conv_kernel=4,
        time_step_rank=8,
        pad_token_id=0,
        bos_token_id=0,
        eos_token_id=0,
    ),
    "jamba": lambda: causal(
        "JambaConfig",
        "JambaForCausalLM",
        num_key_value_heads=2,
        num_experts=4,
        num_experts_per_tok=2,
        expert_layer_period=2,
        expert_layer_offset=1,
        attn_layer_period=2,
        attn_layer_offset=1,
        use_mamba_kernels=False,
        mamba_d_state=8,
        mamba_dt_rank=8,
        pad_token_id=1,
        **DEC,
    ),
    "ctrl": lambda: causal(
        "CTRLConfig", "CTRLLMHeadModel", vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, dff=128, n_positions=64
    ),
    "gemma3": lambda: causal(
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        num_key_value_heads=2,
        head_dim=16,
        sliding_window=4,
        pad_token_id=1,
        **DEC,
    ),
    "cohere2": lambda: causal(
        "Cohere2Config", "Cohere2ForCausalLM", num_key_value_heads=2, sliding_window=4, pad_token_id=1, **DEC
    ),
    "helium": lambda: causal(
        "HeliumConfig", "HeliumForCausalLM", num_key_value_heads=2, head_dim=16, pad_token_id=1, **DEC
    ),
    "glm4": lambda: causal("Glm4Config", "Glm4ForCausalLM", num_key_value_heads=2, head_dim=16, pad_token_id=1, **DEC),
    "exaone4": lambda: causal(
        "Exaone4Config", "Exaone4ForCausalLM", num_key_value_heads=2, sliding_window=4, pad_token_id=1, **DEC
    ),
    "smollm3": lambda: causal("SmolLM3Config", "SmolLM3ForCausalLM", num_key_value_heads=2, pad_token_id=1, **DEC),
    "bitnet": lambda: causal("BitNetConfig", "BitNetForCausalLM", num_key_value_heads=2, pad_token_id=1, **DEC),
    "lfm2": lambda: causal(
        "Lfm2Config",
        "Lfm2ForCausalLM",
        num_key_value_heads=2,
        full_attn_idxs=[1],
        layer_types=["conv", "full_attention"],
        block_multiple_of=32,
        pad_token_id=1,
        **DEC,
    ),
    # (third batch)
    # vision
    "swiftformer": lambda: (lambda mi: (_rescale(mi[0]), mi[1]))(
        vision(
            "SwiftFormerConfig",
            "SwiftFormerForImageClassification",
            depths=[1, 1, 1, 1],
            embed_dims=[16, 24, 32, 48],
            num_labels=10,
        )
    ),
    "vitmae": vitmae,
    "vitmsn": lambda: vision("ViTMSNConfig", "ViTMSNForImageClassification", num_labels=10, **VIT),
    "dinov2_registers": lambda: vision(
        "Dinov2WithRegistersConfig",
        "Dinov2WithRegistersForImageClassification",
        num_labels=10,
        num_register_tokens=4,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        mlp_ratio=2,
        image_size=64,
        patch_size=8,
    ),
    "ijepa": lambda: vision("IJepaConfig", "IJepaForImageClassification", num_labels=10, **VIT),
    "zoedepth": zoedepth,
    "superpoint": lambda: (lambda mi: (_rescale(mi[0]), mi[1]))(
        vision(
            "SuperPointConfig",
            "SuperPointForKeypointDetection",
            field="scores",
            encoder_hidden_sizes=[16, 16, 32, 32],
            decoder_hidden_size=32,
            descriptor_decoder_dim=32,
        )
    ),
    "superpoint_dense": superpoint_dense,
    "sam_vision": lambda: vision(
        "SamVisionConfig",
        "SamVisionModel",
        field="last_hidden_state",
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=64,
        patch_size=8,
        window_size=4,
        global_attn_indexes=[1],
        output_channels=32,
        mlp_dim=64,
        num_pos_feats=16,
        initializer_range=0.02,
    ),  # (default 1e-10: weights ~0, the output does not depend on the image)
    "mask2former": mask2former,
    "maskformer": maskformer,
    "donut_swin": lambda: vision(
        "DonutSwinConfig",
        "DonutSwinModel",
        field="last_hidden_state",
        image_size=64,
        embed_dim=16,
        depths=[1, 1],
        num_heads=[1, 2],
        window_size=4,
        drop_path_rate=0.0,
    ),
    "imagegpt": lambda: causal(
        "ImageGPTConfig",
        "ImageGPTForCausalImageModeling",
        vocab_size=VOCAB,
        n_positions=64,
        n_embd=64,
        n_layer=2,
        n_head=4,
    ),
    "videomae": lambda: (
        Output(
            _build(
                "VideoMAEConfig",
                "VideoMAEForVideoClassification",
                num_frames=4,
                tubelet_size=2,
                num_labels=10,
                **{**VIT, "image_size": 32},
            )
        ).eval(),
        (_randn(1, 4, 3, 32, 32),),
    ),
    "vivit": lambda: (
        Output(
            _build(
                "VivitConfig",
                "VivitForVideoClassification",
                num_frames=4,
                tubelet_size=[2, 8, 8],
                num_labels=10,
                image_size=32,
                hidden_size=64,
                num_hidden_layers=2,
                num_attention_heads=4,
                intermediate_size=128,
            )
        ).eval(),
        (_randn(1, 4, 3, 32, 32),),
    ),
    "rtdetr": rtdetr,
    "conditional_detr": lambda: _detr("ConditionalDetrConfig", "ConditionalDetrForObjectDetection"),
    "detr": lambda: _detr("DetrConfig", "DetrForObjectDetection"),
    "aimv2_vision": lambda: vision("Aimv2VisionConfig", "Aimv2VisionModel", field="pooler_output", **VIT),
    "vitpose": vitpose,
    # audio
    "whisper_encoder": whisper,
    "clap_audio": clap_audio,
    "speech2text_encoder": speech2text,
    "wav2vec2bert": wav2vec2bert,
    "moonshine_encoder": moonshine,
    "dac": dac,
    "mimi": mimi,
    "univnet": univnet,
    "fastspeech2conformer": fastspeech2,
    # time series
    "time_series_transformer": lambda: _ts("TimeSeriesTransformerConfig", "TimeSeriesTransformerModel"),
    # ProbSparse attention (default): at these lengths u = L_Q, so every query is kept and the result does not
    # depend on its torch.randint key sample (checked: two runs equal). distil=True (default) does not export.
    "informer": lambda: _ts("InformerConfig", "InformerModel"),
    "informer_nodistil": lambda: _ts("InformerConfig", "InformerModel", distil=False),
    "autoformer": autoformer,
    "patchtsmixer": patchtsmixer,
    "timesfm": timesfm,
    # stop 39: decoders (mixtures of experts among them), two encoders, a Mamba2 hybrid
    "camembert": lambda: text("CamembertConfig", "CamembertModel", **ENC),
    "nomic_bert": lambda: text("NomicBertConfig", "NomicBertModel", **ENC),
    "openai_gpt": lambda: causal(
        "OpenAIGPTConfig", "OpenAIGPTLMHeadModel", n_embd=64, n_layer=2, n_head=4, vocab_size=VOCAB, n_positions=64
    ),
    "olmo3": lambda: causal("Olmo3Config", "Olmo3ForCausalLM", num_key_value_heads=2, pad_token_id=0, **DEC),
    "ernie4_5": lambda: causal("Ernie4_5Config", "Ernie4_5ForCausalLM", head_dim=16, num_key_value_heads=2, **DEC),
    "qwen3_moe": lambda: causal(
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        head_dim=16,
        num_key_value_heads=2,
        **DEC,
    ),
    "phimoe": lambda: causal(
        "PhimoeConfig", "PhimoeForCausalLM", num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, **DEC
    ),
    "gpt_oss": lambda: causal(
        "GptOssConfig",
        "GptOssForCausalLM",
        num_local_experts=4,
        num_experts_per_tok=2,
        head_dim=16,
        num_key_value_heads=2,
        **DEC,
    ),
    "doge": lambda: causal("DogeConfig", "DogeForCausalLM", **DEC),
    "diffllama": lambda: causal("DiffLlamaConfig", "DiffLlamaForCausalLM", num_key_value_heads=2, **DEC),
    "seed_oss": lambda: causal("SeedOssConfig", "SeedOssForCausalLM", head_dim=16, num_key_value_heads=2, **DEC),
    "vaultgemma": lambda: causal(
        "VaultGemmaConfig", "VaultGemmaForCausalLM", head_dim=16, num_key_value_heads=2, **DEC
    ),
    "hunyuan_dense": lambda: causal(
        "HunYuanDenseV1Config", "HunYuanDenseV1ForCausalLM", head_dim=16, num_key_value_heads=2, **DEC
    ),
    "bamba": lambda: causal(
        "BambaConfig",
        "BambaForCausalLM",
        num_key_value_heads=2,
        mamba_n_heads=4,
        mamba_d_head=32,
        mamba_d_state=16,
        mamba_n_groups=1,
        attn_layer_indices=[1],
        **DEC,
    ),
}
