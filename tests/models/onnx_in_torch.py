"""An ONNX graph run by PyTorch ops, node by node: the Keras applications of keras_zoo.py as a
torch.nn.Module, for what takes a PyTorch model only (benchmarks/zoo_models.py's cases: every
contender there starts from a PyTorch model).

Only the ops of those graphs (``OPS``), with the attributes tf2onnx writes; anything else raises
NotImplementedError naming the op. tests/models/test_keras_zoo.py checks each application against
ONNX Runtime.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def _spatial_padding(x, pads, value=0.0):
    """(x padded where `pads` [begin..., end...] is uneven, the even padding per spatial axis)."""
    rank = len(pads) // 2
    begins, ends = pads[:rank], pads[rank:]
    if list(begins) == list(ends):
        return x, tuple(begins)
    widths = [w for axis in reversed(range(rank)) for w in (begins[axis], ends[axis])]
    return F.pad(x, widths, value=value), (0,) * rank


def _conv(x, w, b=None, *, group=1, strides=(1, 1), dilations=(1, 1), pads=(0, 0, 0, 0), auto_pad="NOTSET", **_):
    if auto_pad not in ("NOTSET", "VALID"):
        raise NotImplementedError(f"onnx_in_torch: Conv auto_pad={auto_pad}")
    x, padding = _spatial_padding(x, pads)
    return F.conv2d(x, w, b, tuple(strides), padding, tuple(dilations), group)


def _check_pool(kind, attrs):
    if attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID") or any(d != 1 for d in attrs.get("dilations", ())):
        raise NotImplementedError(f"onnx_in_torch: {kind} with {attrs}")


def _max_pool(x, *, kernel_shape, strides=(1, 1), pads=(0, 0, 0, 0), ceil_mode=0, **attrs):
    _check_pool("MaxPool", attrs)
    x, padding = _spatial_padding(x, pads, -math.inf)
    return F.max_pool2d(x, tuple(kernel_shape), tuple(strides), padding, ceil_mode=bool(ceil_mode))


def _average_pool(x, *, kernel_shape, strides=(1, 1), pads=(0, 0, 0, 0), ceil_mode=0, count_include_pad=0, **attrs):
    _check_pool("AveragePool", attrs)
    if count_include_pad:  # zeros counted: pad them in
        x, pads = _pad(x, [0, 0, *pads[:2], 0, 0, *pads[2:]]), (0,) * len(pads)
    x, padding = _spatial_padding(x, pads)
    if x.ndim != 4 or any(pads) and not any(padding):
        raise NotImplementedError(f"onnx_in_torch: AveragePool of rank {x.ndim}, uneven pads {pads} not counted")
    return F.avg_pool2d(x, tuple(kernel_shape), tuple(strides), padding, bool(ceil_mode), count_include_pad=False)


def _pad(x, pads, value=None, axes=None, *, mode="constant"):
    if mode != "constant" or axes is not None:
        raise NotImplementedError(f"onnx_in_torch: Pad mode={mode} axes={axes}")
    rank = len(pads) // 2
    widths = [int(w) for axis in reversed(range(rank)) for w in (pads[axis], pads[rank + axis])]
    return F.pad(x, widths, value=0.0 if value is None else float(value))


def _reshape(x, shape, *, allowzero=0):
    return x.reshape([x.shape[i] if s == 0 and not allowzero else s for i, s in enumerate(shape)])


def _squeeze(x, axes=None):
    if axes is None:
        return torch.squeeze(x)
    for axis in sorted((a % x.ndim for a in axes), reverse=True):  # one at a time: torch.onnx.export's way
        x = x.squeeze(axis)
    return x


def _slice(x, starts, ends, axes=None, steps=None):
    """Python's slicing is ONNX's for positive steps (ends past the axis clamp, negative
    indices count from its end)."""
    axes = range(len(starts)) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    if any(step <= 0 for step in steps):
        raise NotImplementedError(f"onnx_in_torch: Slice steps={steps}")
    index = [slice(None)] * x.ndim
    for start, end, axis, step in zip(starts, ends, axes, steps):
        index[axis % x.ndim] = slice(start, end, step)
    return x[tuple(index)]


def _global_average_pool(x):
    return x.mean(dim=tuple(range(2, x.ndim)), keepdim=True)


def _reduce_mean(x, axes=None, *, keepdims=1, **_):
    return x.mean(dim=tuple(axes) if axes is not None else None, keepdim=bool(keepdims))


# op type -> fn(*inputs, **attributes): inputs are tensors, or Python lists for integer constants
OPS = {
    "Add": torch.add,
    "Sub": torch.sub,
    "Mul": torch.mul,
    "Div": torch.div,
    "MatMul": torch.matmul,
    "Neg": lambda x: -x,
    "Sqrt": torch.sqrt,
    "Reciprocal": torch.reciprocal,
    "Erf": torch.erf,
    "Relu": torch.relu,
    "Sigmoid": torch.sigmoid,
    "Clip": lambda x, low=None, high=None: torch.clamp(x, low, high),
    "Conv": _conv,
    "MaxPool": _max_pool,
    "AveragePool": _average_pool,
    "GlobalAveragePool": _global_average_pool,
    "ReduceMean": _reduce_mean,
    "Pad": _pad,
    "Concat": lambda *xs, axis: torch.cat(xs, axis),
    "Slice": _slice,
    "Transpose": lambda x, *, perm: x.permute(*perm),
    "Reshape": _reshape,
    "Squeeze": _squeeze,
    "Expand": lambda x, shape: torch.broadcast_to(x, torch.broadcast_shapes(x.shape, tuple(shape))),
}


def _attribute(value):
    """An attribute's value, a string (auto_pad, mode) as str rather than bytes."""
    return value.decode() if isinstance(value, bytes) else value


class OnnxGraph(nn.Module):
    """`model`'s graph (an onnx.ModelProto) as a PyTorch module: forward(*inputs) runs its nodes
    in order with the ops of OPS. Float initializers become buffers; integer ones (shapes, axes,
    pads) Python lists, so that torch.export sees them as constants."""

    def __init__(self, model):
        super().__init__()
        from onnx import helper, numpy_helper

        graph = model.graph
        unknown = sorted({node.op_type for node in graph.node} - set(OPS))
        if unknown:
            raise NotImplementedError(f"onnx_in_torch: no PyTorch op for {', '.join(unknown)}; it has {', '.join(OPS)}")
        self.buffer_names: dict[str, str] = {}
        self.constants: dict[str, list] = {}
        for index, tensor in enumerate(graph.initializer):
            array = numpy_helper.to_array(tensor)
            if array.dtype.kind == "f":
                self.buffer_names[tensor.name] = f"initializer{index}"
                self.register_buffer(f"initializer{index}", torch.from_numpy(array.copy()))
            else:
                self.constants[tensor.name] = array.tolist()
        self.nodes = [
            (
                node.op_type,
                list(node.input),
                list(node.output),
                {a.name: _attribute(helper.get_attribute_value(a)) for a in node.attribute},
            )
            for node in graph.node
        ]
        initializers = {tensor.name for tensor in graph.initializer}
        self.input_names = [i.name for i in graph.input if i.name not in initializers]
        self.output_names = [o.name for o in graph.output]

    def forward(self, *inputs):
        values = dict(zip(self.input_names, inputs), **self.constants)
        values.update({name: getattr(self, buffer) for name, buffer in self.buffer_names.items()})
        for op, names, outputs, attributes in self.nodes:
            result = OPS[op](*[values[name] if name else None for name in names], **attributes)
            values.update(zip(outputs, result if isinstance(result, tuple) else (result,)))
        results = tuple(values[name] for name in self.output_names)
        return results[0] if len(results) == 1 else results
