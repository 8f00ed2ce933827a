"""Operands read through layout ops: a kernel reads its input where the model keeps it.

Attention splits the output of one dense layer into heads with a reshape, a permute and a
slice (Q, K and V of ``qkv [S, 3 * H * D]`` as ``[H, S, D]``), and merges them again with a
permute before the next dense layer. Materialized, each permute is a copy of the whole
activation at run time. A `View` is the chain of such ops from a source tensor to the
operand a kernel takes; `apply` rebuilds it in TE on the kernel's placeholder of the source,
so that the kernel's schedule inlines it (`inline_views`) and its loads index the source
directly: ``q[h, s, d]`` is ``qkv[s, h * D + d]``.

The steps are TVM's own TOPI computes for the Relax ops (``permute_dims``, ``strided_slice``,
``squeeze``, ``broadcast_to``; ``reshape`` indexes each group of equal-size axes on its own),
so a view reads exactly what the materialized ops would have written. `reads` says whether
a kernel reads the view without dividing its indices, and whether the view's last axis is
consecutive in the source (vector loads of it are whole) or needs packing first.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import s_tir, te, tirx, topi
from tvm.sym import Analyzer, detect_linear_equation
from tvm.topi.utils import ravel_index, unravel_index

_TENSOR_LOAD = tvm.ir.Op.get("te.tensor_load")  # a compute's read of a tensor: (tensor, *indices)


def is_tensor_load(expr) -> bool:
    """Whether `expr` is a TE compute's read of a tensor (a call of te.tensor_load: tensor, *indices)."""
    return isinstance(expr, tvm.ir.expr.Call) and expr.op.same_as(_TENSOR_LOAD)


@dataclass(frozen=True)
class View:
    """A tensor read through layout ops. shape: the source's (ints, or expressions of the
    kernel's shape variables); steps: ("reshape", shape), ("transpose", axes),
    ("strided_slice", begin, end, strides, axes, assume_inbound), ("squeeze", axes or None),
    ("broadcast_to", shape), in the order they apply."""

    shape: tuple
    steps: tuple

    def then(self, *steps: tuple) -> View:
        """This view followed by `steps`."""
        return View(self.shape, self.steps + tuple(steps))


def apply(view: View, source: te.Tensor) -> te.Tensor:
    """`view`'s steps applied to `source` (a placeholder of `view.shape`)."""
    tensor = source
    for kind, *args in view.steps:
        if kind == "reshape":
            tensor = _reshape(tensor, list(args[0]))
        elif kind == "transpose":
            tensor = topi.transpose(tensor, list(args[0]))
        elif kind == "strided_slice":
            begin, end, strides, axes, assume_inbound = args
            tensor = topi.strided_slice(
                tensor, list(begin), list(end), list(strides), list(axes), "end", assume_inbound
            )
        elif kind == "squeeze":
            tensor = topi.squeeze(tensor, None if args[0] is None else list(args[0]))
        elif kind == "broadcast_to":
            tensor = topi.broadcast_to(tensor, list(args[0]))
        else:
            raise ValueError(
                f"views: unknown step {kind!r}; known: reshape, transpose, strided_slice, squeeze, broadcast_to"
            )
    return tensor


def _is_one(dim) -> bool:
    return isinstance(dim, (int, tirx.IntImm)) and int(dim) == 1


def _reshape_groups(old: list, new: list) -> list[tuple[list[int], list[int]]] | None:
    """The axes of `old` and `new` in groups of equal size, in order, unit axes left out (a
    symbolic size groups only with the same size); None where there are no such groups."""
    o = [a for a, d in enumerate(old) if not _is_one(d)]
    n = [a for a, d in enumerate(new) if not _is_one(d)]
    groups, i, j = [], 0, 0
    while i < len(o) and j < len(n):
        group = ([o[i]], [n[j]])
        sizes = [old[o[i]], new[n[j]]]
        if not all(isinstance(d, (int, tirx.IntImm)) for d in sizes):
            if not Analyzer().can_prove_equal(sizes[0], sizes[1]):
                return None
        else:
            sizes = [int(d) for d in sizes]
            while sizes[0] != sizes[1]:
                side, axes, dims, k = (0, o, old, i) if sizes[0] < sizes[1] else (1, n, new, j)
                k += 1
                if k >= len(axes) or not isinstance(dims[axes[k]], (int, tirx.IntImm)):
                    return None
                group[side].append(axes[k])
                sizes[side] *= int(dims[axes[k]])
                i, j = (k, j) if side == 0 else (i, k)
        groups.append(group)
        i, j = i + 1, j + 1
    return groups if i == len(o) and j == len(n) else None


def _reshape(tensor: te.Tensor, shape: list) -> te.Tensor:
    """topi.reshape, but indexing each group of axes of equal size on its own (`_reshape_groups`):
    a symbolic axis that the reshape keeps is read as it is, not through a division by it."""
    old = list(tensor.shape)
    groups = _reshape_groups(old, shape)
    if groups is None:
        return topi.reshape(tensor, shape)

    def element(*index):
        source = [tirx.const(0, d.ty.dtype) for d in old]
        for old_axes, new_axes in groups:
            flat = ravel_index([index[a] for a in new_axes], [shape[a] for a in new_axes])
            for a, i in zip(old_axes, unravel_index(flat, [old[a] for a in old_axes])):
                source[a] = i
        return tensor(*source)

    return te.compute(shape, element, name="T_reshape")


def _substitute(expr, mapping: dict):
    """`expr` with the variables of `mapping` replaced, as it is (tir_passes.blocks.substitute
    goes through PrimFunc.specialize, after which a symbolic view's last index no longer reads
    as linear to detect_linear_equation)."""
    return tvm_ffi.structural_map(expr, (tirx.Var, lambda v: mapping.get(v, v)), order="post")


def _source_indices(tensor: te.Tensor, indices: list) -> list | None:
    """The source indices that `tensor[indices]` reads, through its chain of computes (each a
    single load of its input); None where a step is no such load."""
    while not isinstance(tensor.op, te.PlaceholderOp):
        body = tensor.op.body[tensor.value_index]
        if not is_tensor_load(body):
            return None
        mapping = {axis.var: index for axis, index in zip(tensor.op.axis, indices)}
        tensor, *loaded = body.args
        indices = [_substitute(i, mapping) for i in loaded]
    return indices


@dataclass(frozen=True)
class Reads:
    """How a kernel reads a view of [B, M, K] or [B, K, N]. direct: at source indices without a
    division or remainder of its row or column index, so that it pays no more per element than
    reading a tensor (a division of the matrix index B is made once per tile). unit_stride_last:
    consecutive elements of the last axis are consecutive in the source (the source's last
    index moves by one with it, no other index moves), so vector loads of it are whole."""

    direct: bool
    unit_stride_last: bool


@functools.lru_cache(maxsize=256)  # the strategy and the kernel's builder ask of the same views
def reads(view: View) -> Reads:
    """How `view` is read (see Reads), from its source indices as TVM's analyzer simplifies them."""
    tensor = apply(view, te.placeholder(view.shape, name="source"))
    variables = [tirx.Var(f"i{a}", size.ty.dtype) for a, size in enumerate(tensor.shape)]
    indices = _source_indices(tensor, variables)
    if indices is None:
        return Reads(False, False)
    analyzer = Analyzer()
    for var, size in zip(variables, tensor.shape):
        analyzer.bind(var, tvm.ir.Range(0, size))
    *leading, final = (analyzer.simplify(i) for i in indices)
    direct = not any(_divides(i, variables[1:]) for i in (*leading, final))
    last = variables[-1]
    coefficients = detect_linear_equation(final, [last])
    unit_stride = len(coefficients) == 2 and analyzer.can_prove_equal(coefficients[0], 1)
    unit_stride = unit_stride and not any(v.same_as(last) for i in leading for v in tirx.analysis.undefined_vars(i))
    return Reads(direct, unit_stride)


def _divides(expr, variables: list) -> bool:
    """Whether `expr` divides, or takes a remainder of, an expression of one of `variables`."""
    found = []
    division = (tirx.FloorDiv, tirx.FloorMod, tirx.Div, tirx.Mod)

    def note(e):
        if any(v.same_as(w) for v in tirx.analysis.undefined_vars(e) for w in variables):
            found.append(e)
        return e

    tvm_ffi.structural_map(expr, (division, note), order="post")
    return bool(found)


def inline_views(sch: s_tir.Schedule, keep: tuple[str, ...]) -> None:
    """Inline every block at the root of `sch` but those named in `keep` (the kernel's own):
    the steps of its views, so that the kernel reads their sources."""
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        if sch.get(block).name_hint not in keep:
            sch.compute_inline(block)
