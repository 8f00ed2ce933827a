"""Whole models exported with symbolic dimensions (torch.export Dim): one build, run at several
sizes against PyTorch, every matmul and conv on an accel kernel."""

import numpy as np
import pytest
import torch
import tvm
from torch import nn
from tvm import relax

import accel_target
from accel_target.frontends.torch_ops import import_program
from tests.helpers import assert_close
from tests.models.classic import bert_encoder
from tests.models.hf_zoo import Output
from tests.models.zoo import make

pytestmark = pytest.mark.slow

COVERED = {"relax.nn.conv2d", "relax.matmul"}


def _export(model, example, dynamic_shapes) -> tvm.IRModule:
    with torch.no_grad():
        program = torch.export.export(model.eval(), (example,), dynamic_shapes=dynamic_shapes)
    return import_program(program)


def _check(executable, model, shapes, make_input):
    """Every covered op on an accel kernel; the output at each of `shapes` matches PyTorch."""
    rows = [r for r in accel_target.report(executable).rows if r.op in COVERED]
    assert rows and all(r.kind == "accel" for r in rows), [
        (r.op, r.inputs, r.reason) for r in rows if r.kind != "accel"
    ]
    vm = relax.VirtualMachine(executable, tvm.cpu())
    for shape in shapes:
        x = make_input(shape)
        with torch.no_grad():
            ref = model(x).numpy()
        out = vm["main"](tvm.runtime.tensor(x.numpy())).numpy()
        assert_close(out, ref)


def test_bert_with_symbolic_batch_and_sequence():
    """BERT-base, 2 layers: batch and sequence symbolic, at (1, 16), (2, 77), (1, 128), (1, 384)."""
    torch.manual_seed(0)
    model = bert_encoder(layers=2).eval()
    batch, seq = torch.export.Dim("batch", max=64), torch.export.Dim("seq", min=2, max=512)
    mod = _export(model, torch.randn(2, 16, 768), ({0: batch, 1: seq},))
    executable = accel_target.build(mod)
    _check(executable, model, [(1, 16), (2, 77), (1, 128), (1, 384)], lambda s: torch.randn(*s, 768))


def test_resnet_like_cnn_with_symbolic_batch():
    """Our ResNet-style CNN (BN folded, strided shortcuts, dense head), batch symbolic: 1, 3, 8."""
    model, example, _ = make("residual_cnn")
    batch = torch.export.Dim("batch", min=1, max=64)
    mod = _export(model, example.repeat(2, 1, 1, 1), ({0: batch},))
    executable = accel_target.build(mod)
    _check(executable, model, [(1,), (3,), (8,)], lambda s: torch.randn(*s, 3, 32, 32))


def test_resnet_like_cnn_symbolic_batch_channels_last_input():
    """input_layout="NHWC" with a symbolic batch: main takes [batch, H, W, C]."""
    model, example, _ = make("residual_cnn")
    mod = _export(model, example.repeat(2, 1, 1, 1), ({0: torch.export.Dim("batch", min=1, max=64)},))
    vm = relax.VirtualMachine(accel_target.build(mod, input_layout="NHWC"), tvm.cpu())
    for n in (1, 3):
        x = torch.randn(n, 3, 32, 32)
        with torch.no_grad():
            ref = model(x).numpy()
        out = vm["main"](tvm.runtime.tensor(np.ascontiguousarray(x.numpy().transpose(0, 2, 3, 1)))).numpy()
        assert_close(out, ref)


# token-id transformers from transformers (tiny random configs: hidden 64, 2 layers, 2 heads, a
# vocabulary of 100), input_ids [batch, seq] with both symbolic; a ViT with a symbolic batch
_TEXT = dict(num_hidden_layers=2, num_attention_heads=2, intermediate_size=128, vocab_size=100)
_DECODER = dict(max_position_embeddings=64, bos_token_id=0, eos_token_id=0)
TRANSFORMERS = {
    # position and token type ids sliced from [1, 64] buffers to the symbolic length
    "bert": ("BertConfig", "BertModel", dict(_TEXT, hidden_size=64, max_position_embeddings=64)),
    # a mask of packed sequences: cumsum, broadcast index.Tensor over symbolic axes
    "gpt2": (
        "GPT2Config",
        "GPT2Model",
        dict(n_embd=64, n_layer=2, n_head=2, vocab_size=100, n_positions=64, bos_token_id=0, eos_token_id=0),
    ),
    # rotary embeddings, RMSNorm, SiLU; grouped-query attention (repeat_kv: one key/value head
    # for two query heads)
    "llama": ("LlamaConfig", "LlamaModel", {**_TEXT, **_DECODER, "hidden_size": 64, "num_key_value_heads": 1}),
    # relative position buckets from two aranges of the symbolic length
    "t5_encoder": (
        "T5Config",
        "T5EncoderModel",
        dict(d_model=64, num_layers=2, num_heads=2, d_ff=128, d_kv=32, vocab_size=100),
    ),
}


def _hidden_states(name: str) -> nn.Module:
    """transformers' `name` (TRANSFORMERS) with random weights, returning last_hidden_state."""
    transformers = pytest.importorskip("transformers")
    config_name, model_name, defaults = TRANSFORMERS[name]
    torch.manual_seed(0)
    model = getattr(transformers, model_name)(getattr(transformers, config_name)(**defaults))
    return Output(model.eval(), "last_hidden_state").eval()


def _ids(shape) -> torch.Tensor:
    return torch.randint(0, 100, shape, generator=torch.Generator().manual_seed(sum(shape)))


@pytest.mark.parametrize("name", TRANSFORMERS)
def test_token_transformer_with_symbolic_batch_and_sequence(name):
    """One build for input_ids of any [batch, seq] (seq up to the 64 positions the model has),
    right at three sizes; every product on an accel kernel."""
    model = _hidden_states(name)
    batch, seq = torch.export.Dim("batch", max=16), torch.export.Dim("seq", min=2, max=64)
    mod = accel_target.from_torch(model, (_ids((2, 8)),), dynamic_shapes=({0: batch, 1: seq},))
    _check(accel_target.build(mod), model, [(1, 5), (2, 16), (3, 33)], _ids)


def test_vit_with_symbolic_batch():
    """A ViT (patch embedding conv, class token, encoder) at batch 1, 3, 5 from one build."""
    transformers = pytest.importorskip("transformers")
    config = transformers.ViTConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128, image_size=32, patch_size=8
    )
    torch.manual_seed(0)
    model = Output(transformers.ViTModel(config, add_pooling_layer=False).eval(), "last_hidden_state").eval()
    mod = accel_target.from_torch(
        model, (torch.randn(2, 3, 32, 32),), dynamic_shapes=({0: torch.export.Dim("batch", max=64)},)
    )
    _check(accel_target.build(mod), model, [(1,), (3,), (5,)], lambda s: torch.randn(*s, 3, 32, 32))
