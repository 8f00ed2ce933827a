"""Layout conversion by principle: which calls are elementwise (accel_target.passes.op_kinds),
and every one of them followed by the layout in a conv -> op -> conv block fed NHWC (no runtime
transpose left), whether TVM gives the op a layout inference or not."""

import inspect

import numpy as np
import pytest
import tvm
from tvm import relax

from accel_target.compiler import graph_module
from accel_target.passes.op_kinds import is_elementwise

SHAPE = (1, 4, 6, 6)  # NCHW, as imported
RNG = np.random.default_rng(0)


def _var(name, dtype="float32", shape=SHAPE):
    return relax.Var(name, relax.TensorType(shape, dtype))


def _probe(build):
    """`build(bb)` normalized inside a throwaway function (the calls need no real context)."""
    bb = relax.BlockBuilder()
    x = _var("probe")
    with bb.function("probe", [x]):
        call = bb.normalize(build(bb))
        bb.emit_func_output(x)
    return call


def _enumerated() -> dict:
    """op name -> (builder, arity) of every Relax op whose Python builder takes one or two
    float32 tensors with its default attributes and which the criterion calls elementwise."""
    found = {}
    x, y = _var("x"), _var("y")
    bb = relax.BlockBuilder()
    with bb.function("probe", [x, y]):
        for module in (relax.op, relax.op.nn):
            for name, builder in sorted(vars(module).items()):
                if name.startswith("_") or not inspect.isfunction(builder):
                    continue
                for arity in (1, 2):
                    try:
                        call = bb.normalize(builder(*[x, y][:arity]))
                    except Exception:  # noqa: BLE001  (not an op of these operands)
                        continue
                    if isinstance(call, relax.Call) and is_elementwise(call):
                        found.setdefault(call.op.name, (builder, arity))
        bb.emit_func_output(x)
    return found


ENUMERATED = _enumerated()
# ops of attributes or of other operands, most without a layout inference in TVM 0.27
WITH_ATTRIBUTES = {
    "leakyrelu": lambda x, y: relax.op.nn.leakyrelu(x, 0.1),
    "softplus": lambda x, y: relax.op.nn.softplus(x),
    "mish": lambda x, y: relax.op.multiply(x, relax.op.tanh(relax.op.nn.softplus(x))),
    "clip": lambda x, y: relax.op.clip(x, 0.0, 6.0),
    "where": lambda x, y: relax.op.where(relax.op.greater(x, y), x, y),
    "hardswish": lambda x, y: relax.op.divide(
        relax.op.multiply(x, relax.op.clip(relax.op.add(x, relax.const(3.0)), 0.0, 6.0)), relax.const(6.0)
    ),
    "elu": lambda x, y: relax.op.where(relax.op.greater(x, relax.const(0.0)), x, relax.op.exp(x)),
    "full_like": lambda x, y: relax.op.multiply(x, relax.op.full_like(x, relax.const(2.0))),
    "zeros_like": lambda x, y: relax.op.add(x, relax.op.zeros_like(x)),
    "astype": lambda x, y: relax.op.astype(relax.op.astype(x, "float16"), "float32"),
    "scalar": lambda x, y: relax.op.subtract(relax.const(1.0), x),
    "per_channel": lambda x, y: relax.op.multiply(x, relax.const(RNG.standard_normal((4, 1, 1)).astype("float32"))),
    "per_channel_first": lambda x, y: relax.op.add(relax.const(RNG.standard_normal((4, 1, 1)).astype("float32")), x),
}


def test_the_criterion_reads_what_the_kernel_computes():
    # elementwise by TVM's own kernel for them, though TVM 0.27 has no layout inference for most
    x, b = _var("x"), _var("b", "bool")
    for elementwise in (
        relax.op.nn.leakyrelu(x, 0.2),
        relax.op.nn.softplus(x),
        relax.op.clip(x, 0, 6),
        relax.op.where(b, x, relax.const(0.0)),
        relax.op.add(x, _var("c", shape=(4, 1, 1))),
    ):
        assert is_elementwise(_probe(lambda bb, e=elementwise: e)), elementwise
    # not: TIR's op pattern says kElemWise for tril and prelu, but tril compares its indices
    # and prelu reads its slope along the channel axis, not numpy-broadcast; a slope along the
    # last axis broadcasts, but its axis counts from the front, as a pad's widths do: given one
    # more leading axis (as the rewrites that reshape operands give it) the call means another
    for other in (
        relax.op.tril(x),
        relax.op.nn.prelu(x, _var("slope", shape=(4,)), axis=1),
        relax.op.nn.prelu(x, _var("slope", shape=(6,)), axis=3),
        relax.op.nn.pad(x, [0] * 8),
        relax.op.nn.softmax(x, 1),
        relax.op.flip(x, 1),
        relax.op.cumsum(x, 1),
        relax.op.sum(x, [1]),
        relax.op.nn.pad(x, [0, 0, 0, 0, 1, 1, 1, 1]),
        relax.op.broadcast_to(_var("c", shape=(1, 4, 1, 1)), SHAPE),
    ):
        assert not is_elementwise(_probe(lambda bb, e=other: e)), other


def test_enumeration_finds_the_elementwise_ops():
    unary = {name for name, (_, arity) in ENUMERATED.items() if arity == 1}
    binary = {name for name, (_, arity) in ENUMERATED.items() if arity == 2}
    assert {"relax.nn.relu", "relax.nn.gelu", "relax.nn.silu", "relax.sigmoid", "relax.exp", "relax.erf"} <= unary
    assert {"relax.add", "relax.divide", "relax.maximum", "relax.power", "relax.greater", "relax.atan2"} <= binary
    assert not {"relax.sum", "relax.tril", "relax.nn.softmax", "relax.permute_dims"} & set(ENUMERATED)
    assert len(unary) >= 30 and len(binary) >= 15


def _conv(bb, x, cin, cout, seed):
    weight = np.random.default_rng(seed).standard_normal((cout, cin, 3, 3)).astype("float32")
    return bb.emit(relax.op.nn.conv2d(x, relax.const(weight), padding=[1, 1, 1, 1]))


def _float(bb, value):
    return value if value.ty.dtype == "float32" else bb.emit(relax.op.astype(value, "float32"))


def _conv_op_conv_module(ops: dict) -> tvm.IRModule:
    """main(x) = (conv(op(conv(x), conv'(x))) for each op): NCHW, as an importer makes it."""
    x = _var("x", shape=(1, 3, 6, 6))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            a, b = _conv(bb, x, 3, 4, 0), _conv(bb, x, 3, 4, 1)
            outs = [_conv(bb, _float(bb, bb.emit(build(a, b))), 4, 4, 2) for build in ops.values()]
            out = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(out)
    return bb.get()


def _permutes(mod: tvm.IRModule) -> list[str]:
    """The runtime permutes of main, each named by the ops around it."""
    main = mod["main"]
    bindings = [b for block in main.body.blocks for b in block.bindings]
    value_of = {b.var: b.value for b in bindings}
    found = []
    for b in bindings:
        if getattr(b.value, "op", None) == tvm.ir.Op.get("relax.permute_dims"):
            source = value_of.get(b.value.args[0])
            readers = [r.value.op.name for r in bindings if isinstance(r.value, relax.Call) and b.var in r.value.args]
            found.append(f"{getattr(getattr(source, 'op', None), 'name', source)} -> permute -> {readers}")
    return found


def _elementwise_ops() -> dict:
    """name -> (a, b) -> the op's call; ones_like(a) and the like plus a, so that the branch does
    not fold into a constant."""
    ops = {}
    for name, (builder, arity) in ENUMERATED.items():
        ops[name] = lambda a, b, f=builder, n=arity: f(*[a, b][:n])
        if name in ("relax.ones_like", "relax.zeros_like"):
            ops[name] = lambda a, b, f=builder: relax.op.add(f(a), a)
    return {**ops, **WITH_ATTRIBUTES}


@pytest.mark.parametrize("input_layout", ["NHWC", None])
def test_every_elementwise_op_between_convs_keeps_nhwc(input_layout):
    """Graph phase only; with NCHW input the first conv reads the image as it is."""
    mod = graph_module(_conv_op_conv_module(_elementwise_ops()), input_layout=input_layout, output_layout="NHWC")
    assert _permutes(mod) == []
