"""What `build` returns and its report: kept in an object of ours, read from the IR, carried
through save and load; and the one list of phases that build and the registered pipeline run."""

import pytest
import torch
import tvm

import accel_target
import topi_accel
from accel_target import pipeline
from accel_target.reporting import Report, runtime_kernels
from tests.helpers import assert_close, run_executable
from tests.models.zoo import make


@pytest.fixture(scope="module")
def cnn():
    model, x, _ = make("residual_cnn")
    with torch.no_grad():
        ref = model(x).numpy()
    mod = accel_target.from_torch(model, (x,))
    return mod, x.numpy(), ref, accel_target.build(mod)


def test_build_returns_an_executable_of_ours(cnn):
    mod, x, ref, executable = cnn
    assert isinstance(executable, accel_target.AccelExecutable) and isinstance(executable, tvm.relax.VMExecutable)
    assert executable.weights is None and accel_target.report(executable) is executable.report
    assert_close(run_executable(executable, x), ref)


def test_kernel_counts_from_the_module_match_the_bytecode(cnn):
    executable = cnn[3]
    counted = executable.report.kernels
    assert counted == runtime_kernels(executable)
    assert counted.accel == executable.report.count("accel") > 0


def test_elementwise_ops_in_a_kernel_write_back_are_reported_fused(cnn):
    report = cnn[3].report
    fused = [r for r in report.rows if r.kind == "fused"]
    assert fused and {r.op for r in fused} <= {"relax.add", "relax.nn.relu", "relax.multiply"}, fused
    accel = {r.kernel for r in report.rows if r.kind == "accel"}
    assert {r.kernel.removeprefix("fused into ") for r in fused} <= accel
    assert all(r.kernel.startswith("fused into ") and r.kernel in str(report) for r in fused)


def test_identical_blocks_are_each_reported_fused():
    # FuseOps makes one function for identical groups; every call of it hosts its own ops
    torch.manual_seed(0)
    blocks = [torch.nn.Sequential(torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.ReLU()) for _ in range(3)]
    model, x = torch.nn.Sequential(*blocks).eval(), torch.randn(1, 8, 16, 16)
    report = accel_target.build(accel_target.from_torch(model, (x,)), input_layout="NHWC", output_layout="NHWC").report
    kinds = sorted((r.op, r.kind) for r in report.rows if r.op != "relax.nn.conv2d")
    assert kinds == [("relax.add", "fused")] * 3 + [("relax.nn.relu", "fused")] * 3, str(report)


def test_report_survives_save_and_load(cnn, tmp_path):
    executable = cnn[3]
    accel_target.save(executable, tmp_path / "cnn.so")
    loaded = accel_target.load(tmp_path / "cnn.so")
    assert loaded.report == executable.report == Report.from_dict(executable.report.to_dict())
    assert accel_target.report(loaded) == executable.report


def test_a_signature_without_report_loads_but_has_none(cnn, tmp_path):
    plain = tvm.relax.VMExecutable(cnn[3].mod)  # a VMExecutable not made by build
    accel_target.save(plain, tmp_path / "plain.so")
    loaded = accel_target.load(tmp_path / "plain.so")
    assert loaded.report is None
    with pytest.raises(ValueError, match="saved without a report"):
        accel_target.report(loaded)


def test_registered_pipeline_runs_the_same_phases():
    names = [phase.name for phase in pipeline.PHASES]
    assert names == ["graph", "legalize", "kernels", "lowering"]
    target = tvm.target.Target("accel")
    steps = [name for name, _ in topi_accel.tuning.lowered_kernel_steps(target)]
    # the tuner's replay (finish_kernel) and the build's last passes are one list
    passes = [p.info.name for p in pipeline.lowering_passes(target)]
    assert passes[-len(steps) :] == steps
    single = tvm.target.Target({"tag": "accel", "num-cores": 1})
    single_steps = [name for name, _ in topi_accel.tuning.lowered_kernel_steps(single)]
    names = ["RoundEven", "BoundStores", "PropagateNaN", "SizesNonNegative", "WholeTiles", "InsertPrefetches"]
    assert single_steps == names


def test_a_symbolic_shape_build_marks_every_function_no_alias():
    """A symbolic-shape model gets the VM's `shape_func`; TVM's LLVM code generator marks the
    arguments of a module's functions noalias only when all of them are, so the lowered
    module must have no function without ``tirx.noalias`` (else every kernel loses it)."""
    rows = tvm.tirx.Var("rows", "int64")
    x = tvm.relax.Var("x", tvm.relax.TensorType([rows, 32], "float32"))
    bb = tvm.relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            w = tvm.relax.const(torch.randn(32, 48).numpy())
            out = bb.emit_output(tvm.relax.op.matmul(x, w))
        bb.emit_func_output(out)
    target = tvm.target.Target("accel")
    lowered = pipeline.run_phases(accel_target.optimize(bb.get()), target, "lowering", "lowering")["lowering"]
    funcs = {g.name_hint: f for g, f in lowered.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}
    assert "shape_func" in funcs
    assert all("tirx.noalias" in f.attrs for f in funcs.values()), [n for n, f in funcs.items()]
