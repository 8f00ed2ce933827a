"""The contract: a step of ours that fails leaves what it would change as it was, the build
still gives the right result, the report names the step, where and why, and strict mode
makes it a StrictModeError."""

import pytest
import torch
import tvm
from torch import nn
from tvm import relax

import accel_target
import strategy
import topi_accel
from accel_target import pipeline
from accel_target.declines import Decline, recording_declines
from accel_target.passes import inplace
from strategy import registry
from strategy.registry import StrictModeError
from tests.helpers import assert_close, run_executable

BOOM = "RuntimeError: boom"


class Residual(nn.Module):
    """relu(conv3x3(x) + conv1x1(x)), pooled, then a Linear: two accel convs (one writes over
    the other's output, WriteInPlace) and a dense, elementwise epilogues, a parallel pool."""

    def __init__(self):
        super().__init__()
        self.conv, self.skip, self.fc = nn.Conv2d(8, 16, 3, padding=1), nn.Conv2d(8, 16, 1), nn.Linear(16, 32)

    def forward(self, x):
        y = torch.relu(self.conv(x) + self.skip(x))
        return self.fc(y.mean((2, 3)))


@pytest.fixture(scope="module", name="model")
def _model():
    torch.manual_seed(0)
    model, x = Residual().eval(), torch.randn(1, 8, 12, 12)
    return model, x, accel_target.from_torch(model, (x,))


@pytest.fixture(scope="module", name="kernels")
def _kernels(model):
    """Names of the PrimFuncs of the optimized module."""
    functions = accel_target.optimize(model[2]).functions_items()
    return {g.name_hint for g, f in functions if isinstance(f, tvm.tirx.PrimFunc)}


def _boom(*_args, **_kwargs):
    raise RuntimeError("boom")


def _raising_on(predicate, original):
    """`original`, raising for the PrimFuncs `predicate` holds for."""
    return lambda func, *args: _boom() if predicate(func) else original(func, *args)


def _build_correct(model, **kwargs):
    torch_model, x, mod = model
    executable = accel_target.build(mod, **kwargs)
    assert_close(run_executable(executable, x.numpy()), torch_model(x).detach().numpy())
    return accel_target.report(executable)


def _accel(func) -> bool:
    return topi_accel.contains_accel_kernel(func)


# (step, module and function of topi_accel to break, on which kernels)
KERNEL_STEPS = [
    ("InlineEpilogue", topi_accel, "inline_epilogue", _accel),
    ("Parallelize", topi_accel, "parallelize", lambda func: not _accel(func)),
    ("SizesNonNegative", topi_accel.symbolic, "sizes_non_negative", lambda func: True),
    ("WholeTiles", topi_accel.tir_passes.wholetiles, "whole_tiles", lambda func: True),
    ("InsertPrefetches", topi_accel.tir_passes.prefetch, "insert_prefetches", lambda func: True),
    ("SerialSmallKernels", topi_accel.tir_passes.serial, "serial_when_small", lambda func: True),
    ("RoundEven", topi_accel.tir_passes.round_even, "round_even", lambda func: True),
    ("PropagateNaN", topi_accel.tir_passes.nan_extrema, "propagate_nan", lambda func: True),
]


@pytest.mark.parametrize("step, module, attr, which", KERNEL_STEPS, ids=[s[0] for s in KERNEL_STEPS])
def test_a_kernel_step_that_raises_leaves_the_kernel_as_it_was(model, kernels, monkeypatch, step, module, attr, which):
    monkeypatch.setattr(module, attr, _raising_on(which, getattr(module, attr)))
    report = _build_correct(model)
    assert report.declines, str(report)
    assert {d.step for d in report.declines} == {step}
    assert all(d.reason == BOOM for d in report.declines)
    # each decline names a kernel of the module (WriteInPlace may rename it name_in_place)
    assert all(any(k.startswith(d.where) for k in kernels) for d in report.declines), (report.declines, kernels)
    assert f"declined (left as it was): {step} on" in str(report)
    assert report.to_dict()["declines"][0] == {"step": step, "where": report.declines[0].where, "reason": BOOM}


@pytest.mark.parametrize("step, module, attr, which", KERNEL_STEPS, ids=[s[0] for s in KERNEL_STEPS])
def test_strict_mode_makes_a_kernel_step_failure_an_error(model, monkeypatch, step, module, attr, which):
    monkeypatch.setattr(module, attr, _raising_on(which, getattr(module, attr)))
    with pytest.raises(StrictModeError, match=f"{step} declined .*: {BOOM}; strict mode"):
        accel_target.build(model[2], strict=True)


def test_write_in_place_that_raises_leaves_the_call_as_it_was(model, monkeypatch):
    assert "call_tir_inplace" in accel_target.optimize(model[2]).script()
    monkeypatch.setattr(inplace, "read_from_output", _boom)
    report = _build_correct(model)
    assert [d.step for d in report.declines] == ["WriteInPlace"]
    # the residual conv's kernel: direct, or Winograd where 8 input channels are whole vectors
    assert report.declines[0].where.startswith(("fused_conv2d_nhwc_ohwi", "fused_conv2d_winograd"))
    assert "call_tir_inplace" not in accel_target.optimize(model[2]).script()


def _broken_pass(name):
    @tvm.transform.module_pass(opt_level=0, name=name)
    def broken(mod, _ctx):
        raise RuntimeError("boom")

    return broken


def test_convert_layout_that_raises_gives_back_the_module_before_it(model, monkeypatch):
    monkeypatch.setattr(relax.transform, "ConvertLayout", lambda *_: _broken_pass("ConvertLayout"))
    report = _build_correct(model)
    assert report.declines == (Decline("ConvertLayout", "module", BOOM),)
    # the convs stay NCHW, and still run on accel kernels (their data transposed)
    convs = [r for r in report.rows if r.op == "relax.nn.conv2d"]
    assert convs and all(r.kind == "accel" and "data_layout=NCHW" in r.layouts for r in convs)


def test_simplify_layouts_that_raises_gives_back_the_module_before_it(model, monkeypatch):
    monkeypatch.setattr(pipeline, "SimplifyLayouts", lambda: _broken_pass("SimplifyLayouts"))
    report = _build_correct(model)
    assert report.declines == (Decline("SimplifyLayouts", "module", BOOM),) * 2  # it runs twice
    with pytest.raises(StrictModeError, match="SimplifyLayouts declined module"):
        accel_target.build(model[2], strict=True)


def test_a_graph_pass_leaving_an_ill_formed_module_is_declined(model, monkeypatch):
    @tvm.transform.module_pass(opt_level=0, name="FastMath")
    def ill_formed(mod, _ctx):
        main = mod["main"]
        stray = relax.Var("stray", main.params[0].ty)  # defined nowhere
        out = tvm.IRModule(dict(mod.functions_items()))
        out["main"] = relax.Function(main.params, relax.SeqExpr([], stray), main.ret_ty, main.is_pure, main.attrs)
        return out

    monkeypatch.setattr(pipeline, "FastMath", lambda: ill_formed)
    report = _build_correct(model)
    assert [(d.step, d.where) for d in report.declines] == [("FastMath", "module")]


def _private_registry(monkeypatch):
    """Registrations in this test go to a copy of the registry."""
    monkeypatch.setattr(registry, "_IMPLEMENTATIONS", {op: list(i) for op, i in registry._IMPLEMENTATIONS.items()})


def test_a_strategy_that_raises_gives_the_op_to_the_next_implementation(model, monkeypatch):
    _private_registry(monkeypatch)
    strategy.register("relax.nn.conv2d", "broken.accel", condition=lambda call: None, plevel=1000)(_boom)
    report = _build_correct(model)
    convs = [r for r in report.rows if r.op == "relax.nn.conv2d"]
    assert convs and all(r.kind == "accel" and r.kernel != "broken.accel" for r in convs)
    assert [d.step for d in report.declines] == ["broken.accel"] * len(convs)
    assert all(d.where.startswith("relax.nn.conv2d on float32[") and d.reason == BOOM for d in report.declines)
    with pytest.raises(StrictModeError, match="broken.accel failed on relax.nn.conv2d"):
        accel_target.build(model[2], strict=True)


def test_a_failing_strategy_condition_is_a_reason_not_a_crash(model, monkeypatch):
    _private_registry(monkeypatch)
    strategy.register("relax.matmul", "broken.accel", condition=_boom, plevel=1000)(_boom)
    report = _build_correct(model)
    (dense,) = [r for r in report.rows if r.op == "relax.matmul"]
    assert dense.kind == "accel" and dense.kernel == "dense_kn.accel"
    assert [(d.step, d.reason) for d in report.declines] == [("broken.accel", BOOM)]


def test_declines_go_to_every_open_recording_block_and_the_log(model, monkeypatch, caplog):
    monkeypatch.setattr(
        topi_accel.tir_passes.prefetch,
        "insert_prefetches",
        _raising_on(lambda func: True, topi_accel.tir_passes.prefetch.insert_prefetches),
    )
    with recording_declines() as outer, recording_declines() as inner:
        executable = tvm.compile(model[2], target="accel", relax_pipeline="accel")
    with accel_target.strict(), pytest.raises(StrictModeError, match="InsertPrefetches"):
        tvm.compile(model[2], target="accel", relax_pipeline="accel")
    assert outer == inner and outer and all(d.step == "InsertPrefetches" for d in outer)
    assert "InsertPrefetches declined" in caplog.text
    assert_close(run_executable(executable, model[1].numpy()), model[0](model[1]).detach().numpy())


def test_a_clean_build_declines_nothing(model):
    assert _build_correct(model, strict=True).declines == ()
