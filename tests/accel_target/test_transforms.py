"""The graph passes accel adds: permute simplification, flatten absorption, clip/pad rewrites, numpy folding."""

import numpy as np
import pytest
import torch
import tvm
import tvm_ffi
from tvm import relax, te, topi

import accel_target
import strategy
import topi_accel
from accel_target.passes.fold_numpy import FoldConstantNumpy
from accel_target.passes.fold_subgraphs import fold_constant_subgraphs, fold_what_is_left
from accel_target.passes.io_layouts import convert_input_layout
from accel_target.passes.pad_as_conv import PadAsConv
from accel_target.passes.simplify_layouts import SimplifyLayouts
from accel_target.passes.whole_input_pooling import WholeInputPooling
from accel_target.pipeline import graph_passes
from accel_target.reporting import calls_of
from strategy.layout import constant_array
from tests.helpers import (
    ISAS,
    assert_close,
    compile_primfunc,
    isa_params,
    rand,
    run_compiled,
    run_executable,
    run_primfunc,
    run_relax,
    runs_here,
    single_op_module,
)


def _bindings(mod) -> int:
    return sum(len(block.bindings) for block in mod["main"].body.blocks)


def _ops(mod):
    names = []
    relax.analysis.post_order_visit(
        mod["main"],
        lambda e: names.append(e.op.name) if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) else None,
    )
    return names


def _check(make, params, consts, reference, expect_ops):
    mod = single_op_module(make, params, consts)
    simplified = relax.transform.DeadCodeElimination()(SimplifyLayouts()(mod))
    assert _ops(simplified) == expect_ops
    assert_close(run_relax(simplified, list(params.values()), target="llvm"), reference)


def test_inverse_permutes_cancel():
    x = rand(2, 3, 4, 5)
    _check(
        lambda x: relax.op.nn.relu(relax.op.permute_dims(relax.op.permute_dims(x, [0, 2, 3, 1]), [0, 3, 1, 2])),
        {"x": x},
        {},
        np.maximum(x, 0),
        ["relax.nn.relu"],
    )


def test_permute_chain_becomes_one_permute():
    x = rand(2, 3, 4, 5)
    _check(
        lambda x: relax.op.permute_dims(relax.op.permute_dims(x, [0, 2, 3, 1]), [0, 2, 1, 3]),
        {"x": x},
        {},
        x.transpose(0, 2, 3, 1).transpose(0, 2, 1, 3),
        ["relax.permute_dims"],
    )


def test_permute_of_unit_axes_becomes_reshape():
    x = rand(2, 1, 1, 7)
    _check(lambda x: relax.op.permute_dims(x, [0, 3, 1, 2]), {"x": x}, {}, x.transpose(0, 3, 1, 2), ["relax.reshape"])


def test_flatten_before_dense_moves_into_the_weight_rows():
    x, w = rand(2, 3, 4, 5), rand(60, 7)  # x is NHWC; the model flattens it as NCHW
    nchw_flat = x.transpose(0, 3, 1, 2).reshape(2, 60)
    _check(
        lambda x, w: relax.op.matmul(relax.op.reshape(relax.op.permute_dims(x, [0, 3, 1, 2]), [2, 60]), w),
        {"x": x},
        {"w": w},
        nchw_flat @ w,
        ["relax.reshape", "relax.matmul"],
    )


def test_clip_becomes_maximum_minimum():
    x = rand(2, 8) * 10
    _check(lambda x: relax.op.clip(x, 0.0, 6.0), {"x": x}, {}, np.clip(x, 0, 6), ["relax.maximum", "relax.minimum"])


@pytest.mark.parametrize("value,absorbed", [(0.0, True), (1.5, False)])
def test_zero_pad_is_absorbed_into_conv(value, absorbed):
    x, w = rand(1, 2, 6, 6), rand(3, 2, 3, 3)
    padded = np.pad(x, ((0, 0), (0, 0), (1, 2), (2, 0)), constant_values=value)
    ref = torch.nn.functional.conv2d(torch.from_numpy(padded), torch.from_numpy(w), padding=1).numpy()
    _check(
        lambda x, w: relax.op.nn.conv2d(relax.op.nn.pad(x, [0, 0, 0, 0, 1, 2, 2, 0], pad_value=value), w, padding=1),
        {"x": x},
        {"w": w},
        ref,
        ["relax.nn.conv2d"] if absorbed else ["relax.nn.pad", "relax.nn.conv2d"],
    )


def _conv_pad_pool(value=0.0, mode="constant"):
    """conv2d -> pad (not absorbable: it feeds a pool) -> avg_pool2d, and its numpy/PyTorch result."""
    x, w = rand(1, 3, 6, 6), rand(4, 3, 3, 3)
    conv = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), padding=1)
    padded = torch.nn.functional.pad(conv, (2, 0, 1, 1), mode=mode, value=value if mode == "constant" else None)
    ref = torch.nn.functional.avg_pool2d(padded, 2).numpy()
    mod = single_op_module(
        lambda x, w: relax.op.nn.avg_pool2d(
            relax.op.nn.pad(
                relax.op.nn.conv2d(x, w, padding=1), [0, 0, 0, 0, 1, 1, 2, 0], pad_mode=mode, pad_value=value
            ),
            2,
            2,
        ),
        {"x": x},
        {"w": w},
    )
    return mod, x, ref


def test_spatial_zero_pad_is_converted_to_nhwc_with_the_convs():
    mod, x, ref = _conv_pad_pool()
    # PadAsConv alone: the pad is an identity depthwise conv that SimplifyLayouts turns back
    as_conv = PadAsConv()(mod)
    assert _ops(as_conv).count("relax.nn.conv2d") == 2 and "relax.nn.pad" not in _ops(as_conv)
    assert _ops(SimplifyLayouts()(as_conv)) == _ops(mod)
    with tvm.target.Target("accel"):
        optimized = tvm.transform.Sequential(graph_passes())(mod)
    pads = calls_of(optimized, ("relax.nn.pad",))
    assert len(pads) == 1 and [int(v) for v in pads[0].attrs.pad_width] == [0, 0, 1, 1, 2, 0, 0, 0]  # NHWC
    # one transpose out (NCHW result); none in (the first conv reads the NCHW input: ReadInputNCHW)
    # and none around the pad
    assert _ops(optimized).count("relax.permute_dims") == 1
    assert_close(run_executable(accel_target.build(mod), x), ref)


@pytest.mark.parametrize("value,mode", [(1.5, "constant"), (0.0, "reflect")])
def test_other_pads_stay_as_they_are(value, mode):
    mod, x, ref = _conv_pad_pool(value, mode)
    assert _ops(PadAsConv()(mod)) == _ops(mod)
    assert_close(run_executable(accel_target.build(mod), x), ref)


def test_identity_depthwise_conv_becomes_a_pad():
    x = rand(1, 3, 4, 5)
    _check(
        lambda x, w: relax.op.nn.conv2d(x, w, padding=[1, 0, 2, 3], groups=3),
        {"x": x},
        {"w": np.ones((3, 1, 1, 1), "float32")},
        np.pad(x, ((0, 0), (0, 0), (1, 2), (0, 3))),
        ["relax.nn.pad"],
    )


def test_pad_of_zero_widths_is_dropped():
    x = rand(1, 3, 4, 5)
    _check(lambda x: relax.op.exp(relax.op.nn.pad(x, [0] * 8)), {"x": x}, {}, np.exp(x), ["relax.exp"])


def test_broadcast_weight_of_3d_linear_is_unbroadcast():
    x, w = rand(4, 2, 8), rand(8, 5)
    _check(
        lambda x, w: relax.op.matmul(x, relax.op.broadcast_to(w, [4, 8, 5])),
        {"x": x},
        {"w": w},
        x @ w,
        ["relax.matmul"],
    )


def test_numpy_folding_matches_tvm_folding():
    w, scale, shift = rand(4, 3, 3, 3), rand(4), rand(4)
    mod = single_op_module(
        lambda x, w, s, t: relax.op.add(
            relax.op.nn.conv2d(x, relax.op.multiply(w, relax.op.reshape(relax.op.sqrt(s), [4, 1, 1, 1]))),
            relax.op.reshape(relax.op.subtract(t, s), [1, 4, 1, 1]),
        ),
        {"x": rand(1, 3, 8, 8)},
        {"w": w, "s": np.abs(scale), "t": shift},
    )
    ours = relax.transform.DeadCodeElimination()(FoldConstantNumpy()(mod))
    theirs = relax.transform.DeadCodeElimination()(relax.transform.FoldConstant()(mod))
    assert _ops(ours) == _ops(theirs) == ["relax.nn.conv2d", "relax.add"]
    consts = [[], []]
    for out, folded in zip(consts, (ours, theirs)):
        relax.analysis.post_order_visit(
            folded["main"],
            lambda e, out=out: (
                out.append(constant_array(e))
                if isinstance(e, tvm.ir.expr.Constant) and isinstance(e.ty, relax.TensorType)
                else None
            ),
        )
    assert len(consts[0]) == len(consts[1]) == 2
    for a, b in zip(*consts):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def test_numpy_folding_keeps_int64():
    """An int64 index table folded stays int64, values past int32 too (relax.const alone makes
    an int64 array int32: the add to an int64 input then failed to type-check, and the whole
    pass was declined; BEIT's ONNX export)."""
    table = np.array([0, 1, 2**40], "int64")
    mod = single_op_module(
        lambda x, t: relax.op.add(x, relax.op.multiply(relax.op.broadcast_to(t, [2, 3]), t)),
        {"x": np.arange(6, dtype="int64").reshape(2, 3)},
        {"t": table},
    )
    folded = relax.transform.DeadCodeElimination()(FoldConstantNumpy()(mod))
    assert _ops(folded) == ["relax.add"]
    assert str(folded["main"].ret_ty.dtype) == "int64"
    x = np.arange(6, dtype="int64").reshape(2, 3)
    np.testing.assert_array_equal(run_relax(folded, [x], target="llvm"), x + table * table)


def test_values_of_constants_alone_fold_in_one_build(monkeypatch):
    """An index table computed from constants by ops numpy does not fold (concat, where, take:
    BEIT's relative positions in ONNX) becomes one constant, made by one build; the input's
    part stays."""
    builds = []
    compile_ = tvm.compile
    monkeypatch.setattr(tvm, "compile", lambda *a, **k: builds.append(a) or compile_(*a, **k))
    rows, table = np.array([[0, -1], [2, 1]], "int64"), np.arange(12, dtype="float32").reshape(4, 3)

    def make(x, r, t):
        r = relax.op.concat([r, relax.op.flip(r, axis=0)], axis=0)
        r = relax.op.where(relax.op.less(r, relax.const(0, "int64")), relax.op.add(r, relax.const(4, "int64")), r)
        bias = relax.op.take(t, relax.op.reshape(r, [8]), axis=0)
        return relax.op.add(x, relax.op.sum(bias, axis=[1]))

    mod = single_op_module(make, {"x": rand(8)}, {"r": rows, "t": table})
    folded = fold_constant_subgraphs(mod)
    assert _ops(folded) == ["relax.add"] and len(builds) == 1
    x = rand(8)
    index = np.concatenate([rows, rows[::-1]]).reshape(8)
    assert_close(run_relax(folded, [x], target="llvm"), x + table[np.where(index < 0, index + 4, index)].sum(1))


def test_what_is_left_to_fold_is_folded_by_tvm():
    """A value of constants alone that neither numpy nor the one build folded (a softmax of a
    weight) goes to TVM's FoldConstant."""
    weight = rand(4, 3)
    mod = single_op_module(lambda x, w: relax.op.matmul(x, relax.op.nn.softmax(w)), {"x": rand(2, 4)}, {"w": weight})
    folded = fold_what_is_left(mod)
    assert _ops(folded) == ["relax.matmul"]
    x = rand(2, 4)
    soft = np.exp(weight) / np.exp(weight).sum(-1, keepdims=True)
    assert_close(run_relax(folded, [x], target="llvm"), x @ soft)


def test_where_nothing_is_left_to_fold_constants_are_put_where_they_are_read():
    """The graph of a CNN after the numpy folding (its weights bound to variables): the result
    is TVM's FoldConstant's, without legalizing every op to find nothing to fold."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.SiLU(), torch.nn.Conv2d(8, 4, 1)
    ).eval()
    mod = accel_target.from_torch(model, (torch.randn(1, 3, 8, 8),))
    passes = graph_passes()
    names = [p.info.name for p in passes]
    at = names.index("ContainedFoldConstant")
    with tvm.target.Target("accel"), strategy.registry.suspended():
        before = tvm.transform.Sequential(passes[:at])(mod)
        expected = relax.transform.FoldConstant()(before)
    assert calls_of(before, ["relax.nn.conv2d"]) and _bindings(before) > _bindings(expected)
    assert tvm_ffi.structural_equal(fold_what_is_left(before), expected, map_free_vars=True)


@pytest.mark.parametrize("dims", [1, 2])
def test_a_transposed_conv_between_convs_builds_and_matches(dims):
    """The convs go channels-last; the transposed conv between them stays in the layout TVM
    legalizes (it followed its input to channels-last, and the VM could not run it)."""
    conv, up = (torch.nn.Conv1d, torch.nn.ConvTranspose1d) if dims == 1 else (torch.nn.Conv2d, torch.nn.ConvTranspose2d)
    torch.manual_seed(0)
    model = torch.nn.Sequential(conv(3, 8, 3, padding=1), torch.nn.ReLU(), up(8, 4, 4, stride=4), conv(4, 2, 1)).eval()
    x = torch.randn(1, 3, *[8] * dims)
    executable = accel_target.build(accel_target.from_torch(model, (x,)))
    with torch.no_grad():
        assert_close(run_executable(executable, x.numpy()), model(x).numpy())


def test_an_op_left_in_a_layout_tvm_has_no_kernel_for_declines_convert_layout(monkeypatch):
    """Where ConvertLayout leaves an op in a layout that TVM cannot legalize (as it left the
    transposed convs before they were held to NCHW), the model is built without it: built,
    matching, the decline in the report naming the op, and an error in strict mode; through
    the registered pipeline as well."""
    monkeypatch.delitem(accel_target.pipeline.DESIRED_LAYOUTS, "relax.nn.conv2d_transpose")
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ConvTranspose2d(8, 4, 4, stride=4), torch.nn.Conv2d(4, 2, 1)
    ).eval()
    x = torch.randn(1, 3, 8, 8)
    with torch.no_grad():
        expected = model(x).numpy()
    mod = accel_target.from_torch(model, (x,))
    executable = accel_target.build(mod)
    assert_close(run_executable(executable, x.numpy()), expected)
    (declined,) = executable.report.declines
    assert declined.step == "ConvertLayout"
    assert "relax.nn.conv2d_transpose (data_layout NHWC" in declined.reason
    assert_close(run_executable(tvm.compile(mod, target="accel", relax_pipeline="accel"), x.numpy()), expected)
    with pytest.raises(accel_target.StrictModeError, match="conv2d_transpose"):
        accel_target.build(mod, strict=True)


def test_a_pytorch_value_of_no_input_keeps_int64():
    """A value computed from no input becomes a constant of its own dtype: int64 past int32."""

    class Offsets(torch.nn.Module):
        def forward(self, x):
            return x + torch.arange(4) * 2**33

    x = torch.arange(4)
    executable = accel_target.build(accel_target.from_torch(Offsets(), (x,)))
    np.testing.assert_array_equal(run_executable(executable, x.numpy()), Offsets()(x).numpy())


def test_a_scalar_value_of_no_input_stays_a_scalar():
    """A 0-d value computed from no input becomes a 0-d constant: made 1-d, the scalar result
    came back of shape (1,)."""

    class Total(torch.nn.Module):
        def forward(self, x):
            return x.sum() + torch.arange(3).sum() * 2.0

    x = torch.randn(4)
    out = run_executable(accel_target.build(accel_target.from_torch(Total(), (x,))), x.numpy())
    expected = Total()(x).numpy()
    assert out.shape == expected.shape == ()
    assert_close(out, expected)


def test_a_size_read_from_a_value_of_no_input_is_static():
    """A slice sized by ``.item()`` of positions computed from no input (Reformer's axial
    position embeddings): the size is bound to its value at compile time. Sized at run time,
    the add after it had no known shape, and the build failed in CodeGenVM (stock TVM's too;
    in Reformer, FuseOps failed on the slice's shape, and the model ran unfused)."""

    class AxialPositions(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.table = torch.nn.Parameter(torch.randn(1, 4, 4, 8))

        def forward(self, x):
            last = torch.arange(x.shape[1]).max().item()
            rows = self.table[:, : (last + 4) // 4].reshape(1, -1, 8)
            return torch.relu(x + rows[:, : x.shape[1]]) * 2

    model, x = AxialPositions(), torch.randn(1, 16, 8)
    mod = accel_target.from_torch(model, (x,))
    assert "match_cast" in mod["main"].script()  # the size is read at run time as imported
    executable = accel_target.build(mod)
    assert accel_target.report(executable).declines == ()
    assert_close(run_executable(executable, x.numpy()), model(x).detach().numpy())


def test_convert_input_layout_signature():
    x = rand(1, 3, 4, 5)
    mod = convert_input_layout(single_op_module(lambda x: relax.op.nn.relu(x), {"x": x}, {}), "NHWC")
    (param,) = mod["main"].params
    assert [int(d) for d in param.ty.shape] == [1, 4, 5, 3]
    assert_close(run_relax(mod, [x.transpose(0, 2, 3, 1)], target="llvm"), np.maximum(x, 0))


def test_activation_of_reshape_moves_before_it():
    y = rand(6, 8)
    _check(
        lambda y: relax.op.nn.gelu(relax.op.reshape(y, [2, 3, 8])),
        {"y": y},
        {},
        (torch_gelu(y)).reshape(2, 3, 8),
        ["relax.nn.gelu", "relax.reshape"],
    )


def torch_gelu(a):
    return torch.nn.functional.gelu(torch.from_numpy(a)).numpy()


def test_convert_input_layout_leaves_weight_parameters_alone():
    x, w = rand(1, 3, 6, 6), rand(4, 3, 3, 3)
    mod = single_op_module(lambda x, w: relax.op.nn.conv2d(x, w), {"x": x, "w": w}, {})
    mod["main"] = mod["main"].with_attr("num_input", 1)
    converted = convert_input_layout(mod, "NHWC")
    shapes = [[int(d) for d in p.ty.shape] for p in converted["main"].params]
    assert shapes == [[1, 6, 6, 3], [4, 3, 3, 3]]


def test_parallelize_splits_reductions_over_rows():
    x, g, b = te.placeholder((1, 128, 768)), te.placeholder((768,)), te.placeholder((768,))
    func = topi_accel.parallelize(te.create_prim_func([x, g, b, topi.nn.layer_norm(x, g, b, axis=[-1])]))
    assert "T.parallel(128)" in func.script()


@pytest.mark.parametrize("kind", ["avg", "max", "sum"])
@pytest.mark.parametrize("shape, parts", [((1, 7, 7, 2048), 7), ((1, 112, 112, 32), 28), ((2, 17, 19, 24), 17)])
def test_parallelize_reduces_a_global_pool_in_partial_rows(shape, parts, kind):
    """A global pool in NHWC ([n, h, w, c] -> [n, 1, 1, c]; a squeeze-excitation's mean):
    chunks of rows (a divisor of h, up to 32) reduced in parallel into partial rows of
    channels, read contiguously, then combined; not each channel walking the whole image at
    its row stride. Right against numpy."""
    a = rand(*shape)
    x = te.placeholder(a.shape)
    pool = (
        topi.sum(x, axis=[1, 2], keepdims=True)
        if kind == "sum"
        else topi.nn.adaptive_pool(x, (1, 1), kind, layout="NHWC")
    )
    func = topi_accel.parallelize(te.create_prim_func([x, pool]))
    text = func.script()
    assert f"T.parallel({parts * shape[0]})" in text and "_rf = T.sblock_alloc_buffer" in text, text
    ref = {"avg": np.mean, "max": np.max, "sum": np.sum}[kind](a, axis=(1, 2), keepdims=True)
    assert_close(run_primfunc(func, [a], ref.shape), ref)


def test_parallelize_keeps_a_short_innermost_run_out_of_the_parallel_loop():
    # NCHW -> NHWC of an image: rows in parallel, each row's 224 x 3 elements a serial run
    a = rand(1, 3, 224, 224)
    x = te.placeholder(a.shape)
    func = topi_accel.parallelize(te.create_prim_func([x, topi.transpose(x, [0, 2, 3, 1])]))
    assert "T.parallel(224)" in func.script()
    np.testing.assert_array_equal(run_primfunc(func, [a], (1, 224, 224, 3)), a.transpose(0, 2, 3, 1))
    x = te.placeholder((3, 2048))  # out [2048, 3]: no run long enough below an outer loop: all in parallel
    assert "T.parallel(6144)" in topi_accel.parallelize(te.create_prim_func([x, topi.transpose(x, [1, 0])])).script()


@pytest.mark.parametrize(
    "shape, axes",
    [
        ((1, 14, 14, 64), [0, 3, 1, 2]),
        ((2, 48, 7, 9), [0, 2, 3, 1]),
        ((40, 24), [1, 0]),
        ((3, 20, 33, 8), [1, 3, 0, 2]),
    ],
)
def test_parallelize_copies_a_transpose_of_the_innermost_axis_in_tiles(shape, axes):
    """NHWC -> NCHW, NCHW -> NHWC and others that move the innermost axis: copied in tiles of
    the input's and the output's innermost axes (divisors up to 16), the input's innermost
    innermost, the tiles in parallel where there is work enough; right against numpy."""
    a = rand(*shape)
    x = te.placeholder(a.shape)
    func = topi_accel.parallelize(te.create_prim_func([x, topi.transpose(x, axes)]))
    assert func is not None  # (None: left as TVM wrote it)
    ref = a.transpose(axes)
    np.testing.assert_array_equal(run_primfunc(func, [a], ref.shape), ref)
    if shape == (1, 14, 14, 64):  # out [1, 64, 14, 14]: (4 channel tiles x 14 rows) in parallel, 14 x 16 each
        script = func.script()
        assert "T.parallel(56)" in script and "T.grid(14, 16)" in script, script


def test_parallelize_inlines_an_elementwise_chain_into_its_consumer():
    """A quantize (divide, round, add, clip, cast) then NCHW -> NHWC with a pad, as FuseTIR
    leaves an int8 model's input: one loop nest, no intermediate buffer, its 3 channels
    unrolled; a broadcast
    consumer does not take its producer (it would recompute it per element)."""
    a = rand(1, 3, 20, 18) * 4
    x = te.placeholder(a.shape)
    q = topi.cast(topi.clip(topi.round(x / 0.05) + 120.0, 0.0, 255.0), "uint8")
    out = topi.nn.pad(topi.transpose(q, [0, 2, 3, 1]), [0, 1, 1, 0], [0, 1, 1, 0], pad_value=120)
    func = topi_accel.parallelize(te.create_prim_func([x, out]))
    script = func.script()
    assert script.count("T.sblock(") == 2, script  # the root and the output
    assert "T.unroll(3)" in script  # the channels: one store each, for LLVM to interleave
    ref = np.clip(np.round(a / np.float32(0.05)) + 120, 0, 255).astype("uint8").transpose(0, 2, 3, 1)
    ref = np.pad(ref, [(0, 0), (1, 1), (1, 1), (0, 0)], constant_values=120)
    np.testing.assert_array_equal(run_primfunc(func, [a], ref.shape, dtype="uint8"), ref)
    scale = te.placeholder((1, 1, 1, 64))
    y = te.placeholder((1, 32, 32, 64))
    gate = topi.sigmoid(scale)
    func = topi_accel.parallelize(te.create_prim_func([scale, y, y * gate]))
    assert func.script().count("T.sblock(") == 3  # the gate keeps its block


@pytest.mark.parametrize("kind", ["max", "avg"])
def test_parallelize_pools_window_outside_the_channels(kind):
    a = rand(1, 20, 18, 32)
    x = te.placeholder(a.shape)
    func = topi_accel.parallelize(
        te.create_prim_func([x, topi.nn.pool2d(x, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), kind, layout="NHWC")])
    )
    text = func.script()
    assert "pad_temp" not in text  # the pad is inlined, not a padded copy
    assert "T.parallel" in text and "T.vectorized(32)" in text  # rows parallel, channels innermost
    pool = torch.nn.functional.max_pool2d if kind == "max" else torch.nn.functional.avg_pool2d
    ref = pool(torch.from_numpy(a).permute(0, 3, 1, 2), 3, 2, 1).permute(0, 2, 3, 1).numpy()
    assert_close(run_primfunc(func, [a], ref.shape), ref)


# the channels of a chunk: the largest divisor of the channels in whole vectors within the
# accumulators (AVX-512: 24 x 16 floats, AVX2: 12 x 8, SSE: 12 x 4)
POOL_CHUNKS = {"avx512": {64: 64, 256: 256}, "avx2": {64: 64, 256: 64}, "sse": {64: 32, 256: 32}}


@pytest.mark.parametrize("kind", ["max", "avg"])
@pytest.mark.parametrize("channels", [64, 256])
@pytest.mark.parametrize("isa", ISAS)
def test_pool_window_reduces_in_registers_and_stores_once(isa, channels, kind):
    """The window reduces into a local row of channels, in chunks that the target's accumulator
    registers hold, which is stored to the output once: AVX2 code has no masked store
    (vmaskmovps), which each tap of a max pool reduced in the output itself was; right against
    PyTorch where the host runs the code."""
    target = tvm.target.Target(ISAS[isa])
    a = rand(1, 30, 30, channels)
    x = te.placeholder(a.shape)
    with target:
        func = topi_accel.parallelize(
            te.create_prim_func([x, topi.nn.pool2d(x, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), kind, layout="NHWC")])
        )
    text = func.script()
    assert f'T.sblock_alloc_buffer((1, 15, 15, {channels}), scope="local")' in text
    assert f"T.vectorized({POOL_CHUNKS[isa][channels]})" in text  # the write-back of a chunk
    lib = compile_primfunc(func, target)
    assert "vmaskmov" not in lib.mod.inspect_source("asm")
    if not runs_here(ISAS[isa]):
        return
    pool = torch.nn.functional.max_pool2d if kind == "max" else torch.nn.functional.avg_pool2d
    ref = pool(torch.from_numpy(a).permute(0, 3, 1, 2), 3, 2, 1).permute(0, 2, 3, 1).numpy()
    assert_close(run_compiled(lib, [a], ref.shape), ref)


def test_small_softmax_keeps_its_row_maxima_out_of_masked_stores():
    """A softmax too small for the thread pool ([1, 2, 64, 16]: SegFormer's attention over its
    reduced keys) runs its row maxima window-first but serial and in place, as before pooling
    windows were reduced in registers: reduced in a local row there, AVX2 code took 128 masked
    stores (vmaskmovps) for them."""
    target = tvm.target.Target(ISAS["avx2"])
    a = rand(1, 2, 64, 16)
    x = te.placeholder(a.shape)
    with target:
        func = topi_accel.parallelize(te.create_prim_func([x, topi.nn.fast_softmax(x, -1)]))
    assert "T.parallel" not in func.script()
    lib = compile_primfunc(func, target)
    assert "vmaskmov" not in lib.mod.inspect_source("asm")
    if runs_here(ISAS["avx2"]):
        e = np.exp(a - a.max(-1, keepdims=True))
        assert_close(run_compiled(lib, [a], a.shape), e / e.sum(-1, keepdims=True))


def test_parallelize_computes_softmax_and_layer_norm_row_by_row():
    a = rand(2, 3, 16, 128)
    x = te.placeholder(a.shape)
    func = topi_accel.parallelize(te.create_prim_func([x, topi.nn.fast_softmax(x, -1)]))
    text = func.script()
    # one parallel loop over the 96 rows, the sums and maxima of 128 as 8 vectorized partial results
    assert text.count("T.parallel") == 1 and "T.parallel(96)" in text and "_rf" in text and "T.vectorized(8)" in text
    e = np.exp(a - a.max(-1, keepdims=True))
    assert_close(run_primfunc(func, [a], a.shape), e / e.sum(-1, keepdims=True))

    a, g, b = rand(1, 40, 768), rand(768), rand(768)
    x, gp, bp = te.placeholder(a.shape), te.placeholder(g.shape), te.placeholder(b.shape)
    func = topi_accel.parallelize(te.create_prim_func([x, gp, bp, topi.nn.layer_norm(x, gp, bp, axis=[-1])]))
    assert func.script().count("T.parallel") == 1 and "T.vectorized(16)" in func.script()  # sums of 768: 16 lanes
    ref = (a - a.mean(-1, keepdims=True)) / np.sqrt(a.var(-1, keepdims=True) + 1e-5) * g + b
    assert_close(run_primfunc(func, [a, g, b], a.shape), ref)


def test_parallelize_computes_symbolic_layer_norm_and_softmax_row_by_row():
    """Layer norm over [batch, seq, 768] and softmax over [batch, 12, seq, seq] with batch and
    seq symbolic (a dynamic BERT's): row by row under one parallel loop over all the rows (no
    serial loop around it: each of its iterations would wake the thread pool), and right at
    sizes 1, primes and 128."""
    batch, seq = tvm.tirx.Var("batch", "int64"), tvm.tirx.Var("seq", "int64")
    x, gp, bp = te.placeholder((batch, seq, 768)), te.placeholder((768,)), te.placeholder((768,))
    norm = topi_accel.parallelize(te.create_prim_func([x, gp, bp, topi.nn.layer_norm(x, gp, bp, axis=[-1])]))
    assert norm.script().count("T.parallel(batch * seq)") == 1 and "T.vectorized(16)" in norm.script()
    scores = te.placeholder((batch, 12, seq, seq))
    softmax = topi_accel.parallelize(te.create_prim_func([scores, topi.nn.fast_softmax(scores, -1)]))
    assert softmax.script().count("T.parallel") == 1 and "T.parallel(batch * seq * T.int64(12))" in softmax.script()
    g, b = rand(768), rand(768)
    for n, s in [(1, 1), (2, 7), (1, 128), (3, 97)]:
        a = rand(n, s, 768)
        ref = (a - a.mean(-1, keepdims=True)) / np.sqrt(a.var(-1, keepdims=True) + 1e-5) * g + b
        assert_close(run_primfunc(norm, [a, g, b], a.shape), ref)
        a = rand(n, 12, s, s)
        e = np.exp(a - a.max(-1, keepdims=True))
        assert_close(run_primfunc(softmax, [a], a.shape), e / e.sum(-1, keepdims=True))


# runtime lengths of a symbolic reduction axis: 1, shorter than a vector, primes, 128 and around it
SYMBOLIC_LENGTHS = [1, 2, 7, 97, 128, 131]


@pytest.mark.parametrize("target", isa_params("avx512", "avx2"))
def test_parallelize_vectorizes_symbolic_reductions_with_a_tail(target):
    """Softmax over [batch, 12, seq, seq] and a sum and a max over [rows, n] with the reduced
    extent symbolic: each reduction in vector partial results ("_lanes", the target's vectors)
    and a tail, right at lengths shorter than a vector, primes and 128."""
    batch, seq = tvm.tirx.Var("batch", "int64"), tvm.tirx.Var("seq", "int64")
    scores = te.placeholder((batch, 12, seq, seq))
    rows, n = tvm.tirx.Var("rows", "int64"), tvm.tirx.Var("n", "int64")
    x = te.placeholder((rows, n))
    with tvm.target.Target(target):
        softmax = topi_accel.parallelize(te.create_prim_func([scores, topi.nn.fast_softmax(scores, -1)]))
        total = topi_accel.parallelize(te.create_prim_func([x, topi.sum(x, axis=-1)]))
        largest = topi_accel.parallelize(te.create_prim_func([x, topi.max(x, axis=-1)]))
    for func in (softmax, total, largest):
        assert "_lanes" in func.script() and "T.vectorized(T.int64(8))" in func.script()
    # the partial results live on the stack: a workspace allocation per row cost more than the vectors saved
    lib = tvm.compile(tvm.IRModule({"main": total}), tvm.target.Target(target))
    llvm = lib.mod.inspect_source("ll") if hasattr(lib, "mod") else lib.inspect_source("ll")
    assert "_lanes = tail call ptr" not in llvm and "alloca" in llvm
    for s in SYMBOLIC_LENGTHS:
        a = rand(2, 12, s, s)
        e = np.exp(a - a.max(-1, keepdims=True))
        assert_close(run_primfunc(softmax, [a], a.shape, target), e / e.sum(-1, keepdims=True))
        a = rand(5, s)
        assert_close(run_primfunc(total, [a], (5,), target), a.sum(-1))
        np.testing.assert_array_equal(run_primfunc(largest, [a], (5,), target), a.max(-1))


def test_symbolic_reduction_lanes_come_from_the_target():
    """A symbolic extent of 4 x seq (512 at the representative size) gets the target's vector
    lanes: 16 on AVX-512, 8 on AVX2; none without a target (the reduction is left as it is)."""
    from topi_accel.generic import _symbolic_lanes

    extent = 4 * tvm.tirx.Var("seq", "int64")
    for name, lanes in [("avx512", 16), ("avx2", 8)]:
        with tvm.target.Target(ISAS[name]):
            assert _symbolic_lanes(extent) == lanes
    assert _symbolic_lanes(extent) == 0
    x = te.placeholder((tvm.tirx.Var("rows", "int64"), tvm.tirx.Var("n", "int64")))
    assert "_lanes" not in topi_accel.parallelize(te.create_prim_func([x, topi.sum(x, axis=-1)])).script()


def test_parallelize_splits_a_symbolic_transpose():
    """BERT's head split, [batch, seq, 3, 12, 64] -> [3, batch, 12, seq, 64] with batch and seq
    symbolic: its outer loops fused into one parallel loop (the row of 64 left to LLVM), right
    at sizes 1, primes and 128."""
    batch, seq = tvm.tirx.Var("batch", "int64"), tvm.tirx.Var("seq", "int64")
    x = te.placeholder((batch, seq, 3, 12, 64))
    func = topi_accel.parallelize(te.create_prim_func([x, topi.transpose(x, [2, 0, 3, 1, 4])]))
    assert func.script().count("T.parallel") == 1
    for n, s in [(1, 1), (2, 7), (1, 128), (3, 97)]:
        a = rand(n, s, 3, 12, 64)
        ref = a.transpose(2, 0, 3, 1, 4)
        assert_close(run_primfunc(func, [a], ref.shape), ref)


def test_parallelize_does_not_recompute_a_column_reduction_per_row():
    a = rand(512, 64)
    x = te.placeholder(a.shape)
    func = topi_accel.parallelize(te.create_prim_func([x, x - topi.sum(x, axis=0, keepdims=True)]))
    assert func.script().count("T.parallel") == 2  # each block on its own, not the sum inside the row loop
    assert_close(run_primfunc(func, [a], a.shape), a - a.sum(0, keepdims=True))


@pytest.mark.parametrize("mode,value", [("reflect", 0.0), ("constant", 1.5), ("replicate", 0.0)])
def test_pad_between_inverse_permutes_is_padded_in_place(mode, value):
    x = rand(1, 6, 5, 3)  # NHWC
    nchw = x.transpose(0, 3, 1, 2)
    np_mode = {"reflect": "reflect", "constant": "constant", "replicate": "edge"}[mode]
    widths = ((0, 0), (0, 0), (1, 2), (2, 1))
    kwargs = {"constant_values": value} if mode == "constant" else {}
    ref = np.pad(nchw, widths, mode=np_mode, **kwargs).transpose(0, 2, 3, 1)
    _check(
        lambda x: relax.op.permute_dims(
            relax.op.nn.pad(
                relax.op.permute_dims(x, [0, 3, 1, 2]), [0, 0, 0, 0, 1, 2, 2, 1], pad_mode=mode, pad_value=value
            ),
            [0, 2, 3, 1],
        ),
        {"x": x},
        {},
        ref,
        ["relax.nn.pad"],
    )


def test_takes_between_inverse_permutes_are_done_in_place():
    # PyTorch exports reflect padding as a take per spatial axis
    x = rand(1, 5, 4, 3)  # NHWC
    rows, cols = np.array([1, 0, 1, 2, 3, 4, 3]), np.array([1, 0, 1, 2, 3, 2])
    ref = x.transpose(0, 3, 1, 2)[:, :, rows][:, :, :, cols].transpose(0, 2, 3, 1)
    _check(
        lambda x, r, c: relax.op.permute_dims(
            relax.op.take(relax.op.take(relax.op.permute_dims(x, [0, 3, 1, 2]), r, axis=2), c, axis=3), [0, 2, 3, 1]
        ),
        {"x": x},
        {"r": rows, "c": cols},
        ref,
        ["relax.take", "relax.take"],
    )


def _conv_then(make, channels=16):
    """main(x: [1, 3, 8, 8]) -> make(conv2d(x, w)), w: [channels, 3, 1, 1], and x, w."""
    x, w = rand(1, 3, 8, 8), rand(channels, 3, 1, 1)
    mod = single_op_module(lambda x, w: make(relax.op.nn.conv2d(x, w)), {"x": x}, {"w": w})
    conv = np.einsum("nchw,oc->nohw", x, w[:, :, 0, 0])
    return mod, x, conv


def _graph(mod, input_layout=None):
    with tvm.target.Target("accel"):
        return tvm.transform.Sequential(graph_passes())(convert_input_layout(mod, input_layout))


def test_negative_squeeze_axes_count_from_the_front():
    """squeeze(mean(conv(x), [-1], keepdims), [-1]): ConvertLayout died with std::bad_alloc on
    the negative axis (Swin's pooler); counted from the front, it converts."""
    mod, x, conv = _conv_then(lambda y: relax.op.squeeze(relax.op.mean(y, [-1], keepdims=True), [-1]))
    squeezes = calls_of(SimplifyLayouts()(mod), ("relax.squeeze",))
    assert [int(a) for a in squeezes[0].attrs.axis] == [3]
    assert "relax.nn.conv2d" in _ops(_graph(mod))
    assert_close(run_executable(accel_target.build(mod, strict=True), x), conv.mean(-1))


@pytest.mark.parametrize("scale_first", [True, False])
def test_a_per_channel_scale_of_lower_rank_follows_the_layout(scale_first):
    """PoolFormer's layer scale: a [C, 1, 1] constant times an NCHW activation. Reshaped to
    [1, C, 1, 1] and put second (ConvertLayout takes an elementwise op's layout from its
    first operand), it is converted with the activation: no transpose with NHWC input."""
    scale = rand(16, 1, 1)

    def mul(y):
        return relax.op.multiply(relax.const(scale), y) if scale_first else relax.op.multiply(y, relax.const(scale))

    mod, x, conv = _conv_then(lambda y: relax.op.mean(relax.op.nn.relu(mul(y)), [2, 3]))  # pooled: no layout
    assert "relax.permute_dims" not in _ops(_graph(mod, "NHWC"))
    executable = accel_target.build(mod, input_layout="NHWC", strict=True)
    assert_close(run_executable(executable, x.transpose(0, 2, 3, 1).copy()), np.maximum(conv * scale, 0).mean((2, 3)))
    assert accel_target.report(executable).kernels.layout_transforms == 0


def test_an_elementwise_op_of_two_permuted_tensors_permutes_once():
    """add(permute(a, p), permute(b, p)) -> permute(add(a, b), p): ConvNeXt's residual add, both
    sides permuted back to NCHW, then permuted to NHWC again for the next layer norm."""
    a, b = rand(1, 4, 5, 6), rand(1, 4, 5, 6)
    to_nchw, to_nhwc = [0, 3, 1, 2], [0, 2, 3, 1]
    _check(
        lambda a, b: relax.op.permute_dims(
            relax.op.add(relax.op.permute_dims(a, to_nchw), relax.op.permute_dims(b, to_nchw)), to_nhwc
        ),
        {"a": a, "b": b},
        {},
        a + b,
        ["relax.add"],
    )


# (pooling, kernel, stride, padding, ceil_mode, rewritten): one window over the whole input
# becomes a mean / max (Hugging Face's EfficientNet: a 1280x1280 window on a 2x2 map)
WHOLE_INPUT_POOLS = [
    (torch.nn.functional.avg_pool2d, 1280, 1280, 0, True, True),
    (torch.nn.functional.max_pool2d, 1280, 1280, 0, True, True),
    (torch.nn.functional.avg_pool2d, 5, 5, 0, False, True),  # window = input
    (torch.nn.functional.avg_pool2d, 6, 6, 1, True, False),  # padded: counts differ, left alone
    (torch.nn.functional.max_pool2d, 3, 3, 0, False, False),  # 3x3 windows of a 5x5 map
]


@pytest.mark.parametrize("pool,kernel,stride,padding,ceil_mode,rewritten", WHOLE_INPUT_POOLS)
def test_whole_input_pooling_becomes_a_reduction(pool, kernel, stride, padding, ceil_mode, rewritten):
    def model(x):
        return pool(x, kernel, stride, padding, ceil_mode=ceil_mode)

    module = type("Pool", (torch.nn.Module,), {"forward": lambda self, x: model(x)})().eval()
    x = torch.randn(1, 8, 5, 5)
    mod = accel_target.from_torch(module, (x,))
    ops = _ops(WholeInputPooling()(mod))
    assert any(op.endswith("pool2d") for op in ops) != rewritten
    assert ("relax.mean" in ops or "relax.max" in ops) == rewritten
    assert_close(run_executable(accel_target.build(mod), x.numpy()), model(x).numpy())


class _Stem(torch.nn.Module):
    """A first conv on the image, then pooled and classified: no 4-D output to transpose back."""

    def __init__(self, channels: int, padding: int):
        super().__init__()
        self.conv, self.fc = torch.nn.Conv2d(channels, 16, 3, 2, padding), torch.nn.Linear(16, 5)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).mean((2, 3)))


@pytest.mark.parametrize("channels, padding, reads_nchw", [(3, 1, True), (4, 2, True), (8, 1, False), (3, 0, False)])
def test_the_first_conv_reads_the_nchw_image(channels, padding, reads_nchw):
    """ConvertLayout transposes the NCHW image for the first conv; where its kernel takes the
    image as it is (a few channels, padded: ReadInputNCHW), that transpose is gone and the
    conv's row says so. Else, and with NHWC input, nothing changes."""
    torch.manual_seed(0)
    model, x = _Stem(channels, padding).eval(), torch.randn(2, channels, 23, 20)
    mod = accel_target.from_torch(model, (x,))
    executable = accel_target.build(mod, strict=True)
    assert_close(run_executable(executable, x.numpy()), model(x).detach().numpy())
    report = accel_target.report(executable)
    (conv,) = [row for row in report.rows if row.op == "relax.nn.conv2d"]
    assert conv.kernel == "conv2d_nhwc_ohwi.accel"
    assert conv.layouts.startswith("data_layout=NCHW" if reads_nchw else "data_layout=NHWC"), conv.layouts
    assert report.kernels.activation_transforms == (0 if reads_nchw else 1), report.kernels.calls
    nhwc = accel_target.build(mod, input_layout="NHWC", strict=True)
    assert_close(run_executable(nhwc, x.permute(0, 2, 3, 1).contiguous().numpy()), model(x).detach().numpy())
    assert accel_target.report(nhwc).kernels.activation_transforms == 0
