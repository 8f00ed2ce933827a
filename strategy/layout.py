"""Local layout changes a strategy makes around its kernel.

Activations change layout through a visible "transpose" kernel; weights are
packed with the kernel's IndexMap — at compile time when they are constants,
through a visible "weight_layout_transform" kernel when they arrive at run time.
"""

from __future__ import annotations

import numpy as np
import tvm
import tvm_ffi
from tvm import relax, topi
from tvm.ir import Op
from tvm.tirx import IndexMap

WEIGHT_TRANSFORM = "weight_layout_transform"


def is_permutation(layout: str, canonical: str) -> bool:
    """Whether `layout` is a plain reordering of the axes in `canonical` (no split axes)."""
    return len(layout) == len(canonical) and sorted(layout) == sorted(canonical)


def permutation(src: str, dst: str) -> list[int]:
    """Axes that transpose a `src`-layout tensor into `dst` layout."""
    return [src.index(axis) for axis in dst]


def static_shape(expr: relax.Expr) -> list[int] | None:
    """The shape of a tensor expression as ints; None for a symbolic dimension or a non-tensor."""
    shape = getattr(expr.ty, "shape", None)
    if shape is None or not all(isinstance(d, tvm.tirx.IntImm) for d in shape):
        return None
    return [int(d) for d in shape]


def tensor_shape(expr: relax.Expr) -> list | None:
    """The shape of a tensor expression: an int per known dimension, the PrimExpr of a symbolic
    one (``batch``, ``seq * 12``); None for a non-tensor or an unknown shape."""
    shape = getattr(expr.ty, "shape", None)
    if shape is None:
        return None
    return [int(d) if isinstance(d, tvm.tirx.IntImm) else d for d in shape]


def symbolic_axes(shape: list) -> list[int]:
    """The axes of a `tensor_shape` that are not known numbers."""
    return [i for i, d in enumerate(shape) if not isinstance(d, int)]


def same_dims(a: list, b: list) -> bool:
    """Whether two `tensor_shape`s are provably equal, symbolic dimensions included."""
    analyzer = tvm.sym.Analyzer()
    return len(a) == len(b) and all(
        x == y if isinstance(x, int) and isinstance(y, int) else analyzer.can_prove_equal(x, y) for x, y in zip(a, b)
    )


class KernelDims:
    """The graph's shape variables as one kernel's builder sees them: fresh copies (a PrimFunc
    shares no variable with the Relax function that calls it), and the originals again for the
    scalar parameters of the PrimFunc (shape variables no buffer dimension binds alone)."""

    def __init__(self):
        self._copies: dict = {}

    def __call__(self, dim):
        """`dim` (an int, or an expression of the graph's shape variables) for the builder."""
        if isinstance(dim, int):
            return dim
        return tvm_ffi.structural_map(dim, (tvm.ir.Var, self._copy), order="post")

    def _copy(self, var):
        if var not in self._copies:
            self._copies[var] = tvm.ir.Var(var.name, var.ty)
        return self._copies[var]

    def scalar_args(self, func: tvm.tirx.PrimFunc) -> list:
        """The graph's variables to pass for `func`'s scalar parameters, in order."""
        originals = {copy: var for var, copy in self._copies.items()}
        return [originals[p] for p in func.params if p in originals]


def constant_array(const) -> np.ndarray:
    """The value of a relax constant as a numpy array (scalar constants hold a Python number)."""
    value = const.value
    return value.numpy() if hasattr(value, "numpy") else np.asarray(value, dtype=str(const.ty.dtype))


def array_constant(array) -> relax.Expr:
    """`array` as a relax constant of its own dtype: relax.const alone makes an int64 array
    int32 and a float64 one float32 (a folded index then meets int64 tensors it no longer
    type-checks with), and a 0-d one keeps its shape (np.ascontiguousarray makes it 1-d)."""
    array = np.asarray(array, order="C")
    return relax.const(array, str(array.dtype))


def constant_in(const, layout: str, canonical: str) -> np.ndarray:
    """The value of a relax constant in `layout`, transposed to `canonical` axes."""
    return constant_array(const).transpose(permutation(layout, canonical))


def reshape(bb: relax.BlockBuilder, x: relax.Expr, shape: list) -> relax.Expr:
    """A reshape kernel call, which the VM turns into a view (RewriteDataflowReshape)."""
    return bb.call_te(topi.reshape, x, shape, primfunc_name_hint="reshape")


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
) -> relax.Expr:
    """`weight` (in `layout`) packed by `index_map`, which is written for `canonical` axes.

    A split axis is zero-padded up to a multiple of its block. Constants are
    packed now, by `map_array`; a runtime weight gets one emitted
    layout_transform that does the reordering and the packing together.
    """
    if isinstance(weight, tvm.ir.expr.Constant):
        return array_constant(map_array(index_map, constant_in(weight, layout, canonical)))
    order = permutation(layout, canonical)
    full_map = IndexMap.from_func(lambda *axes: index_map.map_indices([axes[i] for i in order]), ndim=len(layout))
    call = bb.normalize(relax.op.layout_transform(weight, full_map, pad_value=0.0))
    lowered = Op.get("relax.layout_transform").get_attr("FLegalize")(bb, call)
    # TVM's kernel, under a name that says what it moves (reports count it as a weight
    # transform); the attribute keeps BlockBuilder from reusing the first name
    func = bb.get()[lowered.args[0]].with_attr("accel.weight_transform", True)
    gvar = bb.add_func(func, WEIGHT_TRANSFORM)
    return bb.emit(relax.call_tir(gvar, lowered.args[1], list(lowered.ty_args)))


_NUMPY_OPS = {
    tvm.tirx.FloorDiv: np.floor_divide,
    tvm.tirx.FloorMod: np.mod,
    tvm.tirx.Add: np.add,
    tvm.tirx.Sub: np.subtract,
    tvm.tirx.Mul: np.multiply,
}


def _evaluate(expr, env: dict):
    """An index expression of an IndexMap evaluated on numpy index grids."""
    if isinstance(expr, tvm.tirx.Var):
        return env[expr]
    if isinstance(expr, tvm.tirx.IntImm):
        return int(expr)
    op = _NUMPY_OPS.get(type(expr))
    if op is None:
        raise ValueError(f"strategy: cannot evaluate index expression {expr} in numpy")
    return op(_evaluate(expr.a, env), _evaluate(expr.b, env))


def map_array(index_map: IndexMap, array: np.ndarray) -> np.ndarray:
    """`array` laid out by `index_map`, padding with zeros where the map pads.

    What ``IndexMap.map_tensor`` does, vectorized in numpy (map_tensor walks
    element by element, ~6 s for a 2.4M-element weight) and with padding
    (map_tensor refuses maps that pad).
    """
    grids = np.indices(array.shape, sparse=True)
    env = dict(zip(index_map.initial_indices, grids))
    targets = tuple(np.broadcast_to(_evaluate(e, env), array.shape) for e in index_map.final_indices)
    out = np.zeros([int(d) for d in index_map.map_shape(list(array.shape))], array.dtype)
    out[targets] = array
    return out


def dtype_reason(call: relax.Call, supported) -> str | None:
    """None when the call's operand and output dtypes are all `supported`, else why not."""
    dtypes = {str(arg.ty.dtype) for arg in call.args if isinstance(arg.ty, relax.TensorType)}
    out_dtype = getattr(call.attrs, "out_dtype", None)
    if out_dtype is not None and str(out_dtype) not in ("", "void"):
        dtypes.add(str(out_dtype))
    if not dtypes <= set(supported):
        return f"dtype {'/'.join(sorted(dtypes))} is not supported (supported: {', '.join(supported)})"
    return None
