"""Local layout changes a strategy makes around its kernel.

Activations change layout through a visible "transpose" kernel; weights are
packed with the kernel's IndexMap — at compile time when they are constants,
through a visible "te_layout_transform" kernel when they arrive at run time.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, topi
from tvm.ir import Op
from tvm.tirx import IndexMap


def is_permutation(layout: str, canonical: str) -> bool:
    """Whether `layout` is a plain reordering of the axes in `canonical` (no split axes)."""
    return len(layout) == len(canonical) and sorted(layout) == sorted(canonical)


def permutation(src: str, dst: str) -> list[int]:
    """Axes that transpose a `src`-layout tensor into `dst` layout."""
    return [src.index(axis) for axis in dst]


def static_shape(expr: relax.Expr) -> list[int] | None:
    """The shape of a tensor expression as ints, or None when any dimension is symbolic."""
    shape = expr.ty.shape
    if shape is None or not all(isinstance(d, tvm.tirx.IntImm) for d in shape):
        return None
    return [int(d) for d in shape]


def to_layout(x: relax.Expr, src: str, dst: str, bb: relax.BlockBuilder) -> relax.Expr:
    """`x` converted from `src` to `dst` layout by a transpose kernel (`x` itself when equal).

    Returns the call, not emitted, so that a legalization can return it as its result.
    """
    if src == dst:
        return x
    return bb.call_te(topi.transpose, x, permutation(src, dst), primfunc_name_hint="transpose")


def pack_weight(
    bb: relax.BlockBuilder,
    weight: relax.Expr,
    layout: str,
    canonical: str,
    index_map: IndexMap,
    split: tuple[str, int],
) -> relax.Expr:
    """`weight` (in `layout`) packed by `index_map`, which is written for `canonical` axes.

    `split` = (axis, block): the axis `index_map` splits, zero-padded up to a
    multiple of block. Constants are packed now, in numpy +
    IndexMap.map_tensor; a runtime weight gets one emitted layout_transform
    that does the reordering and the packing together.
    """
    order = permutation(layout, canonical)
    if isinstance(weight, tvm.ir.expr.Constant):
        array = weight.value.numpy().transpose(order)
        axis, block = canonical.index(split[0]), split[1]
        pad = [(0, 0)] * array.ndim
        pad[axis] = (0, -array.shape[axis] % block)
        packed = index_map.map_tensor(tvm.runtime.tensor(np.ascontiguousarray(np.pad(array, pad))))
        return relax.const(packed)
    full_map = IndexMap.from_func(lambda *axes: index_map.map_indices([axes[i] for i in order]), ndim=len(layout))
    call = bb.normalize(relax.op.layout_transform(weight, full_map, pad_value=0.0))
    return bb.emit(Op.get("relax.layout_transform").get_attr("FLegalize")(bb, call))
