"""Model import: PyTorch (torch.export) and ONNX, with errors that say what is wrong."""

from __future__ import annotations

import contextlib
import numbers
import os
import re
import warnings

import tvm
from tvm import relax

from .indexing import ONNX, checked_indexing
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


def from_torch(model, example_inputs, *, keep_params_as_input: bool = False):
    """Import a torch.nn.Module through torch.export.

    example_inputs: a tensor or a tuple of tensors (channels_last tensors and
    models moved to channels_last are fine: memory format is not part of the graph).
    Decoders import too (transformers' GPT-2, Llama; see accel_target/torch_ops.py):
    they are exported without their key/value cache, and what depends on no input
    (causal masks, rotary tables) is computed by PyTorch and becomes constants; mixtures of
    experts (Mixtral, Qwen-MoE) through transformers' batch-matmul experts.
    Indexing is checked (accel_target/indexing.py): negative indices count from the end
    where PyTorch says so, and an index outside its tensor is an error, never a read.
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
            with torch.no_grad(), _without_kv_cache(model), _exportable_experts(model):
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


def _graph_inputs(model) -> list:
    """The model's inputs (ValueInfoProto) that are no initializer: what ``main`` takes."""
    initializers = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in initializers]


def _dims(info) -> list | None:
    """An input's dims: an int (dim_value), a str (dim_param) or None (neither); None for no shape."""
    tensor = info.type.tensor_type
    if not tensor.HasField("shape"):
        return None
    return [d.dim_value or d.dim_param or None for d in tensor.shape.dim]


def _name_unknown_dims(model):
    """`model` with a dim_param of its own for each input dim that has neither size nor name
    (``x_dim2``); the model itself when there is none. TVM's importer would make all such
    dims one variable, so that an input ``[?, 3, ?, ?]`` would take only N == H == W."""
    import onnx

    unknown = [(i.name, axis) for i in _graph_inputs(model) for axis, d in enumerate(_dims(i) or []) if d is None]
    if not unknown:
        return model
    taken = {d for i in _graph_inputs(model) for d in _dims(i) or [] if isinstance(d, str)}
    named = onnx.ModelProto()
    named.CopyFrom(model)
    infos = {i.name: i for i in _graph_inputs(named)}
    for input_name, axis in unknown:
        name = re.sub(r"\W", "_", f"{input_name}_dim{axis}")
        while name in taken:
            name += "_"
        taken.add(name)
        infos[input_name].type.tensor_type.shape.dim[axis].dim_param = name
    return named


def _check_shape_dict(model, shape_dict: dict) -> None:
    """Each entry of `shape_dict` names an input, with the input's rank, positive sizes and
    the model's fixed sizes."""
    inputs = {i.name: _dims(i) for i in _graph_inputs(model)}
    for name, shape in shape_dict.items():
        if name not in inputs:
            raise ValueError(
                f"accel: shape_dict names {name!r}, no input of the model; its inputs: {', '.join(inputs)}"
            )
        dims = inputs[name]
        shape = list(shape)
        if not all(isinstance(s, numbers.Integral) and s > 0 for s in shape):
            raise ValueError(f"accel: shape_dict gives input {name!r} shape {shape}; expected positive ints")
        if dims is None:
            continue
        model_shape = "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"
        if len(shape) != len(dims):
            raise ValueError(
                f"accel: shape_dict gives input {name!r} {len(shape)} dims {shape}; the model's has "
                f"{len(dims)}: {model_shape}"
            )
        for axis, (size, dim) in enumerate(zip(shape, dims)):
            if isinstance(dim, int) and size != dim:
                raise ValueError(
                    f"accel: shape_dict gives input {name!r} shape {shape}, but the model fixes its dim {axis} "
                    f"at {dim}: {model_shape}; only its symbolic dims can be given a size"
                )


def _fix_sizes(model, shape_dict: dict[str, list[int]]):
    """`model` with the sizes of `shape_dict` written into its inputs (so that onnx's shape
    inference, and the folding of shapes it knows, see them); the model itself for none."""
    import onnx

    if not shape_dict:
        return model
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    for info in _graph_inputs(fixed):
        if info.name in shape_dict:
            shape = info.type.tensor_type.shape
            shape.ClearField("dim")
            for size in shape_dict[info.name]:
                shape.dim.add().dim_value = size
    return fixed


def from_onnx(path_or_model, shape_dict: dict[str, list[int]] | None = None) -> tvm.IRModule:
    """Import an ONNX model (a file path or an onnx.ModelProto), weights as constants.

    Symbolic input dims stay symbolic: a dim_param (``["batch", "seq", 768]``) becomes a
    shape variable of ``main`` of that name, one per name (inputs that share a dim_param take
    the same size), and a dim with neither size nor name one of its own (``x_dim2``).
    `accel_target.build` makes one executable for every size, and `save` records the names
    in the signature that `load` checks each call against. `shape_dict` ({input name: shape})
    fixes an input's symbolic dims instead (its fixed dims as in the model).

    Quantized models import too: QuantizeLinear / DequantizeLinear (QDQ, per tensor or per
    channel), QLinearConv, QLinearMatMul, quantized pads (accel_target/onnx_quant.py); the
    pipeline rewrites them to integer kernels (accel_target/quantize.py). A pad, reshape or
    expand whose shape the graph computes from constants or fixed sizes is folded first
    (TVM's importer alone fails on them: Swin, ConvBERT, SqueezeBERT). No Gather, Scatter
    or their kin reads or writes outside its tensor: an index outside is an error
    (accel_target/indexing.py)."""
    import onnx
    from tvm.relax.frontend.onnx import from_onnx as tvm_from_onnx

    from .onnx_quant import accel_converters, fold_constant_inputs  # imports TVM's ONNX frontend: onnx needed

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
    _check_shape_dict(model, shape_dict or {})
    shape_dict = {name: [int(s) for s in shape] for name, shape in (shape_dict or {}).items()}
    try:
        with accel_converters():
            mod = tvm_from_onnx(fold_constant_inputs(_fix_sizes(_name_unknown_dims(model), shape_dict)), shape_dict)
    except tvm.error.OpNotImplemented as err:
        raise UnsupportedModelError(f"accel: {str(err).strip().splitlines()[-1]}") from err
    return checked_indexing(mod, ONNX)


__all__ = ["UnsupportedModelError", "from_exported_program_file", "from_onnx", "from_torch", "load_model"]
