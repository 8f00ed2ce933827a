"""PyTorch import through torch.export: `from_torch` (a module, a PT2E-quantized GraphModule) and
`from_exported_program_file` (a ``.pt2`` file of ``torch.export.save``)."""

from __future__ import annotations

import contextlib
import os
import re
import warnings

import tvm
from tvm import relax

from .errors import UnsupportedModelError, first_line
from .torch_ops import failed_op, import_program


@contextlib.contextmanager
def _without_kv_cache(model):
    """A transformers model with ``config.use_cache`` off while it is exported: one forward
    pass needs no key/value cache, and a cache object is no tensor torch.export can return."""
    config = getattr(model, "config", None)
    if getattr(config, "use_cache", None) is not True:
        yield
        return
    config.use_cache = False
    try:
        yield
    finally:
        config.use_cache = True


@contextlib.contextmanager
def _exportable_experts(model):
    """The transformers models in `model` whose mixture-of-experts layers run "grouped_mm"
    switched to "batched_mm" while it is exported, as transformers' own decoding does off the
    CPU: grouped_mm's groups are sized by the routing (a custom op, ``histc`` of the experts
    chosen), which torch.export cannot trace; batched_mm gathers each token's chosen experts'
    weights and computes them with batch matmuls of static shapes. (Memory: the gathered
    weights are tokens x experts per token x one expert's weights.)"""
    switched = []
    for module in model.modules():
        if hasattr(module, "get_experts_implementation") and hasattr(module, "set_experts_implementation"):
            before = module.get_experts_implementation()
            if "grouped_mm" in before.values():
                exportable = {key: "batched_mm" if value == "grouped_mm" else value for key, value in before.items()}
                module.set_experts_implementation(exportable)
                switched.append((module, before))
    try:
        yield
    finally:
        for module, before in reversed(switched):
            module.set_experts_implementation(before)


def _in_eval_mode(model):
    """`model` in eval mode. A module torch.export made (``ExportedProgram.module()``, and
    PT2E's ``prepare_pt2e`` / ``convert_pt2e`` of one) refuses ``eval()`` with a
    NotImplementedError: its mode was fixed in its graph when it was exported, so it is taken
    as it is."""
    try:
        return model.eval()
    except NotImplementedError:
        return model


def register_quantized_ops() -> None:
    """Register PyTorch's ``quantized_decomposed`` ops (what PT2E's ``convert_pt2e`` leaves in a
    graph), which a ``.pt2`` of a quantized model needs before ``torch.export.load`` can read
    it. torch registers them on importing ``torch.ao.quantization.fx._decomposed`` (torchao's
    PT2E imports the same module); importing it twice is harmless."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.ao.quantization points to torchao
        import torch.ao.quantization.fx._decomposed  # noqa: F401


def _export(model, example_inputs: tuple, dynamic_shapes):
    """torch.export of `model` in eval mode, without gradients, key/value cache or grouped experts."""
    import torch

    model = _in_eval_mode(model)
    with warnings.catch_warnings():
        # torch.export's own use of its deprecated LeafSpec: nothing the caller can act on
        warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
        with torch.no_grad(), _without_kv_cache(model), _exportable_experts(model):
            return torch.export.export(model, example_inputs, dynamic_shapes=dynamic_shapes)


def _cannot_import(what: str, err: BaseException) -> UnsupportedModelError:
    """The error for a model that did not import: `err`'s first line, after the aten op whose
    conversion raised it where the line does not name it."""
    message, op = first_line(err).removeprefix("accel: "), failed_op(err)
    where = f"{op}: " if op is not None and not re.search(rf"\b{op.split('.')[0]}\b", message) else ""
    return UnsupportedModelError(f"accel: cannot import {what}: {where}{message}")


def from_torch(model, example_inputs, *, dynamic_shapes=None, keep_params_as_input: bool = False):
    """Import a torch.nn.Module through torch.export.

    example_inputs: a tensor or a tuple of tensors (channels_last tensors and
        models moved to channels_last are fine: memory format is not part of the graph).
    dynamic_shapes: passed to ``torch.export.export`` as it is, e.g. ``({0: Dim("batch"),
        1: Dim("seq", max=512)},)`` for token ids [batch, seq]: each Dim becomes a symbolic
        dimension of ``main`` (its range in the function's attributes), and `build` makes one
        executable for every size in range.
    keep_params_as_input: return the pair (IRModule, {param name: array}) for
        ``build(mod, params)`` instead of an IRModule with the weights as constants.

    Decoders import too (transformers' GPT-2, Llama; see accel_target/frontends/torch_ops.py):
    they are exported without their key/value cache, and what depends on no input (causal
    masks, rotary tables) is computed by PyTorch and becomes constants; mixtures of experts
    (Mixtral, Qwen-MoE) through transformers' batch-matmul experts. A PT2E-quantized model
    (torchao's ``convert_pt2e``: a GraphModule that refuses ``eval()``) is exported as it is; its
    quantize / dequantize ops become accel's integer kernels. Indexing is checked
    (accel_target/passes/indexing.py): negative indices count from the end where PyTorch says so,
    and an index outside its tensor is an error, never a read. A model that mutates a buffer or
    an input (training-mode batch norm) raises UnsupportedModelError.
    """
    import torch

    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    example_inputs = tuple(example_inputs)
    try:
        program = _export(model, example_inputs, dynamic_shapes)
    except Exception as err:  # torch.export's own limits
        error = _cannot_import(type(model).__name__, err)
        if "data-dependent" in str(error):  # Python control flow on a tensor's values
            hint = '; torch.compile(model, backend="accel") runs such code, with graph breaks where it must'
            error = UnsupportedModelError(f"{error}{hint}")
        raise error from err
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
            mod = import_program(program, keep_params_as_input=keep_params_as_input)
    except Exception as err:  # torch.export and the importer raise many types; keep the cause
        raise _cannot_import(type(model).__name__, err) from err
    if not keep_params_as_input:
        return mod
    mod, params = relax.frontend.detach_params(mod)
    names = [p.name for p in mod["main"].params[len(example_inputs) :]]
    return mod, {name: value.numpy() for name, value in zip(names, params["main"], strict=True)}


def from_exported_program_file(path) -> tvm.IRModule:
    """Import a program saved with ``torch.export.save`` (a .pt2 file), weights as constants;
    a PT2E-quantized program too (its ``quantized_decomposed`` ops are registered first)."""
    import torch

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"accel: model file {path!r} does not exist")
    register_quantized_ops()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
        try:
            program = torch.export.load(path)
        except Exception as err:  # zip/pickle/version errors
            raise ValueError(f"accel: {path!r} is not a saved torch.export program ({first_line(err)})") from err
        try:
            return import_program(program)
        except Exception as err:  # the importer raises many types; keep the cause
            raise _cannot_import(repr(path), err) from err


__all__ = ["from_exported_program_file", "from_torch", "register_quantized_ops"]
