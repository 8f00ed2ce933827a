"""Whole models exported with symbolic dimensions (torch.export Dim): one build, run at several
sizes against PyTorch, every matmul and conv on an accel kernel."""

import numpy as np
import pytest
import torch
import tvm
from tvm import relax

import accel_target
from accel_target.torch_ops import import_program
from benchmarks.models import bert_encoder
from tests.helpers import assert_close
from tests.models.zoo import make

pytestmark = pytest.mark.slow

COVERED = {"relax.nn.conv2d", "relax.matmul"}


def _export(model, example, dynamic_shapes) -> tvm.IRModule:
    with torch.no_grad():
        program = torch.export.export(model.eval(), (example,), dynamic_shapes=dynamic_shapes)
    return import_program(program)


def _check(executable, model, shapes, make_input):
    """Every covered op on an accel kernel; the output at each of `shapes` matches PyTorch."""
    rows = [r for r in accel_target.report(executable).rows if r.op in COVERED]
    assert rows and all(r.kind == "accel" for r in rows), [
        (r.op, r.inputs, r.reason) for r in rows if r.kind != "accel"
    ]
    vm = relax.VirtualMachine(executable, tvm.cpu())
    for shape in shapes:
        x = make_input(shape)
        with torch.no_grad():
            ref = model(x).numpy()
        out = vm["main"](tvm.runtime.tensor(x.numpy())).numpy()
        assert_close(out, ref)


def test_bert_with_symbolic_batch_and_sequence():
    """BERT-base, 2 layers: batch and sequence symbolic, at (1, 16), (2, 77), (1, 128), (1, 384)."""
    torch.manual_seed(0)
    model = bert_encoder(layers=2).eval()
    batch, seq = torch.export.Dim("batch", max=64), torch.export.Dim("seq", min=2, max=512)
    mod = _export(model, torch.randn(2, 16, 768), ({0: batch, 1: seq},))
    executable = accel_target.build(mod)
    _check(executable, model, [(1, 16), (2, 77), (1, 128), (1, 384)], lambda s: torch.randn(*s, 768))


def test_resnet_like_cnn_with_symbolic_batch():
    """Our ResNet-style CNN (BN folded, strided shortcuts, dense head), batch symbolic: 1, 3, 8."""
    model, example, _ = make("residual_cnn")
    batch = torch.export.Dim("batch", min=1, max=64)
    mod = _export(model, example.repeat(2, 1, 1, 1), ({0: batch},))
    executable = accel_target.build(mod)
    _check(executable, model, [(1,), (3,), (8,)], lambda s: torch.randn(*s, 3, 32, 32))


def test_resnet_like_cnn_symbolic_batch_channels_last_input():
    """input_layout="NHWC" with a symbolic batch: main takes [batch, H, W, C]."""
    model, example, _ = make("residual_cnn")
    mod = _export(model, example.repeat(2, 1, 1, 1), ({0: torch.export.Dim("batch", min=1, max=64)},))
    vm = relax.VirtualMachine(accel_target.build(mod, input_layout="NHWC"), tvm.cpu())
    for n in (1, 3):
        x = torch.randn(n, 3, 32, 32)
        with torch.no_grad():
            ref = model(x).numpy()
        out = vm["main"](tvm.runtime.tensor(np.ascontiguousarray(x.numpy().transpose(0, 2, 3, 1)))).numpy()
        assert_close(out, ref)
