"""Channels-last inputs and outputs: `convert_input_layout` / `convert_output_layout` give a
function 4-D image parameters or results in another layout than NCHW.

What ``input_layout="NHWC"`` means: every 4-D input that the model reads as NCHW is given
channels-last instead. "Reads as" is decided by the first conv2d the input reaches (through
permutes and elementwise ops, `channel_axis`): the input axis that lands on the conv's channel
axis is the input's channel axis.

- Axis 1 (a PyTorch model, [N, C, H, W]): the input becomes [N, H, W, C].
- Axis 3 (a TensorFlow / Keras export, [N, H, W, C] permuted to NCHW by the model itself): it
  already is channels-last; it is left as it is, so the option asks for what the model takes
  anyway and cannot turn [1, 224, 224, 3] into [1, 224, 3, 224]. (Raising instead would make a
  caller who compiles models of both kinds special-case the option; leaving it costs nothing:
  the model's own permute then cancels against the conv's.)
- Any other axis: a ValueError naming the input, its shape and the axis.
- No conv reached (an image model without convolutions): read as NCHW, as before.
"""

from __future__ import annotations

import tvm
from tvm import relax

from strategy.layout import permutation, tensor_shape

from .op_kinds import is_elementwise
from .relax_util import CONV2D, PAD, PERMUTE, num_inputs, op_name, permute_axes, with_function

SUPPORTED_LAYOUTS = ("NCHW", "NHWC")


def _converts(what: str, layout: str | None) -> bool:
    """Whether `layout` asks for a change (None and "NCHW" do not); a ValueError if unsupported."""
    if layout is None or layout == "NCHW":
        return False
    if layout not in SUPPORTED_LAYOUTS:
        raise ValueError(f"{what}={layout!r} is not supported; supported: None, {', '.join(SUPPORTED_LAYOUTS)}")
    return True


def channel_axis(func: relax.Function, param: relax.Var) -> int | None:
    """The axis of `param` that the first conv2d it reaches reads as its channels (through
    permutes, pads and elementwise ops of its rank), or None when it reaches none."""
    axes = {param: list(range(param.ty.ndim))}  # tensor -> the param's axis at each of its axes
    for block in func.body.blocks:
        for binding in block.bindings:
            value = binding.value
            args = list(value.args) if isinstance(value, relax.Call) else []
            tracked = [a for a in args if a in axes]
            if not tracked:
                continue
            if op_name(value) == CONV2D and args[0] in axes:
                return axes[args[0]][str(value.attrs.data_layout).index("C")]
            if op_name(value) == PERMUTE:
                axes[binding.var] = [axes[args[0]][a] for a in permute_axes(value)]
            elif op_name(value) == PAD or (is_elementwise(value) and value.ty.ndim == len(axes[tracked[0]])):
                axes[binding.var] = axes[tracked[0]]
    return None


def _input_shapes(func: relax.Function, function: str) -> str:
    shapes = ", ".join(
        f"{p.name}: {tensor_shape(p) if isinstance(p.ty, relax.TensorType) else p.ty}" for p in func.params
    )
    return f"{function}() takes ({shapes})"


def convert_input_layout(mod: tvm.IRModule, layout: str | None, function: str = "main") -> tvm.IRModule:
    """`mod` whose `function` takes every 4-D input that it reads as NCHW (an image [N, C, H, W])
    in `layout` instead ("NHWC": [N, H, W, C]); a symbolic batch stays symbolic. An input the
    model reads channels-last already (its own permute to NCHW: a Keras export) is left as it
    is; see the module docstring. Weights passed as parameters after the inputs ("num_input")
    are left as they are.

    The body starts by permuting the new input back to NCHW (in its first dataflow block, if it
    starts with one); after ConvertLayout that permute cancels against the one in front of the
    first convolution, or moves through the ops before it (SimplifyLayouts). None or "NCHW" leaves the
    module as it is; a function without a 4-D input is a ValueError, and so is an input whose
    first conv reads its channels on an axis other than 1 or 3.
    """
    if not _converts("input_layout", layout):
        return mod
    func = mod[function]
    perm_to_nchw, perm_from_nchw = permutation(layout, "NCHW"), permutation("NCHW", layout)
    channels_last = layout.index("C")
    new_params, bindings, already = [], [], []
    for i, param in enumerate(func.params):
        shape = tensor_shape(param)  # a symbolic batch too
        if shape is None or len(shape) != 4 or i >= num_inputs(func):
            new_params.append(param)
            continue
        axis = channel_axis(func, param)
        if axis == channels_last:
            new_params.append(param)
            already.append(param)
            continue
        if axis not in (None, 1):
            raise ValueError(
                f"input_layout={layout!r}: {function}() input {param.name} of shape {shape} is read with its "
                f"channels on axis {axis} by its first conv2d; supported: NCHW inputs (axis 1), made "
                f"{layout}, and inputs already {layout} (axis {channels_last}), left as they are"
            )
        new = relax.Var(
            f"{param.name}_{layout.lower()}", relax.TensorType([shape[axis] for axis in perm_from_nchw], param.ty.dtype)
        )
        new_params.append(new)
        bindings.append(relax.VarBinding(param, relax.op.permute_dims(new, perm_to_nchw)))
    if not bindings:
        if already:  # the model takes channels-last images already: nothing to change
            return mod
        raise ValueError(f"input_layout={layout!r} needs a 4-D NCHW image input, but {_input_shapes(func, function)}")
    blocks = list(func.body.blocks)
    if blocks and isinstance(blocks[0], relax.DataflowBlock):  # with the ops it may cancel against
        blocks[0] = relax.DataflowBlock(bindings + list(blocks[0].bindings))
    else:
        blocks.insert(0, relax.BindingBlock(bindings))
    new_func = relax.Function(new_params, relax.SeqExpr(blocks, func.body.body), func.ret_ty, func.is_pure, func.attrs)
    return relax.transform.Normalize()(with_function(mod, function, new_func))


class _OutputPermuter:
    """The bindings that permute the 4-D tensors of a result (a tensor, or tuples of them)
    by `perm`, each bound to a variable of its own."""

    def __init__(self, perm: list[int]):
        self.perm, self.bindings = perm, []

    def bind(self, value: relax.Expr, ty) -> relax.Var:
        var = relax.Var(f"out{len(self.bindings)}", ty)
        self.bindings.append(relax.VarBinding(var, value))
        return var

    def convert(self, expr: relax.Expr, ty) -> tuple[relax.Expr, object]:
        """(`expr` with its 4-D outputs permuted, its type)"""
        if isinstance(ty, relax.TupleType):
            fields = [self.convert(self.bind(relax.TupleGetItem(expr, i), t), t) for i, t in enumerate(ty.fields)]
            return relax.Tuple([f for f, _ in fields]), relax.TupleType([t for _, t in fields])
        shape = list(ty.shape.values) if isinstance(ty, relax.TensorType) and ty.shape else None
        if shape is None or len(shape) != 4:
            return expr, ty
        permuted = relax.TensorType([shape[axis] for axis in self.perm], ty.dtype)
        return self.bind(relax.op.permute_dims(expr, self.perm), permuted), permuted


def convert_output_layout(mod: tvm.IRModule, layout: str | None, function: str = "main") -> tvm.IRModule:
    """`mod` whose `function` returns every 4-D output (an NCHW image [N, C, H, W], alone or
    in tuples) in `layout` instead ("NHWC": [N, H, W, C]).

    The body ends by permuting those outputs from NCHW, in its last dataflow block if it ends
    with one; after ConvertLayout that permute cancels against the one after the last
    convolution. None or "NCHW" leaves the module as it is; a function without a 4-D output
    is a ValueError.
    """
    if not _converts("output_layout", layout):
        return mod
    func = mod[function]
    permuter = _OutputPermuter(permutation("NCHW", layout))
    result, ret_ty = permuter.convert(func.body.body, func.ret_ty)
    bindings = permuter.bindings
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
