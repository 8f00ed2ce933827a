"""Model import: PyTorch (torch.export) and ONNX, with errors that say what is wrong."""

from __future__ import annotations

import contextlib
import os
import warnings

import tvm
from tvm import relax

from .torch_ops import import_program


def _first_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return lines[0] if lines else type(err).__name__


class UnsupportedModelError(ValueError):
    """The model uses something the importer cannot translate (named in the message)."""


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


def from_torch(model, example_inputs, *, keep_params_as_input: bool = False):
    """Import a torch.nn.Module through torch.export.

    example_inputs: a tensor or a tuple of tensors (channels_last tensors and
    models moved to channels_last are fine: memory format is not part of the graph).
    Decoders import too (transformers' GPT-2, Llama; see accel_target/torch_ops.py):
    they are exported without their key/value cache, and what depends on no input
    (causal masks, rotary tables) is computed by PyTorch and becomes constants.
    Returns the IRModule with weights as constants, or with
    ``keep_params_as_input=True`` the pair (IRModule, {param name: array}) for
    ``build(mod, params)``.
    """
    import torch

    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    model = model.eval()
    try:
        with warnings.catch_warnings():
            # torch.export's own use of its deprecated LeafSpec: nothing the caller can act on
            warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
            with torch.no_grad(), _without_kv_cache(model):
                program = torch.export.export(model, tuple(example_inputs))
            mod = import_program(program, keep_params_as_input=keep_params_as_input)
    except Exception as err:  # torch.export and the importer raise many types; keep the cause
        raise UnsupportedModelError(f"accel: cannot import {type(model).__name__}: {_first_line(err)}") from err
    if not keep_params_as_input:
        return mod
    mod, params = relax.frontend.detach_params(mod)
    names = [p.name for p in mod["main"].params[len(example_inputs) :]]
    return mod, {name: value.numpy() for name, value in zip(names, params["main"], strict=True)}


def from_exported_program_file(path) -> tvm.IRModule:
    """Import a program saved with ``torch.export.save`` (a .pt2 file), weights as constants."""
    import torch

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"accel: model file {path!r} does not exist")
    try:
        program = torch.export.load(path)
    except Exception as err:  # zip/pickle/version errors
        raise ValueError(f"accel: {path!r} is not a saved torch.export program ({_first_line(err)})") from err
    try:
        return import_program(program)
    except Exception as err:  # the importer raises many types; keep the cause
        raise UnsupportedModelError(f"accel: cannot import {path!r}: {_first_line(err)}") from err


MODEL_SUFFIXES = {".onnx": "ONNX", ".pt2": "torch.export program"}


def load_model(path) -> tvm.IRModule:
    """Import a model file by its suffix: .onnx (ONNX) or .pt2 (torch.export.save)."""
    suffix = os.path.splitext(os.fspath(path))[1].lower()
    if suffix == ".onnx":
        return from_onnx(path)
    if suffix == ".pt2":
        return from_exported_program_file(path)
    known = ", ".join(f"{k} ({v})" for k, v in MODEL_SUFFIXES.items())
    raise ValueError(f"accel: cannot tell the format of {os.fspath(path)!r}; supported: {known}")


def from_onnx(path_or_model, shape_dict: dict[str, list[int]] | None = None) -> tvm.IRModule:
    """Import an ONNX model (a file path or an onnx.ModelProto), weights as constants.

    Quantized models import too: QuantizeLinear / DequantizeLinear (QDQ, per tensor or per
    channel), QLinearConv, QLinearMatMul, quantized pads (accel_target/onnx_quant.py); the
    pipeline rewrites them to integer kernels (accel_target/quantize.py)."""
    import onnx
    from tvm.relax.frontend.onnx import from_onnx as tvm_from_onnx

    from .onnx_quant import accel_converters, fold_pad_inputs  # imports TVM's ONNX frontend: onnx needed

    model = path_or_model
    if isinstance(path_or_model, (str, os.PathLike)):
        if not os.path.isfile(path_or_model):
            raise FileNotFoundError(f"accel: ONNX file {os.fspath(path_or_model)!r} does not exist")
        try:
            model = onnx.load(os.fspath(path_or_model))
        except Exception as err:  # protobuf raises several types on garbage
            raise ValueError(f"accel: {os.fspath(path_or_model)!r} is not a valid ONNX model ({err})") from err
    if not isinstance(model, onnx.ModelProto):
        raise TypeError(f"accel: from_onnx takes a path or an onnx.ModelProto, got {type(model).__name__}")
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as err:
        raise ValueError(f"accel: the ONNX model is malformed: {_first_line(err)}") from err
    try:
        with accel_converters():
            return tvm_from_onnx(fold_pad_inputs(model), shape_dict)
    except tvm.error.OpNotImplemented as err:
        raise UnsupportedModelError(f"accel: {str(err).strip().splitlines()[-1]}") from err


__all__ = ["UnsupportedModelError", "from_exported_program_file", "from_onnx", "from_torch", "load_model"]
