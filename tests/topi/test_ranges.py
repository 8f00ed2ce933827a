"""Loops that pick an operand by comparing their index with constants, split into ranges
(topi_accel.tir_passes.ranges): every test resolved, the same results.

References: numpy (hand-written functions) and PyTorch (a concatenation in a model)."""

import numpy as np
import torch
import tvm
import tvm_ffi
from torch import nn
from tvm import tirx
from tvm.script import tirx as T

import accel_target
from accel_target import codegen
from tests.helpers import assert_close, run_executable
from topi_accel.tir_passes.ranges import IF_THEN_ELSE, split_ranges


def _selects(node) -> int:
    found = []
    tvm_ffi.structural_map(node, (tvm.ir.Call, lambda c: found.append(c.op.same_as(IF_THEN_ELSE)) or c))
    return sum(found)


def _selects_in_loops(func) -> int:
    """The selects inside loops (not the argument checks of a lowered function)."""
    counts = []
    tvm_ffi.structural_map(func.body, (tirx.For, lambda f: counts.append(_selects(f.body)) or f))
    return max(counts)


def _loops(func) -> list[int]:
    found = []
    tvm_ffi.structural_map(func.body, (tirx.For, lambda f: found.append(int(f.extent.value)) or f))
    return found


def _run(func, *inputs, out_size):
    out = tvm.runtime.tensor(np.zeros(out_size, "float32"))
    tvm.compile(tvm.IRModule({"main": func}), "llvm")(*(tvm.runtime.tensor(a) for a in inputs), out)
    return out.numpy()


@T.prim_func
def three_way(
    a: T.Buffer((4,), "float32"),
    b: T.Buffer((3,), "float32"),
    c: T.Buffer((5,), "float32"),
    out: T.Buffer((12,), "float32"),
):
    # every spelling of a comparison: 4 <= i, i < 7 (as i >= 7's negation), 6 < i, i >= 7
    for i in range(12):
        out[i] = T.if_then_else(i < 4, a[i], T.if_then_else(6 < i, c[i - 7], b[i - 4])) + T.if_then_else(
            i >= 7, T.float32(1), T.float32(0)
        )


def test_a_three_way_select_becomes_three_loops_with_the_same_results():
    split = split_ranges(three_way)
    assert _selects(three_way.body) == 3 and _selects(split.body) == 0
    assert _loops(split) == [4, 3, 5]
    rng = np.random.default_rng(0)
    a, b, c = (rng.standard_normal(n).astype("float32") for n in (4, 3, 5))
    expected = np.concatenate([a, b, c + 1])
    np.testing.assert_array_equal(_run(split, a, b, c, out_size=12), expected)
    np.testing.assert_array_equal(_run(three_way, a, b, c, out_size=12), expected)


@T.prim_func
def other_conditions(a: T.Buffer((8, 8), "float32"), out: T.Buffer((8, 8), "float32")):
    # a test of another variable, and a compound one: nothing to split on
    for i, j in T.grid(8, 8):
        out[i, j] = T.if_then_else(2 <= i, a[i, j], T.float32(0)) + T.if_then_else(
            1 <= j and j < 7, a[i, j], T.float32(0)
        )


def test_loops_without_a_simple_test_of_their_own_index_stay():
    """The inner loop's only tests are compound; the outer loop is not innermost."""
    assert split_ranges(other_conditions) is None


class DenseBlock(nn.Module):
    """DenseNet's pattern: the features of several convs concatenated over channels, then a
    batch norm and ReLU (in NHWC: a concatenation along the innermost axis)."""

    def __init__(self, parts=6, channels=12):
        super().__init__()
        self.convs = nn.ModuleList(nn.Conv2d(8, channels + k, 1) for k in range(parts))  # unequal widths
        self.norm = nn.BatchNorm2d(sum(channels + k for k in range(parts)))

    def forward(self, x):
        return torch.relu(self.norm(torch.cat([conv(x) for conv in self.convs], 1)))


def test_a_channel_concatenation_runs_as_one_loop_per_operand():
    torch.manual_seed(0)
    model, x = DenseBlock().eval(), torch.randn(1, 8, 9, 9)
    model.norm.running_mean.uniform_(-1, 1)
    mod = accel_target.from_torch(model, (x,))
    # (NHWC out, as the block's next conv reads it: a transpose to NCHW fused into the kernel
    # would put the channels in its outer loop)
    executable = accel_target.build(mod, input_layout="NHWC", output_layout="NHWC")
    with torch.no_grad():
        expected = model(x).permute(0, 2, 3, 1).numpy()
        assert_close(run_executable(executable, x.permute(0, 2, 3, 1).contiguous().numpy()), expected)
    kernels = accel_target.optimize(mod, input_layout="NHWC", output_layout="NHWC")
    (name,) = [g.name_hint for g, _ in kernels.functions_items() if "concatenate" in g.name_hint]
    kernel = kernels[name].with_attr("global_symbol", name)
    lowered = codegen.lower_kernels(tvm.IRModule({name: kernel}), tvm.target.Target("accel"))
    assert _selects_in_loops(lowered[name]) == 0
