"""Symbolic extents: an axis whose size is a variable when the kernel is built and a number
when it runs (a batch, a sequence length).

The kernels' builders take such an axis as ``None`` (`SYMBOLIC`: a fresh `tirx.Var`) or as
an expression of shape variables (``b * s``, as the strategies pass the graph's own, copied:
so that the kernel's buffers have the shapes of the Relax values, as TVM's own kernels do,
and FuseTIR can merge an epilogue into it). A variable that is no whole dimension of any
buffer becomes a scalar parameter after the inputs (as in ``bb.emit_te``). Tile sizes,
weight packing and loop orders are those of the static kernel built for a representative
size: `REPRESENTATIVE_ROWS` rows of a matrix product (BERT at sequence length 128),
`REPRESENTATIVE_BATCH` images of a convolution (a batch-1 build's kernel). The tail of a
symbolic axis is computed on a padded register tile (rows re-read the last one) and dropped
at write-back, as a static tail is.

TVM's simplifier knows that a buffer dimension that is one variable is not negative, not
the factors of a product (``b * s``): without that, ``floormod(i, ceildiv(b * s, 8))`` has
no known sign, the register tile's compacted indices keep their offsets and the tile stays
in memory instead of registers.
`sizes_non_negative` makes those shape parameters non-negative on their face.
"""

from __future__ import annotations

from tvm import tirx

SYMBOLIC = None
REPRESENTATIVE_ROWS = 128
REPRESENTATIVE_BATCH = 1


def is_static(dim) -> bool:
    """Whether an extent (int, IntImm or PrimExpr) is a known number."""
    return isinstance(dim, (int, tirx.IntImm))


def static_or(dim, default: int) -> int:
    """`dim` as an int, or `default` when it is symbolic."""
    return int(dim) if is_static(dim) else default


def extent(dim, name: str):
    """A builder's extent: an int as it is, `SYMBOLIC` as a fresh int64 variable `name`, an
    expression of shape variables as it is."""
    if dim is SYMBOLIC:
        return tirx.Var(name, "int64")
    return int(dim) if is_static(dim) else dim


def unbound_vars(tensors) -> list[tirx.Var]:
    """The shape variables of `tensors` that are no whole dimension of any of them (by name):
    the scalar parameters a PrimFunc of these tensors needs."""
    used, bound = {}, set()
    for tensor in tensors:
        for dim in tensor.shape:
            if isinstance(dim, tirx.Var):
                bound.add(dim)
            elif not is_static(dim):
                used.update((v.name, v) for v in tirx.analysis.undefined_vars(dim))
    return [v for _, v in sorted(used.items(), key=lambda item: item[0]) if v not in bound]


def prim_func(inputs, output) -> tirx.PrimFunc:
    """`te.create_prim_func` of (inputs, the unbound shape variables, output), int64 indices."""
    from tvm import te

    return te.create_prim_func([*inputs, *unbound_vars([*inputs, output]), output], index_dtype_override="int64")


def ceil_to(n, block: int):
    """`n` rounded up to a multiple of `block`: an int, or an expression for a symbolic `n`."""
    if is_static(n):
        return -(-int(n) // block) * block
    return tirx.ceildiv(n, block) * block


def _size_parameters(func: tirx.PrimFunc) -> list[tirx.Var]:
    """The scalar parameters of `func` that occur in a buffer parameter's dimension that is
    no single variable (``b * s``, ``b * 12``)."""
    names = set()
    for param in func.params:
        for dim in getattr(param.ty, "shape", ()):
            if not is_static(dim) and not isinstance(dim, tirx.Var):
                names.update(v.name for v in tirx.analysis.undefined_vars(dim))
    return [p for p in func.params if not hasattr(p.ty, "shape") and p.name in names]


def sizes_non_negative(func: tirx.PrimFunc) -> tirx.PrimFunc | None:
    """`func` with each scalar shape parameter ``v`` of a product-shaped buffer read as
    ``max(v, 0)`` everywhere (same value for any size, same signature); None if there is none."""
    sizes = _size_parameters(func)
    if not sizes:
        return None
    fresh = {p.name: tirx.Var(p.name, p.ty.dtype) for p in sizes}
    special = func.specialize({p: tirx.max(fresh[p.name], tirx.const(0, p.ty.dtype)) for p in sizes})
    kept = iter(special.params)  # the others, in order (names may repeat: an in-place output)
    params = [fresh[p.name] if any(p.same_as(v) for v in sizes) else next(kept) for p in func.params]
    return tirx.PrimFunc(params, special.body, special.ret_type, special.attrs)
