"""How an op follows the layout of its input: the call computed on its operands in their source
layout, for FollowLayouts (`follow_layouts.py`).

An operand ``y = permute_dims(x, perm)`` (axis i of y is axis perm[i] of x) reaches a call
``f(y, ...)``; `follow(call, perm)` says how to compute the same result from x instead: a call
``f'(x, ...)`` and the permutation ``out_perm`` that turns its result into f's, so that
``f(y, ...) == permute_dims(f'(x, ...), out_perm)``. It covers:

- every elementwise call (`op_kinds.is_elementwise`: relu, leakyrelu, softplus, where, clip,
  the arithmetic, comparisons, casts, full_like...): its other tensor operands are converted
  alike, and the call is checked again in its new form;
- the ops that take axes (reductions, argmax, softmax, cumsum, split, concat, squeeze, norms,
  take of 1-D indices, pad, strided_slice) or a layout (pooling, adaptive pooling, resize): the
  axes remapped, the layout string permuted (to one of `LAYOUTS`, which TVM's kernels take);
- broadcast_to, its target shape permuted;
- a reshape: the same reshape of the source's axes, then a permute of the groups of axes it
  splits or merges (ResNeSt's and SKNet's [N, radix * C, H, W] -> [N, radix, C, H, W]); where
  a group merges axes that are not side by side in the source, after a permute of the source
  that brings them together (a cost the region weighs).

The table `AXIS_FIELDS` is read by the attributes' type, which is what the op registers: the
meaning of an ``axis`` field is the op family's, not something a kernel could show.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import tvm
from tvm import relax

from .op_kinds import is_elementwise
from .relax_util import op_name

# attributes' type -> (fields that hold axes, field saying whether reduced axes are kept:
# None when the result keeps every axis, "" when the listed axes are always dropped)
AXIS_FIELDS = {
    "relax.attrs.SoftmaxAttrs": (("axis",), None),
    "relax.attrs.ScanopAttrs": (("axis",), None),
    "relax.attrs.SplitAttrs": (("axis",), None),
    "relax.attrs.ConcatAttrs": (("axis",), None),
    "relax.attrs.TakeAttrs": (("axis",), None),
    "relax.attrs.LayerNormAttrs": (("axes",), None),
    "relax.attrs.RMSNormAttrs": (("axes",), None),
    "relax.attrs.GroupNormAttrs": (("channel_axis", "axes"), None),
    "relax.attrs.InstanceNormAttrs": (("channel_axis", "axes"), None),
    "relax.attrs.StatisticalAttrs": (("axis",), "keepdims"),
    "relax.attrs.ArgmaxArgminAttrs": (("axis",), "keepdims"),
    "relax.attrs.SqueezeAttrs": (("axis",), ""),
}
# ...whose weight is shaped by the normalized axes, in order: kept only where they stay in order
ORDERED_AXES = {"relax.attrs.LayerNormAttrs", "relax.attrs.RMSNormAttrs"}
# attributes' type of the ops that take a layout string -> the layouts their kernels take
LAYOUTS = {
    "relax.attrs.Pool1DAttrs": ("NCW", "NWC"),
    "relax.attrs.Pool2DAttrs": ("NCHW", "NHWC"),
    "relax.attrs.Pool3DAttrs": ("NCDHW", "NDHWC"),
    "relax.attrs.AdaptivePool1DAttrs": ("NCW", "NWC"),
    "relax.attrs.AdaptivePool2DAttrs": ("NCHW", "NHWC"),
    "relax.attrs.AdaptivePool3DAttrs": ("NCDHW", "NDHWC"),
    "relax.attrs.Resize2DAttrs": ("NCHW", "NHWC"),
    "relax.attrs.Resize3DAttrs": ("NCDHW", "NDHWC"),
}


@dataclass(frozen=True)
class Follow:
    """A call computed from its operands in their source layout.

    carried: the operands converted with the layout: argument positions i, or (i, j) for
        field j of a tuple argument (concat's);
    out_perm: the permutation from the new call's result to the old one's (of every field,
        for a tuple result);
    rebuild: the new call, given the call's arguments with the carried ones converted (a tuple
        argument's fields as a list);
    cost: the runtime transposes that the new call adds.
    """

    carried: tuple
    out_perm: list[int]
    rebuild: Callable[[list], relax.Expr]
    cost: int = 0  # runtime transposes the new call makes (a reshape's, see _follow_reshape)


def follow(call: relax.Call, perm: list[int], order: tuple | None = None) -> Follow | None:
    """How `call`, whose carried operands are permuted by `perm` (all alike), is computed from
    their sources; None when it does not follow a layout (see the module docstring). `order`:
    a reshape's groups in the order to make them in (`reshape_orders`)."""
    type_key = _attrs_type(call)
    if type_key in AXIS_FIELDS:
        return _follow_axes(call, perm, type_key)
    if type_key in LAYOUTS:
        return _follow_layout(call, perm, type_key)
    if op_name(call) == "relax.nn.pad":
        return _follow_pad(call, perm)
    if op_name(call) == "relax.strided_slice":
        return _follow_slice(call, perm)
    if op_name(call) == "relax.broadcast_to":
        return _follow_broadcast(call, perm)
    if op_name(call) == "relax.reshape":
        return _follow_reshape(call, perm, order)
    return _follow_elementwise(call, perm)


def inverse(perm: list[int]) -> list[int]:
    """The permutation that undoes `perm`."""
    inv = [0] * len(perm)
    for i, axis in enumerate(perm):
        inv[axis] = i
    return inv


def source_shape(shape: list, perm: list[int]) -> list:
    """The shape of x for ``permute_dims(x, perm)`` of `shape`."""
    return [shape[i] for i in inverse(perm)]


def _attrs_type(call: relax.Call) -> str | None:
    attrs = getattr(call, "attrs", None)
    return None if attrs is None else type(attrs).__tvm_ffi_type_info__.type_key


def _with_attrs(call: relax.Call, **changes) -> tvm.ir.Attrs:
    """`call`'s attributes with the fields in `changes` replaced."""
    info = type(call.attrs).__tvm_ffi_type_info__
    fields = {f.name: getattr(call.attrs, f.name) for f in info.fields}
    return tvm.ir.make_node(info.type_key, **{**fields, **changes})


def _rebuild_with(call: relax.Call, attrs=None) -> Callable[[list], relax.Expr]:
    """args -> `call` of those args (a list in a tuple position becomes a Tuple), `attrs` if given."""

    def rebuild(args):
        args = [relax.Tuple(a) if isinstance(a, list) else a for a in args]
        return relax.Call(call.op, args, call.attrs if attrs is None else attrs, call.ty_args)

    return rebuild


def _follow_elementwise(call: relax.Call, perm: list[int]) -> Follow | None:
    """An elementwise call of rank len(perm): every tensor operand converted (a lower-rank one
    after leading unit axes), and the new call checked elementwise too (prelu's 1-D slope, say,
    must stay 1-D: no)."""
    if not isinstance(call.ty, relax.TensorType) or call.ty.ndim != len(perm) or not is_elementwise(call):
        return None
    carried = tuple(i for i, a in enumerate(call.args) if isinstance(a.ty, relax.TensorType) and a.ty.ndim > 0)
    placeholders = list(call.args)
    for i in carried:
        if call.args[i].ty.shape is None:
            return None
        shape = [1] * (len(perm) - call.args[i].ty.ndim) + list(call.args[i].ty.shape)
        placeholders[i] = relax.Var("operand", relax.TensorType(source_shape(shape, perm), call.args[i].ty.dtype))
    try:
        new = relax.BlockBuilder().normalize(_rebuild_with(call)(placeholders))
    except Exception:  # noqa: BLE001  (the op refuses its operands in the new form)
        return None
    if not is_elementwise(new):
        return None
    return Follow(carried, list(perm), _rebuild_with(call))


def _remapped(value, perm: list[int], ndim: int):
    """An axis field's value (an int, a list of them or None) in the source's axes."""
    if value is None:
        return None
    if isinstance(value, (int, tvm.tirx.IntImm)):
        return perm[int(value) % ndim]
    return [perm[int(a) % ndim] for a in value]


def _axes_of(value, ndim: int) -> list[int]:
    if value is None:
        return list(range(ndim))
    return [int(value) % ndim] if isinstance(value, (int, tvm.tirx.IntImm)) else [int(a) % ndim for a in value]


def kept_perm(perm: list[int], dropped: list[int]) -> list[int]:
    """`out_perm` of an op that drops the axes `dropped` (of the permuted tensor) from its result."""
    kept = [i for i in range(len(perm)) if i not in dropped]
    source_kept = sorted(perm[i] for i in kept)
    return [source_kept.index(perm[i]) for i in kept]


def _follow_axes(call: relax.Call, perm: list[int], type_key: str) -> Follow | None:
    """An op of AXIS_FIELDS: its axes counted in the source; the axes it drops out of out_perm."""
    fields, keep_field = AXIS_FIELDS[type_key]
    ndim = len(perm)
    name = op_name(call)
    if name == "relax.take" and call.args[1].ty.ndim != 1:
        return None
    if type_key == "relax.attrs.ScanopAttrs" and call.attrs.axis is None:
        return None  # (a scan of the flattened tensor)
    changes = {f: _remapped(getattr(call.attrs, f), perm, ndim) for f in fields}
    if "axes" in fields and changes["axes"] is not None:  # the norms' axes: a set of axes...
        if type_key in ORDERED_AXES and changes["axes"] != sorted(changes["axes"]):
            return None
        changes["axes"] = sorted(changes["axes"])
    dropped = []
    if keep_field == "" or (keep_field and not bool(getattr(call.attrs, keep_field))):
        dropped = _dropped_axes(call, ndim)
        if dropped is None:
            return None
    carried = tuple((0, j) for j in range(len(call.args[0].fields))) if name == "relax.concat" else (0,)
    return Follow(carried, kept_perm(perm, dropped), _rebuild_with(call, _with_attrs(call, **changes)))


def _dropped_axes(call: relax.Call, ndim: int) -> list[int] | None:
    """The axes a reduction or squeeze removes from its result."""
    axis = call.attrs.axis
    if op_name(call) == "relax.squeeze" and axis is None:
        shape = getattr(call.args[0].ty, "shape", None)
        if shape is None:
            return None
        return [i for i, d in enumerate(shape) if isinstance(d, tvm.tirx.IntImm) and int(d) == 1]
    return _axes_of(axis, ndim)


def _follow_layout(call: relax.Call, perm: list[int], type_key: str) -> Follow | None:
    """Pooling or resize in the source's layout, where its kernels take that one."""
    layout = str(call.attrs.layout)
    if len(layout) != len(perm) or str(getattr(call.attrs, "out_layout", layout)) != layout:
        return None
    source = "".join(layout[i] for i in inverse(perm))
    if source not in LAYOUTS[type_key]:
        return None
    changes = {"layout": source}
    if hasattr(call.attrs, "out_layout"):
        changes["out_layout"] = source
    return Follow((0,), list(perm), _rebuild_with(call, _with_attrs(call, **changes)))


def _follow_pad(call: relax.Call, perm: list[int]) -> Follow | None:
    """A pad of any mode, its widths moved to the source's axes."""
    widths = [int(v) for v in call.attrs.pad_width]
    if len(widths) != 2 * len(perm):
        return None
    moved = [0] * len(widths)
    for i, axis in enumerate(perm):
        moved[2 * axis : 2 * axis + 2] = widths[2 * i : 2 * i + 2]
    return Follow((0,), list(perm), _rebuild_with(call, _with_attrs(call, pad_width=moved)))


def _follow_slice(call: relax.Call, perm: list[int]) -> Follow | None:
    """strided_slice with its axes (a tuple argument) counted in the source."""
    axes = call.args[1]
    if not isinstance(axes, relax.Tuple) or not all(isinstance(a, tvm.tirx.IntImm) for a in axes.fields):
        return None
    moved = relax.Tuple([tvm.tirx.IntImm(str(a.ty.dtype), perm[int(a) % len(perm)]) for a in axes.fields])
    rebuild = _rebuild_with(call)
    return Follow((0,), list(perm), lambda args: rebuild([args[0], moved, *args[2:]]))


def _follow_broadcast(call: relax.Call, perm: list[int]) -> Follow | None:
    """broadcast_to of a tensor of the result's rank, to the target shape in the source's axes."""
    target = call.args[1]
    if not isinstance(target, relax.ShapeExpr) or len(target.values) != len(perm) or call.args[0].ty.ndim != len(perm):
        return None
    shape = relax.ShapeExpr(source_shape(list(target.values), perm))
    return Follow((0,), list(perm), lambda args: relax.op.broadcast_to(args[0], shape))


def _follow_reshape(call: relax.Call, perm: list[int], order: tuple | None = None) -> Follow | None:
    """A reshape of static shapes as the same reshape of the source, its groups of axes
    (`reshape_groups`) in `order` (indices into the groups; default: the source's own order).
    Where a group merges axes that are not side by side in that order in the source, the
    source is permuted first (`Follow.cost` 1): worth it when the permute after the reshape
    then cancels (EfficientFormer's attention output [heads, N, d] -> [heads * d, H, W] -> NHWC)."""
    found = _reshape_groups_of(call)
    if found is None:
        return None
    shape, new, groups = found
    order = _source_order(groups, shape, perm) if order is None else order
    first = [perm[i] for g in order for i in groups[g][0]]  # the source's axes, grouped
    outs = [k for g in order for k in groups[g][1]]  # the result's axes in the source's order
    grouped, moves = [new[k] for k in outs], transposes_of(first, source_shape(shape, perm))

    def rebuild(args):
        source = relax.op.permute_dims(args[0], first) if moves else args[0]
        return relax.op.reshape(source, grouped)

    return Follow((0,), [outs.index(k) for k in range(len(new))], rebuild, cost=moves)


def reshape_orders(call: relax.Call, perm: list[int]) -> list[tuple]:
    """The orders of a reshape's groups worth trying where the source's own order needs a
    permute: every order of the groups longer than 1 (at most 4 of them), the others kept."""
    found = _reshape_groups_of(call)
    if found is None:
        return []
    shape, _, groups = found
    default = _source_order(groups, shape, perm)
    first = [perm[i] for g in default for i in groups[g][0]]
    long = [g for g, (ins, _) in enumerate(groups) if any(shape[i] != 1 for i in ins)]
    if not transposes_of(first, source_shape(shape, perm)) or len(long) > 4:
        return []
    orders = []
    for chosen in itertools.permutations(long):
        slots = iter(chosen)
        orders.append(tuple(next(slots) if g in long else g for g in default))
    return orders


def _reshape_groups_of(call: relax.Call):
    """(input shape, output shape, `reshape_groups`) of a reshape of static shapes, or None."""
    target = call.args[1]
    shape = [int(d) if isinstance(d, tvm.tirx.IntImm) else None for d in call.args[0].ty.shape or []]
    if not isinstance(target, relax.ShapeExpr) or None in shape or not shape:
        return None
    new = [int(d) if isinstance(d, tvm.tirx.IntImm) else None for d in target.values]
    groups = None if None in new else reshape_groups(shape, new)
    return None if groups is None else (shape, new, groups)


def _source_order(groups: list, shape: list[int], perm: list[int]) -> tuple:
    """The groups in the order of their first source axis longer than 1 (groups of size-1 axes
    before the axis they stand at)."""

    def start(g):
        ins = groups[g][0]
        long = [perm[i] for i in ins if shape[i] != 1]
        return min(long) if long else perm[ins[0]] - 0.5

    return tuple(sorted(range(len(groups)), key=start))


def transposes_of(perm: list[int], shape: list) -> int:
    """1 when ``permute_dims`` by `perm` of a tensor of static `shape` moves an axis longer
    than 1 relative to another, else 0."""
    kept = [a for a in perm if int(shape[a]) != 1]
    return int(kept != sorted(kept))


def reshape_groups(shape: list[int], new: list[int]) -> list[tuple[list[int], list[int]]] | None:
    """The reshape of `shape` to `new` as (input axes, output axes) groups of equal size, each
    one axis split or axes merged, in order (trailing size-1 axes in the last group: [N, C, 2, 2]
    -> [N, C, 4, 1]); None when the sizes do not add up."""
    groups, i, k = [], 0, 0
    while i < len(shape) or k < len(new):
        ins, outs, a, b = [], [], 1, 1
        while True:
            if (a <= b or k == len(new)) and i < len(shape) and (not ins or a != b):
                ins.append(i)
                a *= shape[i]
                i += 1
            elif k < len(new) and (not outs or a != b):
                outs.append(k)
                b *= new[k]
                k += 1
            else:
                break
        if a != b:
            return None
        if not (ins and outs):  # size-1 axes left over at the end join the last group
            if not groups:
                return None
            groups[-1][0].extend(ins)
            groups[-1][1].extend(outs)
            continue
        groups.append((ins, outs))
    return groups
