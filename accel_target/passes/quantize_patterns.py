"""The QDQ forms of QuantizeQDQ as `relax.dpl` patterns, and what a match means for the integer kernels.

Matching reads a function as the importer left it (`FunctionView`: its bindings, each
variable's uses); nothing here emits IR (quantize_builders does). The forms, the integer
activation ``x_q`` per-tensor uint8 / int8 and the weight a dequantized constant:

- KERNEL: ``conv2d / matmul(dequantize(x_q), weight)``, the weight through permutes of it
  (`integer_kernel` -> IntegerKernel);
- the requantized kernel: ``quantize(clamp(... clamp(add(KERNEL, bias))))``, the bias add and
  the clamps (ReLU, clip, maximum / minimum with a scalar constant) optional, each value
  between the kernel and the quantize used once (`requantize_plan` -> Requantize);
- MOVED / CONCAT / REQUANTIZED: ``quantize(op(dequantize(x_q), ...))`` for an op that only
  moves or selects values, ``quantize(concat(dequantize(a_q), ...))``,
  ``quantize(dequantize(x_q))``, all parameters equal (`movement_plan` -> Movement);
- QUANTIZED_PERMUTE: ``quantize(permute_dims(x))``, quantized before the permute.
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import DFPattern, is_op, wildcard

from strategy.layout import constant_array, static_shape

from .fold_numpy import NUMPY_OPS, numpy_call
from .relax_util import op_name

QUANTIZE = "relax.quantize"
DEQUANTIZE = "relax.dequantize"
CONV2D = "relax.nn.conv2d"
MATMUL = "relax.matmul"
PERMUTE_DIMS = "relax.permute_dims"
CONCAT_OP = "relax.concat"
ACTIVATION_DTYPES = ("uint8", "int8")
WEIGHT_DTYPE = "int8"
FLOAT = "float32"
# ops that move or select values: quantize(op(dequantize(x))) == op(x) under equal parameters
DATA_MOVEMENT = (
    "relax.nn.max_pool2d",
    "relax.nn.pad",
    "relax.reshape",
    "relax.permute_dims",
    "relax.squeeze",
    "relax.expand_dims",
)


def _any_op(names) -> DFPattern:
    """A pattern for the op of any of `names`."""
    return functools.reduce(operator.or_, [is_op(name) for name in names])


def _quantize(data: DFPattern) -> DFPattern:
    """quantize(data, scale, zero point)."""
    return is_op(QUANTIZE)(data, wildcard(), wildcard())


DEQUANTIZED = is_op(DEQUANTIZE)(wildcard(), wildcard(), wildcard())
# conv2d / matmul of a dequantized activation; the weight, a dequantized constant through
# permutes of it, is read by quantized_weight
WEIGHT = wildcard()
KERNEL = _any_op([CONV2D, MATMUL])(DEQUANTIZED, WEIGHT)
PERMUTE = is_op(PERMUTE_DIMS)(wildcard())
BIAS_ADD = is_op("relax.add")(wildcard(), wildcard())
# quantize(op(dequantize(x_q), ...)), quantize(concat(...)), quantize(dequantize(x_q)), quantize(permute_dims(x))
MOVEMENT_OP = _any_op(DATA_MOVEMENT)(DEQUANTIZED, varg_default_wildcard=True)
MOVED = _quantize(MOVEMENT_OP)
CONCAT_CALL = is_op(CONCAT_OP)(wildcard())
CONCAT = _quantize(CONCAT_CALL)
REQUANTIZED = _quantize(DEQUANTIZED)
QUANTIZED_PERMUTE = _quantize(PERMUTE)
# clamps before a quantize: (pattern, (view, call) -> (lo, hi) or None)
CLAMPS = [
    (is_op("relax.nn.relu")(wildcard()), lambda view, call: (0.0, np.inf)),
    (
        is_op("relax.clip")(wildcard(), wildcard(), wildcard()),
        lambda view, call: (float(call.args[1].value), float(call.args[2].value)),
    ),
    (is_op("relax.maximum")(wildcard(), wildcard()), lambda view, call: _scalar_bound(view, call, True)),
    (is_op("relax.minimum")(wildcard(), wildcard()), lambda view, call: _scalar_bound(view, call, False)),
]


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


@dataclass(frozen=True)
class Requantize:
    """A kernel requantized to `y`: its float `bias` (one per output channel) added, the result
    clipped to [lo, hi] in `y`'s integers (the dtype's limits narrowed by the clamps)."""

    kernel: IntegerKernel
    bias: np.ndarray
    lo: int
    hi: int
    y: QParams


@dataclass(frozen=True)
class Movement:
    """quantize(op(dequantize(x_q), ...)) as `op` (None: quantize(dequantize(x_q))) on the integer
    `sources` (original expressions; one per field of a concat)."""

    op: relax.Call | None
    sources: list[relax.Expr]
    y: QParams


def integer_limits(dtype: str) -> tuple[int, int]:
    """(min, max) of an integer dtype."""
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


class FunctionView:
    """A Relax function as it was before the rewrite: what each variable is bound to and how often
    it is used, its constant subexpressions' values, and its QDQ forms (`match`)."""

    def __init__(self, func: relax.Function):
        self.bound: dict[relax.Var, relax.Expr] = dict(relax.analysis.get_var2val(func))
        self.uses = count_uses(func)
        # for the patterns: each variable bound to a value, through tuple items (`value`)
        values = {var: self.value(var) for var in self.bound}
        self._var2val = tvm.runtime.convert({k: v for k, v in values.items() if not isinstance(v, relax.Var)})
        self._kernels: dict[relax.Call, IntegerKernel | None] = {}

    def value(self, expr: relax.Expr) -> relax.Expr:
        """What an original variable is bound to (the expression itself otherwise), through
        an item of a tuple built in the function (PyTorch's max_pool2d_with_indices)."""
        value = self.bound.get(expr, expr) if isinstance(expr, relax.Var) else expr
        if isinstance(value, relax.TupleGetItem):
            fields = self.value(value.tuple_value)
            if isinstance(fields, relax.Tuple):
                return self.value(fields.fields[value.index])
        return value

    def match(self, pattern: DFPattern, expr: relax.Expr) -> dict | None:
        """pattern -> matched expression where `pattern` matches `expr` through the bindings, else None."""
        return pattern.extract_matched_expr(expr, self._var2val)

    def single_use_value(self, expr: relax.Expr) -> relax.Expr | None:
        """What `expr` is bound to where it is a variable used once, else None."""
        if isinstance(expr, relax.Var) and self.uses.get(expr, 0) == 1 and expr in self.bound:
            return self.bound[expr]
        return None

    def evaluate(self, expr: relax.Expr) -> np.ndarray | None:
        """The value of an expression of constants only (dequantize, and the ops of
        fold_numpy.NUMPY_OPS: reshape, permute, astype, arithmetic...), in numpy; None if it
        depends on anything else."""
        expr = self.value(expr)
        if isinstance(expr, tvm.ir.expr.Constant):
            return constant_array(expr)
        name = op_name(expr)
        if name != DEQUANTIZE and name not in NUMPY_OPS:
            return None
        tensors = [self.evaluate(a) for a in expr.args if isinstance(getattr(a, "ty", None), relax.TensorType)]
        if any(t is None for t in tensors):
            return None
        return dequantize_numpy(expr, *tensors) if name == DEQUANTIZE else numpy_call(name, expr, tensors)

    def qparams(self, call: relax.Call) -> QParams | None:
        """The parameters of a quantize / dequantize call; None unless scale and zero point are constant."""
        scale, zero_point = self.evaluate(call.args[1]), self.evaluate(call.args[2])
        if scale is None or zero_point is None:
            return None
        dtype = str(call.attrs.out_dtype) if op_name(call) == QUANTIZE else str(call.args[0].ty.dtype)
        axis = int(call.attrs.axis)
        return QParams(scale.astype(FLOAT).reshape(-1), zero_point.astype(np.int64).reshape(-1), axis, dtype)

    def activation(self, dequantize: relax.Call) -> tuple[relax.Expr, QParams] | None:
        """(integer activation, its parameters) of a dequantize call of a per-tensor uint8 / int8
        tensor that is no constant, else None."""
        if self.evaluate(dequantize.args[0]) is not None:
            return None
        params = self.qparams(dequantize)
        if params is None or not params.per_tensor or params.dtype not in ACTIVATION_DTYPES:
            return None
        return dequantize.args[0], params

    def dequantized(self, expr: relax.Expr) -> tuple[relax.Expr, QParams] | None:
        """(integer activation, its parameters) if `expr` is a dequantized activation."""
        matched = self.match(DEQUANTIZED, expr)
        return None if matched is None else self.activation(matched[DEQUANTIZED])

    def kernel(self, call: relax.Call) -> IntegerKernel | None:
        """`call` (conv2d or matmul) as an IntegerKernel, once per call (a kernel is read when
        visited and again by the quantize after it)."""
        if call not in self._kernels:
            self._kernels[call] = integer_kernel(self, call)
        return self._kernels[call]


def quantized_weight(view: FunctionView, expr: relax.Expr, out_axis: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(int8 weight, scale per output channel) of a dequantized constant weight, through
    permutes of it; None unless its scale varies along `out_axis` only and w - zp fits int8."""
    perms = []
    while (permute := view.match(PERMUTE, expr)) is not None:
        axes = permute[PERMUTE].attrs.axes
        perms.append(None if axes is None else [int(a) for a in axes])
        expr = permute[PERMUTE].args[0]
    matched = view.match(DEQUANTIZED, expr)
    if matched is None:
        return None
    w_q, params = view.evaluate(matched[DEQUANTIZED].args[0]), view.qparams(matched[DEQUANTIZED])
    if w_q is None or params is None or w_q.dtype.kind not in "iu":
        return None
    ndim = w_q.ndim
    w = w_q.astype(np.int64) - params.along(params.zero_point, ndim)
    scale = np.broadcast_to(params.along(params.scale, ndim), w.shape)
    for axes in reversed(perms):
        w, scale = np.transpose(w, axes), np.transpose(scale, axes)
    lo, hi = integer_limits(WEIGHT_DTYPE)
    if w.min(initial=0) < lo or w.max(initial=0) > hi:
        return None
    per_channel = np.moveaxis(scale, out_axis, 0).reshape(scale.shape[out_axis], -1)
    if not (per_channel == per_channel[:, :1]).all():
        return None
    return w.astype(WEIGHT_DTYPE), np.ascontiguousarray(per_channel[:, 0])


def integer_kernel(view: FunctionView, call: relax.Call) -> IntegerKernel | None:
    """`call` as an IntegerKernel where it is a KERNEL that fits the contract (static shapes,
    the weight's scale per output channel, w - zp in int8), else None."""
    matched = view.match(KERNEL, call)
    data = None if matched is None else view.activation(matched[DEQUANTIZED])
    out_shape = static_shape(call)
    if data is None or out_shape is None or static_shape(call.args[0]) is None:
        return None
    if op_name(call) == CONV2D:
        attrs = call.attrs
        o_axis = str(attrs.kernel_layout).index("O")
        channel_axis = str(attrs.out_layout).index("C")
        reduce_axes = tuple(a for a in range(4) if a != o_axis)
    else:
        if len(static_shape(call.args[1]) or []) != 2:
            return None
        o_axis, channel_axis, reduce_axes = 1, len(out_shape) - 1, (0,)
    weight = quantized_weight(view, call.args[1], o_axis)
    if weight is None:
        return None
    w, w_scale = weight
    w_sum = w.astype(np.int64).sum(axis=reduce_axes)
    return IntegerKernel(call, data[0], data[1], w, w_scale, w_sum, channel_axis, len(out_shape))


def _scalar_bound(view: FunctionView, call: relax.Call, lower: bool) -> tuple[float, float] | None:
    """(bound, inf) of maximum(x, bound) (`lower`), (-inf, bound) of minimum(x, bound); a scalar constant bound only."""
    bound = view.evaluate(call.args[1])
    if bound is None or bound.size != 1:
        return None
    return (float(bound), np.inf) if lower else (-np.inf, float(bound))


def clamp_bounds(view: FunctionView, value: relax.Expr) -> tuple[float, float] | None:
    """(lo, hi) of a ReLU, clip, or maximum / minimum with a scalar constant, else None."""
    for pattern, bounds in CLAMPS:
        if pattern.match(value):
            return bounds(view, value)
    return None


def per_channel(values: np.ndarray, kernel: IntegerKernel) -> np.ndarray | None:
    """A bias that broadcasts over the output along its channel axis only, as one value per channel."""
    channels = len(kernel.w_scale)
    if values.ndim > kernel.out_ndim:
        return None
    shape = [1] * (kernel.out_ndim - values.ndim) + list(values.shape)
    others = [d for i, d in enumerate(shape) if i != kernel.channel_axis]
    if any(d != 1 for d in others) or shape[kernel.channel_axis] not in (1, channels):
        return None
    return np.broadcast_to(values.astype(np.float64).reshape(-1), (channels,))


def _kernel_below_clamps(view: FunctionView, quantize: relax.Call) -> tuple | None:
    """(kernel call, bias or None, clamps outermost first) of quantize(clamp*([bias +] kernel)),
    every value between the kernel and the quantize used once; None for another form."""
    clamps, value = [], view.single_use_value(quantize.args[0])
    while value is not None and (bounds := clamp_bounds(view, value)) is not None:
        clamps.append(bounds)
        value = view.single_use_value(value.args[0])
    bias = None
    if value is not None and BIAS_ADD.match(value):
        bias = view.evaluate(value.args[1])
        value = None if bias is None else view.single_use_value(value.args[0])
    if value is None or op_name(value) not in (CONV2D, MATMUL):
        return None
    return value, bias, clamps


def requantize_plan(view: FunctionView, quantize: relax.Call, y: QParams) -> Requantize | None:
    """The requantized kernel of `quantize` (per-tensor `y`), else None."""
    found = _kernel_below_clamps(view, quantize)
    kernel = None if found is None else view.kernel(found[0])
    if kernel is None:
        return None
    call, bias, clamps = found
    bias = np.zeros(len(kernel.w_scale)) if bias is None else per_channel(bias, kernel)
    if bias is None:
        return None
    lo, hi = -np.inf, np.inf
    for c_lo, c_hi in reversed(clamps):  # innermost first
        lo, hi = float(np.clip(lo, c_lo, c_hi)), float(np.clip(hi, c_lo, c_hi))
    q_lo, q_hi = integer_limits(y.dtype)
    if lo > -np.inf:
        q_lo = max(q_lo, int(np.round(lo / y.s)) + y.zp)
    if hi < np.inf:
        q_hi = min(q_hi, int(np.round(hi / y.s)) + y.zp)
    return Requantize(kernel, bias, q_lo, q_hi, y)


def movement_plan(view: FunctionView, quantize: relax.Call, y: QParams) -> Movement | None:
    """quantize (per-tensor `y`) of moved values that stay integer: MOVED, CONCAT or
    REQUANTIZED with the parameters of `y` throughout, else None."""
    if (matched := view.match(REQUANTIZED, quantize)) is not None:
        source = view.activation(matched[DEQUANTIZED])
        return Movement(None, [source[0]], y) if source is not None and source[1].same(y) else None
    if (matched := view.match(CONCAT, quantize)) is not None:
        concat = matched[CONCAT_CALL]
        fields = view.value(concat.args[0])
        parts = [view.dequantized(f) for f in fields.fields] if isinstance(fields, relax.Tuple) else [None]
        if any(p is None or not p[1].same(y) for p in parts):
            return None
        return Movement(concat, [p[0] for p in parts], y)
    if (matched := view.match(MOVED, quantize)) is not None:
        source = view.activation(matched[DEQUANTIZED])
        return Movement(matched[MOVEMENT_OP], [source[0]], y) if source is not None and source[1].same(y) else None
    return None


def dequantize_numpy(call, data, scale, zero_point):
    """The value of a dequantize call on constant `data`, in numpy."""
    params = QParams(scale.reshape(-1), zero_point.reshape(-1), int(call.attrs.axis), str(data.dtype))
    centred = data.astype(np.float64) - params.along(params.zero_point, data.ndim).astype(np.float64)
    return (centred * params.along(params.scale, data.ndim).astype(np.float64)).astype(str(call.attrs.out_dtype))


def count_uses(func: relax.Function) -> dict[relax.Var, int]:
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
