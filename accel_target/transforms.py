"""Graph passes TVM lacks, around ConvertLayout, and channels-last inputs.

`SimplifyLayouts` rewrites, wherever they occur:
- chains of permute_dims into one permute (nothing when they cancel), also
  through pads and takes between them (done in the other layout); a
  permute that only moves size-1 axes into a reshape; a permute of a reshape of a
  permute that moves no element relative to a reshape into that reshape;
- a flatten-before-dense, ``matmul(reshape(permute_dims(x)), W)``, into
  ``matmul(reshape(x), W')`` with the rows of the constant W permuted at
  compile time instead of the activations at run time;
- ops ConvertLayout cannot see through (no FRelaxInferLayout in TVM 0.27)
  into ones it can: clip into maximum/minimum, a zero pad of the spatial axes
  into the padding of the conv2d that consumes it;
- a depthwise 1x1 conv2d with unit weights, stride and dilation into the zero
  pad it is (see `PadAsConv`, which creates them around ConvertLayout);
- squeeze's negative axes into non-negative ones (ConvertLayout fails on them);
- an elementwise op of two tensors permuted alike into the permute of the op;
- an operand of an elementwise op of lower rank than the other, 4-D one (a per-channel
  scale [C, 1, 1]) into its reshape to 4-D, and the operand that broadcasts of an add or
  multiply second, so that it is converted with the layout;
- broadcast_to that changes nothing, and a matmul weight broadcast over the
  batch axes (PyTorch's export of Linear on 3-D input) back to the 2-D weight;
- an elementwise op of a reshape (an activation, an op with a scalar such as
  attention's scaling, or ``a + reshape(y)`` with operands of one shape: a
  residual add after a dense layer on flattened rows) into the reshape of the
  op (``reshape(reshape(a) + y)``), so that it follows the kernel directly and
  becomes its epilogue.

`PadAsConv` carries the other spatial zero pads through ConvertLayout. `ShareConstants`
makes tensor constants of equal value one. `BindConstantSizes` makes the sizes a
model reads from values computed at compile time static. `ReadInputNCHW` lets the first
conv read the NCHW image that ConvertLayout had transposed for it.
`convert_input_layout` gives main channels-last image inputs.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
import tvm
import tvm_ffi
from tvm import relax, tirx, topi
from tvm.relax.expr_functor import PyExprMutator, mutator

from strategy.conv2d import reads_nchw
from strategy.layout import array_constant, constant_array, is_permutation, permutation, static_shape, tensor_shape
from strategy.registry import select

READS_NCHW = "conv2d_nhwc_ohwi.accel"  # the implementation whose kernel may read NCHW data

PERMUTE = "relax.permute_dims"
RESHAPE = "relax.reshape"
MATMUL = "relax.matmul"
CLIP = "relax.clip"
PAD = "relax.nn.pad"
TAKE = "relax.take"
CONV2D = "relax.nn.conv2d"
BROADCAST = "relax.broadcast_to"
SQUEEZE = "relax.squeeze"
# elementwise ops of one tensor: f(reshape(x)) == reshape(f(x))
UNARY_ELEMENTWISE = {
    "relax.nn.gelu",
    "relax.nn.gelu_tanh",
    "relax.nn.relu",
    "relax.nn.silu",
    "relax.sigmoid",
    "relax.tanh",
    "relax.erf",
}
# and of two: f(reshape(x), c) == reshape(f(x, c)) for a scalar c, f(reshape(x), y) == reshape(f(x, reshape(y)))
BINARY_ELEMENTWISE = {"relax.add", "relax.subtract", "relax.multiply", "relax.divide"}
COMMUTATIVE = {"relax.add", "relax.multiply"}
# other elementwise ops of two tensors, broadcasting
BROADCASTING = {"relax.maximum", "relax.minimum", "relax.power"}
# the ops moved before a reshape: f(reshape(x), c) == reshape(f(x, c))
ELEMENTWISE = UNARY_ELEMENTWISE | BINARY_ELEMENTWISE


def _rewrite_functions(mutator_class, mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with every Relax function rewritten by a fresh `mutator_class` (a PyExprMutator)."""
    mutator = mutator_class(mod)
    for gvar, func in mod.functions_items():
        if isinstance(func, relax.Function):
            mutator.builder_.update_func(gvar, mutator.visit_expr(func))
    return mutator.builder_.get()


def _bound(mutator: PyExprMutator, expr):
    """What a variable is bound to in `mutator`'s builder (None for a non-variable)."""
    return mutator.lookup_binding(expr) if isinstance(expr, relax.Var) else None


def _resolve(mutator: PyExprMutator, expr):
    """`expr`, or what it is bound to if it is a bound variable (a weight constant, say)."""
    bound = _bound(mutator, expr)
    return expr if bound is None else bound


def _same_shape(a: list | None, b: list | None) -> bool:
    """Whether two shapes (`tensor_shape`: ints and the PrimExprs of symbolic dimensions) are one."""
    return a is not None and b is not None and bool(tvm_ffi.structural_equal(a, b))


def _op_name(expr) -> str | None:
    if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
        return expr.op.name
    return None


def _axes(call: relax.Call) -> list[int]:
    ndim = call.args[0].ty.ndim
    return list(range(ndim))[::-1] if call.attrs.axes is None else [int(a) for a in call.attrs.axes]


def _conv_padding_of_pad(pad: relax.Call, layout: str) -> list[int] | None:
    """[top, left, bottom, right] of a zero pad of only the H and W axes of `layout`, else None."""
    widths = [int(v) for v in pad.attrs.pad_width]
    if str(pad.attrs.pad_mode) != "constant" or float(pad.attrs.pad_value) != 0.0 or len(widths) != 2 * len(layout):
        return None
    h, w = layout.index("H"), layout.index("W")
    if min(widths) < 0 or any(widths[2 * a] or widths[2 * a + 1] for a in range(len(layout)) if a not in (h, w)):
        return None
    return [widths[2 * h], widths[2 * w], widths[2 * h + 1], widths[2 * w + 1]]


def _conv2d_like(call: relax.Call, data: relax.Expr, **changes) -> relax.Call:
    """A conv2d of `data` with `call`'s weight and attributes, but for `changes`."""
    names = ("strides", "padding", "dilation", "groups", "data_layout", "kernel_layout", "out_layout", "out_dtype")
    kwargs = {name: getattr(call.attrs, name) for name in names}
    return relax.op.nn.conv2d(data, call.args[1], **{**kwargs, **changes})


def _moves_only_unit_axes(shape: list[int], axes: list[int]) -> bool:
    """Whether permuting `shape` by `axes` keeps the order of every axis longer than 1."""
    kept = [a for a in axes if shape[a] != 1]
    return kept == sorted(kept)


@mutator
class _LayoutSimplifier(PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        name = _op_name(call)
        if name == PERMUTE:
            return self._permute(call.args[0], _axes(call))
        if name == CLIP:
            return self._clip(call)
        if name == BROADCAST and static_shape(call.args[0]) == static_shape(call):
            return call.args[0]
        if name == SQUEEZE:
            return self._squeeze(call)
        if name in BINARY_ELEMENTWISE or name in BROADCASTING:
            call = self._broadcast_operand_second(self._to_full_rank(call))
            new = self._elementwise_of_permutes(call)
            if new is not None:
                return new
        if name in ELEMENTWISE:
            new = self._elementwise_before_reshape(call)
            return call if new is None else new
        rewrites = {
            MATMUL: (self._unbroadcast_weight, self._absorb_flatten),
            CONV2D: (self._conv_as_pad, self._absorb_pad),
        }
        for rewrite in rewrites.get(name, ()):
            new = rewrite(call)
            if new is not None:
                return new
        return call

    def _elementwise_before_reshape(self, call: relax.Call) -> relax.Expr | None:
        """f(reshape(y), ...) -> reshape(f(y, ...)) for an elementwise f of one tensor, of a tensor
        and a scalar, or of two tensors of the result's shape when y is a matmul's result (the
        other is reshaped: a residual add); so that f follows the kernel and becomes its epilogue.
        Shapes may be symbolic (BERT's [batch, seq, 768] over [batch * seq, 768] rows)."""
        shape = tensor_shape(call)
        if shape is None:
            return None
        for i, arg in enumerate(call.args):
            reshape = _bound(self, arg)
            if _op_name(reshape) != RESHAPE or tensor_shape(reshape.args[0]) is None:
                continue
            y = reshape.args[0]
            args = list(call.args)
            args[i] = y
            if len(args) == 2 and tensor_shape(args[1 - i]) != []:  # not a scalar
                if not _same_shape(tensor_shape(args[1 - i]), shape) or not self._follows_matmul(y):
                    continue
                args[1 - i] = self.builder_.emit(relax.op.reshape(args[1 - i], tensor_shape(y)))
            return relax.op.reshape(self.builder_.emit(relax.Call(call.op, args, call.attrs, call.ty_args)), shape)
        return None

    def _to_full_rank(self, call: relax.Call) -> relax.Call:
        """f(c, x) with x 4-D and c of lower rank (a per-channel scale [C, 1, 1] of an NCHW
        tensor: PoolFormer's layer scale) -> f(reshape(c, [1, C, 1, 1]), x), c with leading
        unit axes as broadcasting reads it: ConvertLayout converts an operand of the same rank
        with the layout, and leaves a lower-rank one in NCHW between two transposes. (A
        constant c's reshape is folded.)"""
        shapes = [static_shape(a) for a in call.args]
        if len(call.args) != 2 or None in shapes or sorted(len(s) for s in shapes)[1] != 4:
            return call
        low = 0 if len(shapes[0]) < len(shapes[1]) else 1
        if not 0 < len(shapes[low]) < 4:  # (a scalar converts as it is)
            return call
        args = list(call.args)
        args[low] = self.builder_.emit(relax.op.reshape(args[low], [1] * (4 - len(shapes[low])) + shapes[low]))
        return self.builder_.normalize(relax.Call(call.op, args, call.attrs, call.ty_args))

    @staticmethod
    def _broadcast_operand_second(call: relax.Call) -> relax.Call:
        """add / multiply(b, x) -> (x, b) when x has the result's shape and b does not (it
        broadcasts): ConvertLayout gives an elementwise op its first operand's layout, so with
        the scale first the activation went back to NCHW (PoolFormer's layer scale)."""
        if _op_name(call) not in COMMUTATIVE or len(call.args) != 2:
            return call
        shape = static_shape(call)
        first, second = (static_shape(a) for a in call.args)
        if shape is None or first == shape or second != shape:
            return call
        return relax.Call(call.op, [call.args[1], call.args[0]], call.attrs, call.ty_args)

    def _elementwise_of_permutes(self, call: relax.Call) -> relax.Expr | None:
        """f(permute_dims(a, p), permute_dims(b, p)) -> permute_dims(f(a, b), p) for operands of
        one shape (ConvNeXt's residual add, both sides permuted back to NCHW): one permute
        instead of two, which then meets the permute after it (and cancels, in ConvNeXt)."""
        permutes = [_bound(self, a) for a in call.args]
        if len(permutes) != 2 or any(_op_name(p) != PERMUTE for p in permutes):
            return None
        (a, b), axes = (p.args[0] for p in permutes), _axes(permutes[0])
        if _axes(permutes[1]) != axes or static_shape(a) is None or static_shape(a) != static_shape(b):
            return None
        return relax.op.permute_dims(self.builder_.emit(relax.Call(call.op, [a, b], call.attrs, call.ty_args)), axes)

    def _follows_matmul(self, expr: relax.Expr) -> bool:
        """Whether `expr` is a matmul, or an elementwise op of one (after a bias add, GELU)."""
        call = _bound(self, expr)
        name = _op_name(call)
        if name in ELEMENTWISE:
            return tensor_shape(expr) is not None and any(self._follows_matmul(arg) for arg in call.args)
        return name == MATMUL

    @staticmethod
    def _squeeze(call: relax.Call) -> relax.Expr:
        """squeeze with negative axes -> the same axes counted from the front: ConvertLayout's
        layout inference for squeeze (TVM 0.27) indexes the layout with them as they are and
        dies with std::bad_alloc (Swin's pooler, squeeze(x, [-2]) after a conv's layout)."""
        axes = call.attrs.axis
        if axes is None or all(int(a) >= 0 for a in axes):
            return call
        ndim = call.args[0].ty.ndim
        if ndim < 0:  # rank unknown
            return call
        return relax.op.squeeze(call.args[0], [int(a) % ndim for a in axes])

    def _clip(self, call: relax.Call) -> relax.Expr:
        data, low, high = call.args
        dtype = data.ty.dtype
        bound = lambda v: relax.const(float(v.value), dtype)  # noqa: E731  (PrimValue -> tensor)
        return relax.op.minimum(self.builder_.emit(relax.op.maximum(data, bound(low))), bound(high))

    def _absorb_pad(self, call: relax.Call) -> relax.Expr | None:
        """conv2d(pad(x, zeros on H and W only), w) -> conv2d(x, w) with the padding added."""
        pad = _bound(self, call.args[0])
        attrs = call.attrs
        extra = _conv_padding_of_pad(pad, str(attrs.data_layout)) if _op_name(pad) == PAD else None
        if extra is None:
            return None
        return _conv2d_like(call, pad.args[0], padding=[int(p) + e for p, e in zip(attrs.padding, extra)])

    def _conv_as_pad(self, call: relax.Call) -> relax.Expr | None:
        """A depthwise 1x1 conv2d with unit weights, stride and dilation -> the zero pad it is."""
        attrs, weight = call.attrs, _resolve(self, call.args[1])
        shape = static_shape(call.args[0])
        if not isinstance(weight, tvm.ir.expr.Constant) or shape is None or len(shape) != 4:
            return None
        layout = str(attrs.data_layout)
        channels = shape[layout.index("C")]
        w = constant_array(weight)
        if (
            int(attrs.groups) != channels
            or w.size != channels
            or np.any(w != 1)
            or any(int(v) != 1 for v in (*attrs.strides, *attrs.dilation))
            or str(attrs.out_layout) != layout
            or str(call.ty.dtype) != str(call.args[0].ty.dtype)
        ):
            return None
        top, left, bottom, right = (int(v) for v in attrs.padding)
        widths = {"H": (top, bottom), "W": (left, right)}
        return relax.op.nn.pad(call.args[0], [v for axis in layout for v in widths.get(axis, (0, 0))])

    def _unbroadcast_weight(self, call: relax.Call) -> relax.Expr | None:
        """matmul(x, broadcast_to(w, [B, K, N])) -> matmul(x, w) when the result is the same."""
        source = _bound(self, call.args[1])
        if _op_name(source) != BROADCAST:
            return None
        weight = source.args[0]
        if weight.ty.ndim != 2:
            return None
        new = self.builder_.normalize(relax.op.matmul(call.args[0], weight, out_dtype=call.attrs.out_dtype))
        shape = static_shape(call)
        return new if shape is not None and static_shape(new) == shape else None

    def _permute(self, data: relax.Expr, axes: list[int]) -> relax.Expr:
        inner = _bound(self, data)
        sunk = self._sink_permute(inner) if _op_name(inner) in (PAD, TAKE) else None
        if sunk is not None:
            inner = sunk
        if _op_name(inner) == PERMUTE:  # permute of a permute: one permute
            inner_axes = _axes(inner)
            data, axes = inner.args[0], [inner_axes[a] for a in axes]
        if _op_name(inner) == RESHAPE:
            reshaped = self._reshape_of_permutes(inner, axes)
            if reshaped is not None:
                return reshaped
        if axes == sorted(axes):
            return data
        shape = static_shape(data)
        if shape is not None and _moves_only_unit_axes(shape, axes):
            return relax.op.reshape(data, [shape[a] for a in axes])
        return relax.op.permute_dims(data, axes)

    def _reshape_of_permutes(self, reshape: relax.Call, axes: list[int]) -> relax.Expr | None:
        """permute_dims(reshape(permute_dims(x, p), s), axes) -> reshape(x, ...) when the two
        permutes leave every element where a reshape of x puts it (a ViT's patch embedding:
        the conv's NHWC output permuted to NCHW by ConvertLayout, flattened, permuted to
        [tokens, channels] by the model)."""
        permute = _bound(self, reshape.args[0])
        if _op_name(permute) != PERMUTE:
            return None
        x = permute.args[0]
        shape, middle = static_shape(x), static_shape(reshape)
        if shape is None or middle is None:
            return None
        index = np.arange(math.prod(shape)).reshape(shape).transpose(_axes(permute)).reshape(middle).transpose(axes)
        if not np.array_equal(index.ravel(), np.arange(index.size)):
            return None
        return relax.op.reshape(x, list(index.shape))

    def _sink_permute(self, call: relax.Call) -> relax.Call | None:
        """op(permute_dims(x, p)) -> permute_dims(op'(x), p) for a pad (any mode) or a take of
        1-D indices (PyTorch exports reflect padding as takes), through chains of them; so
        that the permute meets the one after them (ops ConvertLayout left in NCHW)."""
        source = _bound(self, call.args[0])
        if _op_name(source) in (PAD, TAKE):
            source = self._sink_permute(source)
        if _op_name(source) != PERMUTE:
            return None
        x, p, attrs = source.args[0], _axes(source), call.attrs
        if _op_name(call) == TAKE:
            if attrs.axis is None or call.args[1].ty.ndim != 1:
                return None
            moved = relax.op.take(x, call.args[1], axis=p[int(attrs.axis) % len(p)], mode=str(attrs.mode))
        else:
            widths = [int(v) for v in attrs.pad_width]
            new_widths = [0] * len(widths)
            for i, axis in enumerate(p):  # axis i of the permuted tensor is axis p[i] of x
                new_widths[2 * axis : 2 * axis + 2] = widths[2 * i : 2 * i + 2]
            moved = relax.op.nn.pad(x, new_widths, pad_mode=str(attrs.pad_mode), pad_value=float(attrs.pad_value))
        return self.builder_.normalize(relax.op.permute_dims(self.builder_.emit(moved), p))

    def _absorb_flatten(self, call: relax.Call) -> relax.Expr | None:
        """matmul(reshape(permute_dims(x, p), [N, -1]), W) -> matmul(reshape(x, [N, -1]), W')."""
        flat, weight = call.args[0], _resolve(self, call.args[1])
        reshape = _bound(self, flat)
        if _op_name(reshape) != RESHAPE or not isinstance(weight, tvm.ir.expr.Constant):
            return None
        permute = _bound(self, reshape.args[0])
        if _op_name(permute) != PERMUTE:
            return None
        x, axes = permute.args[0], _axes(permute)
        x_shape, flat_shape = static_shape(x), static_shape(flat)
        if x_shape is None or flat_shape is None or axes[0] != 0 or flat_shape != [x_shape[0], math.prod(x_shape[1:])]:
            return None
        w = constant_array(weight)
        if w.ndim != 2:
            return None
        # rows of W follow the permuted trailing axes; reorder them to follow x's own
        permuted_shape = [x_shape[a] for a in axes[1:]]
        rows = w.reshape(permuted_shape + [w.shape[1]]).transpose(
            [axes.index(j) - 1 for j in range(1, len(axes))] + [len(axes) - 1]
        )
        new_flat = self.builder_.emit(relax.op.reshape(x, flat_shape))
        return relax.op.matmul(new_flat, array_constant(rows.reshape(w.shape)), out_dtype=call.attrs.out_dtype)


@tvm.transform.module_pass(opt_level=0, name="SimplifyLayouts")
class SimplifyLayouts:
    """The rewrites listed in this module's docstring."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return _rewrite_functions(_LayoutSimplifier, mod)


@mutator
class _PadAsConv(PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        padding = _conv_padding_of_pad(call, "NCHW") if _op_name(call) == PAD else None
        if padding is None:
            return call
        shape, dtype = static_shape(call.args[0]), str(call.ty.dtype)
        if shape is None or dtype not in ("float16", "float32", "float64"):
            return call
        ones = relax.const(np.ones((shape[1], 1, 1, 1), dtype))
        return relax.op.nn.conv2d(call.args[0], ones, padding=padding, groups=shape[1])


@tvm.transform.module_pass(opt_level=0, name="PadAsConv")
class PadAsConv:
    """A zero pad of the spatial axes of an NCHW tensor as the identity depthwise
    1x1 conv2d with that padding, so that ConvertLayout converts it with the
    convolutions around it: TVM 0.27 has no FRelaxInferLayout for nn.pad (and
    its InferLayoutOutput cannot be built from Python to register one), so a pad
    would otherwise stay NCHW between two transposes. SimplifyLayouts turns the
    conv back into a pad in whatever layout it ended in. Reflect, replicate and
    non-zero pads are left as they are."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return _rewrite_functions(_PadAsConv, mod)


POOLS = {"relax.nn.avg_pool2d": relax.op.mean, "relax.nn.max_pool2d": relax.op.max}


@mutator
class _WholeInputPooling(PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        reduce = POOLS.get(_op_name(call))
        axes = _whole_input_window(call) if reduce is not None else None
        return call if axes is None else reduce(call.args[0], axes, keepdims=True)


def _whole_input_window(call: relax.Call) -> list[int] | None:
    """The spatial axes of a pooling whose one window, unpadded and undilated, covers its
    whole input (its output is 1x1), else None."""
    attrs = call.attrs
    layout = str(attrs.layout)
    shape, out_shape = static_shape(call.args[0]), static_shape(call)
    if layout not in SUPPORTED_LAYOUTS or str(attrs.out_layout) != layout or shape is None or out_shape is None:
        return None
    axes = [layout.index("H"), layout.index("W")]
    if any(int(p) for p in attrs.padding) or any(int(d) != 1 for d in attrs.dilation):
        return None
    if any(out_shape[a] != 1 or int(k) < shape[a] for a, k in zip(axes, attrs.pool_size)):
        return None
    return axes


@tvm.transform.module_pass(opt_level=0, name="WholeInputPooling")
class WholeInputPooling:
    """An average or max pooling whose one window covers its whole input (unpadded,
    undilated) as a mean or max over the spatial axes. Its kernel loops over the whole
    window, bounds-checking every element: Hugging Face's EfficientNet pools its 2x2
    feature map with a 1280x1280 window (ceil_mode), 15 ms of a 17 ms model."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return _rewrite_functions(_WholeInputPooling, mod)


@mutator
class _ReadInputNCHW(PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        source = _bound(self, call.args[0]) if _op_name(call) == CONV2D else None
        if _op_name(source) != PERMUTE or source.args[0].ty.ndim != 4:
            return call
        layout = str(call.attrs.data_layout)
        if not is_permutation(layout, "NCHW") or _axes(source) != permutation("NCHW", layout):
            return call
        new = _conv2d_like(call, source.args[0], data_layout="NCHW")
        target = tvm.target.Target.current(allow_none=True)
        impl, _ = (None, None) if target is None else select(new, target.keys)
        return new if impl is not None and impl.name == READS_NCHW and reads_nchw(new) else call


@tvm.transform.module_pass(opt_level=0, name="ReadInputNCHW")
class ReadInputNCHW:
    """conv2d(permute_dims(x), data_layout=NHWC) of NCHW `x` -> conv2d(x, data_layout=NCHW), its
    out_layout kept, where conv2d_nhwc_ohwi.accel takes the new call and its kernel reads x as
    it is (strategy.conv2d.reads_nchw: a model's first conv, on the image, transposed in the
    padded copy of its input the kernel makes anyway). ConvertLayout leaves that permute of
    the input before the first conv, a runtime transform of the whole image."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return _rewrite_functions(_ReadInputNCHW, mod)


SUPPORTED_LAYOUTS = ("NCHW", "NHWC")


def convert_input_layout(mod: tvm.IRModule, layout: str | None, function: str = "main") -> tvm.IRModule:
    """`mod` whose `function` takes every 4-D input (an NCHW image) in `layout` instead.

    The body starts by permuting the new input back to NCHW; after
    ConvertLayout that permute cancels against the one in front of the first
    convolution. None or "NCHW" leaves the module as it is.
    """
    if layout is None or layout == "NCHW":
        return mod
    if layout not in SUPPORTED_LAYOUTS:
        raise ValueError(f"input_layout={layout!r} is not supported; supported: None, {', '.join(SUPPORTED_LAYOUTS)}")
    func = mod[function]
    perm_to_nchw, perm_from_nchw = permutation(layout, "NCHW"), permutation("NCHW", layout)
    new_params, bindings = [], []
    for i, param in enumerate(func.params):
        shape = tensor_shape(param)  # a symbolic batch too
        if shape is None or len(shape) != 4 or i >= num_inputs(func):
            new_params.append(param)
            continue
        new = relax.Var(
            f"{param.name}_{layout.lower()}", relax.TensorType([shape[axis] for axis in perm_from_nchw], param.ty.dtype)
        )
        new_params.append(new)
        bindings.append(relax.VarBinding(param, relax.op.permute_dims(new, perm_to_nchw)))
    if not bindings:
        shapes = ", ".join(
            f"{p.name}: {tensor_shape(p) if isinstance(p.ty, relax.TensorType) else p.ty}" for p in func.params
        )
        raise ValueError(f"input_layout={layout!r} needs a 4-D NCHW image input, but {function}() takes ({shapes})")
    body = relax.SeqExpr([relax.BindingBlock(bindings)] + list(func.body.blocks), func.body.body)
    new_func = relax.Function(new_params, body, func.ret_ty, func.is_pure, func.attrs)
    return relax.transform.Normalize()(with_function(mod, function, new_func))


def convert_output_layout(mod: tvm.IRModule, layout: str | None, function: str = "main") -> tvm.IRModule:
    """`mod` whose `function` returns every 4-D output (an NCHW image) in `layout` instead.

    The body ends by permuting those outputs from NCHW; after ConvertLayout that
    permute cancels against the one after the last convolution. None or "NCHW"
    leaves the module as it is.
    """
    if layout is None or layout == "NCHW":
        return mod
    if layout not in SUPPORTED_LAYOUTS:
        raise ValueError(f"output_layout={layout!r} is not supported; supported: None, {', '.join(SUPPORTED_LAYOUTS)}")
    func, perm = mod[function], permutation("NCHW", layout)
    bindings = []

    def bind(value: relax.Expr, ty) -> relax.Var:
        var = relax.Var(f"out{len(bindings)}", ty)
        bindings.append(relax.VarBinding(var, value))
        return var

    def convert(expr: relax.Expr, ty) -> tuple[relax.Expr, object]:
        """(`expr` with its 4-D outputs permuted, its type)"""
        if isinstance(ty, relax.TupleType):
            fields = [convert(bind(relax.TupleGetItem(expr, i), t), t) for i, t in enumerate(ty.fields)]
            return relax.Tuple([f for f, _ in fields]), relax.TupleType([t for _, t in fields])
        shape = list(ty.shape.values) if isinstance(ty, relax.TensorType) and ty.shape else None
        if shape is None or len(shape) != 4:
            return expr, ty
        permuted = relax.TensorType([shape[axis] for axis in perm], ty.dtype)
        return bind(relax.op.permute_dims(expr, perm), permuted), permuted

    result, ret_ty = convert(func.body.body, func.ret_ty)
    if not any(isinstance(b.value, relax.Call) for b in bindings):
        raise ValueError(
            f"output_layout={layout!r} needs a 4-D NCHW image output, but {function}() returns {func.ret_ty}"
        )
    # in main's last dataflow block, if it ends with one, so that the permutes cancel
    blocks = list(func.body.blocks)
    if blocks and isinstance(blocks[-1], relax.DataflowBlock):
        blocks[-1] = relax.DataflowBlock(list(blocks[-1].bindings) + bindings)
    else:
        blocks.append(relax.BindingBlock(bindings))
    body = relax.SeqExpr(blocks, result)
    new_func = relax.Function(func.params, body, ret_ty, func.is_pure, func.attrs)
    return relax.transform.Normalize()(with_function(mod, function, new_func))


def num_inputs(func: relax.Function) -> int:
    """How many leading parameters of `func` are the model's inputs: its "num_input" attribute
    (weights imported as parameters, keep_params_as_input, follow them), else all."""
    if func.attrs is not None and "num_input" in func.attrs:
        return int(func.attrs["num_input"])
    return len(func.params)


def with_function(mod: tvm.IRModule, name: str, func) -> tvm.IRModule:
    """A copy of `mod` with `func` as `name` (`mod` itself is left as it is)."""
    out = tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs)
    out[name] = func
    return out


_BINARY = {
    "relax.add": np.add,
    "relax.subtract": np.subtract,
    "relax.multiply": np.multiply,
    "relax.divide": np.divide,
    "relax.power": np.power,
    "relax.maximum": np.maximum,
    "relax.minimum": np.minimum,
}
_UNARY = {
    "relax.sqrt": np.sqrt,
    "relax.rsqrt": lambda a: 1 / np.sqrt(a),
    "relax.exp": np.exp,
    "relax.negative": np.negative,
}


def _shape_arg(expr) -> list[int]:
    return [int(v) for v in expr.values]


_SHAPE_OPS = {
    "relax.reshape": lambda a, call: a.reshape(_shape_arg(call.args[1])),
    "relax.broadcast_to": lambda a, call: np.broadcast_to(a, _shape_arg(call.args[1])),
    "relax.permute_dims": lambda a, call: a.transpose(
        None if call.attrs.axes is None else [int(x) for x in call.attrs.axes]
    ),
    "relax.expand_dims": lambda a, call: np.expand_dims(a, tuple(int(x) for x in call.attrs.axis)),
    "relax.squeeze": lambda a, call: np.squeeze(
        a, None if call.attrs.axis is None else tuple(int(x) for x in call.attrs.axis)
    ),
    "relax.astype": lambda a, call: a,  # the cast to the call's dtype in numpy_call does it
}
# the ops numpy_call computes
NUMPY_OPS = _BINARY.keys() | _UNARY.keys() | _SHAPE_OPS.keys()


def numpy_call(name: str, call: relax.Call, arrays: list[np.ndarray]) -> np.ndarray:
    """The value of `call` (op `name`, one of NUMPY_OPS) on `arrays`, the values of its tensor
    operands, computed in numpy and cast to the call's dtype."""
    if name in _BINARY:
        result = _BINARY[name](*arrays)
    elif name in _UNARY:
        result = _UNARY[name](arrays[0])
    else:
        result = _SHAPE_OPS[name](arrays[0], call)
    return np.asarray(result, dtype=str(call.ty.dtype))


@mutator
class _NumpyFolder(PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        name = _op_name(call)
        if name not in NUMPY_OPS:
            return call
        if not isinstance(call.ty, relax.TensorType) or static_shape(call) is None:
            return call
        operands = [_resolve(self, a) for a in call.args if not isinstance(a, relax.ShapeExpr)]
        if not all(isinstance(a, tvm.ir.expr.Constant) for a in operands):
            return call
        arrays = [constant_array(a) for a in operands]
        return array_constant(numpy_call(name, call, arrays))


@tvm.transform.module_pass(opt_level=0, name="FoldConstantNumpy")
class FoldConstantNumpy:
    """Fold elementwise and shape ops on constants in numpy.

    TVM's FoldConstant compiles one kernel with LLVM for every op it folds
    (~0.1 s each in 0.27: 5 s for the BN folding of a ResNet-10); these are
    the ops weight preparation consists of. FoldConstant still runs after it
    for anything else.
    """

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return _rewrite_functions(_NumpyFolder, mod)


@mutator
class _FastMath(PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        name = _op_name(call)
        if name not in ("relax.nn.gelu", "relax.nn.softmax") or str(call.ty.dtype) != "float32":
            return call
        x = call.args[0]
        if name == "relax.nn.softmax":
            return self.builder_.call_te(
                topi.nn.fast_softmax, x, int(call.attrs.axis), primfunc_name_hint="fast_softmax"
            )
        scaled = self.builder_.emit(relax.op.multiply(x, relax.const(0.7071067811865476, "float32")))
        erf = self.builder_.emit(self.builder_.call_te(topi.fast_erf, scaled, primfunc_name_hint="fast_erf"))
        half_x = self.builder_.emit(relax.op.multiply(x, relax.const(0.5, "float32")))
        return relax.op.multiply(half_x, relax.op.add(erf, relax.const(1.0, "float32")))


@tvm.transform.module_pass(opt_level=0, name="FastMath")
class FastMath:
    """GELU and softmax with TVM's vectorizable fast_erf / fast_exp instead of libm's
    scalar erff / expf (a third of BERT's softmax time).

    GELU stays exact in form, x * (1 + erf(x / sqrt(2))) / 2 (fast_erf's max abs
    error is 3.7e-7), as elementwise ops that become the epilogue of the dense
    kernel before them. TVM's own FastMathTransform also swaps every exp and
    tanh; this keeps to the two ops where the time is."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return _rewrite_functions(_FastMath, mod)


@mutator
class _ConstantSharer(PyExprMutator):
    def __init__(self, mod=None):
        super().__init__(mod)
        self.first: dict = {}  # (dtype, shape, digest of the bytes) -> the first such constant
        self.shared: dict = {}  # a constant seen before -> the one it became (hashed once)

    def visit_generic_const_(self, const):
        if not isinstance(const.value, tvm.runtime.Tensor):
            return const
        if const not in self.shared:
            array = const.value.numpy()
            key = (str(array.dtype), array.shape, hashlib.blake2b(np.ascontiguousarray(array).data).digest())
            self.shared[const] = self.first.setdefault(key, const)
        return self.shared[const]


@mutator
class _EmptyMaker(PyExprMutator):
    def visit_generic_const_(self, const):
        value = const.value
        if not isinstance(value, tvm.runtime.Tensor) or math.prod(value.shape) != 0:
            return const
        empty = self.builder_.call_te(topi.full, list(value.shape), str(value.dtype), 0, primfunc_name_hint="empty")
        return self.builder_.emit(empty)


@tvm.transform.module_pass(opt_level=0, name="EmptyConstantsAtRunTime")
class EmptyConstantsAtRunTime:
    """A constant with no element (``x[:, :0]`` of a weight, a repeat of 0: ViTMAE's mask
    tokens without a mask) becomes a kernel that makes it: TVM saves such a constant in a
    library but cannot load it back ("Invalid DLTensor file format"), so the executable could
    not run (`AccelExecutable.jit` goes through a library) nor be saved. After the kernel
    phase's FoldConstant, which would fold it back."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return _rewrite_functions(_EmptyMaker, mod)


@tvm.transform.module_pass(opt_level=0, name="ShareConstants")
class ShareConstants:
    """Tensor constants of equal value become one constant. The strategies pack a constant
    weight once per call that reads it (MicroBatch's per-sample copies of the leading layers
    read each weight once per sample); every copy would be a weight of its own in the
    library, its weights file and memory (ResNet-50 at batch 8: 409 weights, 500 MB, for 108)."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return _rewrite_functions(_ConstantSharer, mod)


def _known_dims(value, bound: dict) -> list[int] | None:
    """The dimensions a match_cast reads from the shape `value`, where they are known at
    compile time: a shape of constants, or one read from a constant tensor (``.item()`` of a
    tensor the folding computed; `bound`: variable -> value)."""
    if isinstance(value, relax.ShapeExpr) and all(isinstance(v, tirx.IntImm) for v in value.values):
        return [int(v) for v in value.values]
    # (the importer's R.tensor_to_shape is a packed call by the time the folding is done)
    packed = value.args[0] if _op_name(value) == "relax.call_pure_packed" else None
    if isinstance(packed, relax.ExternFunc) and str(packed.global_symbol) == "vm.builtin.tensor_to_shape":
        tensor = bound.get(value.args[1], value.args[1])
        if isinstance(tensor, tvm.ir.expr.Constant):
            return [int(v) for v in tensor.value.numpy().reshape(-1)]
    return None


def _constant_sizes(func: relax.Function) -> dict:
    """shape variable -> int, for the variables that a match_cast in `func` defines from a
    value known at compile time."""
    bound: dict = {}
    sizes: dict = {}
    for block in func.body.blocks:
        for binding in block.bindings:
            value = bound.get(binding.value, binding.value) if isinstance(binding.value, relax.Var) else binding.value
            bound[binding.var] = value
            if not isinstance(binding, relax.MatchCast) or not isinstance(binding.ty, relax.ShapeType):
                continue
            pattern, dims = binding.ty.values, _known_dims(value, bound)
            if pattern is not None and dims is not None and len(dims) == len(pattern):
                sizes.update((var, dim) for var, dim in zip(pattern, dims) if isinstance(var, tirx.Var))
    return sizes


@tvm.transform.module_pass(opt_level=0, name="BindConstantSizes")
class BindConstantSizes:
    """A shape variable that a match_cast reads from a value known at compile time becomes
    that number in the whole function: ``.item()`` of a tensor computed from constants
    (Reformer's axial position embeddings read their length from positions the folding
    computed), and a match_cast of a shape of constants. What it sizes is then static: folded,
    fused and scheduled as any other tensor. Sized at run time, an op that broadcasts it
    against a static shape has no known shape, which LegalizeOps skips and CodeGenVM then
    fails on; and LegalizeOps gives a slice's shape a branch (``T.if_then_else(n < -4, n // 4
    + 5, n // 4 + 1)``) that FuseOps fails on ("Cannot find the FInferType attribute
    registered to op: prim.if_then_else"): Reformer ran unfused. After the first numpy folding;
    repeated while it finds more (a size read from a shape of sizes)."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        for gvar, func in mod.functions_items():
            if not isinstance(func, relax.Function):
                continue
            done: set = set()
            while sizes := {var: dim for var, dim in _constant_sizes(mod[gvar]).items() if var not in done}:
                mod = relax.transform.BindSymbolicVars(sizes, gvar.name_hint)(mod)
                done.update(sizes)
        return mod
