"""argmax and argmin as PyTorch and numpy define them.

TVM's argmax reduces (index, value) pairs from the identity (-1, lowest finite value) and
keeps the accumulated pair unless the next value is greater: a row of -inf gives index -1
(no element of the row), and a NaN survives only while no number follows it. PyTorch and
numpy count NaN greater than every number (argmin: smaller) and return the first index of
the extremum. Here the reduction starts from a pair that loses every comparison (the
largest index, -inf; argmin: +inf), a NaN wins over every number, and of equal values (NaN
equal to NaN) the first index wins.
"""

from __future__ import annotations

from tvm import te, tirx

INDEX_DTYPE = "int64"


def _reducer(largest: bool):
    """The comm_reducer of (index, value) pairs: the better value, or of equal ones the first."""

    def combine(x, y):
        (x_index, x_value), (y_index, y_value) = x, y
        x_nan, y_nan = tirx.isnan(x_value), tirx.isnan(y_value)
        better = tirx.Or(x_value > y_value if largest else x_value < y_value, tirx.And(x_nan, tirx.Not(y_nan)))
        tie = tirx.And(tirx.Or(x_value == y_value, tirx.And(x_nan, y_nan)), x_index < y_index)
        take_x = tirx.Or(better, tie)
        return tirx.Select(take_x, x_index, y_index), tirx.Select(take_x, x_value, y_value)

    def identity(index_dtype, value_dtype):
        worst = -float("inf") if largest else float("inf")
        return tirx.max_value(index_dtype), tirx.const(worst, value_dtype)

    return te.comm_reducer(combine, identity, name="argmax" if largest else "argmin")


def arg_extremum(data: te.Tensor, axis: int | None, keepdims: bool, largest: bool) -> te.Tensor:
    """int64 index of the largest (`largest`) or smallest value along `axis` (None: of the
    flattened tensor, its row-major index); NaN counts as larger (smaller) than every number.

    data: a float tensor of any rank, symbolic dimensions allowed. The result drops `axis`
    (None: every axis), or keeps it with extent 1 where `keepdims`.
    """
    if not str(data.dtype).startswith(("float", "bfloat")):
        raise ValueError(f"arg_extremum: dtype {data.dtype} is not supported; it takes float tensors")
    shape = list(data.shape)
    axes = list(range(len(shape))) if axis is None else [axis % len(shape)]
    reduce_axes = dict(zip(axes, (te.reduce_axis((0, shape[a]), name=f"k{a}") for a in axes)))
    reducer = _reducer(largest)

    def compute(*out_index):
        kept = iter(out_index)
        index = []
        for a in range(len(shape)):
            if a in reduce_axes and keepdims:
                next(kept)
            index.append(reduce_axes[a] if a in reduce_axes else next(kept))
        flat = tirx.const(0, INDEX_DTYPE)
        for a in axes:
            flat = flat * tirx.Cast(INDEX_DTYPE, shape[a]) + tirx.Cast(INDEX_DTYPE, index[a])
        return reducer((flat, data[tuple(index)]), axis=list(reduce_axes.values()))

    out_shape = [1 if a in reduce_axes else d for a, d in enumerate(shape) if keepdims or a not in reduce_axes]
    return te.compute(out_shape, compute, name="argmax" if largest else "argmin")[0]
