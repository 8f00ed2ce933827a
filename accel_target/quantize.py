"""Quantized graphs (quantize / dequantize, "QDQ") to the integer kernels' calls, before layout conversion.

`QuantizeQDQ` rewrites every Relax function of a module:

- ``conv2d(dequantize(x_q), dequantize(w_q))`` [``+ bias``] [``-> relu / clip``] [``-> quantize``]
  into ``conv2d(x_q, w_q, out_dtype="int32")`` and an elementwise requantize after it:
  ``astype(float32) * scale[oc] + bias'[oc]``, then, when a quantize follows, ``round -> + zp_y
  -> clip(lo, hi) -> astype(uint8 / int8)`` (a ReLU or clip before the quantize becomes the
  clip's bounds). The activation's zero point is padded explicitly (``nn.pad`` with
  ``pad_value=zp_x``, the conv's padding 0) and its ``zp_x * sum(w)`` is folded into ``bias'``;
- ``matmul(dequantize(x_q), dequantize(w_q))`` likewise into ``matmul(x_q, w_q, out_dtype="int32")``,
  the weight folded to int8 ``[in, out]`` (a transpose of it is applied at compile time);
- ``quantize(op(dequantize(x_q)))`` with the same scale and zero point on both sides, for an op
  that only moves or selects values (max pooling, pad, reshape, permute, squeeze, concat),
  into ``op(x_q)``: the tensor stays integer (a pad pads with the zero point);
- every other quantize / dequantize into plain elementwise ops (``(astype(x) - zp) * scale``,
  ``clip(round(x / scale) + zp)``), which have layout inference.

Weights must be constants with per-output-channel (or per-tensor) scales and zero point 0 (or
one that keeps ``w - zp`` in int8); activations per-tensor uint8 or int8. Anything else stays
float: a conv on dequantized (folded) weights, shown as float32 in the report. Never wrong.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from strategy.layout import array_constant, constant_array, static_shape

from .reporting import calls_of
from .transforms import NUMPY_OPS, numpy_call

QUANTIZE = "relax.quantize"
DEQUANTIZE = "relax.dequantize"
CONV2D = "relax.nn.conv2d"
MATMUL = "relax.matmul"
ADD = "relax.add"
ACTIVATION_DTYPES = ("uint8", "int8")
WEIGHT_DTYPE = "int8"
# ops that move or select values: quantize(op(dequantize(x))) == op(x) under equal parameters
DATA_MOVEMENT = {
    "relax.nn.max_pool2d",
    "relax.nn.pad",
    "relax.reshape",
    "relax.permute_dims",
    "relax.squeeze",
    "relax.expand_dims",
    "relax.concat",
}
FLOAT = "float32"


@dataclass(frozen=True)
class QParams:
    """Quantization parameters of a quantize / dequantize call: scale and zero point (0-D, or
    1-D along `axis`), the integer dtype."""

    scale: np.ndarray
    zero_point: np.ndarray
    axis: int
    dtype: str

    @property
    def per_tensor(self) -> bool:
        return self.scale.size == 1 and self.zero_point.size == 1

    @property
    def s(self) -> float:
        """The per-tensor scale."""
        return float(self.scale.item())

    @property
    def zp(self) -> int:
        """The per-tensor zero point."""
        return int(self.zero_point.item())

    def same(self, other: QParams) -> bool:
        return (
            self.per_tensor
            and other.per_tensor
            and self.dtype == other.dtype
            and self.s == other.s
            and self.zp == other.zp
        )

    def along(self, values: np.ndarray, ndim: int) -> np.ndarray:
        """`values` (one per channel, or one) shaped to broadcast over a rank-`ndim` tensor at `axis`
        (full rank: [1, C, 1, 1] for axis 1 of an NCHW tensor), a scalar when there is one."""
        if values.size == 1:
            return values.reshape(())
        axis = self.axis % ndim
        return values.reshape([1] * axis + [-1] + [1] * (ndim - 1 - axis))


def _op_name(expr) -> str | None:
    if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
        return expr.op.name
    return None


def _integer_limits(dtype: str) -> tuple[int, int]:
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


@dataclass(frozen=True)
class IntegerKernel:
    """A conv2d / matmul whose operands are a dequantized activation and a constant quantized weight.

    data: the integer activation (original expression); x: its parameters;
    weight: int8 array in the call's weight layout ([in, out] for a matmul);
    w_scale, w_sum: per output channel (1-D, length oc); channel_axis: of the output.
    """

    call: relax.Call
    data: relax.Expr
    x: QParams
    weight: np.ndarray
    w_scale: np.ndarray
    w_sum: np.ndarray
    channel_axis: int
    out_ndim: int


@mutator
class _QDQRewriter(PyExprMutator):
    """Pattern matching reads the function as it was (`self.bound`: original var -> value);
    what is emitted refers to the rewritten variables (`self.visit_expr(original var)`)."""

    def __init__(self, mod: tvm.IRModule):
        super().__init__(mod)
        self.bound: dict[relax.Var, relax.Expr] = {}
        self.uses: dict[relax.Var, int] = {}
        # original conv2d / matmul -> its IntegerKernel or None (a call is matched when visited
        # and again by the quantize after it)
        self.kernels: dict[relax.Call, IntegerKernel | None] = {}

    def visit_function_(self, func: relax.Function) -> relax.Expr:
        self.bound, self.uses = dict(relax.analysis.get_var2val(func)), _uses(func)
        self.kernels = {}
        return super().visit_function_(func)

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        name = _op_name(call)
        new = None
        if name in (CONV2D, MATMUL):
            new = self._float_result(call)
        elif name == QUANTIZE:
            new = self._quantize(call)
        elif name == DEQUANTIZE:
            new = self._dequantize(call)
        return self.visit_expr_post_order(call) if new is None else new

    # -- reading the original function
    def _value(self, expr: relax.Expr) -> relax.Expr:
        """What an original variable is bound to (the expression itself otherwise), through
        an item of a tuple built in the function (PyTorch's max_pool2d_with_indices)."""
        value = self.bound.get(expr, expr) if isinstance(expr, relax.Var) else expr
        if isinstance(value, relax.TupleGetItem):
            fields = self._value(value.tuple_value)
            if isinstance(fields, relax.Tuple):
                return self._value(fields.fields[value.index])
        return value

    def _evaluate(self, expr: relax.Expr) -> np.ndarray | None:
        """The value of an expression of constants only (dequantize, and the ops of
        transforms.NUMPY_OPS: reshape, permute, astype, arithmetic...), in numpy; None if it
        depends on anything else."""
        expr = self._value(expr)
        if isinstance(expr, tvm.ir.expr.Constant):
            return constant_array(expr)
        name = _op_name(expr)
        if name != DEQUANTIZE and name not in NUMPY_OPS:
            return None
        tensors = [self._evaluate(a) for a in expr.args if isinstance(getattr(a, "ty", None), relax.TensorType)]
        if any(t is None for t in tensors):
            return None
        return _dequantize_numpy(expr, *tensors) if name == DEQUANTIZE else numpy_call(name, expr, tensors)

    def _qparams(self, call: relax.Call) -> QParams | None:
        scale, zero_point = self._evaluate(call.args[1]), self._evaluate(call.args[2])
        if scale is None or zero_point is None:
            return None
        dtype = str(call.attrs.out_dtype) if _op_name(call) == QUANTIZE else str(call.args[0].ty.dtype)
        axis = int(call.attrs.axis)
        return QParams(scale.astype(FLOAT).reshape(-1), zero_point.astype(np.int64).reshape(-1), axis, dtype)

    def _dequantized(self, expr: relax.Expr) -> tuple[relax.Expr, QParams] | None:
        """(integer activation, its per-tensor parameters) if `expr` is a dequantized activation."""
        value = self._value(expr)
        if _op_name(value) != DEQUANTIZE or self._evaluate(value.args[0]) is not None:
            return None
        params = self._qparams(value)
        if params is None or not params.per_tensor or params.dtype not in ACTIVATION_DTYPES:
            return None
        return value.args[0], params

    def _quantized_weight(self, expr: relax.Expr, out_axis: int) -> tuple[np.ndarray, np.ndarray] | None:
        """(int8 weight, scale per output channel) of a dequantized constant weight, through
        permutes of it; None unless its scale varies along `out_axis` only and w - zp fits int8."""
        perms = []
        value = self._value(expr)
        while _op_name(value) == "relax.permute_dims":
            perms.append(None if value.attrs.axes is None else [int(a) for a in value.attrs.axes])
            value = self._value(value.args[0])
        if _op_name(value) != DEQUANTIZE:
            return None
        w_q, params = self._evaluate(value.args[0]), self._qparams(value)
        if w_q is None or params is None or w_q.dtype.kind not in "iu":
            return None
        ndim = w_q.ndim
        w = w_q.astype(np.int64) - params.along(params.zero_point, ndim)
        scale = np.broadcast_to(params.along(params.scale, ndim), w.shape)
        for axes in reversed(perms):
            w, scale = np.transpose(w, axes), np.transpose(scale, axes)
        lo, hi = _integer_limits(WEIGHT_DTYPE)
        if w.min(initial=0) < lo or w.max(initial=0) > hi:
            return None
        per_channel = np.moveaxis(scale, out_axis, 0).reshape(scale.shape[out_axis], -1)
        if not (per_channel == per_channel[:, :1]).all():
            return None
        return w.astype(WEIGHT_DTYPE), np.ascontiguousarray(per_channel[:, 0])

    def _integer_kernel(self, call: relax.Call) -> IntegerKernel | None:
        """`call` (conv2d or matmul) as an IntegerKernel, or None if it does not fit the contract."""
        if call not in self.kernels:
            self.kernels[call] = self._match_kernel(call)
        return self.kernels[call]

    def _match_kernel(self, call: relax.Call) -> IntegerKernel | None:
        data = self._dequantized(call.args[0])
        out_shape = static_shape(call)
        if data is None or out_shape is None or static_shape(call.args[0]) is None:
            return None
        if _op_name(call) == CONV2D:
            attrs = call.attrs
            o_axis = str(attrs.kernel_layout).index("O")
            channel_axis = str(attrs.out_layout).index("C")
            reduce_axes = tuple(a for a in range(4) if a != o_axis)
        else:
            if len(static_shape(call.args[1]) or []) != 2:
                return None
            o_axis, channel_axis, reduce_axes = 1, len(out_shape) - 1, (0,)
        weight = self._quantized_weight(call.args[1], o_axis)
        if weight is None:
            return None
        w, w_scale = weight
        w_sum = w.astype(np.int64).sum(axis=reduce_axes)
        return IntegerKernel(call, data[0], data[1], w, w_scale, w_sum, channel_axis, len(out_shape))

    # -- emitting
    def _channel_const(self, values: np.ndarray, kernel: IntegerKernel) -> tvm.ir.expr.Constant:
        """Per-output-channel values as a constant broadcasting over the output ([1, oc, 1, 1] in NCHW, [oc] last)."""
        shape = [-1]
        if kernel.channel_axis != kernel.out_ndim - 1:
            shape = [1] * kernel.out_ndim
            shape[kernel.channel_axis] = -1
        return relax.const(np.ascontiguousarray(values, dtype=FLOAT).reshape(shape))

    def _emit_accumulator(self, kernel: IntegerKernel) -> relax.Expr:
        """The int32 conv2d / matmul of the integer activation and the int8 weight (emitted)."""
        data = self.visit_expr(kernel.data)
        weight = relax.const(kernel.weight)
        call = kernel.call
        if _op_name(call) == MATMUL:
            return self.builder_.emit(relax.op.matmul(data, weight, out_dtype="int32"))
        attrs, padding = call.attrs, [int(p) for p in call.attrs.padding]
        zero_point = kernel.x.zp
        if zero_point != 0 and any(padding):
            layout = str(attrs.data_layout)
            widths = {"H": (padding[0], padding[2]), "W": (padding[1], padding[3])}
            pad_width = [w for axis in layout for w in widths.get(axis, (0, 0))]
            data = self.builder_.emit(relax.op.nn.pad(data, pad_width, pad_value=float(zero_point)))
            padding = [0, 0, 0, 0]
        conv = relax.op.nn.conv2d(
            data,
            weight,
            strides=attrs.strides,
            padding=padding,
            dilation=attrs.dilation,
            groups=attrs.groups,
            data_layout=attrs.data_layout,
            kernel_layout=attrs.kernel_layout,
            out_layout=attrs.out_layout,
            out_dtype="int32",
        )
        return self.builder_.emit(conv)

    def _dequantized_result(self, kernel: IntegerKernel, bias: np.ndarray, divisor: float = 1.0) -> relax.Expr:
        """(astype(acc) * scale + bias') / divisor as astype -> multiply -> add (emitted, float32)."""
        scale = kernel.x.s * kernel.w_scale.astype(np.float64)
        folded = bias - kernel.x.zp * scale * kernel.w_sum
        acc = self._emit_accumulator(kernel)
        as_float = self.builder_.emit(relax.op.astype(acc, FLOAT))
        scaled = self.builder_.emit(relax.op.multiply(as_float, self._channel_const(scale / divisor, kernel)))
        return relax.op.add(scaled, self._channel_const(folded / divisor, kernel))

    def _float_result(self, call: relax.Call) -> relax.Expr | None:
        """An integer conv2d / matmul with the float result of `call` (dequantized operands)."""
        kernel = self._integer_kernel(call)
        if kernel is None:
            return None
        return self._dequantized_result(kernel, np.zeros(len(kernel.w_scale)))

    def _quantize(self, call: relax.Call) -> relax.Expr | None:
        y = self._qparams(call)
        if y is None:
            return None
        if y.per_tensor:
            new = self._requantized(call.args[0], y)
            if new is None:
                new = self._integer_data_movement(call.args[0], y)
            if new is not None:
                return new
            permute = self._value(call.args[0])
            if _op_name(permute) == "relax.permute_dims":  # quantize first: the permute may then cancel
                quantized = self.builder_.emit(self._quantize_elementwise(self.visit_expr(permute.args[0]), y))
                return relax.op.permute_dims(quantized, permute.attrs.axes)
        return self._quantize_elementwise(self.visit_expr(call.args[0]), y)

    def _single_use(self, expr) -> bool:
        return isinstance(expr, relax.Var) and self.uses.get(expr, 0) == 1 and expr in self.bound

    def _requantized(self, expr: relax.Expr, y: QParams) -> relax.Expr | None:
        """quantize(kernel [+ bias] [-> clamps]) as the integer kernel and its requantize, when every
        value between the kernel and the quantize is used once."""
        clamps, bias = [], None
        while self._single_use(expr):
            value = self.bound[expr]
            bounds = self._clamp_bounds(value)
            if bounds is not None and bias is None:
                clamps.append(bounds)
            elif _op_name(value) == ADD and bias is None:
                bias = self._evaluate(value.args[1])
                if bias is None:
                    return None
            elif _op_name(value) in (CONV2D, MATMUL):
                return self._requantize(value, bias, clamps, y)
            else:
                return None
            expr = value.args[0]
        return None

    def _requantize(self, call: relax.Call, bias: np.ndarray | None, clamps: list, y: QParams) -> relax.Expr | None:
        """The integer kernel of `call` requantized to `y`: its float `bias` (None: none) added,
        clamped by `clamps` ((lo, hi) of each ReLU / clip, outermost first)."""
        kernel = self._integer_kernel(call)
        if kernel is None:
            return None
        bias = np.zeros(len(kernel.w_scale)) if bias is None else self._per_channel(bias, kernel)
        if bias is None:
            return None
        lo, hi = -np.inf, np.inf
        for c_lo, c_hi in reversed(clamps):  # innermost first
            lo, hi = float(np.clip(lo, c_lo, c_hi)), float(np.clip(hi, c_lo, c_hi))
        scale, zero_point = y.s, y.zp
        q_lo, q_hi = _integer_limits(y.dtype)
        if lo > -np.inf:
            q_lo = max(q_lo, int(np.round(lo / scale)) + zero_point)
        if hi < np.inf:
            q_hi = min(q_hi, int(np.round(hi / scale)) + zero_point)
        value = self.builder_.emit(self._dequantized_result(kernel, bias, scale))
        rounded = self.builder_.emit(relax.op.round(value))
        shifted = rounded
        if zero_point != 0:
            shifted = self.builder_.emit(relax.op.add(rounded, relax.const(float(zero_point), FLOAT)))
        clipped = self.builder_.emit(relax.op.clip(shifted, float(q_lo), float(max(q_lo, q_hi))))
        return relax.op.astype(clipped, y.dtype)

    def _per_channel(self, values: np.ndarray, kernel: IntegerKernel) -> np.ndarray | None:
        """A bias that broadcasts over the output along its channel axis only, as one value per channel."""
        channels = len(kernel.w_scale)
        if values.ndim > kernel.out_ndim:
            return None
        shape = [1] * (kernel.out_ndim - values.ndim) + list(values.shape)
        others = [d for i, d in enumerate(shape) if i != kernel.channel_axis]
        if any(d != 1 for d in others) or shape[kernel.channel_axis] not in (1, channels):
            return None
        return np.broadcast_to(values.astype(np.float64).reshape(-1), (channels,))

    def _clamp_bounds(self, value: relax.Expr) -> tuple[float, float] | None:
        """(lo, hi) of a ReLU, clip, or maximum / minimum with a scalar constant, else None."""
        name = _op_name(value)
        if name == "relax.nn.relu":
            return 0.0, np.inf
        if name == "relax.clip":
            return float(value.args[1].value), float(value.args[2].value)
        if name in ("relax.maximum", "relax.minimum"):
            bound = self._evaluate(value.args[1])
            if bound is None or bound.size != 1:
                return None
            return (float(bound), np.inf) if name == "relax.maximum" else (-np.inf, float(bound))
        return None

    def _integer_data_movement(self, expr: relax.Expr, y: QParams) -> relax.Expr | None:
        """quantize(op(dequantize(x_q), ...)) -> op(x_q, ...) for an op that moves values, all
        parameters equal; quantize(dequantize(x_q)) -> x_q."""
        value = self._value(expr)
        if _op_name(value) == DEQUANTIZE:
            source = self._dequantized(expr)
            return self.visit_expr(source[0]) if source is not None and source[1].same(y) else None
        name = _op_name(value)
        if name not in DATA_MOVEMENT:
            return None
        if name == "relax.concat":
            return self._integer_concat(self._value(value.args[0]), value.attrs.axis, y)
        source = self._dequantized(value.args[0])
        if source is None or not source[1].same(y):
            return None
        data = self.visit_expr(source[0])
        if name == "relax.nn.pad":
            attrs = value.attrs
            quantized = np.round(float(attrs.pad_value) / y.s) + y.zp
            pad_value = float(np.clip(quantized, *_integer_limits(y.dtype)))
            return relax.op.nn.pad(data, [int(w) for w in attrs.pad_width], str(attrs.pad_mode), pad_value)
        args = [data] + [self.visit_expr(a) for a in value.args[1:]]
        return relax.Call(value.op, args, value.attrs)

    def _integer_concat(self, fields: relax.Expr, axis, y: QParams) -> relax.Expr | None:
        """concat of dequantized tensors that all have the output's parameters, in integers."""
        parts = [self._dequantized(f) for f in fields.fields] if isinstance(fields, relax.Tuple) else [None]
        if any(p is None or not p[1].same(y) for p in parts):
            return None
        return relax.op.concat(relax.Tuple([self.visit_expr(p[0]) for p in parts]), axis=axis)

    def _quantize_elementwise(self, data: relax.Expr, y: QParams) -> relax.Expr:
        """clip(round(x / scale) + zp, dtype limits) -> astype, as elementwise ops."""
        ndim = data.ty.ndim
        scaled = self.builder_.emit(relax.op.divide(data, relax.const(y.along(y.scale, ndim), FLOAT)))
        rounded = self.builder_.emit(relax.op.round(scaled))
        shifted = rounded
        if y.zero_point.any():
            zero_point = relax.const(y.along(y.zero_point, ndim).astype(FLOAT))
            shifted = self.builder_.emit(relax.op.add(rounded, zero_point))
        lo, hi = _integer_limits(y.dtype)
        return relax.op.astype(self.builder_.emit(relax.op.clip(shifted, float(lo), float(hi))), y.dtype)

    def _dequantize(self, call: relax.Call) -> relax.Expr | None:
        """(astype(x) - zp) * scale as elementwise ops; a constant's value folded."""
        folded = self._evaluate(call)
        if folded is not None:
            return array_constant(folded.astype(str(call.attrs.out_dtype)))
        params = self._qparams(call)
        if params is None:
            return None
        data = self.visit_expr(call.args[0])
        ndim = data.ty.ndim
        as_float = self.builder_.emit(relax.op.astype(data, FLOAT))
        centred = as_float
        if params.zero_point.any():
            zero_point = relax.const(params.along(params.zero_point, ndim).astype(FLOAT))
            centred = self.builder_.emit(relax.op.subtract(as_float, zero_point))
        result = relax.op.multiply(centred, relax.const(params.along(params.scale, ndim), FLOAT))
        out_dtype = str(call.attrs.out_dtype)
        return result if out_dtype == FLOAT else relax.op.astype(self.builder_.emit(result), out_dtype)


def _dequantize_numpy(call, data, scale, zero_point):
    params = QParams(scale.reshape(-1), zero_point.reshape(-1), int(call.attrs.axis), str(data.dtype))
    centred = data.astype(np.float64) - params.along(params.zero_point, data.ndim).astype(np.float64)
    return (centred * params.along(params.scale, data.ndim).astype(np.float64)).astype(str(call.attrs.out_dtype))


def _uses(func: relax.Function) -> dict[relax.Var, int]:
    """var -> number of its uses in `func`."""
    uses = {}

    def count(expr):
        if isinstance(expr, relax.Var):
            uses[expr] = uses.get(expr, 0) + 1

    for block in func.body.blocks:
        for binding in block.bindings:
            relax.analysis.post_order_visit(binding.value, count)
    relax.analysis.post_order_visit(func.body.body, count)
    return uses


def has_qdq(mod: tvm.IRModule) -> bool:
    """Whether any Relax function of `mod` calls quantize or dequantize."""
    return any(
        calls_of(mod, (QUANTIZE, DEQUANTIZE), gvar.name_hint)
        for gvar, func in mod.functions_items()
        if isinstance(func, relax.Function)
    )


@tvm.transform.module_pass(opt_level=0, name="QuantizeQDQ")
def quantize_qdq(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    """QDQ patterns to integer conv2d / matmul with their requantize, the other quantize and
    dequantize calls to elementwise ops (module docstring); a module without them as it is."""
    if not has_qdq(mod):
        return mod
    rewriter = _QDQRewriter(mod)
    for gvar, func in mod.functions_items():
        if isinstance(func, relax.Function):
            rewriter.builder_.update_func(gvar, rewriter.visit_expr(func))
    return relax.transform.DeadCodeElimination()(rewriter.builder_.get())


__all__ = ["QParams", "has_qdq", "quantize_qdq"]
