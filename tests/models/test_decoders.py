"""Decoders from transformers (GPT-2, Llama; small configs, random weights) through
from_torch and accel_target.build, against PyTorch eager; and the import pieces they
need (accel_target/frontends/torch_ops.py) one by one, against PyTorch."""

import numpy as np
import pytest
import torch
import tvm
from tvm import relax

import accel_target
from accel_target.frontends import UnsupportedModelError
from tests.helpers import assert_close, run_executable
from tests.models.hf_zoo import GPT2, LLAMA
from tests.models.test_models import _check_report

transformers = pytest.importorskip("transformers")

LAYERS = GPT2["n_layer"]  # = LLAMA["num_hidden_layers"]


def _decoder(name: str):
    """(model, example inputs) for a decoder of the table below, random weights."""
    torch.manual_seed(0)
    ids = torch.randint(0, 100, (2 if name == "gpt2_batch2" else 1, 8))
    if name.startswith("gpt2"):
        config = transformers.GPT2Config(**GPT2)
        model = transformers.GPT2Model(config) if name == "gpt2_batch2" else transformers.GPT2LMHeadModel(config)
        return model.eval(), (ids,)
    config = transformers.LlamaConfig(**LLAMA)
    if name == "llama_padded":  # a padding mask as a second input: left padding masks whole rows
        mask = torch.ones(1, 8, dtype=torch.int64)
        mask[0, :3] = 0
        return transformers.LlamaModel(config).eval(), (ids, mask)
    return transformers.LlamaForCausalLM(config).eval(), (ids,)


def _reference(model, inputs) -> np.ndarray:
    with torch.no_grad():
        return model(*inputs)[0].numpy()


def _matmul_constants(mod: tvm.IRModule) -> list[np.ndarray]:
    """The constant right operands of main's matmuls, and of the permute_dims of constants."""
    found = {"matmul": [], "permute": []}

    def visit(expr):
        if isinstance(expr, relax.Call) and expr.op.name in ("relax.matmul", "relax.permute_dims"):
            operand = expr.args[1] if expr.op.name == "relax.matmul" else expr.args[0]
            if isinstance(operand, tvm.ir.expr.Constant):
                found["matmul" if expr.op.name == "relax.matmul" else "permute"].append(operand)

    relax.analysis.post_order_visit(mod["main"], visit)
    return found


# GPT-2 with its LM head; GPT-2 at batch 2 (PyTorch's own decomposition of its attention
# fails there); Llama with grouped-query attention, rotary embeddings, RMSNorm, SiLU;
# Llama given a padding mask
@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt2_lm", "gpt2_batch2", "llama_lm", "llama_padded"])
def test_decoder_matches_pytorch_on_accel_kernels(name):
    model, inputs = _decoder(name)
    executable = accel_target.build(accel_target.from_torch(model, inputs))
    assert_close(run_executable(executable, *[x.numpy() for x in inputs]), _reference(model, inputs))
    report = accel_target.report(executable)
    _, dense = _check_report(executable, report)
    matmuls = [r for r in report.rows if r.op == "relax.matmul"]
    # every product on an accel kernel: 4 (GPT-2) or 7 (Llama) dense per layer, 2 in attention
    assert all(r.kind == "accel" for r in matmuls)
    assert sum(r.kernel == "batch_matmul_kn.accel" for r in matmuls) == 2 * LAYERS
    per_layer = 4 if name.startswith("gpt2") else 7
    assert len(dense) == per_layer * LAYERS + name.endswith("_lm")
    assert report.kernels.weight_transforms == 0


@pytest.mark.slow
def test_gpt2_conv1d_weights_reach_dense_as_stored():
    """GPT-2's Conv1D keeps its weight [in, out] (addmm(bias, x, W)): the dense reads it as
    it is, no transpose at import or anywhere after."""
    model, inputs = _decoder("gpt2_batch2")
    mod = accel_target.from_torch(model, inputs)
    found = _matmul_constants(mod)
    conv1d = [
        p.detach().numpy()
        for name, p in model.named_parameters()
        if (".attn." in name or ".mlp." in name) and name.endswith(".weight")
    ]
    assert found["permute"] == [] and len(found["matmul"]) == len(conv1d) == 4 * LAYERS
    for const, weight in zip(found["matmul"], conv1d, strict=True):
        np.testing.assert_array_equal(const.value.numpy(), weight)
    report = accel_target.report(accel_target.build(mod))
    assert report.kernels.weight_transforms == 0


def test_import_leaves_the_kv_cache_setting_as_it_was():
    config = transformers.GPT2Config(**{**GPT2, "n_layer": 1})
    model = transformers.GPT2Model(config)
    assert model.config.use_cache is True
    mod = accel_target.from_torch(model, (torch.zeros(1, 4, dtype=torch.int64),))
    assert model.config.use_cache is True
    assert len(mod["main"].params) == 1  # the ids; no cache in or out
    assert isinstance(mod["main"].ret_ty, relax.TensorType)


@pytest.mark.slow
def test_a_mixture_of_experts_decoder_matches_pytorch():
    """Mixtral: 4 experts, 2 per token. Its default experts ("grouped_mm": groups sized by the
    routing) cannot be exported; from_torch exports transformers' batch-matmul experts and
    leaves the model's own setting as it was."""
    torch.manual_seed(0)
    config = transformers.MixtralConfig(**LLAMA, num_local_experts=4, num_experts_per_tok=2)
    model = transformers.MixtralForCausalLM(config).eval()
    ids = torch.randint(0, 100, (1, 8))
    executable = accel_target.build(accel_target.from_torch(model, (ids,)))
    assert model.get_experts_implementation() == {"": "grouped_mm"}
    assert_close(run_executable(executable, ids.numpy()), _reference(model, (ids,)))
    report = accel_target.report(executable)
    assert report.declines == ()
    assert all(r.kind == "accel" for r in report.rows if r.op == "relax.matmul")


class Attention(torch.nn.Module):
    """F.scaled_dot_product_attention with the given keyword arguments."""

    def __init__(self, **kwargs):
        super().__init__()
        self.kwargs = kwargs

    def forward(self, q, k, v, *mask):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, *mask, **self.kwargs)


def _bool_mask_with_dead_row(shape):
    mask = torch.rand(shape) > 0.3
    mask[..., 0, :] = False  # the first query sees nothing: PyTorch gives zeros there
    mask[..., 1:, 0] = True
    return mask


def _float_mask(shape):
    mask = torch.randn(shape)
    mask[..., 2, 1:] = float("-inf")
    return mask


SDPA_CASES = [
    # q, k, v heads; keyword arguments; mask maker
    ((2, 4, 6, 8), (2, 4, 5, 8), (2, 4, 5, 3), {}, None),
    ((1, 4, 6, 8), (1, 4, 6, 8), (1, 4, 6, 8), {"is_causal": True}, None),
    ((1, 4, 6, 8), (1, 4, 6, 8), (1, 4, 6, 8), {"scale": 0.3}, None),
    # masks: bool with a row that sees nothing, float (additive) with -inf entries
    ((1, 4, 6, 8), (1, 4, 6, 8), (1, 4, 6, 8), {}, lambda: _bool_mask_with_dead_row((1, 1, 6, 6))),
    ((2, 2, 6, 8), (2, 2, 6, 8), (2, 2, 6, 8), {}, lambda: _float_mask((2, 2, 6, 6))),
    # grouped-query attention: 4 query heads share 2 key/value heads
    ((1, 4, 6, 8), (1, 2, 6, 8), (1, 2, 6, 8), {"enable_gqa": True}, None),
    # 3-D: [batch, length, features]
    ((3, 6, 8), (3, 7, 8), (3, 7, 8), {}, None),
]


@pytest.mark.parametrize("q_shape, k_shape, v_shape, kwargs, make_mask", SDPA_CASES)
def test_scaled_dot_product_attention_converter(q_shape, k_shape, v_shape, kwargs, make_mask):
    torch.manual_seed(0)
    inputs = [torch.randn(s) for s in (q_shape, k_shape, v_shape)] + ([make_mask()] if make_mask else [])
    model = Attention(**kwargs)
    mod = accel_target.from_torch(model, tuple(inputs))
    ops = []
    relax.analysis.post_order_visit(mod["main"], lambda e: isinstance(e, relax.Call) and ops.append(e.op.name))
    assert ops.count("relax.matmul") == 2 and "relax.nn.attention" not in ops
    out = run_executable(tvm.compile(mod, "llvm"), *[x.numpy() for x in inputs])
    assert_close(out, model(*inputs).numpy())


def test_scaled_dot_product_attention_with_dropout_is_refused():
    q = torch.randn(1, 2, 4, 8)
    with pytest.raises(UnsupportedModelError, match=r"scaled_dot_product_attention with dropout_p=0.5; supported: 0.0"):
        accel_target.from_torch(Attention(dropout_p=0.5), (q, q, q))


class PackedPositions(torch.nn.Module):
    """The causal mask of transformers' masking_utils, from positions alone: diff, cumsum of
    a bool, broadcast indexing; then used on the input."""

    def forward(self, x):
        positions = torch.arange(x.shape[-1]).unsqueeze(0)
        starts = torch.diff(positions, prepend=positions[:, :1] - 1, dim=-1) != 1
        sequence = starts.cumsum(-1)
        q, kv = torch.arange(x.shape[-1])[:, None], torch.arange(x.shape[-1])[None, :]
        mask = (sequence[0][q] == sequence[0][kv]) & (kv <= q)
        return x.masked_fill(~mask, 0.0)


def test_input_independent_values_become_constants():
    x = torch.randn(6, 6)
    mod = accel_target.from_torch(PackedPositions(), (x,))
    ops = []
    relax.analysis.post_order_visit(mod["main"], lambda e: isinstance(e, relax.Call) and ops.append(e.op.name))
    assert not {"relax.arange", "relax.cumsum", "relax.concat", "relax.index_tensor"} & set(ops)
    assert_close(run_executable(tvm.compile(mod, "llvm"), x.numpy()), PackedPositions()(x).numpy())


class CumulativeSum(torch.nn.Module):
    def forward(self, x):
        return (x > 0).cumsum(-1), x.to(torch.int32).cumsum(0), x.cumsum(1)


def test_cumsum_of_bools_and_integers_sums_in_int64():
    x = torch.randn(4, 5) * 3
    mod = accel_target.from_torch(CumulativeSum(), (x,))
    outputs = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())["main"](tvm.runtime.tensor(x.numpy()))
    for out, ref in zip(outputs, CumulativeSum()(x), strict=True):
        assert str(out.dtype) == str(ref.dtype).replace("torch.", "")
        np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-6)


class BoolComparisons(torch.nn.Module):
    """XLM's ``mask == 0`` on a bool mask, two bool tensors, a bool against a float."""

    def forward(self, x, y):
        positive = x > 0
        return positive == 0, positive != (y > 0), torch.where(positive == 1.0, x, 2 * x)


def test_bool_comparisons_compile_and_match_pytorch():
    x, y = torch.randn(4, 5), torch.randn(4, 5)
    ex = accel_target.build(accel_target.from_torch(BoolComparisons(), (x, y)))
    outputs = relax.VirtualMachine(ex, tvm.cpu())["main"](*(tvm.runtime.tensor(a.numpy()) for a in (x, y)))
    for out, ref in zip(outputs, BoolComparisons()(x, y), strict=True):
        np.testing.assert_array_equal(out.numpy(), ref.numpy())


class EmptyCache(torch.nn.Module):
    """XLM's attention concatenates its empty 1-D cache with the keys: PyTorch leaves it out."""

    def __init__(self):
        super().__init__()
        self.register_buffer("cache", torch.empty(0))

    def forward(self, x):
        return torch.cat([self.cache, x], dim=-2) * 2


def test_cat_leaves_out_an_empty_1d_tensor():
    x = torch.randn(1, 2, 3, 4)
    ex = accel_target.build(accel_target.from_torch(EmptyCache(), (x,)))
    np.testing.assert_array_equal(run_executable(ex, x.numpy()), EmptyCache()(x).numpy())
