"""SimplifyLayouts: the layout changes ConvertLayout leaves, cancelled or folded; ops it cannot
see through, made into ones it can.

Wherever they occur, it rewrites:

- chains of permute_dims into one permute (nothing when they cancel), also through pads and
  takes between them (done in the other layout); a permute that only moves size-1 axes into a
  reshape; a permute of a broadcast into the broadcast of the permute; a permute of a reshape
  of a permute that moves no element relative to a reshape into that reshape;
- a flatten-before-dense, ``matmul(reshape(permute_dims(x)), W)``, into
  ``matmul(reshape(x), W')`` with the rows of the constant W permuted at compile time instead
  of the activations at run time;
- ops ConvertLayout cannot see through (no FRelaxInferLayout in TVM 0.27) into ones it can:
  clip into maximum/minimum, a zero pad of the spatial axes into the padding of the conv2d
  that consumes it;
- a depthwise 1x1 conv2d with unit weights, stride and dilation into the zero pad it is (see
  `PadAsConv`, which creates them around ConvertLayout); a conv2d of ``x * s``, s a constant
  per input channel (image normalization's scale), into a conv2d of x with its weight scaled;
- a pad of all-zero widths into its input (a runtime copy otherwise); a reshape of a reshape
  into one reshape;
- squeeze's negative axes into non-negative ones (ConvertLayout fails on them);
- an elementwise op (`op_kinds.is_elementwise`: what TVM's kernel for it computes, not a list
  of names) of two tensors permuted alike into the permute of the op;
- an operand of an elementwise op of lower rank than the other, 4-D one (a per-channel scale
  [C, 1, 1]) into its reshape to 4-D, and the operand that broadcasts of an add or multiply
  second, so that it is converted with the layout;
- broadcast_to that changes nothing, and a matmul weight broadcast over the batch axes
  (PyTorch's export of Linear on 3-D input) back to the 2-D weight;
- an elementwise op of a reshape (an activation, an op with a scalar such as attention's
  scaling, or ``a + reshape(y)`` with operands of one shape: a residual add after a dense
  layer on flattened rows) into the reshape of the op (``reshape(reshape(a) + y)``), so that
  it follows the kernel directly and becomes its epilogue.

Each rewrite is a function ``(m, call) -> new expression or None`` (`m`: the mutator, for its
builder and bindings); `REWRITES` says which ones each op gets, in order; an elementwise call
it does not name gets `ELEMENTWISE_REWRITES` after the `ELEMENTWISE_CANONICAL` forms of its call.

Last, `follow_layouts` moves each runtime permute down through the ops that follow their
input's layout (every elementwise op, reductions and other ops of axes, pooling), wherever that
leaves fewer runtime transposes, and the rewrites above run once more on the result.
"""

from __future__ import annotations

import math

import numpy as np
import tvm
import tvm_ffi
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from strategy.layout import array_constant, constant_array, same_dims, static_shape, tensor_shape

from .follow_layouts import follow_layouts
from .op_kinds import is_elementwise
from .relax_util import (
    CONV2D,
    PAD,
    PERMUTE,
    RESHAPE,
    bound,
    conv2d_like,
    conv_padding_of_pad,
    moves_only_unit_axes,
    op_name,
    permute_axes,
    resolve,
    rewrite_functions,
)

MATMUL = "relax.matmul"
CLIP = "relax.clip"
TAKE = "relax.take"
BROADCAST = "relax.broadcast_to"
SQUEEZE = "relax.squeeze"
COMMUTATIVE = {"relax.add", "relax.multiply"}


def same_shape(a: list | None, b: list | None) -> bool:
    """Whether two shapes (`tensor_shape`: ints and the PrimExprs of symbolic dimensions) are one."""
    return a is not None and b is not None and bool(tvm_ffi.structural_equal(a, b))


def with_args(call: relax.Call, args: list) -> relax.Call:
    """`call` (same op, attributes and type arguments) of `args`."""
    return relax.Call(call.op, args, call.attrs, call.ty_args)


# permutes


def simplify_permute(m: PyExprMutator, call: relax.Call) -> relax.Expr:
    """permute_dims(x, axes) as one permute of what it meets (through pads and takes), a
    reshape, or nothing."""
    data, axes = call.args[0], permute_axes(call)
    inner = bound(m, data)
    if op_name(inner) == BROADCAST:
        hoisted = permute_before_broadcast(m, inner, axes)
        if hoisted is not None:
            return hoisted
    sunk = sink_permute(m, inner) if op_name(inner) in (PAD, TAKE) else None
    if sunk is not None:
        inner = sunk
    if op_name(inner) == PERMUTE:  # permute of a permute: one permute
        inner_axes = permute_axes(inner)
        data, axes = inner.args[0], [inner_axes[a] for a in axes]
    if op_name(inner) == RESHAPE:
        reshaped = reshape_of_permutes(m, inner, axes)
        if reshaped is not None:
            return reshaped
    if axes == sorted(axes):
        return data
    shape = static_shape(data)
    if shape is not None and moves_only_unit_axes(shape, axes):
        return relax.op.reshape(data, [shape[a] for a in axes])
    return relax.op.permute_dims(data, axes)


def permute_before_broadcast(m: PyExprMutator, broadcast: relax.Call, axes: list[int]) -> relax.Expr | None:
    """permute_dims(broadcast_to(y, s), axes) -> broadcast_to(permute_dims(y, axes), s permuted):
    the permute of what is broadcast, not of the broadcast (an efficient-channel-attention gate
    [N, C, 1, 1] expanded to its image's [N, C, H, W], which ConvertLayout permutes to NHWC for
    the product: a reshape to [N, 1, 1, C] then, where it was a transpose of the whole image)."""
    y, target = broadcast.args[0], broadcast.args[1]
    shape = static_shape(y)
    if not isinstance(target, relax.ShapeExpr) or len(target.values) != len(axes) or shape is None:
        return None
    if len(shape) < len(axes):  # (broadcasting aligns the trailing axes)
        y = m.builder_.emit(relax.op.reshape(y, [1] * (len(axes) - len(shape)) + shape))
    moved = m.builder_.emit(simplify_permute(m, relax.op.permute_dims(y, axes)))
    return relax.op.broadcast_to(moved, [target.values[a] for a in axes])


def collapse_reshapes(m: PyExprMutator, call: relax.Call) -> relax.Expr | None:
    """reshape(reshape(x, s1), s2) -> reshape(x, s2): one reshape for FollowLayouts to carry
    (its rule reads the groups of axes one reshape splits or merges)."""
    inner = bound(m, call.args[0])
    if op_name(inner) != RESHAPE:
        return None
    return relax.op.reshape(inner.args[0], call.args[1])


def reshape_of_permutes(m: PyExprMutator, reshape: relax.Call, axes: list[int]) -> relax.Expr | None:
    """permute_dims(reshape(permute_dims(x, p), s), axes) -> reshape(x, ...) when the two
    permutes leave every element where a reshape of x puts it (a ViT's patch embedding: the
    conv's NHWC output permuted to NCHW by ConvertLayout, flattened, permuted to [tokens,
    channels] by the model)."""
    permute = bound(m, reshape.args[0])
    if op_name(permute) != PERMUTE:
        return None
    x = permute.args[0]
    shape, middle = static_shape(x), static_shape(reshape)
    if shape is None or middle is None:
        return None
    index = np.arange(math.prod(shape)).reshape(shape).transpose(permute_axes(permute)).reshape(middle).transpose(axes)
    if not np.array_equal(index.ravel(), np.arange(index.size)):
        return None
    return relax.op.reshape(x, list(index.shape))


def sink_permute(m: PyExprMutator, call: relax.Call) -> relax.Call | None:
    """op(permute_dims(x, p)) -> permute_dims(op'(x), p) for a pad (any mode) or a take of 1-D
    indices (PyTorch exports reflect padding as takes), through chains of them; so that the
    permute meets the one after them (ops ConvertLayout left in NCHW)."""
    source = bound(m, call.args[0])
    if op_name(source) in (PAD, TAKE):
        source = sink_permute(m, source)
    if op_name(source) != PERMUTE:
        return None
    x, p, attrs = source.args[0], permute_axes(source), call.attrs
    if op_name(call) == TAKE:
        if attrs.axis is None or call.args[1].ty.ndim != 1:
            return None
        moved = relax.op.take(x, call.args[1], axis=p[int(attrs.axis) % len(p)], mode=str(attrs.mode))
    else:
        widths = [int(v) for v in attrs.pad_width]
        new_widths = [0] * len(widths)
        for i, axis in enumerate(p):  # axis i of the permuted tensor is axis p[i] of x
            new_widths[2 * axis : 2 * axis + 2] = widths[2 * i : 2 * i + 2]
        moved = relax.op.nn.pad(x, new_widths, pad_mode=str(attrs.pad_mode), pad_value=float(attrs.pad_value))
    return m.builder_.normalize(relax.op.permute_dims(m.builder_.emit(moved), p))


def drop_zero_pad(_m: PyExprMutator, call: relax.Call) -> relax.Expr | None:
    """pad(x, all widths 0) -> x: a copy of x (PyTorch's F.pad to a multiple that is met
    already, MobileViT's patches)."""
    return call.args[0] if all(int(w) == 0 for w in call.attrs.pad_width) else None


# ops ConvertLayout cannot see through


def clip_as_min_max(m: PyExprMutator, call: relax.Call) -> relax.Expr:
    """clip(x, low, high) -> minimum(maximum(x, low), high), which have layout inference."""
    data, low, high = call.args
    dtype = data.ty.dtype
    const = lambda v: relax.const(float(v.value), dtype)  # noqa: E731  (PrimValue -> tensor)
    return relax.op.minimum(m.builder_.emit(relax.op.maximum(data, const(low))), const(high))


def squeeze_from_front(_m: PyExprMutator, call: relax.Call) -> relax.Expr | None:
    """squeeze with negative axes -> the same axes counted from the front: ConvertLayout's
    layout inference for squeeze (TVM 0.27) indexes the layout with them as they are and dies
    with std::bad_alloc (Swin's pooler, squeeze(x, [-2]) after a conv's layout)."""
    axes = call.attrs.axis
    if axes is None or all(int(a) >= 0 for a in axes):
        return None
    ndim = call.args[0].ty.ndim
    if ndim < 0:  # rank unknown
        return None
    return relax.op.squeeze(call.args[0], [int(a) % ndim for a in axes])


def drop_noop_broadcast(_m: PyExprMutator, call: relax.Call) -> relax.Expr | None:
    """broadcast_to(x, shape of x) -> x, where the shapes are provably equal (symbolic ones
    too; an unknown shape is not)."""
    source, target = tensor_shape(call.args[0]), tensor_shape(call)
    return call.args[0] if source is not None and target is not None and same_dims(source, target) else None


# convolutions and pads


def absorb_pad(m: PyExprMutator, call: relax.Call) -> relax.Expr | None:
    """conv2d(pad(x, zeros on H and W only), w) -> conv2d(x, w) with the padding added."""
    pad = bound(m, call.args[0])
    attrs = call.attrs
    extra = conv_padding_of_pad(pad, str(attrs.data_layout)) if op_name(pad) == PAD else None
    if extra is None:
        return None
    return conv2d_like(call, pad.args[0], padding=[int(p) + e for p, e in zip(attrs.padding, extra)])


def conv_as_pad(m: PyExprMutator, call: relax.Call) -> relax.Expr | None:
    """A depthwise 1x1 conv2d with unit weights, stride and dilation -> the zero pad it is."""
    attrs, weight = call.attrs, resolve(m, call.args[1])
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


def absorb_input_scale(m: PyExprMutator, call: relax.Call) -> relax.Expr | None:
    """conv2d(x * s) or conv2d(x / s) -> conv2d(x) with the weight scaled along its input
    channels, for a constant s of one value per channel of x (or one in all): exact but for
    rounding, zero padding included (0 * s = 0). Keras-style image normalization before the
    first conv, say. A shift (x - mean) would not be exact (the padded border would be -mean
    instead of 0): it stays, an elementwise op in the conv's layout."""
    scaled, weight = bound(m, call.args[0]), resolve(m, call.args[1])
    name = op_name(scaled)
    if name not in ("relax.multiply", "relax.divide") or not isinstance(weight, tvm.ir.expr.Constant):
        return None
    for x, factor in [scaled.args] + ([scaled.args[::-1]] if name == "relax.multiply" else []):
        scale = _channel_scale(resolve(m, factor), x, scaled, str(call.attrs.data_layout))
        if scale is not None:
            scale = 1.0 / scale if name == "relax.divide" else scale
            return with_args(call, [x, array_constant(_scaled_weight(constant_array(weight), scale, call.attrs))])
    return None


def _channel_scale(factor, x, scaled: relax.Call, layout: str) -> np.ndarray | None:
    """The constant `factor` of ``scaled = x * factor`` as one float per channel of x (layout
    `layout`), or None: not a constant, not per channel, or x broadcast by it."""
    if not isinstance(factor, tvm.ir.expr.Constant) or not isinstance(factor.ty, relax.TensorType):
        return None
    shape, dtype = static_shape(x), str(x.ty.dtype)
    if shape is None or shape != static_shape(scaled) or len(shape) != len(layout) or "float" not in dtype:
        return None
    values = constant_array(factor)
    if values.ndim > len(shape):
        return None
    values = values.reshape([1] * (len(shape) - values.ndim) + list(values.shape))
    channel = layout.index("C")
    if any(n != 1 for axis, n in enumerate(values.shape) if axis != channel):
        return None
    return np.broadcast_to(values.reshape(-1).astype("float64"), (shape[channel],))


def _scaled_weight(weight: np.ndarray, scale: np.ndarray, attrs) -> np.ndarray:
    """A conv2d weight (layout attrs.kernel_layout) times `scale` along its input channels:
    input channel i of output channel o is channel (o // (O / groups)) * I + i of the data."""
    layout, groups = str(attrs.kernel_layout), int(attrs.groups)
    o_axis, i_axis = layout.index("O"), layout.index("I")
    outs, ins = weight.shape[o_axis], weight.shape[i_axis]
    channel = (np.arange(outs)[:, None] // (outs // groups)) * ins + np.arange(ins)[None, :]
    factors = scale[channel]  # [O, I]
    if i_axis < o_axis:
        factors = factors.T
    shape = [n if axis in (o_axis, i_axis) else 1 for axis, n in enumerate(weight.shape)]
    return (weight * factors.reshape(shape)).astype(weight.dtype)


# dense layers


def unbroadcast_weight(m: PyExprMutator, call: relax.Call) -> relax.Expr | None:
    """matmul(x, broadcast_to(w, [B, K, N])) -> matmul(x, w) when the result is the same."""
    source = bound(m, call.args[1])
    if op_name(source) != BROADCAST:
        return None
    weight = source.args[0]
    if weight.ty.ndim != 2:
        return None
    new = m.builder_.normalize(relax.op.matmul(call.args[0], weight, out_dtype=call.attrs.out_dtype))
    shape = static_shape(call)
    return new if shape is not None and static_shape(new) == shape else None


def absorb_flatten(m: PyExprMutator, call: relax.Call) -> relax.Expr | None:
    """matmul(reshape(permute_dims(x, p), [N, -1]), W) -> matmul(reshape(x, [N, -1]), W')."""
    flat, weight = call.args[0], resolve(m, call.args[1])
    reshape = bound(m, flat)
    if op_name(reshape) != RESHAPE or not isinstance(weight, tvm.ir.expr.Constant):
        return None
    permute = bound(m, reshape.args[0])
    if op_name(permute) != PERMUTE:
        return None
    x, axes = permute.args[0], permute_axes(permute)
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
    new_flat = m.builder_.emit(relax.op.reshape(x, flat_shape))
    return relax.op.matmul(new_flat, array_constant(rows.reshape(w.shape)), out_dtype=call.attrs.out_dtype)


# elementwise ops: canonical forms of their calls


def to_full_rank(m: PyExprMutator, call: relax.Call) -> relax.Call:
    """f(c, x) with x 4-D and c of lower rank (a per-channel scale [C, 1, 1] of an NCHW tensor:
    PoolFormer's layer scale) -> f(reshape(c, [1, C, 1, 1]), x), c with leading unit axes as
    broadcasting reads it: ConvertLayout converts an operand of the same rank with the layout,
    and leaves a lower-rank one in NCHW between two transposes. (A constant c's reshape is
    folded.)"""
    shapes = [static_shape(a) for a in call.args]
    if len(call.args) != 2 or None in shapes or sorted(len(s) for s in shapes)[1] != 4:
        return call
    low = 0 if len(shapes[0]) < len(shapes[1]) else 1
    if not 0 < len(shapes[low]) < 4:  # (a scalar converts as it is)
        return call
    args = list(call.args)
    args[low] = m.builder_.emit(relax.op.reshape(args[low], [1] * (4 - len(shapes[low])) + shapes[low]))
    return m.builder_.normalize(with_args(call, args))


def broadcast_operand_second(_m: PyExprMutator, call: relax.Call) -> relax.Call:
    """add / multiply(b, x) -> (x, b) when x has the result's shape and b does not (it
    broadcasts): ConvertLayout gives an elementwise op its first operand's layout, so with the
    scale first the activation went back to NCHW (PoolFormer's layer scale)."""
    if op_name(call) not in COMMUTATIVE or len(call.args) != 2:
        return call
    shape = static_shape(call)
    first, second = (static_shape(a) for a in call.args)
    if shape is None or first == shape or second != shape:
        return call
    return with_args(call, [call.args[1], call.args[0]])


# elementwise ops: rewrites


def elementwise_of_permutes(m: PyExprMutator, call: relax.Call) -> relax.Expr | None:
    """f(permute_dims(a, p), permute_dims(b, p)) -> permute_dims(f(a, b), p) for operands of one
    shape (ConvNeXt's residual add, both sides permuted back to NCHW): one permute instead of
    two, which then meets the permute after it (and cancels, in ConvNeXt)."""
    permutes = [bound(m, a) for a in call.args]
    if len(permutes) != 2 or any(op_name(p) != PERMUTE for p in permutes):
        return None
    (a, b), axes = (p.args[0] for p in permutes), permute_axes(permutes[0])
    if permute_axes(permutes[1]) != axes or static_shape(a) is None or static_shape(a) != static_shape(b):
        return None
    return relax.op.permute_dims(m.builder_.emit(with_args(call, [a, b])), axes)


def follows_matmul(m: PyExprMutator, expr: relax.Expr) -> bool:
    """Whether `expr` is a matmul, or an elementwise op of one (after a bias add, GELU)."""
    call = bound(m, expr)
    if op_name(call) == MATMUL:
        return True
    return is_elementwise(call) and tensor_shape(expr) is not None and any(follows_matmul(m, a) for a in call.args)


def elementwise_before_reshape(m: PyExprMutator, call: relax.Call) -> relax.Expr | None:
    """f(reshape(y), ...) -> reshape(f(y, ...)) for an elementwise f whose other tensor operands
    are scalars, or one tensor of the result's shape when y is a matmul's result (that one is
    reshaped: a residual add); so that f follows the kernel and becomes its epilogue. Shapes
    may be symbolic (BERT's [batch, seq, 768] over [batch * seq, 768] rows)."""
    shape = tensor_shape(call)
    if shape is None:
        return None
    tensors = [i for i, a in enumerate(call.args) if isinstance(a.ty, relax.TensorType)]
    for i in tensors:
        reshape = bound(m, call.args[i])
        if op_name(reshape) != RESHAPE or tensor_shape(reshape.args[0]) is None:
            continue
        y = reshape.args[0]
        if not same_shape(tensor_shape(reshape), shape):  # (a reshaped operand that broadcasts)
            continue
        args = list(call.args)
        args[i] = y
        others = [j for j in tensors if j != i and tensor_shape(call.args[j]) != []]  # not scalars
        if others:
            j = others[0]
            if len(others) > 1 or not same_shape(tensor_shape(args[j]), shape) or not follows_matmul(m, y):
                continue
            args[j] = m.builder_.emit(relax.op.reshape(args[j], tensor_shape(y)))
        return relax.op.reshape(m.builder_.emit(with_args(call, args)), shape)
    return None


# the canonical forms of an elementwise call, in order: (m, call) -> call
ELEMENTWISE_CANONICAL = (to_full_rank, broadcast_operand_second)
# the rewrites of an elementwise call (op_kinds.is_elementwise) that REWRITES does not name
ELEMENTWISE_REWRITES = (elementwise_of_permutes, elementwise_before_reshape)
# op -> its rewrites, in order: the first that returns an expression replaces the call
REWRITES = {
    PERMUTE: (simplify_permute,),
    RESHAPE: (collapse_reshapes,),
    PAD: (drop_zero_pad,),
    CLIP: (clip_as_min_max,),
    BROADCAST: (drop_noop_broadcast,),
    SQUEEZE: (squeeze_from_front,),
    MATMUL: (unbroadcast_weight, absorb_flatten),
    CONV2D: (conv_as_pad, absorb_pad, absorb_input_scale),
}


@mutator
class _LayoutSimplifier(PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        rewrites = REWRITES.get(op_name(call))
        if rewrites is None and is_elementwise(call):
            for canonical in ELEMENTWISE_CANONICAL:
                call = canonical(self, call)
            rewrites = ELEMENTWISE_REWRITES
        for rewrite in rewrites or ():
            new = rewrite(self, call)
            if new is not None:
                return new
        return call


@tvm.transform.module_pass(opt_level=0, name="SimplifyLayouts")
class SimplifyLayouts:
    """The rewrites listed in this module's docstring, in every Relax function."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        mod = rewrite_functions(_LayoutSimplifier, mod)
        followed = follow_layouts(mod)
        return mod if followed is mod else rewrite_functions(_LayoutSimplifier, followed)
