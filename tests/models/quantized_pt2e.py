"""PT2E-quantized models as a new user makes them, for the tests (tests/models/test_quantized.py):
torch.export of a float model, torchao's ``prepare_pt2e`` with its X86InductorQuantizer
(per-channel int8 weights, uint8 activations), calibration on random data, ``convert_pt2e``."""

import warnings

import torch
from torch import nn


def quantized_pt2e(model: nn.Module, example: torch.Tensor, batches: int = 4):
    """`model` (eval, float) quantized with torchao's PT2E flow and X86InductorQuantizer, calibrated
    on `batches` standard normal batches of `example`'s shape and memory format: the GraphModule
    ``convert_pt2e`` returns (quantized_decomposed q/dq ops around float ops)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchao's import-time notes (CUDA kernels, deprecations)
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
        from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as x86

    quantizer = x86.X86InductorQuantizer().set_global(x86.get_default_x86_inductor_quantization_config())
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        prepared = prepare_pt2e(torch.export.export(model.eval(), (example,)).module(), quantizer)
        for _ in range(batches):
            batch = torch.randn(example.shape, generator=generator)
            prepared(batch.contiguous(memory_format=torch.channels_last) if example.dim() == 4 else batch)
        return convert_pt2e(prepared)


def last_activation_scale(converted) -> float:
    """The scale of the last quantize_per_tensor of a converted model: one step of its last
    quantized activation."""
    quantize = torch.ops.quantized_decomposed.quantize_per_tensor.default
    scales = [node.args[1] for node in converted.graph.nodes if node.target == quantize]
    return float(scales[-1])
