"""MicroBatch: a batch's leading layers per sample while their activations outweigh their weights;
ShareConstants: one constant per value."""

import numpy as np
import pytest
import torch
import tvm
from torch import nn
from tvm import relax

import accel_target
from accel_target.compiler import graph_module
from accel_target.passes import microbatch
from accel_target.passes.constants import ShareConstants
from accel_target.passes.relax_util import op_name
from accel_target.runtime.executable import lift_weights
from tests.helpers import assert_close, run_executable


class Block(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(channels, channels, 3, padding=1), nn.ReLU(), nn.Conv2d(channels, channels, 3, padding=1)
        )

    def forward(self, x):
        return torch.relu(x + self.body(x))


def _model(batch: int):
    """Two residual blocks on 32x32x16 activations (4.6 KB of weights each, 64 KB of
    activation per sample), then a weight-heavy 3x3 conv to 256 channels at 8x8 (147 KB of
    weights, 4 KB of activation per sample), then a classifier."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.ReLU(),
        Block(16),
        Block(16),
        nn.MaxPool2d(4),
        nn.Conv2d(16, 256, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(256, 10),
    ).eval()
    return model, torch.randn(batch, 3, 32, 32)


@pytest.fixture
def small_caches(monkeypatch):
    """Activations of the test models count as leaving the caches."""
    monkeypatch.setattr(microbatch, "MIN_BATCH_BYTES", 64 * 1024)


def _graph(model, x):
    return graph_module(accel_target.from_torch(model, (x,)))


def _convs(mod) -> list:
    return [b.value.ty for b in microbatch.dataflow_bindings(mod["main"]) if op_name(b.value) == "relax.nn.conv2d"]


def test_leading_blocks_run_per_sample_up_to_the_weight_heavy_conv(small_caches):
    model, x = _model(batch=4)
    shapes = [[int(d) for d in ty.shape.values] for ty in _convs(_graph(model, x))]
    # the stem and both blocks once per sample, at batch 1; the 256-channel conv on the batch
    assert shapes == [[1, 32, 32, 16]] * 5 * 4 + [[4, 8, 8, 256]], shapes
    executable = accel_target.build(accel_target.from_torch(model, (x,)))
    with torch.no_grad():
        assert_close(run_executable(executable, x.numpy()), model(x).numpy())
    assert executable.report.count("accel", ["relax.nn.conv2d"]) == 21


def test_each_weight_is_one_weight_of_the_library(small_caches, monkeypatch):
    model, x = _model(batch=4)
    mod = accel_target.from_torch(model, (x,))
    # the weights that build(weights="separate") would keep beside the library
    _, split = lift_weights(accel_target.optimize(mod))
    monkeypatch.setattr(microbatch, "MIN_BATCH_BYTES", 1 << 62)
    _, batched = lift_weights(accel_target.optimize(mod))
    assert len(split) == len(batched), (len(split), len(batched))


@pytest.mark.parametrize(
    "batch, why",
    [
        (1, "a single sample"),
        (4, "activations that stay in the caches"),  # (MIN_BATCH_BYTES as it is)
    ],
)
def test_left_as_it_was(batch, why):
    model, x = _model(batch)
    shapes = [int(ty.shape.values[0]) for ty in _convs(_graph(model, x))]
    assert shapes == [batch] * 6, why


def test_a_symbolic_batch_is_left_as_it_was(small_caches):
    batch = tvm.tirx.Var("batch", "int64")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((batch, 64, 64, 16), "float32"))
    w = relax.const(np.ones((16, 3, 3, 16), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, w, padding=1, data_layout="NHWC", kernel_layout="OHWI"))
            z = bb.emit_output(relax.op.nn.relu(relax.op.add(y, x)))
        bb.emit_func_output(z)
    assert microbatch.plan(bb.get()["main"]) is None


def test_an_op_that_mixes_samples_ends_the_per_sample_part(small_caches):
    class Mixing(nn.Module):
        def __init__(self):
            super().__init__()
            self.head, self.tail = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), Block(16)), Block(16)

        def forward(self, x):
            y = self.head(x)
            return self.tail(y - y.mean(0, keepdim=True))  # across the batch

    torch.manual_seed(0)
    model, x = Mixing().eval(), torch.randn(4, 3, 32, 32)
    shapes = [int(ty.shape.values[0]) for ty in _convs(_graph(model, x))]
    assert shapes == [1] * 3 * 4 + [4, 4], shapes
    with torch.no_grad():
        assert_close(
            run_executable(accel_target.build(accel_target.from_torch(model, (x,))), x.numpy()), model(x).numpy()
        )


def test_equal_constants_become_one():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4,), "float32"))
    with bb.function("main", [x]):
        a = bb.emit(relax.op.add(x, relax.const(np.arange(4, dtype="float32"))))
        b = bb.emit(relax.op.add(a, relax.const(np.arange(4, dtype="float32"))))
        c = bb.emit(relax.op.add(b, relax.const(np.ones(4, dtype="float32"))))
        bb.emit_func_output(c)

    def distinct_constants(mod) -> int:
        found = []
        relax.analysis.post_order_visit(
            mod["main"],
            lambda e: found.append(e) if isinstance(getattr(e, "value", None), tvm.runtime.Tensor) else None,
        )
        return len([c for i, c in enumerate(found) if not any(c.same_as(d) for d in found[:i])])

    assert (distinct_constants(bb.get()), distinct_constants(ShareConstants()(bb.get()))) == (3, 2)
