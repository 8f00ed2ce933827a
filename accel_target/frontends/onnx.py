"""ONNX import: `from_onnx`, with symbolic input dims kept symbolic and errors that say what is wrong."""

from __future__ import annotations

import numbers
import os
import re

import tvm

from ..passes.indexing import ONNX, checked_indexing
from .errors import UnsupportedModelError, first_line


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
    channel), QLinearConv, QLinearMatMul, quantized pads (accel_target/frontends/onnx_quant.py); the
    pipeline rewrites them to integer kernels (accel_target/passes/quantize.py). A pad, reshape or
    expand whose shape the graph computes from constants or fixed sizes is folded first
    (TVM's importer alone fails on them: Swin, ConvBERT, SqueezeBERT). No Gather, Scatter
    or their kin reads or writes outside its tensor: an index outside is an error
    (accel_target/passes/indexing.py)."""
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
        # an op version that a later opset deprecated (GroupNormalization-18) is still valid:
        # exporters write it, ONNX Runtime runs it, TVM's importer converts it
        if "is deprecated in domain_version" not in str(err):
            raise ValueError(f"accel: the ONNX model is malformed: {first_line(err)}") from err
    _check_shape_dict(model, shape_dict or {})
    shape_dict = {name: [int(s) for s in shape] for name, shape in (shape_dict or {}).items()}
    try:
        with accel_converters():
            mod = tvm_from_onnx(fold_constant_inputs(_fix_sizes(_name_unknown_dims(model), shape_dict)), shape_dict)
    except tvm.error.OpNotImplemented as err:
        raise UnsupportedModelError(f"accel: {str(err).strip().splitlines()[-1]}") from err
    return checked_indexing(mod, ONNX)


__all__ = ["from_onnx"]
