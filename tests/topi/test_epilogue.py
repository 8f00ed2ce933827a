"""Fused epilogues: every variant computed in the accel kernel's write-back, and still correct."""

import subprocess

import numpy as np
import pytest
import torch
import tvm
import tvm_ffi
from torch import nn
from tvm import relax, s_tir

import accel_target
from tests.helpers import ISAS, assert_close, rand, run_executable, run_outputs, runs_here, single_op_module
from topi_accel import epilogue
from topi_accel.tir_passes import blocks


class ConvEpilogue(nn.Module):
    def __init__(self, kind, channels=21, in_channels=8):  # 21: a channel tail after 16
        super().__init__()
        self.kind = kind
        self.conv = nn.Conv2d(in_channels, channels, 3, padding=1, bias=kind != "bn")
        self.bn = nn.BatchNorm2d(channels)
        self.skip = nn.Conv2d(in_channels, channels, 1)

    def forward(self, x):
        y = self.conv(x)
        if self.kind == "bias_relu":
            return torch.relu(y)
        if self.kind == "bias_relu6":
            return nn.functional.relu6(y)
        if self.kind == "bn":
            return torch.relu(self.bn(y))
        if self.kind == "gelu":
            return nn.functional.gelu(y)
        if self.kind == "residual":
            return torch.relu(y + self.skip(x))
        return y


class DenseEpilogue(nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.kind, self.fc = kind, nn.Linear(33, 70)

    def forward(self, x):
        y = self.fc(x)
        return {
            "bias": y,
            "gelu": nn.functional.gelu(y),
            "relu": torch.relu(y),
            "residual": y + x.sum(-1, keepdim=True),
        }[self.kind]


def _check(model, x, accel_kernels):
    model = model.eval()
    if hasattr(model, "bn"):
        model.bn.running_mean.uniform_(-1, 1)
        model.bn.running_var.uniform_(0.5, 2)
    executable = accel_target.build(accel_target.from_torch(model, (x,)))
    assert_close(run_executable(executable, x.numpy()), model(x).detach().numpy())
    calls = accel_target.report(executable).kernels.calls
    fused = [c for c in calls if "conv2d_" in c or "dense_kn" in c]
    assert len(fused) == accel_kernels
    return calls


@pytest.mark.parametrize("kind", ["bias_relu", "bias_relu6", "bn", "gelu", "residual", "bias"])
def test_conv_epilogue_is_fused(kind):
    calls = _check(ConvEpilogue(kind), torch.randn(2, 8, 9, 11), accel_kernels=2 if kind == "residual" else 1)
    # nothing elementwise runs on its own: only the layout transforms at the model's edges and the kernels
    assert all("conv2d_nhwc_ohwi" in c or c.startswith("transpose") for c in calls), calls
    assert any(c.startswith("fused_conv2d_nhwc_ohwi") for c in calls)


class SpeltOutGelu(nn.Module):
    """GELU as ONNX exporters write it: x / 2 * (1 + erf(x / sqrt(2)))."""

    def forward(self, x):
        return x * 0.5 * (1.0 + torch.erf(x * 0.7071067811865476))


ACTIVATIONS = {
    "silu": nn.SiLU,
    "sigmoid": nn.Sigmoid,
    "tanh": nn.Tanh,
    "gelu": nn.GELU,
    "erf": SpeltOutGelu,
    "hardswish": nn.Hardswish,
    "leaky": lambda: nn.LeakyReLU(0.1),
    "mish": nn.Mish,
    "softplus": nn.Softplus,
    "softplus_beta": lambda: nn.Softplus(beta=2.0, threshold=5.0),
    "elu": nn.ELU,
    "selu": nn.SELU,
    "celu": lambda: nn.CELU(0.5),
}
LIBM = ("expf", "tanhf", "erff", "logf")  # called one lane at a time when a kernel uses them


@pytest.mark.parametrize("name", ACTIVATIONS)
def test_activation_epilogues_call_no_scalar_libm_function(name, tmp_path):
    """conv -> activation, with inputs far into both tails: the activation is the conv's
    epilogue, computed in its write-back (not a serial loop nest of its own after it), matches
    PyTorch, and the library calls none of libm's exp / tanh / erf / log (which LLVM calls lane
    by lane: a vector epilogue is the point). The conv is a Winograd one, whose output value
    (its inverse transform) is the largest to inline into an activation's reads."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(64, 64, 3, padding=1), ACTIVATIONS[name]()).eval()
    x = torch.randn(1, 64, 30, 29) * 8
    mod = accel_target.from_torch(model, (x,))
    executable = accel_target.build(mod)
    with torch.no_grad():
        expected, scale = model(x).numpy(), float(model[0](x).abs().max())
    # the Winograd conv's float32 sums differ from PyTorch's by up to ~3e-6 of its output's
    # scale, which an activation near 0 passes on (assert_close's scale is the activation's)
    tvm.testing.assert_allclose(run_executable(executable, x.numpy()), expected, rtol=1e-4, atol=1e-5 * scale)
    (kernel,) = [c for c in accel_target.report(executable).kernels.calls if "conv2d" in c]
    assert kernel.startswith("fused_conv2d_winograd")
    (func,) = [f for g, f in accel_target.optimize(mod).functions_items() if g.name_hint == kernel]
    sch = s_tir.Schedule(func)
    stages = [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]
    assert all(name.startswith("conv2d") for name in stages), stages
    accel_target.save(executable, tmp_path / "model.so")
    symbols = subprocess.run(["nm", "-D", "--undefined-only", tmp_path / "model.so"], capture_output=True, text=True)
    called = {line.split()[-1].split("@")[0] for line in symbols.stdout.splitlines()}
    assert not called & set(LIBM), called


@pytest.mark.parametrize("kind", ["bias_relu", "bn", "residual"])
def test_winograd_conv_epilogue_is_fused_into_its_write_back(kind):
    """A 3x3 conv with 16 -> 32 channels and a 15x14 output runs on conv2d_winograd (a tail
    tile in both directions); its epilogue is computed in the inverse transform."""
    model, x = ConvEpilogue(kind, channels=32, in_channels=16), torch.randn(2, 16, 15, 14)
    calls = _check(model, x, accel_kernels=2 if kind == "residual" else 1)
    (kernel,) = [c for c in calls if "conv2d_winograd" in c]
    assert kernel.startswith("fused_conv2d_winograd")
    assert all("conv2d_" in c or c.startswith("transpose") for c in calls), calls
    lowered = accel_target.optimize(accel_target.from_torch(model.eval(), (x,)))
    (func,) = [f for g, f in lowered.functions_items() if g.name_hint == kernel]
    sch = s_tir.Schedule(func)
    stages = [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]
    assert all(name.startswith("conv2d_winograd") for name in stages), stages  # no loop nest of its own


@pytest.mark.parametrize("kind", ["bias", "gelu", "relu"])
def test_dense_epilogue_is_fused(kind):
    calls = _check(DenseEpilogue(kind), torch.randn(3, 5, 33), accel_kernels=1)
    assert [c for c in calls if "dense_kn" in c][0].startswith("fused_dense_kn")
    assert all("dense_kn" in c or "reshape" in c for c in calls), calls


@pytest.mark.parametrize("shape", [(2, 16, 32), (2, 3, 4, 32)], ids=str)
def test_dense_residual_add_is_fused(shape):
    """A transformer sublayer's x + linear(x), which PyTorch exports on rows flattened to 2-D:
    the add moves before the reshape back, into the kernel's write-back."""
    torch.manual_seed(0)
    model = nn.Sequential()
    model.fc = nn.Linear(32, 32)
    model.forward = lambda x: x + model.fc(x)
    calls = _check(model, torch.randn(*shape), accel_kernels=1)
    (kernel,) = [c for c in calls if not c.startswith("reshape")]  # the reshapes are views
    assert kernel.startswith("fused_dense_kn") and kernel.count("add") == 2, calls


@pytest.mark.parametrize("shape", [(2, 16, 32), (3, 5, 32), (2, 3, 4, 32)], ids=str)
def test_dense_on_rows_of_several_axes_fuses_bias_and_residual(shape):
    """matmul(x, W) + b + x on x of rank 3-4 (as ONNX models have it): the kernel takes the
    rows as they are, unless its 8-row tiles would span two of the leading axes ((2, 3, 4):
    the rows are flattened and the adds run after the reshape back)."""
    x, w, b = rand(*shape), rand(32, 32), rand(32)
    mod = single_op_module(
        lambda data, weight, bias: relax.op.add(relax.op.add(relax.op.matmul(data, weight), bias), data),
        {"data": x},
        {"weight": w, "bias": b},
    )
    executable = accel_target.build(mod)
    assert_close(run_executable(executable, x), x @ w + b + x)
    calls = accel_target.report(executable).kernels.calls
    if shape == (2, 3, 4, 32):
        assert calls[0].startswith("dense_kn") and len(calls) == 2, calls
    else:
        assert len(calls) == 1 and calls[0].startswith("fused_dense_kn") and calls[0].count("add") == 2, calls


def _symbolic_sublayer(flatten: bool, w, b) -> tvm.IRModule:
    """main(x) = x + (x @ w + b) with x [batch, 32] or, rows flattened as PyTorch exports a
    Linear, [batch, seq, 32] (reshape to [batch * seq, 32], matmul, bias, reshape back)."""
    batch, seq = tvm.tirx.Var("batch", "int64"), tvm.tirx.Var("seq", "int64")
    x = relax.Var("x", relax.TensorType([batch, seq, 32] if flatten else [batch, 32], "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            rows = bb.emit(relax.op.reshape(x, [batch * seq, 32])) if flatten else x
            y = bb.emit(relax.op.add(relax.op.matmul(rows, relax.const(w)), relax.const(b)))
            if flatten:
                y = bb.emit(relax.op.reshape(y, [batch, seq, 32]))
            out = bb.emit_output(relax.op.add(y, x))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("flatten", [False, True], ids=["rows", "batch*seq"])
def test_dense_epilogue_is_fused_with_symbolic_rows(flatten):
    """Bias and residual add in the write-back of a kernel with symbolic rows, a single
    variable or BERT's batch * seq; one build, correct at sizes 1, primes and 128."""
    w, b = rand(32, 32), rand(32)
    executable = accel_target.build(_symbolic_sublayer(flatten, w, b))
    assert not accel_target.report(executable).declines  # the in-place kernel lowered as any other
    calls = [c for c in accel_target.report(executable).kernels.calls if not c.startswith(("reshape", "shape_func"))]
    assert len(calls) == 1 and calls[0].startswith("fused_dense_kn") and calls[0].count("add") == 2, calls
    for shape in [(1, 1), (2, 7), (3, 97), (1, 128)]:
        x = rand(*shape, 32) if flatten else rand(shape[0] * shape[1], 32)
        assert_close(run_executable(executable, x), x @ w + b + x)


def test_attention_scale_is_fused_into_batch_matmul():
    """softmax(q @ k / 8) on [1, 12, 16, 8] x [1, 12, 8, 16]: the kernel writes the 4-D result
    itself, so the scaling is its epilogue."""
    q, k = rand(1, 12, 16, 8), rand(1, 12, 8, 16)
    mod = single_op_module(
        lambda q, k: relax.op.nn.softmax(relax.op.divide(relax.op.matmul(q, k), relax.const(8.0, "float32"))),
        {"q": q, "k": k},
        {},
    )
    executable = accel_target.build(mod)
    scores = q @ k / 8
    expected = np.exp(scores - scores.max(-1, keepdims=True))
    assert_close(run_executable(executable, q, k), expected / expected.sum(-1, keepdims=True))
    calls = accel_target.report(executable).kernels.calls
    assert calls[0].startswith("fused_batch_matmul_kn") and "divide" in calls[0] and len(calls) == 2, calls


def test_dense_with_non_elementwise_consumer_stays_correct():
    calls = _check(DenseEpilogue("residual"), torch.randn(3, 5, 33), accel_kernels=1)
    assert any("dense_kn" in c for c in calls)


def test_gelu_uses_fast_erf_within_tolerance_and_is_fused():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU()).eval()
    x = torch.randn(8, 64) * 4  # wide range of GELU inputs
    executable = accel_target.build(accel_target.from_torch(model, (x,)))
    assert_close(run_executable(executable, x.numpy()), model(x).detach().numpy())
    (kernel,) = accel_target.report(executable).kernels.calls
    assert kernel.startswith("fused_dense_kn") and "fast_erf" in kernel


class SqueezeExcitation(nn.Module):
    """x * sigmoid(conv1x1(mean(x))): the gate conv's bias and sigmoid follow it elementwise,
    its product with x broadcasts the [1, C, 1, 1] gate over [1, C, H, W] (EfficientNet, RegNet)."""

    def __init__(self, channels=16):
        super().__init__()
        self.conv, self.gate = nn.Conv2d(8, channels, 3, padding=1), nn.Conv2d(channels, channels, 1)

    def forward(self, x):
        y = self.conv(x)
        return y * torch.sigmoid(self.gate(y.mean((2, 3), keepdim=True)))


def test_a_broadcasting_consumer_stays_out_of_the_write_back():
    """The gate's bias and sigmoid are computed in its conv's write-back; the broadcast
    product is not (TVM 0.27's reverse_compute_inline failed on it with an InternalError
    instead of refusing): in strict mode, where a step that fails is an error."""
    torch.manual_seed(0)
    model, x = SqueezeExcitation().eval(), torch.randn(1, 8, 6, 6)
    mod = accel_target.from_torch(model, (x,))
    executable = accel_target.build(mod, strict=True)
    assert_close(run_executable(executable, x.numpy()), model(x).detach().numpy())
    lowered = accel_target.optimize(mod)
    (gate,) = [f for g, f in lowered.functions_items() if "sigmoid" in g.name_hint and "conv2d_nhwc" in g.name_hint]
    sch = s_tir.Schedule(gate)
    stages = [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]
    assert [s for s in stages if not s.startswith("conv2d_nhwc_ohwi")] == ["T_multiply"], stages


@pytest.mark.parametrize("isa", ["avx512", "avx2"])
@pytest.mark.parametrize("size, parallel", [(48, True), (12, False)])
def test_a_broadcasting_consumer_runs_on_the_thread_pool_when_large(isa, size, parallel):
    """The gate's product with the image, left at the root of the gate's kernel, is split
    across the thread pool as TVM's own kernels are, and weighs as much as their statements
    when the build decides whether the kernel is worth a parallel launch: 16 x 48 x 48
    products (over MIN_PARALLEL_WORK_SCALAR) run in parallel on any target, 16 x 12 x 12
    serially. Counted as vector lanes, even EfficientNet's 112 x 112 x 32 products would run
    serially. Right against PyTorch where the host runs the code."""
    target = tvm.target.Target(ISAS[isa])
    torch.manual_seed(0)
    model, x = SqueezeExcitation().eval(), torch.randn(1, 8, size, size)
    imported = accel_target.from_torch(model, (x,))
    if runs_here(ISAS[isa]):
        out = run_executable(accel_target.build(imported, target=target), x.numpy())
        assert_close(out, model(x).detach().numpy())
    mod = accel_target.optimize(imported, target=target)
    lowered = accel_target.pipeline.run_phases(mod, target, "lowering", "lowering")["lowering"]
    (gate,) = [f for g, f in lowered.functions_items() if "sigmoid" in g.name_hint and "conv2d_nhwc" in g.name_hint]
    product = gate.script()
    product = product[: product.index('T.sblock("T_multiply")')]
    assert (product.rfind("T.parallel(") > product.rfind('T.sblock("conv2d_nhwc_ohwi")')) == parallel, product


def test_reads_elementwise_tells_a_broadcast_from_an_elementwise_read():
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def func(a: T.Buffer((4, 1), "float32"), b: T.Buffer((4, 8), "float32"), out: T.Buffer((4, 8), "float32")):
        t = T.sblock_alloc_buffer((4, 1))
        u = T.sblock_alloc_buffer((4, 1))
        for i, j in T.grid(4, 1):
            with T.sblock("t"):
                vi, vj = T.axis.remap("SS", [i, j])
                t[vi, vj] = a[vi, vj] + T.float32(1)
        for i, j in T.grid(4, 1):
            with T.sblock("u"):
                vi, vj = T.axis.remap("SS", [i, j])
                u[vi, vj] = t[vi, vj] * T.float32(2)
        for i, j in T.grid(4, 8):
            with T.sblock("out"):
                vi, vj = T.axis.remap("SS", [i, j])
                out[vi, vj] = u[vi, 0] * b[vi, vj]

    sch = s_tir.Schedule(func)
    t, u, out = (sch.get_sblock(n) for n in ("t", "u", "out"))
    assert epilogue.reads_elementwise(sch, u, t)
    assert not epilogue.reads_elementwise(sch, out, u)


def test_round_half_to_even_is_vectorized():
    """A vectorized loop that rounds (every requantize) stays a vector loop once `round_even`
    writes tirx.nearbyint (which TVM 0.27 vectorizes as scalar calls) as llvm.roundeven; the
    rounding is still half to even, as numpy's."""
    from tvm import te, tirx

    from topi_accel.tir_passes.round_even import round_even

    a = (np.arange(64, dtype="float32") - 32) / 2  # every .5 from -16 to 15.5
    x = te.placeholder((64,), name="x")
    y = te.compute((64,), lambda i: tirx.nearbyint(x[i] * 1.0), name="y")
    sch = s_tir.Schedule(round_even(te.create_prim_func([x, y])))
    _, lanes = sch.split(sch.get_loops(sch.get_sblock("y"))[0], [None, 16])
    sch.vectorize(lanes)
    lib = tvm.compile(tvm.IRModule({"main": sch.mod["main"]}), tvm.target.Target("accel"))
    assert "llvm.roundeven.v16f32" in lib.mod.inspect_source("ll")
    out = tvm.runtime.tensor(np.zeros(64, "float32"))
    lib["main"](tvm.runtime.tensor(a), out)
    np.testing.assert_array_equal(out.numpy(), np.rint(a))


class NaNPaths(nn.Module):
    """relu and relu6 in conv write-backs, max pooling, maxima and minima of two tensors, amax,
    activations whose fast forms clamp their input, and a chain of clamps."""

    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(3, 16, 3, padding=1), nn.Conv2d(16, 16, 1)

    def forward(self, x, y):
        a = nn.functional.relu6(self.conv1(x))
        b = nn.functional.max_pool2d(torch.relu(self.conv2(a)), 2)
        pooled = nn.functional.max_pool2d(x, 2)
        both = torch.cat([torch.maximum(pooled, y), torch.minimum(y, pooled), torch.clamp(y, -0.5, 0.5)], 1)
        chain = torch.maximum(torch.maximum(torch.maximum(y, pooled), y * 2), y - 1).clamp(-3, 3).clamp(-2, 2)
        acts = [torch.sigmoid(y), torch.tanh(y), nn.functional.silu(y), nn.functional.gelu(y)]
        acts += [nn.functional.hardswish(y), nn.functional.leaky_relu(y), torch.exp(y)]
        return b, both, torch.amax(y, (2, 3)), torch.amin(y, (2, 3)), chain, torch.cat(acts, 1)


@pytest.mark.parametrize("isa", ISAS)
def test_nan_propagates_as_in_pytorch(isa):
    """TVM's max(a, b) is a > b ? a : b, which gave relu(NaN) = 0 and dropped a NaN from a max
    pool: every floating max and min propagates NaN as PyTorch's do (tir_passes.nan_extrema)."""
    torch.manual_seed(0)
    model, x, y = NaNPaths().eval(), torch.randn(1, 3, 8, 8), torch.randn(1, 3, 4, 4)
    x[0, 1, 2, 3] = y[0, 0, 1, 1] = torch.nan  # one pixel: NaN through every channel of the convs
    y[0, 2, 3, 0] = -torch.nan
    executable = accel_target.build(accel_target.from_torch(model, (x, y)), target=ISAS[isa])
    if not runs_here(ISAS[isa]):
        pytest.skip(f"built and checked only: this host cannot run {isa} code")
    outputs = run_outputs(executable, x.numpy(), y.numpy())
    with torch.no_grad():
        for ours, theirs in zip(outputs, model(x, y)):
            assert np.isnan(theirs.numpy()).any()
            np.testing.assert_array_equal(np.isnan(ours), np.isnan(theirs.numpy()))
            assert_close(np.nan_to_num(ours), np.nan_to_num(theirs.numpy()))


class Extrema(nn.Module):
    def forward(self, x):
        pooled = nn.functional.max_pool2d(x, 2)
        return (
            torch.amax(x, 1),
            torch.amin(-x, (2, 3)),
            pooled,
            torch.amax(x, (1, 2, 3)),
            -nn.functional.max_pool2d(-x, 3),
        )


def test_maxima_of_infinities_are_infinite():
    """TVM's max reductions start from the lowest finite value: the amax or max pool of -infs
    was -3.4e38. Each accumulates from -inf (a minimum from +inf), as PyTorch's do."""
    x = torch.full((1, 4, 6, 6), -torch.inf)
    x[0, 1, 2, 3], x[0, 2, :3, :3] = 1.0, torch.inf
    executable = accel_target.build(accel_target.from_torch(Extrema().eval(), (x,)))
    for ours, theirs in zip(run_outputs(executable, x.numpy()), Extrema()(x)):
        assert np.isinf(theirs.numpy()).any()
        np.testing.assert_array_equal(ours, theirs.numpy())


def test_relax_silu_is_a_vector_epilogue_of_the_conv():
    """R.nn.silu, as a Relax program (rather than TVM's importers, which write sigmoid and
    multiply) states it: computed in the conv's write-back, and equal to PyTorch's SiLU."""
    x, w = rand(1, 16, 8, 8) * 4, rand(16, 16, 3, 3)
    bb = relax.BlockBuilder()
    data = relax.Var("x", relax.TensorType(x.shape, "float32"))
    with bb.function("main", [data]):
        with bb.dataflow():
            conv = bb.emit(relax.op.nn.conv2d(data, relax.const(w), padding=1))
            out = bb.emit_output(relax.op.nn.silu(conv))
        bb.emit_func_output(out)
    executable = accel_target.build(bb.get())
    ref = nn.functional.silu(nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), padding=1))
    assert_close(run_executable(executable, x), ref.numpy())
    assert [c for c in accel_target.report(executable).kernels.calls if "conv2d" in c] == [
        "fused_conv2d_nhwc_ohwi_fast_silu"
    ]


class ReusingChain(nn.Module):
    """Three sigmoids of a scaled and shifted input, each reading it 18 times (TVM's fast_exp),
    after a conv or not."""

    def __init__(self, conv: bool):
        super().__init__()
        self.conv = nn.Conv2d(8, 8, 1) if conv else nn.Identity()

    def forward(self, x):
        x = self.conv(x)
        for _ in range(3):
            x = torch.sigmoid(x * 1.5 + 0.5)
        return x


def _largest_value(func: tvm.tirx.PrimFunc) -> int:
    """Nodes of the largest value a store of `func` writes, counted as a tree (capped)."""
    sizes = []

    def visit(store):
        sizes.append(blocks._value_size(store.value, None))
        return store

    tvm_ffi.structural_map(func.body, (tvm.tirx.BufferStore, visit), order="post")
    return max(float("inf") if s is None else s[0] for s in sizes)


@pytest.mark.parametrize("conv", [False, True], ids=["alone", "after_conv"])
def test_inlining_a_chain_that_rereads_its_input_stays_small(conv):
    """Each step read several times would copy its whole expression per read if inlined: the
    fused kernel keeps an intermediate where a copy would pass blocks.MAX_INLINED_NODES (a
    fourth sigmoid took TVM's passes a minute), and computes what PyTorch does."""
    torch.manual_seed(0)
    model, x = ReusingChain(conv).eval(), torch.randn(1, 8, 16, 16)
    mod = accel_target.from_torch(model, (x,))
    assert_close(run_executable(accel_target.build(mod), x.numpy()), model(x).detach().numpy())
    kernels = [f for f in accel_target.optimize(mod).functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    assert max(_largest_value(f) for f in kernels) <= blocks.MAX_INLINED_NODES


@pytest.mark.parametrize("channels", [24, 56])
def test_squeeze_excitation_with_a_channel_tail_builds_strictly(channels):
    """The gate's sigmoid, let-bound (FastMath reads its input once), in a write-back that
    WholeTiles copies for whole tiles and the channel tail: each copy defines its own
    variables (TIR defines one once; InsertPrefetches declined the ill-formed kernel of
    EfficientNet's squeeze-excite)."""
    torch.manual_seed(0)
    model, x = SqueezeExcitation(channels).eval(), torch.randn(1, 8, 16, 16)
    executable = accel_target.build(accel_target.from_torch(model, (x,)), input_layout="NHWC", strict=True)
    out = run_executable(executable, x.permute(0, 2, 3, 1).contiguous().numpy())
    assert_close(out, model(x).detach().numpy())
