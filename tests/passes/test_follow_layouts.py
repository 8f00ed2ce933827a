"""FollowLayouts (the last step of SimplifyLayouts): the ops after one that TVM 0.27's
ConvertLayout leaves in NCHW (leakyrelu) follow the convs' NHWC layout: reductions, softmaxes,
scans, pooling, pads, splits and concats, slices, resizes, channel-splitting reshapes; no
runtime transpose is left, and the graph computes what it did."""

import numpy as np
import pytest
import tvm
from tvm import relax

from accel_target.compiler import graph_module
from accel_target.passes.follow_layouts import follow_layouts
from accel_target.passes.follow_rules import kept_perm, reshape_groups
from tests.helpers import assert_close, run_relax
from tests.passes.test_elementwise import _permutes

C = 8  # channels after the first conv
RNG = np.random.default_rng(1)


def _const(*shape):
    return relax.const(RNG.standard_normal(shape).astype("float32"))


def _conv(cin, cout=4, **kwargs):
    return lambda x: relax.op.nn.conv2d(x, _const(cout, cin, 3, 3), padding=kwargs.get("padding", [1, 1, 1, 1]))


# branch name -> (bb, a) -> NCHW tensor of 4 channels, `a` the leakyrelu of the first conv [1, C, 8, 8]
BRANCHES = {
    "log_softmax": lambda bb, a: _conv(C)(bb.emit(relax.op.nn.log_softmax(a, axis=1))),
    "cumsum": lambda bb, a: _conv(C)(bb.emit(relax.op.cumsum(a, axis=1))),
    "sum_keepdims": lambda bb, a: _conv(C)(bb.emit(relax.op.multiply(a, bb.emit(relax.op.sum(a, [1], True))))),
    "squeeze_excite": lambda bb, a: _conv(C)(
        bb.emit(relax.op.multiply(a, bb.emit(relax.op.sigmoid(bb.emit(relax.op.mean(a, [2, 3], True))))))
    ),
    "max_pool": lambda bb, a: _conv(C)(bb.emit(relax.op.nn.max_pool2d(a, 3, 1, 1))),
    "avg_pool": lambda bb, a: _conv(C)(bb.emit(relax.op.nn.avg_pool2d(a, 2, 2))),
    "reflect_pad": lambda bb, a: _conv(C, padding=[0, 0, 0, 0])(
        bb.emit(relax.op.nn.pad(a, [0, 0, 0, 0, 1, 1, 1, 1], pad_mode="reflect"))
    ),
    "split_concat": lambda bb, a: _conv(C)(
        bb.emit(
            relax.op.concat(
                [bb.emit(relax.TupleGetItem(s, i)) for s in [bb.emit(relax.op.split(a, 2, 1))] for i in (1, 0)], 1
            )
        )
    ),
    "slice": lambda bb, a: _conv(4)(bb.emit(relax.op.strided_slice(a, [1], [2], [6]))),
    "resize": lambda bb, a: _conv(C)(bb.emit(relax.op.image.resize2d(a, (16, 16), method="nearest_neighbor"))),
    "radix_sum": lambda bb, a: _conv(4)(bb.emit(relax.op.sum(bb.emit(relax.op.reshape(a, [1, 2, 4, 8, 8])), [1]))),
    # MobileViT-v2's patches: H and W merged into a trailing size-1 axis, a group norm over them
    "merged_group_norm": lambda bb, a: _conv(C)(
        bb.emit(
            relax.op.reshape(
                bb.emit(
                    relax.op.nn.group_norm(
                        bb.emit(relax.op.reshape(a, [1, C, 64, 1])), _const(C), _const(C), 1, 1, [2, 3]
                    )
                ),
                [1, C, 8, 8],
            )
        )
    ),
    "where": lambda bb, a: _conv(C)(
        bb.emit(relax.op.where(bb.emit(relax.op.greater(a, relax.const(0.5))), a, relax.const(0.0)))
    ),
}


def _module(branches: dict) -> tvm.IRModule:
    """main(x [1, 3, 8, 8]) = concat of the spatial means of conv(branch(leakyrelu(conv(x))))."""
    x = relax.Var("x", relax.TensorType((1, 3, 8, 8), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.nn.leakyrelu(bb.emit(_conv(3, C)(x)), 0.1))
            means = [bb.emit(relax.op.mean(bb.emit(branch(bb, a)), [2, 3])) for branch in branches.values()]
            out = bb.emit_output(relax.op.concat(means, axis=1))
        bb.emit_func_output(out)
    return bb.get()


def test_ops_after_leakyrelu_follow_the_nhwc_layout():
    mod = _module(BRANCHES)
    converted = graph_module(mod, input_layout="NHWC")
    assert _permutes(converted) == []
    x = RNG.standard_normal((1, 3, 8, 8)).astype("float32")
    expected = run_relax(mod, [x], target="llvm")
    assert_close(run_relax(converted, [x.transpose(0, 2, 3, 1).copy()], target="llvm"), expected)


def _nchw_block(build) -> tvm.IRModule:
    """main(x NHWC) = build(bb, permute(x) to NCHW): the region of one permute."""
    x = relax.Var("x", relax.TensorType((1, 4, 4, 6), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(build(bb, bb.emit(relax.op.permute_dims(x, [0, 3, 1, 2]))))
        bb.emit_func_output(out)
    return bb.get()


# a permute moved down only where that removes more runtime transposes than it adds
@pytest.mark.parametrize(
    "build, moved",
    [
        # the relu's result read in NCHW by a reshape: still one permute, moved or not
        (lambda bb, y: relax.op.reshape(bb.emit(relax.op.nn.relu(y)), [1, 6, 16]), False),
        # added to an NCHW input tensor that would need a permute of its own
        (lambda bb, y: relax.op.add(y, relax.op.ones((1, 6, 4, 4), "float32")), False),
        # cancelled against the permute back after it
        (lambda bb, y: relax.op.permute_dims(bb.emit(relax.op.nn.relu(y)), [0, 2, 3, 1]), True),
        # a full reduction's result needs no permute at all
        (lambda bb, y: relax.op.sum(bb.emit(relax.op.exp(y)), [2, 3]), True),
    ],
)
def test_a_permute_moves_only_where_that_saves_transposes(build, moved):
    mod = _nchw_block(build)
    followed = follow_layouts(mod)
    assert (followed is not mod) == moved
    x = RNG.standard_normal((1, 4, 4, 6)).astype("float32")
    assert_close(run_relax(followed, [x], target="llvm"), run_relax(mod, [x], target="llvm"))


def test_reshape_groups_and_dropped_axes():
    # ResNeSt's radix split of the channels, and its inverse
    assert reshape_groups([1, 128, 16, 16], [1, 2, 64, 16, 16]) == [([0], [0]), ([1], [1, 2]), ([2], [3]), ([3], [4])]
    assert reshape_groups([1, 2, 64, 4], [1, 128, 4]) == [([0], [0]), ([1, 2], [1]), ([3], [2])]
    assert reshape_groups([6], [4]) is None
    # a trailing size-1 axis joins the last group
    assert reshape_groups([1, 8, 2, 2], [1, 8, 4, 1]) == [([0], [0]), ([1], [1]), ([2, 3], [2, 3])]
    # NHWC -> NCHW permute, then a sum over C without keepdims: [N, H, W] straight from the source
    assert kept_perm([0, 3, 1, 2], [1]) == [0, 1, 2]
    assert kept_perm([0, 3, 1, 2], [2, 3]) == [0, 1]
