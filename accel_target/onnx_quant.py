"""ONNX import of quantized models: what TVM 0.27's ONNX frontend lacks or cannot read.

- `fold_pad_inputs`: a pre-pass on the ONNX graph that computes, with onnx's reference
  evaluator, the pads / constant value / axes of a Pad that a subgraph of constants produces
  (PyTorch's export of ``F.pad`` builds the pads with ConstantOfShape, Concat, Slice...; ONNX
  Runtime's QDQ quantizer wraps the constant value in QuantizeLinear -> DequantizeLinear).
  TVM's Pad converter reads them as constants and fails otherwise ("Dynamic pads are not
  supported yet", or ``'Call' object has no attribute 'value'``).
- Converters, used while `accel_converters()` is active (TVM's frontend has no public way to
  add converters; the block swaps its converter table and restores it):
  ``Pad`` in constant mode becomes ``relax.nn.pad`` (stock TVM emits an opaque TE kernel that
  no graph pass can see through); ``Clip`` with constant bounds becomes ``maximum`` /
  ``minimum`` (likewise); ``QLinearConv`` and ``QLinearMatMul`` (missing in TVM) become
  ``quantize(conv / matmul(dequantize(x), dequantize(w)) + bias)``, which
  `accel_target.quantize` rewrites to the integer kernels like any QDQ graph.
"""

from __future__ import annotations

import contextlib
import threading

import numpy as np
import tvm
from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend as stock
from tvm.relax.frontend.onnx.onnx_frontend import get_constant

from strategy.layout import constant_array

# op type -> positions of its inputs that TVM's converter needs as constants
CONSTANT_INPUTS = {"Pad": (1, 2, 3)}
_PATCH_LOCK = threading.Lock()


def _constant_subgraph(name: str, producers: dict, constants: set) -> list | None:
    """The nodes that compute `name` from initializers and Constant nodes alone, in graph
    order; None if it depends on a graph input."""
    nodes, pending, seen = [], [name], set()
    while pending:
        value = pending.pop()
        if value in seen or value in constants or value == "":
            continue
        seen.add(value)
        node = producers.get(value)
        if node is None:  # a graph input
            return None
        nodes.append(node)
        pending.extend(node.input)
    return nodes


def _constant_inputs(graph, producers: dict):
    """(node, input position) of every input of CONSTANT_INPUTS that a node produces."""
    for node in graph.node:
        for i in CONSTANT_INPUTS.get(node.op_type, ()):
            if i < len(node.input) and node.input[i] in producers:
                yield node, i


def _evaluate(name: str, nodes: list, model) -> np.ndarray:
    """The value of `name`, computed by `nodes` (in graph order) from the model's initializers."""
    import onnx
    from onnx.reference import ReferenceEvaluator

    initializers = {init.name: init for init in model.graph.initializer}
    used = [initializers[v] for v in dict.fromkeys(v for n in nodes for v in n.input) if v in initializers]
    output = onnx.helper.make_tensor_value_info(name, onnx.TensorProto.UNDEFINED, None)
    graph = onnx.helper.make_graph(nodes, "fold", [], [output], used)
    sub = onnx.helper.make_model(graph, opset_imports=model.opset_import, ir_version=model.ir_version)
    return np.asarray(ReferenceEvaluator(sub).run(None, {})[0])


def fold_pad_inputs(model):
    """`model` (an onnx.ModelProto) with every input of CONSTANT_INPUTS that a subgraph of
    constants computes replaced by an initializer holding its value; the model itself when
    there is none. The subgraph's nodes stay (TVM converts them, dead code removes them)."""
    import onnx

    producers = {out: node for node in model.graph.node for out in node.output}
    if next(_constant_inputs(model.graph, producers), None) is None:
        return model
    model = onnx.ModelProto.FromString(model.SerializeToString())  # leave the caller's model as it is
    graph = model.graph
    producers = {out: node for node in graph.node for out in node.output}
    constants = {init.name for init in graph.initializer}
    order = {id(node): i for i, node in enumerate(graph.node)}
    folded = {}
    for node, i in list(_constant_inputs(graph, producers)):
        name = node.input[i]
        if name not in folded:
            nodes = _constant_subgraph(name, producers, constants)
            if nodes is None:
                continue
            folded[name] = f"{name}__folded"
            value = _evaluate(name, sorted(nodes, key=lambda n: order[id(n)]), model)
            graph.initializer.append(onnx.numpy_helper.from_array(value, folded[name]))
        node.input[i] = folded[name]
    return model


class Pad(stock.Pad):
    """Constant-mode Pad as relax.nn.pad (layout inference, foldable into a conv's padding)."""

    @classmethod
    def _lower_pad(cls, bb, inputs, attr, params, allowed_modes):
        if attr.get("mode", b"constant").decode("utf-8") != "constant":
            return super()._lower_pad(bb, inputs, attr, params, allowed_modes)
        before, after, value = cls._parse_pads_and_axes(inputs, params)
        widths = [int(w) for pair in zip(before, after) for w in pair]
        return relax.op.nn.pad(inputs[0], widths, "constant", float(value))


class Clip(stock.Clip):
    """Clip with constant bounds as maximum / minimum (elementwise, with layout inference)."""

    @classmethod
    def _impl_v13(cls, bb, inputs, attr, params):
        bounds = [None if b is None else get_constant(b, params) for b in (inputs[1], inputs[2])]
        if any(b is not None and not isinstance(b, tvm.ir.GenericConst) for b in bounds):
            return super()._impl_v13(bb, inputs, attr, params)
        result = inputs[0]
        dtype = str(result.ty.dtype)
        for bound, op in zip(bounds, (relax.op.maximum, relax.op.minimum)):
            value = None if bound is None else float(constant_array(bound))
            if value is not None and not np.isnan(value):
                result = bb.emit(op(result, relax.const(value, dtype)))
        return result


def _input(inputs, i):
    return inputs[i] if len(inputs) > i else None


def _dequantize(x, scale, zero_point, axis: int) -> relax.Expr:
    if zero_point is None:
        zero_point = relax.const(0, str(x.ty.dtype))
    return relax.op.dequantize(x, scale, zero_point, axis=axis)


def _quantize(bb, y, scale, zero_point, axis: int = 1) -> relax.Expr:
    dtype = "uint8" if zero_point is None else str(zero_point.ty.dtype)
    if zero_point is None:
        zero_point = relax.const(0, dtype)
    return relax.op.quantize(bb.normalize(y), scale, zero_point, axis=axis, out_dtype=dtype)


class QLinearConv(stock.OnnxOpConverter):
    """QLinearConv(x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp[, B int32]) as
    quantize(Conv(dequantize(x), dequantize(w), dequantize(B, x_scale * w_scale)))."""

    @classmethod
    def _impl_v10(cls, bb, inputs, attr, params):
        x = bb.normalize(_dequantize(inputs[0], inputs[1], _input(inputs, 2), 1))
        w = bb.normalize(_dequantize(inputs[3], inputs[4], _input(inputs, 5), 0))
        conv_inputs = [x, w]
        bias = _input(inputs, 8)
        if bias is not None:
            bias_scale = bb.normalize(relax.op.multiply(inputs[1], inputs[4]))
            conv_inputs.append(bb.normalize(_dequantize(bias, bias_scale, None, 0)))
        y = stock.Conv.get_converter(11)(bb, stock.onnx_input(conv_inputs), attr, params)
        return _quantize(bb, y, inputs[6], _input(inputs, 7))


class QLinearMatMul(stock.OnnxOpConverter):
    """QLinearMatMul(a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp) as
    quantize(matmul(dequantize(a), dequantize(b))), b's scale per column or per tensor."""

    @classmethod
    def _impl_v10(cls, bb, inputs, attr, params):
        a = bb.normalize(_dequantize(inputs[0], inputs[1], _input(inputs, 2), 1))
        b = bb.normalize(_dequantize(inputs[3], inputs[4], _input(inputs, 5), inputs[3].ty.ndim - 1))
        y = bb.normalize(relax.op.matmul(a, b))
        return _quantize(bb, y, inputs[6], _input(inputs, 7), axis=y.ty.ndim - 1)


CONVERTERS = {"Pad": Pad, "Clip": Clip, "QLinearConv": QLinearConv, "QLinearMatMul": QLinearMatMul}


@contextlib.contextmanager
def accel_converters():
    """Within the block, TVM's ONNX frontend converts with CONVERTERS on top of its own."""
    original = stock._get_convert_map

    def convert_map():
        return {**original(), **CONVERTERS}

    with _PATCH_LOCK:
        stock._get_convert_map = convert_map
        try:
            yield
        finally:
            stock._get_convert_map = original


__all__ = ["CONVERTERS", "accel_converters", "fold_pad_inputs"]
