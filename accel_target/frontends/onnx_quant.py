"""ONNX import: what TVM 0.27's ONNX frontend lacks or cannot read (quantized models, shapes
that the graph computes).

- `fold_constant_inputs`: a pre-pass on the ONNX graph that computes, with onnx's reference
  evaluator, the inputs that TVM's converters read as constants (CONSTANT_INPUTS: a Pad's pads,
  constant value and axes, a Reshape's, Expand's, Tile's or ConstantOfShape's shape, a Gather's
  data) where a subgraph of constants and of known shapes produces them. PyTorch's export of
  ``F.pad`` builds the pads with ConstantOfShape, Concat, Slice...; ONNX Runtime's QDQ quantizer
  wraps the constant value in QuantizeLinear -> DequantizeLinear; a model exported with fixed
  sizes computes its reshapes from ``Shape`` of activations (Swin, ConvBERT, SqueezeBERT,
  MobileViT). TVM's converters fail on each ("Dynamic pads are not supported yet", ``'Call'
  object has no attribute 'value'``, "Reshape requires the input new shape to be Shape").
- Converters, used while `accel_converters()` is active (TVM's frontend has no public way to
  add converters; the block swaps its converter table and restores it):
  ``ConstantOfShape`` of a constant shape fills with a scalar (TVM's fails for a scalar shape);
  ``Pad`` in constant mode becomes ``relax.nn.pad`` (stock TVM emits an opaque TE kernel that
  no graph pass can see through); ``Clip`` with constant bounds becomes ``maximum`` /
  ``minimum`` (likewise); ``Celu`` (missing in TVM) is its formula; ``QLinearConv`` and
  ``QLinearMatMul`` (missing in TVM) become
  ``quantize(conv / matmul(dequantize(x), dequantize(w)) + bias)``, which
  `accel_target.passes.quantize` rewrites to the integer kernels like any QDQ graph;
  ``ConvInteger`` (missing in TVM) and ``MatMulInteger`` (which TVM widens to int32) become
  the int8 kernels' own calls, ``conv2d`` / ``matmul`` of uint8 / int8 data and a constant
  int8 weight with ``out_dtype="int32"``, and the zero points' correction; ``Resize`` with
  scales whose product with the input size is not whole maps coordinates as ONNX defines
  them (accel_target/frontends/onnx_resize.py); TopK, Sign, IsInf, ThresholdedRelu and OneHot
  as ONNX defines them where TVM's differ (accel_target/frontends/onnx_ops.py).
"""

from __future__ import annotations

import functools

import numpy as np
import tvm
from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend as stock
from tvm.relax.frontend.onnx.onnx_frontend import get_constant

from strategy.layout import array_constant, constant_array

from .. import tvm_private
from .onnx_ops import CONVERTERS as CORRECTED
from .onnx_resize import Resize

# op type -> positions of its inputs that TVM's converter needs as constants (a shape it
# cannot read from a tensor computed at run time: "Reshape requires the input new shape to be
# Shape", "broadcast_to expects the input shape to have the number of ndim at least..."; a
# Gather of a shape: "shape_of expects a tensor input")
CONSTANT_INPUTS = {
    "Pad": (1, 2, 3),
    "Reshape": (1,),
    "Expand": (1,),
    "ConstantOfShape": (0,),
    "Tile": (1,),
    "Gather": (0,),
}


def _static_shapes(model) -> dict[str, list[int]]:
    """{tensor name: shape} for every tensor of `model` whose shape onnx's shape inference
    knows in full (no symbolic or unknown dim)."""
    import onnx

    try:
        graph = onnx.shape_inference.infer_shapes(model).graph
    except Exception:  # noqa: BLE001  (inference fails on some valid models: no shapes then)
        return {}
    shapes = {}
    for info in [*graph.input, *graph.value_info, *graph.output]:
        tensor = info.type.tensor_type
        if tensor.HasField("shape") and all(d.HasField("dim_value") for d in tensor.shape.dim):
            shapes[info.name] = [d.dim_value for d in tensor.shape.dim]
    return shapes


def _shape_leaf(node, shapes) -> bool:
    """Whether `node` is a Shape of a tensor whose shape is known (`shapes()`): a constant."""
    return node.op_type == "Shape" and node.input[0] in shapes()


def _constant_subgraph(name: str, producers: dict, constants: set, shapes) -> list | None:
    """The nodes that compute `name` from initializers, Constant nodes and the shapes of
    tensors whose shape is known alone, in graph order; None if it depends on a graph input
    otherwise."""
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
        if not _shape_leaf(node, shapes):
            pending.extend(node.input)
    return nodes


def _constant_inputs(graph, producers: dict):
    """(node, input position) of every input of CONSTANT_INPUTS that a node produces."""
    for node in graph.node:
        for i in CONSTANT_INPUTS.get(node.op_type, ()):
            if i < len(node.input) and node.input[i] in producers:
                yield node, i


def _known_shape(node, shapes):
    """A Constant node in place of the Shape `node` of a tensor whose shape is known."""
    import onnx

    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    shape = np.array(shapes()[node.input[0]], "int64")[attrs.get("start", 0) : attrs.get("end")]
    return onnx.helper.make_node("Constant", [], list(node.output), value=onnx.numpy_helper.from_array(shape))


def _evaluate(name: str, nodes: list, model, shapes) -> np.ndarray:
    """The value of `name`, computed by `nodes` (in graph order) from the model's initializers
    and the known shapes."""
    import onnx
    from onnx.reference import ReferenceEvaluator

    nodes = [_known_shape(n, shapes) if _shape_leaf(n, shapes) else n for n in nodes]
    initializers = {init.name: init for init in model.graph.initializer}
    used = [initializers[v] for v in dict.fromkeys(v for n in nodes for v in n.input) if v in initializers]
    output = onnx.helper.make_tensor_value_info(name, onnx.TensorProto.UNDEFINED, None)
    graph = onnx.helper.make_graph(nodes, "fold", [], [output], used)
    sub = onnx.helper.make_model(graph, opset_imports=model.opset_import, ir_version=model.ir_version)
    return np.asarray(ReferenceEvaluator(sub).run(None, {})[0])


def fold_constant_inputs(model):
    """`model` (an onnx.ModelProto) with every input of CONSTANT_INPUTS that a subgraph of
    constants computes replaced by an initializer holding its value; the model itself when
    there is none. Constants here include the shape of a tensor whose shape onnx's shape
    inference knows in full (a model exported with fixed input sizes computes its reshapes'
    shapes from them), in rounds: a reshape folded lets inference know the shapes after it.
    A symbolic dim keeps its subgraph. The subgraph's nodes stay (TVM converts them, dead
    code removes them)."""
    import onnx

    producers = {out: node for node in model.graph.node for out in node.output}
    if next(_constant_inputs(model.graph, producers), None) is None:
        return model
    model = onnx.ModelProto.FromString(model.SerializeToString())  # leave the caller's model as it is
    while _fold_once(model):
        pass
    return model


def _fold_once(model) -> bool:
    """One round of `fold_constant_inputs`, in place; whether it folded anything."""
    import onnx

    graph = model.graph
    producers = {out: node for node in graph.node for out in node.output}
    constants = {init.name for init in graph.initializer}
    order = {id(node): i for i, node in enumerate(graph.node)}
    shapes = functools.cache(lambda: _static_shapes(model))  # inferred once a subgraph reaches a Shape
    folded = {}
    for node, i in list(_constant_inputs(graph, producers)):
        name = node.input[i]
        if name not in folded:
            nodes = _constant_subgraph(name, producers, constants, shapes)
            if nodes is None:
                continue
            folded[name] = f"{name}__folded"
            value = _evaluate(name, sorted(nodes, key=lambda n: order[id(n)]), model, shapes)
            graph.initializer.append(onnx.numpy_helper.from_array(value, folded[name]))
        node.input[i] = folded[name]
    return bool(folded)


class Pad(stock.Pad):
    """Constant-mode Pad as relax.nn.pad (layout inference, foldable into a conv's padding)."""

    @classmethod
    def _lower_pad(cls, bb, inputs, attr, params, allowed_modes):
        if attr.get("mode", b"constant").decode("utf-8") != "constant":
            return super()._lower_pad(bb, inputs, attr, params, allowed_modes)
        before, after, value = cls._parse_pads_and_axes(inputs, params)
        widths = [int(w) for pair in zip(before, after) for w in pair]
        return relax.op.nn.pad(inputs[0], widths, "constant", float(value))


class ConstantOfShape(stock.ConstantOfShape):
    """A constant shape: a constant up to one axis, else ``full`` of a scalar (TVM's converter
    fills with the one-element tensor that ONNX gives the value in, and fails for an empty
    shape, a scalar: "broadcast_to expects the input shape to have the number of ndim at least
    as the input tensor's")."""

    @classmethod
    def _impl_v9(cls, bb, inputs, attr, params):
        shape = get_constant(inputs[0], params)
        if not isinstance(shape, tvm.ir.GenericConst):
            return super()._impl_v9(bb, inputs, attr, params)
        value = attr.get("value")
        value = stock.get_numpy(value).reshape(-1) if value is not None else np.zeros(1, "float32")
        shape = constant_array(shape).tolist()
        if len(shape) <= 1:  # a scalar or a vector (often a shape): a constant, as the converters after it read
            return array_constant(np.full(shape, value[0], value.dtype))
        return relax.op.full(relax.ShapeExpr(shape), relax.const(value[0], str(value.dtype)), str(value.dtype))


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


class Celu(stock.OnnxOpConverter):
    """Celu (missing in TVM): max(0, x) + min(0, alpha * (exp(x / alpha) - 1)), PyTorch's
    F.celu exported."""

    @classmethod
    def _impl_v12(cls, bb, inputs, attr, params):
        x = inputs[0]
        dtype, alpha = str(x.ty.dtype), float(attr.get("alpha", 1.0))
        zero, one, scale = (relax.const(v, dtype) for v in (0.0, 1.0, alpha))
        negative = relax.op.multiply(scale, relax.op.subtract(relax.op.exp(relax.op.divide(x, scale)), one))
        return bb.emit(relax.op.add(relax.op.maximum(x, zero), relax.op.minimum(negative, zero)))


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


def _constant_or_none(expr, params) -> np.ndarray | None:
    """`expr`'s value if it is a constant (an initializer), else None."""
    value = get_constant(expr, params) if expr is not None else None
    return constant_array(value) if isinstance(value, tvm.ir.GenericConst) else None


def _int8_weights(weight, zero_point, params) -> np.ndarray | None:
    """A constant integer weight as int8 with a zero point of 0, or None. uint8 weights move
    by -128 (exact: ``w - zp == (w - 128) - (zp - 128)``), so a uint8 weight with zero point
    128, as ONNX Runtime's ConvInteger wants them, is symmetric int8."""
    w = _constant_or_none(weight, params)
    zp = np.zeros(1, "int64") if zero_point is None else _constant_or_none(zero_point, params)
    if w is None or zp is None or str(w.dtype) not in ("uint8", "int8"):
        return None
    shift = 128 if str(w.dtype) == "uint8" else 0
    if np.any(zp.astype(np.int64) - shift != 0):
        return None
    return (w.astype(np.int64) - shift).astype("int8")


def _scalar_zero_point(zero_point, params) -> int | None:
    """A constant scalar zero point as an int (0 when absent), or None."""
    if zero_point is None:
        return 0
    zp = _constant_or_none(zero_point, params)
    return int(zp.reshape(-1)[0]) if zp is not None and zp.size == 1 else None


class ConvInteger(stock.OnnxOpConverter):
    """ConvInteger(x, w[, x_zp, w_zp]) -> int32 (missing in TVM). With a constant weight whose
    zero point is 0 (int8), or 128 (uint8, moved to int8), a constant scalar x_zp and explicit
    pads of a 2-D conv: x padded with x_zp, ``conv2d(x, w8, out_dtype="int32")`` (the int8
    kernels' call) minus ``x_zp * sum(w8)`` per output channel. Otherwise the conv of
    ``x - x_zp`` and ``w - w_zp`` widened to int32, exact but on TVM's kernels."""

    @classmethod
    def _impl_v10(cls, bb, inputs, attr, params):
        x, w = inputs[0], inputs[1]
        w8 = _int8_weights(w, _input(inputs, 3), params)
        zx = _scalar_zero_point(_input(inputs, 2), params)
        auto_pad = attr.get("auto_pad", b"NOTSET")
        auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
        if w8 is None or zx is None or w8.ndim != 4 or auto_pad not in ("NOTSET", "VALID"):
            return cls._widened(bb, inputs, attr, params)
        pads = [int(p) for p in attr.get("pads", [0] * 4)] if auto_pad == "NOTSET" else [0] * 4
        top, left, bottom, right = pads
        if any(pads):
            x = bb.normalize(relax.op.nn.pad(x, [0, 0, 0, 0, top, bottom, left, right], "constant", float(zx)))
        conv = relax.op.nn.conv2d(
            x,
            array_constant(w8),
            strides=[int(v) for v in attr.get("strides", [1, 1])],
            dilation=[int(v) for v in attr.get("dilations", [1, 1])],
            groups=int(attr.get("group", 1)),
            out_dtype="int32",
        )
        if zx == 0:
            return conv
        correction = (zx * w8.astype(np.int64).reshape(w8.shape[0], -1).sum(axis=1)).astype("int32")
        return relax.op.subtract(bb.normalize(conv), array_constant(correction.reshape(1, -1, 1, 1)))

    @classmethod
    def _widened(cls, bb, inputs, attr, params):
        def centred(value, zero_point, axis):
            value = relax.op.astype(value, "int32")
            if zero_point is None:
                return bb.normalize(value)
            zp = bb.normalize(relax.op.astype(zero_point, "int32"))
            if zp.ty.ndim == 1 and int(zp.ty.shape[0]) > 1:  # per output channel of the weight
                zp = relax.op.reshape(zp, [-1] + [1] * (value.ty.ndim - 1) if axis == 0 else [1, -1])
            return bb.normalize(relax.op.subtract(value, zp))

        x = centred(inputs[0], _input(inputs, 2), 1)
        w = centred(inputs[1], _input(inputs, 3), 0)
        return stock.Conv.get_converter(11)(bb, stock.onnx_input([x, w]), attr, params)


class MatMulInteger(stock.MatMulInteger):
    """MatMulInteger(a, b[, a_zp, b_zp]) -> int32. With a constant b whose zero point is 0
    (int8; uint8 with 128 moved to int8) and a scalar a_zp (a constant or a runtime scalar, as
    DynamicQuantizeLinear makes it): ``matmul(a, b8, out_dtype="int32")`` (the int8 kernels'
    call) minus ``a_zp * sum_k b8[k, n]``. Otherwise TVM's converter (widened to int32)."""

    @classmethod
    def _impl_v10(cls, bb, inputs, attr, params):
        a, b = inputs[0], inputs[1]
        b8 = _int8_weights(b, _input(inputs, 3), params)
        za = _input(inputs, 2)
        scalar = za is None or all(int(d) == 1 for d in bb.normalize(za).ty.shape)
        if b8 is None or b8.ndim != 2 or not scalar:
            return super()._impl_v10(bb, inputs, attr, params)
        y = relax.op.matmul(a, array_constant(b8), out_dtype="int32")
        if za is None:
            return y
        column_sums = array_constant(b8.astype(np.int64).sum(axis=0).astype("int32"))
        za32 = relax.op.reshape(relax.op.astype(za, "int32"), [])
        return relax.op.subtract(bb.normalize(y), relax.op.multiply(za32, column_sums))


CONVERTERS = {
    **CORRECTED,
    "Resize": Resize,
    "Pad": Pad,
    "ConstantOfShape": ConstantOfShape,
    "Clip": Clip,
    "Celu": Celu,
    "QLinearConv": QLinearConv,
    "QLinearMatMul": QLinearMatMul,
    "ConvInteger": ConvInteger,
    "MatMulInteger": MatMulInteger,
}


def accel_converters():
    """Within the block, TVM's ONNX importer converts with CONVERTERS on top of its own."""
    return tvm_private.onnx_converters(CONVERTERS)


__all__ = ["CONVERTERS", "accel_converters", "fold_constant_inputs"]
