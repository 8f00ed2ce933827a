"""Strassen's form of a large product with a constant weight (strategy/strassen.py, opt-in)."""

import numpy as np
import pytest
import scipy.special
import torch
import tvm
from tvm import relax

import accel_target
import strategy
from strategy.strassen import weight_sums
from tests.helpers import ISAS, assert_close, isa_params, rand, run_executable, single_op_module
from tests.models.classic import bert_encoder


def _implementations(mod, target, strassen=True) -> list[str]:
    """The implementation each matmul of `mod` gets from the pipeline for `target`."""
    with strategy.recording() as log:
        accel_target.optimize(mod, target=target, strassen=strassen)
    return [d.implementation for d in log if d.op == "relax.matmul"]


def _dense(x, w, bias=None):
    def call(data, weight, **b):
        y = relax.op.matmul(data, weight)
        return relax.op.nn.gelu(relax.op.add(y, b["bias"])) if b else y

    return single_op_module(call, {"data": x}, {"weight": w, **({} if bias is None else {"bias": bias})})


def test_the_seven_products_add_up_to_the_product():
    x, w = rand(6, 8).astype(np.float64), rand(8, 10).astype(np.float64)
    a11, a12, a21, a22 = x[:3, :4], x[:3, 4:], x[3:, :4], x[3:, 4:]
    lefts = [a11 + a22, a21 + a22, a11, a22, a11 + a12, a21 - a11, a12 - a22]
    p1, p2, p3, p4, p5, p6, p7 = (a @ b for a, b in zip(lefts, weight_sums(w)))
    c = np.block([[p1 + p4 - p5 + p7, p3 + p5], [p2 + p4, p1 - p2 + p3 + p6]])
    np.testing.assert_allclose(c, x @ w, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("target", isa_params())
def test_a_large_product_runs_as_seven_and_matches_numpy(target):
    # 256 rows over two leading axes, a bias and GELU after it (they join the sums' kernel)
    x, w, bias = rand(2, 128, 768), rand(768, 1536) / 16, rand(1536)
    mod = _dense(x, w, bias)
    assert _implementations(mod, target) == ["strassen.accel"]
    executable = accel_target.build(mod, target=target, strassen=True)
    fused = {r.op for r in accel_target.report(executable).rows if r.kernel == "fused into strassen.accel"}
    assert "relax.add" in fused and any("erf" in op for op in fused)  # the bias and GELU (its erf)
    y = x.astype(np.float64) @ w + bias
    reference = y * 0.5 * (1 + scipy.special.erf(y / np.sqrt(2)))
    assert_close(run_executable(executable, x), reference.astype(np.float32))


@pytest.mark.parametrize("isa", ISAS)
def test_it_takes_products_of_128_rows_on_every_isa(isa):
    assert _implementations(_dense(rand(128, 768), rand(768, 768)), ISAS[isa]) == ["strassen.accel"]
    assert _implementations(_dense(rand(2, 64, 768), rand(768, 768)), ISAS[isa]) == ["strassen.accel"]


def test_a_single_core_target_gets_serial_sums():
    """Like every accel kernel, the two kernels of sums use threads only where the target has
    several cores."""
    mod = _dense(rand(128, 768), rand(768, 768))
    for cores in (1, 2):
        target = {"tag": "accel", "mcpu": "haswell", "num-cores": cores}
        optimized = accel_target.optimize(mod, target=target, strassen=True)
        kernels = [f for g, f in optimized.functions_items() if g.name_hint.startswith("strassen_lefts")]
        assert len(kernels) == 1 and all(("T.parallel" in f.script()) == (cores > 1) for f in kernels)


@pytest.mark.parametrize(
    "x, w",
    [
        pytest.param(rand(126, 768), rand(768, 768), id="too-few-rows"),
        pytest.param(rand(130, 512), rand(512, 1024), id="too-few-inputs"),
        pytest.param(rand(130, 1024), rand(1024, 514), id="too-few-outputs"),
        pytest.param(rand(129, 768), rand(768, 768), id="odd-rows"),
        pytest.param(rand(128, 769), rand(769, 768), id="odd-inputs"),
        pytest.param(rand(128, 768, dtype="float64"), rand(768, 768, dtype="float64"), id="float64"),
    ],
)
def test_a_product_it_does_not_pay_for_stays_as_it_is(x, w):
    assert "strassen.accel" not in _implementations(_dense(x, w), ISAS["avx2"])


def test_it_is_off_unless_asked_for():
    mod = _dense(rand(256, 768), rand(768, 768))
    assert _implementations(mod, ISAS["avx2"], strassen=False) == ["dense_kn.accel"]


def test_a_product_of_two_activations_or_of_symbolic_rows_stays_as_it_is():
    x, w = rand(256, 768), rand(768, 768)
    both = single_op_module(relax.op.matmul, {"x1": x, "x2": w}, {})
    rows = tvm.tirx.Var("rows", "int64")
    bb = relax.BlockBuilder()
    data = relax.Var("data", relax.TensorType((rows, 768), "float32"))
    with bb.function("main", [data]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.matmul(data, relax.const(w)))
        bb.emit_func_output(out)
    assert "strassen.accel" not in _implementations(both, ISAS["avx2"])
    assert _implementations(bb.get(), ISAS["avx2"]) == ["dense_kn.accel"]


@pytest.mark.slow
@pytest.mark.parametrize("target", isa_params("avx512", "avx2"))
def test_a_bert_layer_with_its_products_in_strassens_form_matches_pytorch(target):
    """The benchmark's BERT-base layer on 256 rows (2 x 128 tokens): its four products with
    constant weights in Strassen's form, each a batch_dense_kn of seven, against PyTorch."""
    torch.manual_seed(0)
    model, x = bert_encoder(layers=1).eval(), torch.randn(2, 128, 768)
    executable = accel_target.build(accel_target.from_torch(model, (x,)), target=target, strassen=True)
    rows = [r for r in accel_target.report(executable).rows if r.op == "relax.matmul"]
    assert sum(r.kernel == "strassen.accel" for r in rows) == 4
    with torch.no_grad():
        assert_close(run_executable(executable, x.numpy()), model(x).numpy())
