"""WriteInPlace: a kernel writes its output over a tensor its write-back adds, only when
nothing reads that tensor afterwards, and the results stay the same."""

import numpy as np
import torch
import tvm
from torch import nn
from tvm import relax
from tvm.script import tirx as T

import accel_target
from accel_target.passes import inplace
from accel_target.reporting import calls_of
from tests.helpers import assert_close, rand, run_executable


class Block(nn.Module):
    """relu(conv(x) + shortcut(x)); `twice`: then relu(conv2(that) + shortcut(x)) too."""

    def __init__(self, twice=False, channels=24):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)
        self.shortcut = nn.Conv2d(channels, channels, 1)
        self.conv2 = nn.Conv2d(channels, channels, 1) if twice else None

    def forward(self, x):
        s = self.shortcut(x)
        y = torch.relu(self.conv(x) + s)
        return torch.relu(self.conv2(y) + s) if self.conv2 is not None else y


def _in_place_calls(mod: tvm.IRModule) -> list[relax.Call]:
    return calls_of(mod, ("relax.call_tir_inplace",))


def _build(model, x, **kwargs):
    mod = accel_target.from_torch(model.eval(), (x,))
    return accel_target.optimize(mod, **kwargs), accel_target.build(mod, **kwargs)


def test_residual_block_writes_over_its_shortcut():
    model, x = nn.Sequential(Block(), Block()), torch.randn(1, 24, 10, 12)
    optimized, executable = _build(model, x)
    calls = _in_place_calls(optimized)
    # both blocks: the second's shortcut is the first block's output, dead after its add
    assert len(calls) == 2
    for call in calls:
        kernel = optimized[call.args[0]]
        assert len(kernel.params) == len(call.args[1].fields)  # no output buffer of its own
        assert "conv2d_nhwc_ohwi" in call.args[0].name_hint
    assert_close(run_executable(executable, x.numpy()), model(x).detach().numpy())


def test_a_shortcut_read_later_is_not_overwritten():
    # the first kernel adding s is not its last reader: only the second writes over s
    # (were s overwritten by the first, the second would add the first's output instead)
    model, x = Block(twice=True), torch.randn(1, 24, 10, 12)
    optimized, executable = _build(model, x)
    residual = [
        c
        for c in calls_of(optimized, ("relax.call_tir", "relax.call_tir_inplace"))
        if "conv2d" in c.args[0].name_hint and "add" in c.args[0].name_hint and len(c.args[1].fields) >= 4
    ]
    assert [c.op.name for c in residual] == ["relax.call_tir", "relax.call_tir_inplace"]
    assert_close(run_executable(executable, x.numpy()), model(x).detach().numpy())


def test_a_view_of_a_tensor_read_later_is_not_overwritten():
    class Views(nn.Module):  # two dense kernels each add a reshape (a view, once lowered) of z
        def __init__(self):
            super().__init__()
            self.fc, self.fc2 = nn.Linear(32, 32), nn.Linear(32, 32)

        def forward(self, x):
            z = torch.tanh(x)
            y = self.fc(torch.sigmoid(x).reshape(32, 32)) + z.reshape(32, 32)
            return torch.relu(self.fc2(y)) + z.reshape(32, 32)

    model, x = Views().eval(), torch.randn(2, 16, 32)
    optimized, executable = _build(model, x)
    dense = [
        c.op.name
        for c in calls_of(optimized, ("relax.call_tir", "relax.call_tir_inplace"))
        if "dense_kn" in c.args[0].name_hint
    ]
    # the first writing over its view would overwrite z, which the second reads
    assert dense == ["relax.call_tir", "relax.call_tir_inplace"]
    assert_close(run_executable(executable, x.numpy()), model(x).detach().numpy())


def test_the_model_input_is_not_overwritten():
    class Identity(nn.Module):  # relu(conv(x) + x): the shortcut is main's own input
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(16, 16, 3, padding=1)

        def forward(self, x):
            return torch.relu(self.conv(x) + x)

    model, x = Identity().eval(), torch.randn(1, 16, 9, 9)
    nhwc = x.permute(0, 2, 3, 1).contiguous().numpy()
    optimized, executable = _build(model, x, input_layout="NHWC")
    assert not _in_place_calls(optimized)
    vm = relax.VirtualMachine(executable, tvm.cpu())
    data = tvm.runtime.tensor(nhwc)
    out = vm["main"](data).numpy()
    np.testing.assert_array_equal(data.numpy(), nhwc)
    assert_close(out, model(x).detach().numpy())


# (TVMScript misreads a docstring in the functions below)
@T.prim_func(s_tir=True)
def _aligned(a: T.Buffer((8, 4), "float32"), r: T.Buffer((8, 4), "float32"), out: T.Buffer((8, 4), "float32")):
    for i, j in T.grid(8, 4):
        with T.sblock("write_back"):
            vi, vj = T.axis.remap("SS", [i, j])
            out[vi, vj] = a[vi, vj] * T.float32(2) + r[vi, vj]


@T.prim_func(s_tir=True)
def _shifted(a: T.Buffer((8, 4), "float32"), r: T.Buffer((8, 4), "float32"), out: T.Buffer((8, 4), "float32")):
    for i, j in T.grid(8, 4):
        with T.sblock("write_back"):
            vi, vj = T.axis.remap("SS", [i, j])
            out[vi, vj] = r[7 - vi, vj]


@T.prim_func(s_tir=True)
def _reduction(a: T.Buffer((8, 4), "float32"), r: T.Buffer((8, 4), "float32"), out: T.Buffer((8, 4), "float32")):
    for i, j, k in T.grid(8, 4, 4):
        with T.sblock("sum"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                out[vi, vj] = T.float32(0)
            out[vi, vj] = out[vi, vj] + r[vi, vj] * a[vi, vk]


@T.prim_func(s_tir=True)
def _two_readers(a: T.Buffer((8, 4), "float32"), r: T.Buffer((8, 4), "float32"), out: T.Buffer((8, 4), "float32")):
    t = T.sblock_alloc_buffer((8, 4))
    for i, j in T.grid(8, 4):
        with T.sblock("first"):
            vi, vj = T.axis.remap("SS", [i, j])
            t[vi, vj] = r[vi, 3 - vj]
    for i, j in T.grid(8, 4):
        with T.sblock("write_back"):
            vi, vj = T.axis.remap("SS", [i, j])
            out[vi, vj] = t[vi, vj] + r[vi, vj]


def test_in_place_input_reads_only_the_element_it_writes():
    assert inplace.in_place_input(_aligned, 2) == 0  # a, the first aligned input
    assert inplace.in_place_input(_shifted, 2) is None  # reads another row than it writes
    assert inplace.in_place_input(_reduction, 2) is None  # reads r again after the first write
    assert inplace.in_place_input(_two_readers, 2) is None  # r read by a block before the write-back


def test_read_from_output_computes_the_same():
    a, r = rand(8, 4), rand(8, 4)
    target = tvm.target.Target("accel")
    in_place = inplace.read_from_output(_aligned, 1)
    assert [p.name for p in in_place.params] == ["a", "out"]
    out = tvm.runtime.tensor(r.copy())  # holds r, and then the result
    tvm.compile(tvm.IRModule({"main": in_place}), target).jit()(tvm.runtime.tensor(a), out)
    assert_close(out.numpy(), a * 2 + r)


class Bottleneck(nn.Module):
    """relu(conv_b(relu(conv_a(x))) + x): x is conv_a's data and conv_b's residual."""

    def __init__(self, channels=32):
        super().__init__()
        self.conv_a, self.conv_b = nn.Conv2d(channels, channels // 4, 1), nn.Conv2d(channels // 4, channels, 1)

    def forward(self, x):
        return torch.relu(self.conv_b(torch.relu(self.conv_a(x))) + x)


def test_a_residual_every_thread_of_a_conv_reads_whole_is_not_overwritten(monkeypatch):
    """The second block's residual (the first's output) is overwritten unless the conv reading
    it as its data has every thread read all of it (topi_accel.conv2d.THREADS_READ_WHOLE_INPUT:
    both cores then hold its lines). (The first block's is the model's input.)"""
    model, x = nn.Sequential(Bottleneck(), Bottleneck()).eval(), torch.randn(1, 32, 8, 8)
    for whole, in_place in ((False, 1), (True, 0)):
        monkeypatch.setattr(inplace, "_threads_read_whole_input", lambda func, whole=whole: whole)
        optimized, executable = _build(model, x, input_layout="NHWC")
        assert len(_in_place_calls(optimized)) == in_place
        assert_close(run_executable(executable, x.permute(0, 2, 3, 1).numpy()), model(x).detach().numpy())


def test_no_tensor_overwritten_is_read_whole_by_the_threads_of_a_conv():
    """In a model whose convs choose their own schedules (ResNet-50's stage-3 bottlenecks, whose
    1x1 convs split their channel blocks on some targets and their rows on others), no tensor a
    kernel overwrites is the data of a kernel marked THREADS_READ_WHOLE_INPUT."""
    model, x = nn.Sequential(*[Bottleneck(1024) for _ in range(3)]).eval(), torch.randn(1, 1024, 14, 14)
    optimized, executable = _build(model, x, input_layout="NHWC")
    main = optimized["main"]
    whole = inplace._read_whole(optimized, main)
    overwritten = {call.args[1].fields[-1] for call in _in_place_calls(optimized)}
    assert not overwritten & whole
    assert len(overwritten | whole) > 0  # the residuals are one or the other
    assert_close(run_executable(executable, x.permute(0, 2, 3, 1).numpy()), model(x).detach().numpy())
